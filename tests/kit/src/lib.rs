//! One `batond` process across its restarts, for the integration tests (`tests/`) and the
//! fault harness (`jepsen/`), and the test certificates a cluster with TLS uses (`TestCerts`): how it is started (its log file, its environment), the faults
//! applied to it (SIGKILL, SIGSTOP/SIGCONT, SIGTERM), how its end is told apart from a crash,
//! and reading its log. Where the process runs (ports, a network namespace) and what waits for
//! it to be ready belong to the caller, which builds the [`Command`]; [`RunArgs`] is the
//! `batond run` command line both callers start it with.
//!
//! Nothing here panics on a process that is gone: each call says what it found, and the
//! caller decides whether that fails a test or stops a run.

use std::ffi::OsString;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long [`Process::pause`] waits for every thread to stop after the SIGSTOP.
const STOP_WAIT: Duration = Duration::from_secs(10);

/// A test CA and one certificate it signed, usable as a server and as a client certificate,
/// as PEM files (made with rcgen): what a cluster with TLS runs with in the tests and the
/// harness. The CA's own key is kept too, so that a test can serve the CA certificate itself
/// (the mistake `openssl req -x509` invites).
#[derive(Debug, Clone)]
pub struct TestCerts {
    pub ca: PathBuf,
    pub ca_key: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestCerts {
    /// A new CA named `name` and a certificate for `127.0.0.1`, `localhost` and `more_hosts`
    /// (IP addresses or names), written under `dir` as `NAME-ca.pem`, `NAME-ca-key.pem`,
    /// `NAME-cert.pem` and `NAME-key.pem`.
    ///
    /// # Panics
    ///
    /// When rcgen cannot make them or `dir` cannot be written: a broken test setup.
    pub fn generate(dir: &Path, name: &str, more_hosts: &[String]) -> TestCerts {
        use rcgen::{
            BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
            IsCa, KeyPair, KeyUsagePurpose,
        };
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate().expect("a CA key");
        let ca_key_pem = ca_key.serialize_pem();
        let ca = CertifiedIssuer::self_signed(ca, ca_key).expect("a self-signed CA");
        let mut hosts = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
        hosts.extend(more_hosts.iter().cloned());
        hosts.dedup();
        let mut leaf = CertificateParams::new(hosts).expect("leaf parameters");
        leaf.distinguished_name
            .push(DnType::CommonName, format!("{name} node"));
        leaf.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().expect("a leaf key");
        let cert = leaf.signed_by(&key, &ca).expect("a leaf signed by the CA");
        let certs = TestCerts {
            ca: dir.join(format!("{name}-ca.pem")),
            ca_key: dir.join(format!("{name}-ca-key.pem")),
            cert: dir.join(format!("{name}-cert.pem")),
            key: dir.join(format!("{name}-key.pem")),
        };
        fs::write(&certs.ca, ca.pem()).expect("write the CA");
        fs::write(&certs.ca_key, ca_key_pem).expect("write the CA's key");
        fs::write(&certs.cert, cert.pem()).expect("write the certificate");
        fs::write(&certs.key, key.serialize_pem()).expect("write the key");
        certs
    }

    /// The CA certificate, PEM.
    ///
    /// # Panics
    ///
    /// When the file is gone (its directory was removed too early).
    pub fn ca_pem(&self) -> Vec<u8> {
        fs::read(&self.ca).expect("read the CA")
    }

    /// `batond` flags: the client API over HTTPS and mutual TLS between peers, all with this
    /// one certificate.
    pub fn batond_args(&self) -> Vec<OsString> {
        let mut args = Vec::new();
        for flag in ["--tls-cert", "--peer-tls-cert"] {
            args.extend([flag.into(), self.cert.clone().into_os_string()]);
        }
        for flag in ["--tls-key", "--peer-tls-key"] {
            args.extend([flag.into(), self.key.clone().into_os_string()]);
        }
        args.extend(["--peer-ca".into(), self.ca.clone().into_os_string()]);
        args
    }
}

/// The `batond run` command line of one member of a test cluster: its id, data directory,
/// addresses, the whole cluster's `id=api@peer` list and the timing flags (`None`: batond's
/// default); more flags are appended to the result.
#[derive(Debug, Clone)]
pub struct RunArgs {
    pub id: u64,
    pub data_dir: PathBuf,
    pub listen: String,
    pub peer_listen: String,
    pub initial_cluster: String,
    pub heartbeat_ms: Option<u64>,
    pub election_timeout_ms: Option<u64>,
    pub tick_ms: Option<u64>,
}

impl RunArgs {
    /// The arguments after the `batond` program name.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec!["run".into(), "--id".into(), self.id.to_string().into()];
        args.extend(["--data-dir".into(), self.data_dir.clone().into_os_string()]);
        for (flag, value) in [
            ("--listen", self.listen.clone()),
            ("--peer-listen", self.peer_listen.clone()),
            ("--initial-cluster", self.initial_cluster.clone()),
        ] {
            args.extend([flag.into(), value.into()]);
        }
        for (flag, value) in [
            ("--heartbeat-ms", self.heartbeat_ms),
            ("--election-timeout-ms", self.election_timeout_ms),
            ("--tick-ms", self.tick_ms),
        ] {
            if let Some(value) = value {
                args.extend([flag.into(), value.to_string().into()]);
            }
        }
        args
    }
}

/// One `batond` process and its log file, which every start appends to.
#[derive(Debug)]
pub struct Process {
    log_path: PathBuf,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    child: Option<Child>,
    paused: bool,
    starts: u32,
    /// How a start ended when it was found to have exited by itself, kept across the kill that
    /// reaps it and across later starts, so that a crash is never mistaken for a kill nor
    /// covered up by a restart.
    crashed: Option<ExitStatus>,
    /// Sent SIGKILL by [`Process::send_kill`] and not reaped yet: its exit is no crash.
    killed: bool,
}

impl Process {
    /// A process not started yet, logging to `log_path`.
    pub fn new(log_path: PathBuf) -> Process {
        Process {
            log_path,
            state: Mutex::new(State::default()),
        }
    }

    /// The file that receives the process's stdout and stderr, across restarts.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Starts `command` (a `batond` command line), its output appended to the log after a
    /// line `---- {banner}: start #N ----`. The caller's `BATON_*` variables are removed so
    /// that only the command line configures the node (batond reads every flag from
    /// `BATON_<FLAG>` too). Returns the pid.
    pub fn start(&self, mut command: Command, banner: &str) -> std::io::Result<u32> {
        let mut state = self.lock();
        state.starts += 1;
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)?;
        writeln!(log, "---- {banner}: start #{} ----", state.starts)?;
        command
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .env("RUST_BACKTRACE", "1");
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("BATON_") {
                command.env_remove(key);
            }
        }
        let child = command.spawn()?;
        let pid = child.id();
        state.child = Some(child);
        state.paused = false;
        state.killed = false;
        Ok(pid)
    }

    /// How many times the process was started.
    pub fn starts(&self) -> u32 {
        self.lock().starts
    }

    /// The pid of the current start, if it has not been reaped.
    pub fn pid(&self) -> Option<u32> {
        self.lock().child.as_ref().map(Child::id)
    }

    /// True while the process runs (paused or not).
    pub fn is_running(&self) -> bool {
        let mut state = self.lock();
        state
            .child
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// True between [`Process::pause`] and [`Process::resume`].
    pub fn is_paused(&self) -> bool {
        self.lock().paused
    }

    /// How the current start ended, if it exited by itself and was not reaped yet.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        let mut state = self.lock();
        state
            .child
            .as_mut()
            .and_then(|child| child.try_wait().ok().flatten())
    }

    /// How the first start that exited by itself ended (not by [`Process::kill`] nor after
    /// [`Process::signal`] and [`Process::try_reap`]), whatever ran since.
    pub fn crashed(&self) -> Option<ExitStatus> {
        let exited = self.exit_status();
        let state = self.lock();
        state.crashed.or(exited.filter(|_| !state.killed))
    }

    /// Takes the process back once it has exited (after a SIGTERM, say): its status, or
    /// `None` while it still runs or when nothing runs.
    pub fn try_reap(&self) -> Option<ExitStatus> {
        let mut state = self.lock();
        let status = state.child.as_mut()?.try_wait().ok().flatten()?;
        state.child = None;
        state.paused = false;
        Some(status)
    }

    /// SIGKILL (SIGCONT first if paused) without waiting for the exit, which is then no
    /// crash; [`Process::kill`] reaps it. A process that had already exited by itself is
    /// recorded as crashed.
    pub fn send_kill(&self) {
        let mut state = self.lock();
        let paused = state.paused;
        let Some(child) = state.child.as_mut() else {
            return;
        };
        if let Ok(Some(status)) = child.try_wait() {
            state.crashed.get_or_insert(status);
            return;
        }
        if paused {
            let _ = signal(child.id(), "CONT");
        }
        let _ = child.kill();
        state.killed = true;
    }

    /// SIGKILL (SIGCONT first if paused) and reap. A process that had already exited by
    /// itself is recorded as crashed (see [`Process::exit_status`]). Safe on a process that
    /// is not running.
    pub fn kill(&self) {
        let mut state = self.lock();
        let paused = state.paused;
        let killed = std::mem::take(&mut state.killed);
        if let Some(mut child) = state.child.take() {
            if let (false, Ok(Some(status))) = (killed, child.try_wait()) {
                state.crashed.get_or_insert(status);
            }
            if paused {
                // It may have exited meanwhile; SIGKILL settles it either way.
                let _ = signal(child.id(), "CONT");
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        state.paused = false;
    }

    /// SIGSTOP: the process stays alive but answers nothing, like a long GC pause. Returns
    /// once every thread has stopped: kill(2) returns before that, and each thread stops only
    /// when it next runs, which on a loaded machine can be long enough to answer a request.
    pub fn pause(&self) -> Result<(), String> {
        let mut state = self.lock();
        let pid = state.child.as_ref().map(Child::id).ok_or("not running")?;
        if state.paused {
            return Ok(());
        }
        signal(pid, "STOP")?;
        state.paused = true;
        let deadline = Instant::now() + STOP_WAIT;
        loop {
            let states = thread_states(pid);
            if states.is_empty() || states.contains(&'Z') {
                return Err(format!("process {pid} exited as it was paused"));
            }
            if states.iter().all(|state| *state == 'T') {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "process {pid} not stopped {STOP_WAIT:?} after SIGSTOP: threads {states:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// SIGCONT after [`Process::pause`].
    pub fn resume(&self) -> Result<(), String> {
        let mut state = self.lock();
        let pid = state.child.as_ref().map(Child::id).ok_or("not running")?;
        if state.paused {
            signal(pid, "CONT")?;
            state.paused = false;
        }
        Ok(())
    }

    /// Sends signal `name` (`TERM`, `HUP`, ...) to the running process.
    pub fn signal(&self, name: &str) -> Result<(), String> {
        let pid = self.pid().ok_or("not running")?;
        signal(pid, name)
    }

    /// The size of the log: where the next start's lines begin.
    pub fn log_len(&self) -> u64 {
        fs::metadata(&self.log_path).map_or(0, |meta| meta.len())
    }

    /// True when the log, from byte `from` on, contains `needle`.
    pub fn log_contains(&self, from: u64, needle: &str) -> bool {
        fs::read(&self.log_path).is_ok_and(|bytes| {
            let from = usize::try_from(from).unwrap_or(usize::MAX).min(bytes.len());
            find(&bytes[from..], needle.as_bytes()).is_some()
        })
    }

    /// The last `lines` lines of the log (from its last 64 KiB).
    pub fn log_tail(&self, lines: usize) -> Vec<String> {
        let Ok(bytes) = fs::read(&self.log_path) else {
            return vec![format!("(no log at {})", self.log_path.display())];
        };
        let start = bytes.len().saturating_sub(64 * 1024);
        let text = String::from_utf8_lossy(&bytes[start..]);
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..]
            .iter()
            .map(|line| (*line).to_owned())
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `kill -NAME pid`.
pub fn signal(pid: u32, name: &str) -> Result<(), String> {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status()
        .map_err(|error| format!("run `kill -{name} {pid}`: {error}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`kill -{name} {pid}` failed: {status}"))
    }
}

/// The scheduler state of each thread of process `pid` (`R`, `S`, `T`, ...; see proc(5)), read
/// from `/proc/PID/task/*/stat`; empty when the process is gone.
pub fn thread_states(pid: u32) -> Vec<char> {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(|task| fs::read_to_string(task.ok()?.path().join("stat")).ok())
        // The name in parentheses may hold anything; the state follows the last ')'.
        .filter_map(|stat| stat.rsplit_once(')')?.1.trim_start().chars().next())
        .collect()
}

/// Where `needle` first occurs in `haystack`.
pub fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_args_are_the_flags_batond_run_takes() {
        let args = RunArgs {
            id: 2,
            data_dir: PathBuf::from("/tmp/n2"),
            listen: "127.0.0.1:7420".to_owned(),
            peer_listen: "127.0.0.1:7421".to_owned(),
            initial_cluster: "2=127.0.0.1:7420@127.0.0.1:7421".to_owned(),
            heartbeat_ms: Some(50),
            election_timeout_ms: Some(300),
            tick_ms: None,
        }
        .to_args();
        let text: Vec<&str> = args.iter().map(|arg| arg.to_str().unwrap()).collect();
        assert_eq!(
            text,
            [
                "run",
                "--id",
                "2",
                "--data-dir",
                "/tmp/n2",
                "--listen",
                "127.0.0.1:7420",
                "--peer-listen",
                "127.0.0.1:7421",
                "--initial-cluster",
                "2=127.0.0.1:7420@127.0.0.1:7421",
                "--heartbeat-ms",
                "50",
                "--election-timeout-ms",
                "300"
            ]
        );
    }

    fn sleeper(dir: &Path) -> (Process, Command) {
        let process = Process::new(dir.join("sleep.log"));
        let mut command = Command::new("sh");
        command.args(["-c", "echo up; exec sleep 30"]);
        (process, command)
    }

    fn wait_until(mut condition: impl FnMut() -> bool) {
        for _ in 0..500 {
            if condition() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("condition not met within 5 s");
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("baton-kit-{name}-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn find_locates_a_line_anywhere_in_the_bytes() {
        let log = b"INFO serving\nINFO installing snapshot snapshot={1-2-3}\n";
        assert_eq!(find(log, b"installing snapshot"), Some(18));
        assert_eq!(find(log, b"snapshot installed"), None);
        assert_eq!(find(b"", b"x"), None);
        assert_eq!(find(b"abc", b""), Some(0));
    }

    #[test]
    fn a_killed_process_is_not_a_crash_and_restarts_append_to_the_log() {
        let dir = temp_dir("kill");
        let (process, command) = sleeper(&dir);
        process.start(command, "test").unwrap();
        wait_until(|| process.log_contains(0, "up"));
        assert!(process.is_running());
        process.pause().unwrap();
        assert!(process.is_paused());
        process.kill();
        assert!(!process.is_running() && !process.is_paused());
        assert_eq!(process.crashed(), None, "a kill is not a crash");

        let (_, command) = sleeper(&dir);
        let from = process.log_len();
        process.start(command, "test").unwrap();
        assert_eq!(process.starts(), 2);
        wait_until(|| process.log_contains(from, "up"));
        assert!(process
            .log_tail(10)
            .iter()
            .any(|line| line == "---- test: start #2 ----"));
        drop(process);
        fs::remove_dir_all(dir).unwrap();
    }

    /// Not a test of its own: with `BATON_KIT_SPIN` set it is the child of
    /// `pause_returns_once_every_thread_has_stopped`, a process of many busy threads, and spins
    /// until it is killed (60 s at most).
    #[test]
    fn spinning_child() {
        if std::env::var_os("BATON_KIT_SPIN").is_none() {
            return;
        }
        for _ in 0..SPINNERS {
            std::thread::spawn(|| {
                let until = Instant::now() + Duration::from_secs(60);
                while Instant::now() < until {
                    std::hint::spin_loop();
                }
            });
        }
        println!("every thread is busy");
        std::thread::sleep(Duration::from_secs(60));
    }

    const SPINNERS: usize = 32;

    /// kill(2) returns before a SIGSTOP has stopped the process: each thread stops itself when
    /// it next runs, which on a loaded machine is many milliseconds later, and until then it
    /// serves requests. `pause` returns only once no thread runs (a paused leader answered a
    /// read index in CI before this).
    #[test]
    fn pause_returns_once_every_thread_has_stopped() {
        let dir = temp_dir("spin");
        let process = Process::new(dir.join("spin.log"));
        for round in 0..5 {
            let mut command = Command::new(std::env::current_exe().unwrap());
            command
                .args([
                    "--exact",
                    "tests::spinning_child",
                    "--nocapture",
                    "--test-threads",
                    "1",
                ])
                .env("BATON_KIT_SPIN", "1");
            let from = process.log_len();
            process.start(command, "test").unwrap();
            wait_until(|| process.log_contains(from, "every thread is busy"));
            process.pause().unwrap();
            let states = thread_states(process.pid().unwrap());
            assert!(
                states.len() > SPINNERS,
                "round {round}: the child's threads: {states:?}"
            );
            assert!(
                states.iter().all(|state| *state == 'T'),
                "round {round}: pause returned with threads in states {states:?}"
            );
            process.kill();
        }
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_exit_by_itself_stays_recorded_across_the_kill_and_the_restart() {
        let dir = temp_dir("crash");
        let process = Process::new(dir.join("crash.log"));
        let mut command = Command::new("sh");
        command.args(["-c", "exit 3"]);
        process.start(command, "test").unwrap();
        wait_until(|| process.exit_status().is_some());
        process.kill();
        assert_eq!(process.exit_status(), None, "reaped");
        assert!(process.pause().is_err(), "nothing runs to pause");
        let (_, command) = sleeper(&dir);
        process.start(command, "test").unwrap();
        assert_eq!(process.crashed().and_then(|status| status.code()), Some(3));
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_terminated_process_is_reaped_with_its_status() {
        let dir = temp_dir("term");
        let (process, command) = sleeper(&dir);
        process.start(command, "test").unwrap();
        assert_eq!(process.try_reap(), None, "still running");
        process.signal("TERM").unwrap();
        let mut status = None;
        wait_until(|| {
            status = process.try_reap();
            status.is_some()
        });
        assert!(!status.unwrap().success());
        assert!(!process.is_running());
        assert_eq!(
            process.crashed(),
            None,
            "a terminated process did not crash"
        );
        fs::remove_dir_all(dir).unwrap();
    }
}
