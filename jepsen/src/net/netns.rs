//! The network-namespace backend of [`Net`]: one namespace per node, joined by veth pairs to a
//! bridge in the root namespace, faults as iptables DROP rules inside the nodes' namespaces.
//!
//! Layout, for a harness with pid `P` and a private subnet `10.213.X.0/24` no address or route
//! on this machine uses yet:
//!
//! - bridge `bjepP` in the root namespace, address `10.213.X.254/24`: the harness (clients,
//!   control calls) reaches every node through it;
//! - namespace `bjepP-nI` for node `I`, with `lo` up and `eth0` = `10.213.X.I/24`, the inside
//!   end of the veth pair whose outside end `bjepPvI` is a port of the bridge;
//! - `batond` runs as `ip netns exec bjepP-nI batond ...` (which execs, so the child's pid is
//!   batond's own) and listens on `10.213.X.I` for both its API ([`API_PORT`]) and its peers
//!   ([`PEER_PORT`]).
//!
//! A blocked link `from -> to` is the rule `-A INPUT -s <from> -j DROP` in `to`'s namespace:
//! packets that `from` sends to `to` are lost, silently (the sender sees timeouts). At the TCP
//! level a one-way cut also stalls the connections `to` opened to `from`, whose replies are
//! lost: the classic packet-level one-way partition. Every change replaces the whole filter
//! table of every node namespace at once (`iptables-restore`), so heal is a flush. The root
//! namespace's iptables are never touched, and the only addresses anything here names are the
//! ones set up here.
//!
//! Everything is torn down (namespaces, hence veths, then the bridge) by [`Net::shutdown`],
//! which the cluster guard calls after killing the nodes, and again by `Drop`. Names carry the
//! harness pid, so a leftover of a crashed run never collides with the next run, and setup
//! deletes leftovers whose pid is gone (and SIGKILLs the nodes a SIGKILLed harness orphaned
//! inside them: nothing but the harness creates `bjep<pid>-*` namespaces). Every command has a time limit.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::{mpsc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};

use super::{Link, Net};

/// The port of every node's API inside its namespace.
pub const API_PORT: u16 = 7001;
/// The port of every node's peer listener inside its namespace.
pub const PEER_PORT: u16 = 7002;
/// Every device and namespace name starts with this.
const PREFIX: &str = "bjep";
/// Second octet of the private subnets used.
const SUBNET_B: u8 = 213;
/// The bridge's host number in the subnet.
const BRIDGE_HOST: u8 = 254;
/// Time limit of one `ip` or `iptables` command.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// The names one run uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// The bridge in the root namespace.
    pub bridge: String,
    prefix: String,
}

impl Names {
    /// The names of the run of harness pid `pid`.
    pub fn new(pid: u32) -> Names {
        let prefix = format!("{PREFIX}{pid}");
        Names {
            bridge: prefix.clone(),
            prefix,
        }
    }

    /// Node `id`'s namespace.
    pub fn namespace(&self, id: u64) -> String {
        format!("{}-n{id}", self.prefix)
    }

    /// The root-namespace end of node `id`'s veth pair (a bridge port).
    pub fn veth(&self, id: u64) -> String {
        format!("{}v{id}", self.prefix)
    }

    /// The throwaway namespace of [`probe`].
    fn probe_namespace(&self) -> String {
        format!("{}-probe", self.prefix)
    }
}

/// Node `id`'s address in subnet `10.213.subnet.0/24`.
pub fn node_addr(subnet: u8, id: u64) -> Ipv4Addr {
    Ipv4Addr::new(10, SUBNET_B, subnet, u8::try_from(id).unwrap_or(0))
}

/// The bridge's address in subnet `10.213.subnet.0/24`.
pub fn bridge_addr(subnet: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, SUBNET_B, subnet, BRIDGE_HOST)
}

/// The `ip` commands that build the network for nodes `ids` (each a list of arguments).
pub fn setup_commands(names: &Names, subnet: u8, ids: &[u64]) -> Vec<Vec<String>> {
    let mut commands = vec![
        args(&["link", "add", &names.bridge, "type", "bridge"]),
        args(&[
            "addr",
            "add",
            &format!("{}/24", bridge_addr(subnet)),
            "dev",
            &names.bridge,
        ]),
        args(&["link", "set", &names.bridge, "up"]),
    ];
    for &id in ids {
        let namespace = names.namespace(id);
        let veth = names.veth(id);
        commands.extend([
            args(&["netns", "add", &namespace]),
            args(&["-n", &namespace, "link", "set", "lo", "up"]),
            args(&[
                "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &namespace,
            ]),
            args(&["link", "set", &veth, "master", &names.bridge]),
            args(&["link", "set", &veth, "up"]),
            args(&[
                "-n",
                &namespace,
                "addr",
                "add",
                &format!("{}/24", node_addr(subnet, id)),
                "dev",
                "eth0",
            ]),
            args(&["-n", &namespace, "link", "set", "eth0", "up"]),
        ]);
    }
    commands
}

/// The `ip` commands that remove everything [`setup_commands`] builds. Deleting a namespace
/// deletes the veth pair with an end in it; the explicit veth delete covers a namespace that
/// lingers (a process still inside).
pub fn teardown_commands(names: &Names, ids: &[u64]) -> Vec<Vec<String>> {
    let mut commands = Vec::new();
    for &id in ids {
        commands.push(args(&["netns", "del", &names.namespace(id)]));
        commands.push(args(&["link", "del", &names.veth(id)]));
    }
    commands.push(args(&["link", "del", &names.bridge]));
    commands
}

/// The DROP rules of each node's namespace that block exactly `links` (nodes `ids`).
pub fn input_rules(subnet: u8, ids: &[u64], links: &BTreeSet<Link>) -> BTreeMap<u64, Vec<String>> {
    ids.iter()
        .map(|&to| {
            let rules = links
                .iter()
                .filter(|&&(from, into)| into == to && from != to && ids.contains(&from))
                .map(|&(from, _)| format!("-A INPUT -s {}/32 -j DROP", node_addr(subnet, from)))
                .collect();
            (to, rules)
        })
        .collect()
}

/// The `iptables-restore` input that makes a namespace's filter table exactly `rules`.
pub fn restore_script(rules: &[String]) -> String {
    let mut script =
        String::from("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n");
    for rule in rules {
        script.push_str(rule);
        script.push('\n');
    }
    script.push_str("COMMIT\n");
    script
}

/// A subnet octet `X` such that nothing in `ip -4 addr` / `ip -4 route` output `in_use`
/// mentions `10.213.X.`: the first free one from a start derived from `pid`.
pub fn pick_subnet(pid: u32, in_use: &str) -> Option<u8> {
    let start = pid % 250;
    (0..250u32)
        .map(|step| u8::try_from((start + step) % 250).unwrap_or(0) + 1)
        .find(|&octet| !in_use.contains(&format!("10.{SUBNET_B}.{octet}.")))
}

/// The pids of the runs that left namespaces (`ip netns list`) or devices (`ip -o link`)
/// behind and whose process `alive` says is gone, with the names to delete.
pub fn stale(
    netns_list: &str,
    link_list: &str,
    alive: impl Fn(u32) -> bool,
) -> (Vec<String>, Vec<String>) {
    let mut namespaces = Vec::new();
    for line in netns_list.lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        if let Some(pid) = owner(name, &['-']) {
            if !alive(pid) {
                namespaces.push(name.to_owned());
            }
        }
    }
    let mut links = Vec::new();
    for line in link_list.lines() {
        // "7: bjep123v1@if2: <BROADCAST,...": the name sits between the first ": " and ':'/'@'.
        let Some(rest) = line.split_once(": ").map(|(_, rest)| rest) else {
            continue;
        };
        let name = rest.split([':', '@']).next().unwrap_or_default();
        if let Some(pid) = owner(name, &['v']) {
            if !alive(pid) && !links.contains(&name.to_owned()) {
                links.push(name.to_owned());
            }
        }
    }
    (namespaces, links)
}

/// The pid in a name of ours: `bjep<pid>` alone, or followed by one of `separators` and more.
fn owner(name: &str, separators: &[char]) -> Option<u32> {
    let rest = name.strip_prefix(PREFIX)?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let tail = &rest[digits.len()..];
    let pid: u32 = digits.parse().ok()?;
    if tail.is_empty() || tail.starts_with(separators) {
        Some(pid)
    } else {
        None
    }
}

/// Whether namespaces can be used here: root, `ip` and `iptables` run, and a throwaway
/// namespace takes a DROP rule through `iptables-restore` (then is deleted).
pub fn probe() -> anyhow::Result<()> {
    if effective_uid()? != 0 {
        bail!("not root");
    }
    run("ip", &["-V"], None).context("`ip` does not run")?;
    run("iptables", &["--version"], None).context("`iptables` does not run")?;
    let names = Names::new(std::process::id());
    let namespace = names.probe_namespace();
    run("ip", &["netns", "add", &namespace], None)?;
    let rule = format!(
        "-A INPUT -s {}/32 -j DROP",
        node_addr(pick_subnet(std::process::id(), "").unwrap_or(1), 1)
    );
    let tried = (|| {
        in_namespace(
            &namespace,
            "iptables-restore",
            &["-w", "5"],
            Some(&restore_script(std::slice::from_ref(&rule))),
        )?;
        let listed = in_namespace(&namespace, "iptables", &["-w", "5", "-S", "INPUT"], None)?;
        if !String::from_utf8_lossy(&listed.stdout).contains(&rule) {
            bail!("the probe rule did not show in `iptables -S`");
        }
        Ok(())
    })();
    let deleted = run("ip", &["netns", "del", &namespace], None);
    tried?;
    deleted?;
    Ok(())
}

/// The namespace network of one run.
pub struct NetnsNet {
    names: Names,
    subnet: u8,
    ids: Vec<u64>,
    blocked: Mutex<BTreeSet<Link>>,
    /// True once torn down.
    down: Mutex<bool>,
}

impl fmt::Debug for NetnsNet {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("NetnsNet")
            .field("names", &self.names)
            .field("subnet", &self.subnet)
            .field("blocked", &self.blocked())
            .finish()
    }
}

impl NetnsNet {
    /// Deletes stale leftovers, then builds the bridge, namespaces and veths for nodes `ids`
    /// and checks every namespace reaches the bridge. On failure, removes what it built.
    pub fn setup(ids: &[u64]) -> anyhow::Result<NetnsNet> {
        if ids.iter().any(|&id| !(1..=250).contains(&id)) {
            bail!("node ids must be 1..=250 for the namespace network");
        }
        if effective_uid()? != 0 {
            bail!("the namespace network needs root");
        }
        remove_stale();
        let pid = std::process::id();
        let in_use = format!(
            "{}\n{}",
            String::from_utf8_lossy(&run("ip", &["-4", "-o", "addr", "show"], None)?.stdout),
            String::from_utf8_lossy(
                &run("ip", &["-4", "route", "show", "table", "all"], None)?.stdout
            )
        );
        let subnet = pick_subnet(pid, &in_use).context("no free 10.213.X.0/24 subnet")?;
        let net = NetnsNet {
            names: Names::new(pid),
            subnet,
            ids: ids.to_vec(),
            blocked: Mutex::new(BTreeSet::new()),
            down: Mutex::new(false),
        };
        // From here on, dropping `net` on an error removes whatever was built.
        for command in setup_commands(&net.names, subnet, ids) {
            let command: Vec<&str> = command.iter().map(String::as_str).collect();
            run("ip", &command, None)?;
        }
        net.apply(&BTreeSet::new())?;
        net.check_reachable()?;
        Ok(net)
    }

    /// Every namespace can open a TCP connection to a listener on the bridge address.
    fn check_reachable(&self) -> anyhow::Result<()> {
        let listener = std::net::TcpListener::bind((bridge_addr(self.subnet), 0))
            .context("bind on the bridge address")?;
        let port = listener.local_addr()?.port();
        for &id in &self.ids {
            let script = format!("exec 3<>/dev/tcp/{}/{port}", bridge_addr(self.subnet));
            in_namespace(
                &self.names.namespace(id),
                "timeout",
                &["3", "bash", "-c", &script],
                None,
            )
            .with_context(|| format!("namespace of node {id} cannot reach the bridge"))?;
        }
        Ok(())
    }

    /// Makes every node namespace's filter table block exactly `links`, all at once.
    fn apply(&self, links: &BTreeSet<Link>) -> anyhow::Result<()> {
        let rules = input_rules(self.subnet, &self.ids, links);
        let handles: Vec<_> = rules
            .into_iter()
            .map(|(id, rules)| {
                let namespace = self.names.namespace(id);
                std::thread::spawn(move || {
                    in_namespace(
                        &namespace,
                        "iptables-restore",
                        &["-w", "5"],
                        Some(&restore_script(&rules)),
                    )
                })
            })
            .collect();
        let mut failure = None;
        for handle in handles {
            match handle.join() {
                Ok(Ok(_)) => {}
                Ok(Err(error)) => failure = Some(error),
                Err(_) => failure = Some(anyhow::anyhow!("iptables thread panicked")),
            }
        }
        match failure {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    fn teardown(&self) {
        let mut down = self
            .down
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if *down {
            return;
        }
        *down = true;
        for command in teardown_commands(&self.names, &self.ids) {
            let command: Vec<&str> = command.iter().map(String::as_str).collect();
            let _ = run("ip", &command, None);
        }
    }
}

impl Net for NetnsNet {
    fn name(&self) -> &'static str {
        "netns-iptables"
    }

    fn set_blocked(&self, links: &BTreeSet<Link>) {
        if *self
            .down
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
        {
            return;
        }
        match self.apply(links) {
            Ok(()) => {
                *self
                    .blocked
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) = links.clone();
            }
            Err(error) => eprintln!("baton-jepsen: netns: setting the blocked links: {error:#}"),
        }
    }

    fn blocked(&self) -> BTreeSet<Link> {
        self.blocked
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    fn api_addr(&self, id: u64) -> SocketAddr {
        SocketAddr::from((node_addr(self.subnet, id), API_PORT))
    }

    fn peer_listen_addr(&self, id: u64) -> SocketAddr {
        SocketAddr::from((node_addr(self.subnet, id), PEER_PORT))
    }

    fn advertised_api_addr(&self, id: u64) -> String {
        self.api_addr(id).to_string()
    }

    fn advertised_peer_addr(&self, id: u64) -> String {
        self.peer_listen_addr(id).to_string()
    }

    fn unidentified_connections(&self) -> u64 {
        0
    }

    fn command(&self, id: u64, program: &Path) -> Command {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec"])
            .arg(self.names.namespace(id))
            .arg(program);
        command
    }

    fn shutdown(&self) {
        self.heal();
        self.teardown();
    }
}

impl Drop for NetnsNet {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// Deletes namespaces (killing the orphaned nodes still inside) and devices of earlier runs
/// whose harness process is gone.
fn remove_stale() {
    let netns_list = run("ip", &["netns", "list"], None)
        .map(|output| String::from_utf8_lossy(&output.stdout).into_owned())
        .unwrap_or_default();
    let link_list = run("ip", &["-o", "link", "show"], None)
        .map(|output| String::from_utf8_lossy(&output.stdout).into_owned())
        .unwrap_or_default();
    let (namespaces, links) = stale(&netns_list, &link_list, |pid| {
        Path::new(&format!("/proc/{pid}")).exists()
    });
    for namespace in namespaces {
        eprintln!("baton-jepsen: netns: removing leftover namespace {namespace}");
        // Processes still inside are nodes orphaned when their harness was SIGKILLed.
        let inside = run("ip", &["netns", "pids", &namespace], None)
            .map(|output| String::from_utf8_lossy(&output.stdout).into_owned())
            .unwrap_or_default();
        for pid in inside
            .split_whitespace()
            .filter_map(|pid| pid.parse::<u32>().ok())
        {
            eprintln!("baton-jepsen: netns: killing orphaned process {pid} in {namespace}");
            let _ = run("kill", &["-KILL", &pid.to_string()], None);
        }
        let _ = run("ip", &["netns", "del", &namespace], None);
    }
    for link in links {
        eprintln!("baton-jepsen: netns: removing leftover device {link}");
        let _ = run("ip", &["link", "del", &link], None);
    }
}

/// The effective uid, from `/proc/self/status`.
fn effective_uid() -> anyhow::Result<u32> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|uids| uids.split_whitespace().nth(1))
        .and_then(|euid| euid.parse().ok())
        .context("no Uid line in /proc/self/status")
}

fn args(items: &[&str]) -> Vec<String> {
    items.iter().map(|item| (*item).to_owned()).collect()
}

/// Runs `program args` inside `namespace`.
fn in_namespace(
    namespace: &str,
    program: &str,
    arguments: &[&str],
    input: Option<&str>,
) -> anyhow::Result<Output> {
    let mut all = vec!["netns", "exec", namespace, program];
    all.extend_from_slice(arguments);
    run("ip", &all, input)
}

/// Runs a command to completion within [`COMMAND_TIMEOUT`] (killed past it), feeding it
/// `input`; fails unless it exits 0.
fn run(program: &str, arguments: &[&str], input: Option<&str>) -> anyhow::Result<Output> {
    let shown = format!("{program} {}", arguments.join(" "));
    let mut child = Command::new(program)
        .args(arguments)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("spawn `{shown}`"))?;
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin.write_all(input.as_bytes())?;
    }
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let (done, finished) = mpsc::channel();
    let readers = std::thread::spawn(move || {
        let mut out = Vec::new();
        let mut err = Vec::new();
        if let Some(stdout) = stdout.as_mut() {
            let _ = stdout.read_to_end(&mut out);
        }
        if let Some(stderr) = stderr.as_mut() {
            let _ = stderr.read_to_end(&mut err);
        }
        let _ = done.send(());
        (out, err)
    });
    let deadline = std::time::Instant::now() + COMMAND_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("`{shown}` took longer than {COMMAND_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    // The pipes close when the child exits (unless it left a descendant holding them).
    let (stdout, stderr) = if finished.recv_timeout(Duration::from_secs(1)).is_ok() {
        readers.join().unwrap_or_default()
    } else {
        (Vec::new(), Vec::new())
    };
    if !status.success() {
        bail!(
            "`{shown}`: {status}: {}",
            String::from_utf8_lossy(&stderr).trim()
        );
    }
    Ok(Output {
        status,
        stdout,
        stderr,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::cut_between;

    const IDS: [u64; 3] = [1, 2, 3];

    fn rules(links: &BTreeSet<Link>) -> BTreeMap<u64, Vec<String>> {
        input_rules(7, &IDS, links)
    }

    #[test]
    fn names_are_unique_per_pid_and_fit_interface_names() {
        let names = Names::new(4_194_304); // the largest pid_max
        assert_eq!(names.bridge, "bjep4194304");
        assert_eq!(names.veth(3), "bjep4194304v3");
        assert_eq!(names.namespace(3), "bjep4194304-n3");
        assert!(names.bridge.len() <= 15 && names.veth(250).len() <= 15);
        assert_ne!(Names::new(1), Names::new(11));
    }

    #[test]
    fn isolating_a_node_drops_both_ways_in_every_namespace() {
        let by_node = rules(&cut_between(&[2], &IDS));
        assert_eq!(
            by_node[&2],
            vec![
                "-A INPUT -s 10.213.7.1/32 -j DROP".to_owned(),
                "-A INPUT -s 10.213.7.3/32 -j DROP".to_owned()
            ]
        );
        assert_eq!(
            by_node[&1],
            vec!["-A INPUT -s 10.213.7.2/32 -j DROP".to_owned()]
        );
        assert_eq!(
            by_node[&3],
            vec!["-A INPUT -s 10.213.7.2/32 -j DROP".to_owned()]
        );
    }

    #[test]
    fn a_majority_minority_split_keeps_the_majority_connected() {
        let by_node = rules(&cut_between(&[1, 3], &IDS));
        // 1 and 3 still hear each other; both drop 2; 2 drops both.
        assert_eq!(
            by_node[&1],
            vec!["-A INPUT -s 10.213.7.2/32 -j DROP".to_owned()]
        );
        assert_eq!(
            by_node[&3],
            vec!["-A INPUT -s 10.213.7.2/32 -j DROP".to_owned()]
        );
        assert_eq!(by_node[&2].len(), 2);
    }

    #[test]
    fn a_one_way_cut_drops_only_at_the_receivers() {
        // Node 1 cannot send to 2 and 3, but hears them.
        let by_node = rules(&BTreeSet::from([(1, 2), (1, 3)]));
        assert!(by_node[&1].is_empty());
        assert_eq!(
            by_node[&2],
            vec!["-A INPUT -s 10.213.7.1/32 -j DROP".to_owned()]
        );
        assert_eq!(
            by_node[&3],
            vec!["-A INPUT -s 10.213.7.1/32 -j DROP".to_owned()]
        );
    }

    #[test]
    fn a_bridge_cuts_only_the_two_ends() {
        let by_node = rules(&BTreeSet::from([(1, 3), (3, 1)]));
        assert!(by_node[&2].is_empty());
        assert_eq!(
            by_node[&1],
            vec!["-A INPUT -s 10.213.7.3/32 -j DROP".to_owned()]
        );
        assert_eq!(
            by_node[&3],
            vec!["-A INPUT -s 10.213.7.1/32 -j DROP".to_owned()]
        );
    }

    #[test]
    fn heal_flushes_every_namespace_and_foreign_links_are_ignored() {
        let by_node = rules(&BTreeSet::new());
        assert_eq!(by_node.len(), 3);
        assert!(by_node.values().all(Vec::is_empty));
        // Links naming a node outside the cluster, or a node to itself, name no address.
        let by_node = rules(&BTreeSet::from([(9, 1), (1, 1)]));
        assert!(by_node.values().all(Vec::is_empty));
        let script = restore_script(&[]);
        assert!(script.starts_with("*filter\n:INPUT ACCEPT"));
        assert!(script.ends_with("COMMIT\n"));
        assert!(!script.contains("-A "));
        let script = restore_script(&["-A INPUT -s 10.213.7.1/32 -j DROP".to_owned()]);
        assert!(script.contains("\n-A INPUT -s 10.213.7.1/32 -j DROP\nCOMMIT\n"));
    }

    #[test]
    fn setup_builds_and_teardown_removes_only_our_names() {
        let names = Names::new(42);
        let setup = setup_commands(&names, 9, &IDS);
        let joined: Vec<String> = setup.iter().map(|command| command.join(" ")).collect();
        assert!(joined.contains(&"link add bjep42 type bridge".to_owned()));
        assert!(joined.contains(&"addr add 10.213.9.254/24 dev bjep42".to_owned()));
        assert!(joined.contains(&"netns add bjep42-n2".to_owned()));
        assert!(joined
            .contains(&"link add bjep42v2 type veth peer name eth0 netns bjep42-n2".to_owned()));
        assert!(joined.contains(&"-n bjep42-n2 addr add 10.213.9.2/24 dev eth0".to_owned()));
        assert!(joined.contains(&"-n bjep42-n3 link set lo up".to_owned()));
        let teardown: Vec<String> = teardown_commands(&names, &IDS)
            .iter()
            .map(|command| command.join(" "))
            .collect();
        assert!(teardown.contains(&"netns del bjep42-n1".to_owned()));
        assert_eq!(teardown.last().unwrap(), "link del bjep42");
        for command in &teardown {
            assert!(command
                .split(' ')
                .next_back()
                .unwrap()
                .starts_with("bjep42"));
        }
    }

    #[test]
    fn subnets_in_use_are_skipped() {
        assert_eq!(pick_subnet(0, ""), Some(1));
        assert_eq!(pick_subnet(0, "inet 10.213.1.254/24 brd"), Some(2));
        assert_eq!(pick_subnet(249, ""), Some(250));
        assert_eq!(pick_subnet(249, "10.213.250.0/24 dev x"), Some(1));
        let all: String = (1..=250)
            .map(|octet| format!("10.213.{octet}.0/24\n"))
            .collect();
        assert_eq!(pick_subnet(5, &all), None);
    }

    #[test]
    fn only_leftovers_of_dead_runs_are_stale() {
        let netns = "bjep100-n1 (id: 3)\nbjep100-n2\nbjep200-n1 (id: 4)\nbjep100x\nbjeptest\nother\nbjep300-probe\n";
        let links = "1: lo: <LOOPBACK,UP>\n5: bjep100: <BROADCAST>\n6: bjep100v1@if2: <BROADCAST>\n7: bjep200v1@if2: <UP>\n8: bjep1000extra: <UP>\n9: eth0: <UP>\n";
        let (namespaces, devices) = stale(netns, links, |pid| pid == 200);
        assert_eq!(
            namespaces,
            vec!["bjep100-n1", "bjep100-n2", "bjep300-probe"]
        );
        assert_eq!(devices, vec!["bjep100", "bjep100v1"]);
    }
}
