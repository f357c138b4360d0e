//! `--fsync-probe DIR`: what one `fdatasync` of a small write costs on the disk under DIR, the
//! floor under a replicated write (SPEC: the leader's and a follower's flush, in parallel, plus
//! a loopback round trip). Printed beside the lease cycle's acquire latency, from the same run.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;

/// Flushes measured; the first few warm the file up and are not counted.
const FLUSHES: usize = 500;
const WARM_UP: usize = 20;
/// The size of one write: about one small log entry.
pub(super) const RECORD_BYTES: usize = 256;

/// The median of `FLUSHES` positioned writes of `RECORD_BYTES`, each followed by an
/// `fdatasync`, into one preallocated file in `dir` (removed afterwards), as the log does.
pub(super) fn fdatasync_p50(dir: &Path) -> anyhow::Result<Duration> {
    let path = dir.join(format!("baton-fsync-probe-{}", std::process::id()));
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("create {}", path.display()))?;
    let result = (|| {
        let size = (RECORD_BYTES * FLUSHES) as u64;
        file.write_all_at(&vec![0; size as usize], 0)?;
        file.sync_all()?;
        let record = [0x5a_u8; RECORD_BYTES];
        let mut took = Vec::with_capacity(FLUSHES);
        for flush in 0..FLUSHES {
            let started = Instant::now();
            file.write_all_at(&record, (flush * RECORD_BYTES) as u64)?;
            file.sync_data()?;
            took.push(started.elapsed());
        }
        let mut counted = took.split_off(WARM_UP);
        counted.sort();
        Ok::<_, std::io::Error>(counted[counted.len() / 2])
    })();
    let _ = std::fs::remove_file(&path);
    result.with_context(|| format!("the fdatasync probe in {}", dir.display()))
}
