//! The backup file: what `GET /v1/snapshot` answers, `baton snapshot save` writes,
//! `baton snapshot inspect` reads and `batond restore` seeds a new cluster from
//! (docs/operations.md). A pure format, written to any `io::Write` ([`BackupWriter`], so a
//! server streams it) and read from bytes:
//!
//! ```text
//! "BATONBAK"  magic, 8 bytes
//! u32 LE      the backup format (BACKUP_FORMAT)
//! u32 LE      the header's length
//! ...         the header, JSON (BackupHeader)
//! u64 LE      the state's length
//! ...         the replicated state, in the state machine's own snapshot encoding
//! u32 LE      CRC-32 of every byte before it
//! ```
//!
//! The header is JSON so that an operator (or `jq` after `inspect --json`) reads it without
//! Baton; the state is opaque here and decoded only by `batond restore`. Every way a file can
//! be wrong (not a backup, a newer format, truncated, a flipped bit, bytes after the end) is a
//! [`BackupError`] found before anything is written from it.

use std::io::Write as _;

use serde::{Deserialize, Serialize};

/// The first bytes of every backup file.
pub const BACKUP_MAGIC: &[u8; 8] = b"BATONBAK";
/// The backup format this build writes and reads.
pub const BACKUP_FORMAT: u32 = 1;
/// The content type of `GET /v1/snapshot`'s answer.
pub const BACKUP_CONTENT_TYPE: &str = "application/vnd.baton.backup";
/// The longest header accepted: far above any real one, so a corrupt length is refused
/// rather than believed.
const HEADER_BYTES_MAX: u32 = 1 << 20;

/// What a backup says of itself: where in the log it was cut and what it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BackupHeader {
    /// The log index of the last entry applied to the state (the state is exactly the cluster's
    /// at this index).
    pub index: u64,
    /// The term of that entry.
    pub term: u64,
    /// The cluster time (ms) of the state.
    pub cluster_time_ms: u64,
    /// The highest fence the cluster had granted at `index`.
    pub fence: u64,
    /// The cluster's members when it was saved: `id=API@PEER`, by id.
    pub members: Vec<String>,
    /// The node that cut it.
    pub saved_by: u64,
    /// When it was cut, by that node's wall clock (informational).
    pub saved_at: String,
    /// Sessions and leases held, dead or alive, across namespaces.
    pub sessions: u64,
    pub leases: u64,
    /// The length of the state's bytes.
    pub state_bytes: u64,
}

/// Why bytes are not a backup this build can use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackupError {
    /// It does not start with [`BACKUP_MAGIC`].
    NotABackup,
    /// A format this build does not read (a newer release wrote it).
    Format(u32),
    /// It ends before the end its lengths announce.
    Truncated { len: u64, expected: u64 },
    /// More bytes than its lengths announce.
    TrailingBytes { len: u64, expected: u64 },
    /// The checksum does not match: some byte changed after it was written.
    Checksum,
    /// The header is not the JSON of a [`BackupHeader`], or disagrees with the state's length.
    Header(String),
}

impl std::fmt::Display for BackupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackupError::NotABackup => write!(f, "not a Baton backup (no BATONBAK magic)"),
            BackupError::Format(found) => write!(
                f,
                "backup format {found}; this build reads format {BACKUP_FORMAT} (restore it with the release that saved it, or a newer one)"
            ),
            BackupError::Truncated { len, expected } => write!(
                f,
                "truncated: {len} bytes, its header announces {expected} (was the save interrupted?)"
            ),
            BackupError::TrailingBytes { len, expected } => write!(
                f,
                "{len} bytes where its header announces {expected}: something was appended to it"
            ),
            BackupError::Checksum => {
                write!(f, "checksum mismatch: the file was changed or damaged after it was saved")
            }
            BackupError::Header(reason) => write!(f, "unreadable header: {reason}"),
        }
    }
}

impl std::error::Error for BackupError {}

/// A backup file's bytes: `header` then `state`. `header.state_bytes` is set from `state`.
pub fn encode_backup(header: &BackupHeader, state: &[u8]) -> Vec<u8> {
    let bytes = Vec::with_capacity(BACKUP_MAGIC.len() + 1024 + state.len());
    let write = |bytes| -> std::io::Result<Vec<u8>> {
        let mut writer = BackupWriter::new(bytes, header, state.len() as u64)?;
        writer.write_all(state)?;
        writer.finish()
    };
    write(bytes).expect("writing to a Vec never fails")
}

/// Writes a backup file as its state is produced, never holding it whole: `new` writes
/// everything before the state (`header.state_bytes` set to `state_bytes`), the state is
/// written through it (exactly `state_bytes` of it: more is an error at once, fewer at
/// `finish`), and `finish` writes the checksum.
#[derive(Debug)]
pub struct BackupWriter<W> {
    out: W,
    hasher: crc32fast::Hasher,
    /// The bytes before the state.
    head: u64,
    state_bytes: u64,
    written: u64,
}

impl<W: std::io::Write> BackupWriter<W> {
    /// Writes the magic, the format, the header and the state's length to `out`.
    pub fn new(
        out: W,
        header: &BackupHeader,
        state_bytes: u64,
    ) -> std::io::Result<BackupWriter<W>> {
        let header = BackupHeader {
            state_bytes,
            ..header.clone()
        };
        let json = serde_json::to_vec(&header).expect("a backup header always serializes");
        let mut writer = BackupWriter {
            out,
            hasher: crc32fast::Hasher::new(),
            head: 0,
            state_bytes,
            written: 0,
        };
        writer.put(BACKUP_MAGIC)?;
        writer.put(&BACKUP_FORMAT.to_le_bytes())?;
        writer.put(&(json.len() as u32).to_le_bytes())?;
        writer.put(&json)?;
        writer.put(&state_bytes.to_le_bytes())?;
        writer.head = writer.written;
        writer.written = 0;
        Ok(writer)
    }

    /// How long the whole file is.
    pub fn file_len(&self) -> u64 {
        self.head + self.state_bytes + 4
    }

    /// Writes the checksum after a state of exactly `state_bytes`; returns the writer.
    pub fn finish(mut self) -> std::io::Result<W> {
        if self.written != self.state_bytes {
            return Err(std::io::Error::other(format!(
                "a state of {} bytes where the header says {}",
                self.written, self.state_bytes
            )));
        }
        let checksum = self.hasher.clone().finalize();
        self.out.write_all(&checksum.to_le_bytes())?;
        Ok(self.out)
    }

    fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.hasher.update(bytes);
        self.out.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }
}

impl<W: std::io::Write> std::io::Write for BackupWriter<W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if self.written + bytes.len() as u64 > self.state_bytes {
            return Err(std::io::Error::other(format!(
                "a state over the {} bytes the header says",
                self.state_bytes
            )));
        }
        self.put(bytes)?;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// Checks a whole backup file and splits it into its header and the state's bytes.
pub fn decode_backup(bytes: &[u8]) -> Result<(BackupHeader, &[u8]), BackupError> {
    let len = bytes.len() as u64;
    if bytes.len() < BACKUP_MAGIC.len() || &bytes[..BACKUP_MAGIC.len()] != BACKUP_MAGIC {
        return Err(BackupError::NotABackup);
    }
    let mut at = BACKUP_MAGIC.len();
    let format = read_u32(bytes, &mut at)?;
    if format != BACKUP_FORMAT {
        return Err(BackupError::Format(format));
    }
    let header_len = read_u32(bytes, &mut at)?;
    if header_len > HEADER_BYTES_MAX {
        return Err(BackupError::Header(format!(
            "a header of {header_len} bytes, over {HEADER_BYTES_MAX}"
        )));
    }
    let header_end = at as u64 + u64::from(header_len);
    let state_at = header_end + 8;
    if len < state_at {
        return Err(BackupError::Truncated {
            len,
            expected: state_at,
        });
    }
    let header_bytes = &bytes[at..header_end as usize];
    at = header_end as usize;
    let state_len = u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let expected = state_at.saturating_add(state_len).saturating_add(4);
    if len < expected {
        return Err(BackupError::Truncated { len, expected });
    }
    if len > expected {
        return Err(BackupError::TrailingBytes { len, expected });
    }
    let body_end = bytes.len() - 4;
    let checksum = u32::from_le_bytes(bytes[body_end..].try_into().expect("4 bytes"));
    if crc32fast::hash(&bytes[..body_end]) != checksum {
        return Err(BackupError::Checksum);
    }
    let header: BackupHeader = serde_json::from_slice(header_bytes)
        .map_err(|error| BackupError::Header(error.to_string()))?;
    if header.state_bytes != state_len {
        return Err(BackupError::Header(format!(
            "it says the state is {} bytes, the file holds {state_len}",
            header.state_bytes
        )));
    }
    Ok((header, &bytes[state_at as usize..body_end]))
}

fn read_u32(bytes: &[u8], at: &mut usize) -> Result<u32, BackupError> {
    let field = bytes.get(*at..*at + 4).ok_or(BackupError::Truncated {
        len: bytes.len() as u64,
        expected: (*at + 4) as u64,
    })?;
    *at += 4;
    Ok(u32::from_le_bytes(field.try_into().expect("4 bytes")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> BackupHeader {
        BackupHeader {
            index: 42,
            term: 3,
            cluster_time_ms: 9_000,
            fence: 17,
            members: vec!["1=127.0.0.1:7420@127.0.0.1:7421".to_owned()],
            saved_by: 1,
            saved_at: "2026-12-05T10:00:00.000Z".to_owned(),
            sessions: 2,
            leases: 5,
            state_bytes: 0,
        }
    }

    #[test]
    fn a_backup_reads_back_as_written() {
        let bytes = encode_backup(&header(), b"the state");
        let (read, state) = decode_backup(&bytes).unwrap();
        assert_eq!(state, b"the state");
        assert_eq!(read.state_bytes, 9);
        assert_eq!(
            read,
            BackupHeader {
                state_bytes: 9,
                ..header()
            }
        );
    }

    #[test]
    fn a_backup_written_in_pieces_is_the_one_encoded_whole_and_its_length_is_kept() {
        let state = [7_u8; 100];
        let mut writer = BackupWriter::new(Vec::new(), &header(), 100).unwrap();
        for piece in state.chunks(7) {
            writer.write_all(piece).unwrap();
        }
        let length = writer.file_len();
        let whole = encode_backup(&header(), &state);
        assert_eq!(length, whole.len() as u64);
        assert_eq!(writer.finish().unwrap(), whole);

        let mut short = BackupWriter::new(Vec::new(), &header(), 100).unwrap();
        short.write_all(&state[..99]).unwrap();
        let error = short.finish().unwrap_err().to_string();
        assert!(
            error.contains("99 bytes where the header says 100"),
            "{error}"
        );
        let mut long = BackupWriter::new(Vec::new(), &header(), 100).unwrap();
        long.write_all(&state).unwrap();
        assert!(long.write_all(&[0]).is_err(), "a state past its length");
    }

    #[test]
    fn every_truncation_is_refused_as_such() {
        let bytes = encode_backup(&header(), &[7; 100]);
        for cut in 0..bytes.len() {
            let error = decode_backup(&bytes[..cut]).unwrap_err();
            let expected = if cut < BACKUP_MAGIC.len() {
                matches!(error, BackupError::NotABackup)
            } else {
                matches!(error, BackupError::Truncated { .. })
            };
            assert!(expected, "cut at {cut}: {error}");
        }
    }

    #[test]
    fn every_flipped_byte_is_refused() {
        let bytes = encode_backup(&header(), &[7; 64]);
        for at in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x10;
            assert!(
                decode_backup(&damaged).is_err(),
                "a flip at byte {at} passed"
            );
        }
    }

    #[test]
    fn a_newer_format_other_bytes_and_appended_bytes_say_what_they_are() {
        let mut bytes = encode_backup(&header(), b"state");
        bytes[8..12].copy_from_slice(&2_u32.to_le_bytes());
        assert_eq!(decode_backup(&bytes).unwrap_err(), BackupError::Format(2));
        assert!(decode_backup(&bytes)
            .unwrap_err()
            .to_string()
            .contains("this build reads format 1"));
        assert_eq!(
            decode_backup(b"{\"index\": 1}").unwrap_err(),
            BackupError::NotABackup
        );
        let mut longer = encode_backup(&header(), b"state");
        longer.push(0);
        assert!(matches!(
            decode_backup(&longer).unwrap_err(),
            BackupError::TrailingBytes { .. }
        ));
    }
}
