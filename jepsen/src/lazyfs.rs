//! A lazy file system for the `power` nemesis: a FUSE file system (fuser, mounted through
//! Debian's `fusermount3`) that keeps apart what its users wrote and what reached "stable
//! storage", and can cut power, dropping everything that had not.
//!
//! The rules, those of a disk and a kernel page cache that lose everything not synced:
//!
//! - A file's bytes and size are durable only once the file is `fsync`ed or `fdatasync`ed
//!   (FUSE `fsync`, either flag). `sync_file_range` never reaches a FUSE file system as a sync,
//!   so it makes nothing durable, as on a disk whose cache it does not flush.
//! - A directory's entries (files and directories created, renamed into or out of it, removed)
//!   are durable only once the directory itself is `fsync`ed (FUSE `fsyncdir`). A file that was
//!   created and fsynced in a directory never synced is gone after a cut, as on ext4. A rename
//!   between two directories of which only one was synced leaves the file under both names or
//!   neither, as POSIX allows.
//! - Everything processes see (reads, listings, sizes) is the current state, pending writes
//!   included. Files are served with direct I/O and no attribute or entry caching, so the
//!   kernel keeps no copy that could outlive a cut.
//! - [`LazyMount::cut_power`], called once every process using the mount is dead, replaces
//!   the current state with the durable one; with [`Torn::LastWrite`] the last write of each
//!   file that had one pending first reaches the disk in part (its first half), as a torn
//!   sector write would.
//!
//! Everything lives in memory (the durable state too): a mount is made for one harness run.
//! Hard links, symbolic links, extended attributes and locks are refused (`ENOSYS`): batond
//! uses none of them.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
    WriteFlags,
};

/// The kernel caches no attribute and no entry.
const NO_CACHE: Duration = Duration::ZERO;
const BLOCK: u64 = 4_096;

/// Whether a power cut tears the last pending write of each file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Torn {
    /// Unsynced writes are dropped whole.
    No,
    /// The first half of each file's last unsynced write reaches the disk, the rest is dropped.
    LastWrite,
}

/// What a power cut dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cut {
    /// Files whose bytes or size went back to their last sync.
    pub files: usize,
    /// Bytes written and not synced, dropped.
    pub bytes: u64,
    /// Directories whose entries went back to their last sync.
    pub dirs: usize,
    /// Files whose last write was torn.
    pub torn: usize,
}

/// A lazy file system mounted at a directory; unmounted when dropped.
pub struct LazyMount {
    state: Arc<Mutex<State>>,
    sync_delay_us: Arc<AtomicU64>,
    mountpoint: PathBuf,
    session: Option<fuser::BackgroundSession>,
}

impl std::fmt::Debug for LazyMount {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("LazyMount")
            .field("mountpoint", &self.mountpoint)
            .finish_non_exhaustive()
    }
}

impl LazyMount {
    /// Mounts an empty lazy file system at `mountpoint` (an existing, empty directory).
    pub fn mount(mountpoint: &Path) -> std::io::Result<LazyMount> {
        use std::os::unix::fs::MetadataExt;
        let owner = std::fs::metadata(mountpoint)?;
        let state = Arc::new(Mutex::new(State::new(owner.uid(), owner.gid())));
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::FSName("baton-lazyfs".to_owned()),
            MountOption::NoAtime,
        ];
        let sync_delay_us = Arc::new(AtomicU64::new(0));
        let session = fuser::spawn_mount(
            LazyFs {
                state: state.clone(),
                sync_delay_us: sync_delay_us.clone(),
            },
            mountpoint,
            &config,
        )?;
        Ok(LazyMount {
            state,
            sync_delay_us,
            mountpoint: mountpoint.to_owned(),
            session: Some(session),
        })
    }

    /// Makes every file sync take `delay` before it answers (zero: at once), as a slow disk
    /// would; other operations go on meanwhile. A sync makes durable what the file held when it
    /// was asked for, unless a power cut comes first.
    pub fn set_sync_delay(&self, delay: Duration) {
        let micros = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.sync_delay_us.store(micros, Ordering::Relaxed);
    }

    /// Turns the power off: from now until `cut_power`, no sync makes anything durable, those
    /// still under way included, and none is answered until `killing`. Call it before
    /// signalling the processes that use the mount, so that a sync a dying process waits for
    /// cannot complete.
    pub fn power_off(&self) {
        self.lock().power = Power::Off;
    }

    /// The processes using the mount have been sent SIGKILL: syncs held since `power_off`,
    /// and any asked from now on, fail (a process cannot exit while the kernel waits for an
    /// answer on its behalf). Nothing becomes durable.
    pub fn killing(&self) {
        let mut state = self.lock();
        state.power = Power::Dying;
        state.answer_held();
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Cuts power: everything not synced is dropped (see the module's rules). Call it once the
    /// processes that used the mount are dead.
    pub fn cut_power(&self, torn: Torn) -> Cut {
        self.lock().cut(torn)
    }
}

impl Drop for LazyMount {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            let _ = session.umount_and_join();
        }
    }
}

/// One file's bytes: as processes see them, and as they were at the last sync.
#[derive(Debug, Clone, Default)]
struct FileData {
    current: Vec<u8>,
    durable: Vec<u8>,
    /// Bytes written since the last sync (a count, for the report).
    pending_bytes: u64,
    /// The last write since the last sync: where, and how long (for a torn cut).
    last_write: Option<(u64, usize)>,
}

/// One directory's entries: as processes see them, and as they were at the last sync.
#[derive(Debug, Clone, Default)]
struct DirData {
    current: BTreeMap<OsString, u64>,
    durable: BTreeMap<OsString, u64>,
}

#[derive(Debug, Clone)]
enum Kind {
    File(FileData),
    Dir(DirData),
}

#[derive(Debug, Clone)]
struct Inode {
    kind: Kind,
    perm: u16,
    uid: u32,
    gid: u32,
    mtime: SystemTime,
}

#[derive(Debug)]
struct State {
    inodes: BTreeMap<u64, Inode>,
    next: u64,
    /// How many power cuts there have been: a slow sync that a cut overtook makes nothing
    /// durable.
    cuts: u64,
    /// Between `power_off` and the cut no sync makes anything durable.
    power: Power,
    /// Syncs asked for while the power is off: unanswered until the processes are being
    /// killed, as a machine without power answers nothing (so no process learns of a failed
    /// sync and stops on its own before it is killed).
    held: HeldSyncs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Power {
    On,
    /// Syncs are held unanswered.
    Off,
    /// The processes have been sent SIGKILL: syncs are answered with EIO, which none of them
    /// will see (a FUSE request the kernel has sent must be answered before its process can
    /// exit).
    Dying,
}

/// Syncs held unanswered until the power cut.
#[derive(Default)]
struct HeldSyncs(Vec<ReplyEmpty>);

impl std::fmt::Debug for HeldSyncs {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "{} held syncs", self.0.len())
    }
}

impl State {
    fn new(uid: u32, gid: u32) -> State {
        let root = Inode {
            kind: Kind::Dir(DirData::default()),
            perm: 0o755,
            uid,
            gid,
            mtime: SystemTime::now(),
        };
        State {
            inodes: BTreeMap::from([(INodeNo::ROOT.0, root)]),
            next: INodeNo::ROOT.0 + 1,
            cuts: 0,
            power: Power::On,
            held: HeldSyncs::default(),
        }
    }

    fn cut(&mut self, torn: Torn) -> Cut {
        self.cuts += 1;
        self.power = Power::On;
        self.answer_held();
        let mut cut = Cut::default();
        for inode in self.inodes.values_mut() {
            match &mut inode.kind {
                Kind::File(file) => {
                    if file.current == file.durable {
                        file.pending_bytes = 0;
                        file.last_write = None;
                        continue;
                    }
                    cut.files += 1;
                    cut.bytes += file.pending_bytes;
                    let mut after = file.durable.clone();
                    if let (Torn::LastWrite, Some((offset, length))) = (torn, file.last_write) {
                        let start = offset as usize;
                        let half = (length / 2).min(file.current.len().saturating_sub(start));
                        if half > 0 {
                            if after.len() < start + half {
                                after.resize(start + half, 0);
                            }
                            after[start..start + half]
                                .copy_from_slice(&file.current[start..start + half]);
                            cut.torn += 1;
                        }
                    }
                    file.current = after.clone();
                    file.durable = after;
                    file.pending_bytes = 0;
                    file.last_write = None;
                }
                Kind::Dir(dir) => {
                    if dir.current != dir.durable {
                        cut.dirs += 1;
                        dir.current = dir.durable.clone();
                    }
                }
            }
        }
        // What no durable entry reaches any more is gone.
        let mut reachable = std::collections::BTreeSet::from([INodeNo::ROOT.0]);
        let mut stack = vec![INodeNo::ROOT.0];
        while let Some(ino) = stack.pop() {
            if let Some(Inode {
                kind: Kind::Dir(dir),
                ..
            }) = self.inodes.get(&ino)
            {
                for child in dir.current.values() {
                    if reachable.insert(*child) {
                        stack.push(*child);
                    }
                }
            }
        }
        self.inodes.retain(|ino, _| reachable.contains(ino));
        cut
    }

    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let inode = self.inodes.get(&ino)?;
        let (kind, size, nlink) = match &inode.kind {
            Kind::File(file) => (FileType::RegularFile, file.current.len() as u64, 1),
            Kind::Dir(dir) => (FileType::Directory, BLOCK, 2 + dir.current.len() as u32),
        };
        Some(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: inode.mtime,
            mtime: inode.mtime,
            ctime: inode.mtime,
            crtime: inode.mtime,
            kind,
            perm: inode.perm,
            nlink,
            uid: inode.uid,
            gid: inode.gid,
            rdev: 0,
            blksize: BLOCK as u32,
            flags: 0,
        })
    }

    fn dir(&mut self, ino: u64) -> Result<&mut DirData, Errno> {
        match self.inodes.get_mut(&ino).map(|inode| &mut inode.kind) {
            Some(Kind::Dir(dir)) => Ok(dir),
            Some(Kind::File(_)) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn answer_held(&mut self) {
        for reply in std::mem::take(&mut self.held.0) {
            reply.error(Errno::EIO);
        }
    }

    fn file(&mut self, ino: u64) -> Result<&mut FileData, Errno> {
        match self.inodes.get_mut(&ino).map(|inode| &mut inode.kind) {
            Some(Kind::File(file)) => Ok(file),
            Some(Kind::Dir(_)) => Err(Errno::EISDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn child(&mut self, parent: u64, name: &OsStr) -> Result<Option<u64>, Errno> {
        Ok(self.dir(parent)?.current.get(name).copied())
    }

    /// A new inode named `name` in `parent`.
    fn add(
        &mut self,
        parent: u64,
        name: &OsStr,
        kind: Kind,
        perm: u16,
        req: &Request,
    ) -> Result<u64, Errno> {
        if self.child(parent, name)?.is_some() {
            return Err(Errno::EEXIST);
        }
        let ino = self.next;
        self.next += 1;
        self.inodes.insert(
            ino,
            Inode {
                kind,
                perm,
                uid: req.uid(),
                gid: req.gid(),
                mtime: SystemTime::now(),
            },
        );
        self.dir(parent)?.current.insert(name.to_owned(), ino);
        Ok(ino)
    }

    fn write(&mut self, ino: u64, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let file = self.file(ino)?;
        let start = usize::try_from(offset).map_err(|_| Errno::EFBIG)?;
        let end = start + data.len();
        if file.current.len() < end {
            file.current.resize(end, 0);
        }
        file.current[start..end].copy_from_slice(data);
        file.pending_bytes += data.len() as u64;
        file.last_write = Some((offset, data.len()));
        if let Some(inode) = self.inodes.get_mut(&ino) {
            inode.mtime = SystemTime::now();
        }
        Ok(data.len() as u32)
    }
}

/// The FUSE side.
struct LazyFs {
    state: Arc<Mutex<State>>,
    sync_delay_us: Arc<AtomicU64>,
}

/// Makes `asked`, what file `ino` held when a sync was asked for, its durable bytes, unless a
/// power cut came since (`cuts` is the count when it was asked). What was written after the
/// ask stays pending.
fn settle_sync(state: &mut State, ino: u64, cuts: u64, asked: Vec<u8>) {
    if state.cuts != cuts || state.power != Power::On {
        return;
    }
    if let Ok(file) = state.file(ino) {
        if file.current == asked {
            file.pending_bytes = 0;
            file.last_write = None;
        }
        file.durable = asked;
    }
}

impl LazyFs {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    fn entry(&self, state: &State, ino: u64, reply: ReplyEntry) {
        match state.attr(ino) {
            Some(attr) => reply.entry(&NO_CACHE, &attr, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }
}

fn perm(mode: u32, umask: u32) -> u16 {
    ((mode & !umask) & 0o7777) as u16
}

impl Filesystem for LazyFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut state = self.lock();
        match state.child(parent.0, name) {
            Ok(Some(ino)) => self.entry(&state, ino, reply),
            Ok(None) => reply.error(Errno::ENOENT),
            Err(errno) => reply.error(errno),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.lock().attr(ino.0) {
            Some(attr) => reply.attr(&NO_CACHE, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut state = self.lock();
        if let Some(size) = size {
            match state.file(ino.0) {
                Ok(file) => {
                    let Ok(size) = usize::try_from(size) else {
                        return reply.error(Errno::EFBIG);
                    };
                    file.current.resize(size, 0);
                    file.pending_bytes += 1;
                    file.last_write = None;
                }
                Err(errno) => return reply.error(errno),
            }
        }
        let Some(inode) = state.inodes.get_mut(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        if let Some(mode) = mode {
            inode.perm = (mode & 0o7777) as u16;
        }
        if let Some(uid) = uid {
            inode.uid = uid;
        }
        if let Some(gid) = gid {
            inode.gid = gid;
        }
        match mtime {
            Some(TimeOrNow::SpecificTime(time)) => inode.mtime = time,
            Some(TimeOrNow::Now) => inode.mtime = SystemTime::now(),
            None => {}
        }
        match state.attr(ino.0) {
            Some(attr) => reply.attr(&NO_CACHE, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let mut state = self.lock();
        match state.add(
            parent.0,
            name,
            Kind::Dir(DirData::default()),
            perm(mode, umask),
            req,
        ) {
            Ok(ino) => self.entry(&state, ino, reply),
            Err(errno) => reply.error(errno),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut state = self.lock();
        match state.child(parent.0, name) {
            Ok(Some(ino))
                if matches!(state.inodes.get(&ino).map(|i| &i.kind), Some(Kind::Dir(_))) =>
            {
                reply.error(Errno::EISDIR)
            }
            Ok(Some(_)) => {
                if let Ok(dir) = state.dir(parent.0) {
                    dir.current.remove(name);
                }
                reply.ok();
            }
            Ok(None) => reply.error(Errno::ENOENT),
            Err(errno) => reply.error(errno),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut state = self.lock();
        let ino = match state.child(parent.0, name) {
            Ok(Some(ino)) => ino,
            Ok(None) => return reply.error(Errno::ENOENT),
            Err(errno) => return reply.error(errno),
        };
        match state.dir(ino) {
            Ok(dir) if !dir.current.is_empty() => return reply.error(Errno::ENOTEMPTY),
            Ok(_) => {}
            Err(errno) => return reply.error(errno),
        }
        if let Ok(dir) = state.dir(parent.0) {
            dir.current.remove(name);
        }
        reply.ok();
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut state = self.lock();
        let ino = match state.child(parent.0, name) {
            Ok(Some(ino)) => ino,
            Ok(None) => return reply.error(Errno::ENOENT),
            Err(errno) => return reply.error(errno),
        };
        match state.child(newparent.0, newname) {
            Ok(Some(_)) if flags.contains(RenameFlags::RENAME_NOREPLACE) => {
                return reply.error(Errno::EEXIST)
            }
            Ok(Some(existing)) => {
                if let Ok(dir) = state.dir(existing) {
                    if !dir.current.is_empty() {
                        return reply.error(Errno::ENOTEMPTY);
                    }
                }
            }
            Ok(None) => {}
            Err(errno) => return reply.error(errno),
        }
        if flags.bits() & !RenameFlags::RENAME_NOREPLACE.bits() != 0 {
            return reply.error(Errno::EINVAL);
        }
        if let Ok(dir) = state.dir(parent.0) {
            dir.current.remove(name);
        }
        if let Ok(dir) = state.dir(newparent.0) {
            dir.current.insert(newname.to_owned(), ino);
        }
        reply.ok();
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mut state = self.lock();
        if let Err(errno) = state.file(ino.0) {
            return reply.error(errno);
        }
        if flags.0 & libc::O_TRUNC != 0 {
            if let Ok(file) = state.file(ino.0) {
                file.current.clear();
                file.pending_bytes += 1;
                file.last_write = None;
            }
        }
        reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let mut state = self.lock();
        match state.file(ino.0) {
            Ok(file) => {
                let start = (offset as usize).min(file.current.len());
                let end = (start + size as usize).min(file.current.len());
                reply.data(&file.current[start..end]);
            }
            Err(errno) => reply.error(errno),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.lock().write(ino.0, offset, data) {
            Ok(written) => reply.written(written),
            Err(errno) => reply.error(errno),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) makes nothing durable.
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let delay = Duration::from_micros(self.sync_delay_us.load(Ordering::Relaxed));
        let mut state = self.lock();
        match state.power {
            Power::Off => return state.held.0.push(reply),
            Power::Dying => return reply.error(Errno::EIO),
            Power::On => {}
        }
        let cuts = state.cuts;
        let asked = match state.file(ino.0) {
            Ok(file) => file.current.clone(),
            Err(errno) => return reply.error(errno),
        };
        if delay.is_zero() {
            settle_sync(&mut state, ino.0, cuts, asked);
            return reply.ok();
        }
        drop(state);
        // A slow disk: the sync answers later, from a thread of its own, so the mount serves
        // other operations (the followers' reads of what was written, say) meanwhile.
        let shared = self.state.clone();
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            let mut state = shared.lock().unwrap_or_else(|poison| poison.into_inner());
            match state.power {
                Power::Off => return state.held.0.push(reply),
                Power::Dying => return reply.error(Errno::EIO),
                Power::On if state.cuts != cuts => return reply.error(Errno::EIO),
                Power::On => {}
            }
            settle_sync(&mut state, ino.0, cuts, asked);
            reply.ok();
        });
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.lock().dir(ino.0) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(errno) => reply.error(errno),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let mut state = self.lock();
        let entries: Vec<(OsString, u64)> = match state.dir(ino.0) {
            Ok(dir) => dir
                .current
                .iter()
                .map(|(name, ino)| (name.clone(), *ino))
                .collect(),
            Err(errno) => return reply.error(errno),
        };
        let mut all = vec![(OsString::from("."), ino.0, FileType::Directory)];
        all.push((OsString::from(".."), ino.0, FileType::Directory));
        for (name, child) in entries {
            let kind = match state.inodes.get(&child).map(|inode| &inode.kind) {
                Some(Kind::Dir(_)) => FileType::Directory,
                _ => FileType::RegularFile,
            };
            all.push((name, child, kind));
        }
        for (position, (name, child, kind)) in all.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(child), position as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut state = self.lock();
        match state.power {
            Power::Off => return state.held.0.push(reply),
            Power::Dying => return reply.error(Errno::EIO),
            Power::On => {}
        }
        match state.dir(ino.0) {
            Ok(dir) => {
                dir.durable = dir.current.clone();
                reply.ok();
            }
            Err(errno) => reply.error(errno),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let blocks = 1 << 24;
        reply.statfs(
            blocks,
            blocks,
            blocks,
            1 << 20,
            1 << 20,
            BLOCK as u32,
            255,
            BLOCK as u32,
        );
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let mut state = self.lock();
        let ino = match state.child(parent.0, name) {
            Ok(Some(_)) if flags & libc::O_EXCL != 0 => return reply.error(Errno::EEXIST),
            Ok(Some(ino)) => {
                if flags & libc::O_TRUNC != 0 {
                    if let Ok(file) = state.file(ino) {
                        file.current.clear();
                        file.pending_bytes += 1;
                        file.last_write = None;
                    }
                }
                ino
            }
            Ok(None) => match state.add(
                parent.0,
                name,
                Kind::File(FileData::default()),
                perm(mode, umask),
                req,
            ) {
                Ok(ino) => ino,
                Err(errno) => return reply.error(errno),
            },
            Err(errno) => return reply.error(errno),
        };
        match state.attr(ino) {
            Some(attr) => reply.created(
                &NO_CACHE,
                &attr,
                Generation(0),
                FileHandle(0),
                FopenFlags::FOPEN_DIRECT_IO,
            ),
            None => reply.error(Errno::ENOENT),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs::{self, File, OpenOptions};
    use std::io::Write;
    use std::os::unix::fs::FileExt;

    use super::*;

    /// A lazy mount in a fresh temporary directory, or `None` (said loudly) where FUSE cannot
    /// mount: no `/dev/fuse` or no `fusermount3` (Debian `fuse3`). CI installs both.
    fn mounted() -> Option<(tempfile::TempDir, LazyMount)> {
        let dir = tempfile::tempdir().unwrap();
        match LazyMount::mount(dir.path()) {
            Ok(mount) => Some((dir, mount)),
            Err(error) => {
                eprintln!(
                    "SKIPPED: cannot mount a FUSE file system here ({error}); needs /dev/fuse and fusermount3 (apt-get install fuse3)"
                );
                assert!(
                    std::env::var_os("CI").is_none(),
                    "CI must be able to mount FUSE: {error}"
                );
                None
            }
        }
    }

    fn sync_dir(path: &Path) {
        File::open(path).unwrap().sync_all().unwrap();
    }

    #[test]
    fn a_write_is_gone_after_a_cut_unless_synced_and_its_directory_too() {
        let Some((dir, mount)) = mounted() else {
            return;
        };
        let root = dir.path();
        let kept = root.join("kept");
        let mut file = File::create(&kept).unwrap();
        file.write_all(b"synced").unwrap();
        file.sync_data().unwrap();
        sync_dir(root);
        // After the directory's last sync: one file never synced, one synced but not its entry.
        fs::write(root.join("lost"), b"never synced").unwrap();
        fs::write(root.join("orphan"), b"x").unwrap();
        File::open(root.join("orphan")).unwrap().sync_all().unwrap();
        file.write_all(b" and more").unwrap();
        drop(file);
        assert_eq!(
            fs::read(root.join("lost")).unwrap(),
            b"never synced",
            "reads see pending writes"
        );
        let cut = mount.cut_power(Torn::No);
        assert!(cut.dirs == 1 && cut.files == 2, "{cut:?}");
        assert_eq!(fs::read(&kept).unwrap(), b"synced");
        assert!(!root.join("lost").exists(), "an unsynced entry survived");
        assert!(
            !root.join("orphan").exists(),
            "a synced file in an unsynced dir survived"
        );
    }

    /// (`sync_file_range`, which makes nothing durable here either, is sled's, below: nix has
    /// no wrapper for it and this crate allows no `unsafe`.)
    #[test]
    fn fdatasync_counts_and_close_does_not() {
        let Some((dir, mount)) = mounted() else {
            return;
        };
        let path = dir.path().join("log");
        let file = File::create(&path).unwrap();
        sync_dir(dir.path());
        file.write_all_at(b"first", 0).unwrap();
        file.sync_data().unwrap();
        file.write_all_at(b"second", 5).unwrap();
        drop(file);
        mount.cut_power(Torn::No);
        assert_eq!(fs::read(&path).unwrap(), b"first");
    }

    #[test]
    fn a_rename_or_an_unlink_without_a_directory_sync_is_undone() {
        let Some((dir, mount)) = mounted() else {
            return;
        };
        let root = dir.path();
        for name in ["a", "b"] {
            let mut file = File::create(root.join(name)).unwrap();
            file.write_all(name.as_bytes()).unwrap();
            file.sync_all().unwrap();
        }
        sync_dir(root);
        fs::rename(root.join("a"), root.join("c")).unwrap();
        fs::remove_file(root.join("b")).unwrap();
        assert!(!root.join("a").exists() && root.join("c").exists());
        mount.cut_power(Torn::No);
        assert_eq!(fs::read(root.join("a")).unwrap(), b"a");
        assert_eq!(fs::read(root.join("b")).unwrap(), b"b");
        assert!(!root.join("c").exists());
        // Synced, they stay done.
        fs::rename(root.join("a"), root.join("c")).unwrap();
        fs::remove_file(root.join("b")).unwrap();
        sync_dir(root);
        mount.cut_power(Torn::No);
        assert_eq!(fs::read(root.join("c")).unwrap(), b"a");
        assert!(!root.join("a").exists() && !root.join("b").exists());
    }

    /// A slow sync completes later while other writes go on; one that the power overtakes
    /// makes nothing durable, and a sync asked for with the power off is not answered until
    /// the processes are being killed.
    #[test]
    fn a_sync_the_power_overtakes_makes_nothing_durable() {
        let Some((dir, mount)) = mounted() else {
            return;
        };
        let path = dir.path().join("log");
        let file = std::sync::Arc::new(File::create(&path).unwrap());
        sync_dir(dir.path());
        mount.set_sync_delay(Duration::from_millis(100));
        file.write_all_at(b"kept", 0).unwrap();
        let started = std::time::Instant::now();
        file.sync_data().unwrap();
        assert!(started.elapsed() >= Duration::from_millis(100));
        file.write_all_at(b"lost", 4).unwrap();
        let syncing = {
            let file = file.clone();
            std::thread::spawn(move || file.sync_data())
        };
        std::thread::sleep(Duration::from_millis(20));
        mount.power_off();
        let held = {
            let file = file.clone();
            std::thread::spawn(move || file.sync_data())
        };
        std::thread::sleep(Duration::from_millis(150));
        assert!(
            !held.is_finished(),
            "a sync was answered with the power off"
        );
        mount.killing();
        assert!(syncing.join().unwrap().is_err());
        assert!(held.join().unwrap().is_err());
        drop(file);
        mount.set_sync_delay(Duration::ZERO);
        mount.cut_power(Torn::No);
        assert_eq!(fs::read(&path).unwrap(), b"kept");
    }

    #[test]
    fn a_torn_cut_keeps_a_prefix_of_the_last_write() {
        let Some((dir, mount)) = mounted() else {
            return;
        };
        let path = dir.path().join("segment");
        let file = File::create(&path).unwrap();
        file.write_all_at(b"head", 0).unwrap();
        file.sync_all().unwrap();
        sync_dir(dir.path());
        file.write_all_at(b"00000000", 4).unwrap();
        file.write_all_at(b"abcdefgh", 4).unwrap();
        drop(file);
        let cut = mount.cut_power(Torn::LastWrite);
        assert_eq!(cut.torn, 1, "{cut:?}");
        assert_eq!(fs::read(&path).unwrap(), b"headabcd");
    }

    #[test]
    fn appends_offsets_truncates_and_directories_behave_as_on_a_disk() {
        let Some((dir, mount)) = mounted() else {
            return;
        };
        let root = dir.path();
        fs::create_dir_all(root.join("raft-log/sub")).unwrap();
        let path = root.join("raft-log/x");
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        file.write_all(b"one,").unwrap();
        file.write_all(b"two").unwrap();
        // As on Linux: a positioned write to a file opened for appending appends.
        file.write_all_at(b"ONE", 0).unwrap();
        drop(file);
        assert_eq!(fs::read(&path).unwrap(), b"one,twoONE");
        OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(3)
            .unwrap();
        assert_eq!(fs::read(&path).unwrap().len(), 3);
        let mut names: Vec<_> = fs::read_dir(root.join("raft-log"))
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, ["sub", "x"]);
        assert!(
            fs::remove_dir(root.join("raft-log")).is_err(),
            "removed a non-empty dir"
        );
        // Nothing was synced: the whole tree is gone.
        mount.cut_power(Torn::No);
        assert!(!root.join("raft-log").exists());
        assert_eq!(fs::read_dir(root).unwrap().count(), 0);
    }

    /// What sled 0.34's `flush` leaves after a power cut: it syncs with `sync_file_range`, not
    /// `fsync`, so its writes never reach the durable state of this file system.
    #[test]
    fn sleds_flush_does_not_survive_a_power_cut() {
        let Some((dir, mount)) = mounted() else {
            return;
        };
        let path = dir.path().join("db");
        {
            let db = sled::Config::new().path(&path).open().unwrap();
            db.insert(b"vote", b"term 7, node 2").unwrap();
            db.flush().unwrap();
            assert_eq!(
                db.get(b"vote").unwrap().as_deref(),
                Some(&b"term 7, node 2"[..])
            );
        }
        let cut = mount.cut_power(Torn::No);
        let reopened = sled::Config::new().path(&path).open();
        let survived = match &reopened {
            Ok(db) => db.get(b"vote").unwrap().is_some(),
            Err(_) => false,
        };
        eprintln!(
            "sled after a power cut: {cut:?}, reopened: {:?}, vote survived: {survived}",
            reopened.as_ref().map(|_| "ok")
        );
        assert!(!survived, "sled's flushed vote survived the cut: {cut:?}");
    }

    /// The store's own files, on the same file system: a saved vote and an appended entry are
    /// still there after the cut.
    #[tokio::test]
    async fn batons_store_keeps_its_vote_and_log_across_a_power_cut() {
        use baton_raft_store::store::{log_id, Entry, Vote};
        use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
        use openraft::{EntryPayload, RaftLogReader};

        let Some((dir, mount)) = mounted() else {
            return;
        };
        let data = dir.path().join("node-1");
        let vote = Vote::new(7, 2);
        let entry = Entry {
            log_id: log_id(7, 2, 1),
            payload: EntryPayload::Blank,
        };
        {
            let (mut log, _machine) = baton_raft_store::store::open(&data).unwrap();
            log.save_vote(&vote).await.unwrap();
            log.blocking_append([entry.clone()]).await.unwrap();
        }
        let cut = mount.cut_power(Torn::LastWrite);
        let (mut log, _machine) = baton_raft_store::store::open(&data)
            .unwrap_or_else(|error| panic!("does not reopen after {cut:?}: {error}"));
        assert_eq!(log.read_vote().await.unwrap(), Some(vote), "{cut:?}");
        assert_eq!(
            log.try_get_log_entries(..).await.unwrap(),
            [entry],
            "{cut:?}"
        );
    }
}
