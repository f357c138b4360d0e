//! `batond`'s command line (docs/cli.md): `batond dev` and `batond run`, every flag also read
//! from `BATON_<FLAG>`. Parsing ends here: the rest of the node takes a `NodeConfig`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context};
use baton_raft_store::store::Member;
use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(name = "batond", version, about = "The Baton lease server")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Mode,
}

#[derive(Debug, Subcommand)]
pub enum Mode {
    /// A one-node cluster that initializes itself on first start and resumes from its data dir.
    Dev {
        #[arg(long, env = "BATON_DATA_DIR", default_value = "./baton-data")]
        data_dir: PathBuf,
        #[arg(long, env = "BATON_LISTEN", default_value = "127.0.0.1:7420")]
        listen: SocketAddr,
        #[arg(long, env = "BATON_PEER_LISTEN", default_value = "127.0.0.1:7421")]
        peer_listen: SocketAddr,
        #[command(flatten)]
        access: Access,
        #[command(flatten)]
        tuning: Tuning,
    },
    /// One member of a replicated cluster.
    Run {
        /// This node's id: a positive integer, unique in the cluster.
        #[arg(long, env = "BATON_ID")]
        id: u64,
        #[arg(long, env = "BATON_DATA_DIR")]
        data_dir: PathBuf,
        /// Client HTTP API address.
        #[arg(long, env = "BATON_LISTEN")]
        listen: SocketAddr,
        /// Raft peer RPC address.
        #[arg(long, env = "BATON_PEER_LISTEN")]
        peer_listen: SocketAddr,
        /// `1=API@PEER,2=API@PEER,...`; used only when the data dir is empty.
        #[arg(long, env = "BATON_INITIAL_CLUSTER")]
        initial_cluster: Option<String>,
        #[command(flatten)]
        access: Access,
        #[command(flatten)]
        tuning: Tuning,
    },
    /// Seeds the data dir of one member of a new cluster from a backup (`baton snapshot save`),
    /// then exits; run it on every member with the same file and --initial-cluster, then start
    /// them with `batond run`. Fences granted after it are above every fence of the old cluster.
    Restore(Restore),
    /// When a majority is lost for good: makes this stopped member's data dir a one-member
    /// cluster holding everything in its log, then exits. Start it with `batond run` and add
    /// new members with `baton cluster add`. The old dir is kept beside it.
    Recover(Recover),
}

/// `batond recover`: a stopped survivor's data dir made a one-member cluster.
#[derive(Debug, Args)]
pub struct Recover {
    /// The survivor's id (its `--id`).
    #[arg(long, env = "BATON_ID")]
    pub id: u64,
    /// The survivor's data dir. Its node must be stopped.
    #[arg(long, env = "BATON_DATA_DIR")]
    pub data_dir: PathBuf,
}

/// `batond restore`: seeds a new cluster member's data dir from a backup file and exits.
#[derive(Debug, Args)]
pub struct Restore {
    /// The backup file (`baton snapshot save`).
    pub file: PathBuf,
    /// The new member's id, as it will be given to `batond run`.
    #[arg(long, env = "BATON_ID")]
    pub id: u64,
    /// The new member's data dir: absent or empty.
    #[arg(long, env = "BATON_DATA_DIR")]
    pub data_dir: PathBuf,
    /// The new cluster, `1=API@PEER,2=API@PEER,...`: the same on every member.
    #[arg(long, env = "BATON_INITIAL_CLUSTER")]
    pub initial_cluster: String,
}

/// Who may reach the node: the flags `batond dev` and `batond run` share.
#[derive(Debug, Clone, Args)]
pub struct Access {
    /// Require a token on every client request but /healthz and /readyz (docs/security.md).
    /// The first admin token comes from `BATON_BOOTSTRAP_TOKEN`. The peer port must then be
    /// authenticated too (--cluster-secret or peer TLS).
    #[arg(long, env = "BATON_AUTH")]
    pub auth: bool,
    /// Serve a non-loopback --listen without --auth, or a non-loopback --peer-listen without
    /// --cluster-secret or peer TLS: only on a network nobody else can reach.
    #[arg(long, env = "BATON_INSECURE")]
    pub insecure: bool,
}

/// The environment variable holding the bootstrap admin secret (never a flag: a flag shows in
/// the process list).
pub const BOOTSTRAP_TOKEN_ENV: &str = "BATON_BOOTSTRAP_TOKEN";
/// A token secret's length bounds, in bytes of printable ASCII.
pub const SECRET_BYTES_MIN: usize = 16;
pub const SECRET_BYTES_MAX: usize = 256;

/// Whether `secret` can be a token secret: 16..=256 printable ASCII characters, no spaces.
pub fn check_secret(secret: &str) -> Result<(), String> {
    if secret.len() < SECRET_BYTES_MIN || secret.len() > SECRET_BYTES_MAX {
        return Err(format!(
            "a token secret must be {SECRET_BYTES_MIN}..={SECRET_BYTES_MAX} characters, got {}",
            secret.len()
        ));
    }
    if !secret.bytes().all(|byte| byte.is_ascii_graphic()) {
        return Err("a token secret may only hold printable ASCII without spaces".to_owned());
    }
    Ok(())
}

#[derive(Debug, Clone, Args)]
pub struct Tuning {
    /// Shared secret that authenticates peer RPC; unset means unauthenticated.
    #[arg(long, env = "BATON_CLUSTER_SECRET", hide_env_values = true)]
    pub cluster_secret: Option<String>,
    /// Serve the client API over HTTPS with this certificate chain (PEM).
    #[arg(long, env = "BATON_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "BATON_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Mutual TLS between peers: this node's certificate chain (PEM), signed by --peer-ca.
    #[arg(long, env = "BATON_PEER_TLS_CERT", requires_all = ["peer_tls_key", "peer_ca"])]
    pub peer_tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --peer-tls-cert.
    #[arg(long, env = "BATON_PEER_TLS_KEY", requires = "peer_tls_cert")]
    pub peer_tls_key: Option<PathBuf>,
    /// The CA (PEM) every peer's certificate must be signed by; also trusted when a follower
    /// forwards to the leader's HTTPS client API.
    #[arg(long, env = "BATON_PEER_CA", requires = "peer_tls_cert")]
    pub peer_ca: Option<PathBuf>,
    #[arg(long, env = "BATON_HEARTBEAT_MS", default_value_t = 50)]
    pub heartbeat_ms: u64,
    /// Minimum election timeout; the maximum is one and a half times this.
    #[arg(long, env = "BATON_ELECTION_TIMEOUT_MS", default_value_t = 150)]
    pub election_timeout_ms: u64,
    /// How often an idle leader commits a tick so cluster time keeps pace.
    #[arg(long, env = "BATON_TICK_MS", default_value_t = 250)]
    pub tick_ms: u64,
    /// How often the leader sweeps expired leases (in bounded batches).
    #[arg(long, env = "BATON_SWEEP_MS", default_value_t = 1_000)]
    pub sweep_ms: u64,
    /// Take a snapshot after this many log entries; older entries are then purged.
    #[arg(long, env = "BATON_SNAPSHOT_LOG_ENTRIES", default_value_t = 10_000)]
    pub snapshot_log_entries: u64,
    /// Most event streams (`Accept: text/event-stream`) open on this node at once; past it, a
    /// new stream is refused with 429 RESOURCE_EXHAUSTED.
    #[arg(long, env = "BATON_EVENT_STREAMS_MAX", default_value_t = 1_024)]
    pub event_streams_max: usize,
    /// With --auth, most event streams one token may have open on this node at once; past
    /// it, that token's new stream is refused with 429 RESOURCE_EXHAUSTED.
    #[arg(long, env = "BATON_EVENT_STREAMS_PER_TOKEN_MAX", default_value_t = 64)]
    pub event_streams_per_token_max: usize,
    /// Most connections open at once on each of the client and peer ports; at the cap a new
    /// connection takes the place of the oldest idle one. 0: what the open-file limit
    /// leaves (its soft limit raised to the hard one) after 128 for the store.
    #[arg(long, env = "BATON_CONNECTIONS_MAX", default_value_t = 0)]
    pub connections_max: usize,
    /// The longest a connection may take to send a whole request head (after its TLS
    /// handshake), and a request its whole body.
    #[arg(
        long,
        env = "BATON_REQUEST_HEADER_TIMEOUT_MS",
        default_value_t = 10_000
    )]
    pub request_header_timeout_ms: u64,
    /// The longest a keep-alive connection may idle between requests.
    #[arg(long, env = "BATON_IDLE_TIMEOUT_MS", default_value_t = 60_000)]
    pub idle_timeout_ms: u64,
    /// Most commands grouped into one log entry (group commit); 1 turns grouping off.
    #[arg(long, env = "BATON_GROUP_COMMIT_MAX", default_value_t = 1_024)]
    pub group_commit_max: usize,
    #[arg(long, env = "BATON_LOG_FORMAT", value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
    /// Test only: allow `POST /v1/debug/clock` to change this node's clock rate and offset.
    #[arg(long, env = "BATON_CLOCK_CONTROL", default_value_t = false)]
    pub clock_control: bool,
}

impl Tuning {
    /// The client API's certificate and key, with --tls-cert.
    pub fn api_tls(&self) -> Option<crate::tls::Identity> {
        Some(crate::tls::Identity {
            cert: self.tls_cert.clone()?,
            key: self.tls_key.clone()?,
        })
    }

    /// This node's peer certificate and key and the peer CA, with --peer-tls-cert.
    pub fn peer_tls(&self) -> Option<(crate::tls::Identity, PathBuf)> {
        Some((
            crate::tls::Identity {
                cert: self.peer_tls_cert.clone()?,
                key: self.peer_tls_key.clone()?,
            },
            self.peer_ca.clone()?,
        ))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

/// Everything a node needs to start, validated.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub id: u64,
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub peer_listen: SocketAddr,
    /// The members to bootstrap with when the data dir is empty; `None` joins an existing
    /// cluster (it must be added through the membership API).
    pub initial_cluster: Option<BTreeMap<u64, Member>>,
    /// `--auth`: every client request but the health checks needs a token.
    pub auth: bool,
    /// `BATON_BOOTSTRAP_TOKEN`, checked: the secret of the `bootstrap` admin token this node
    /// proposes until the cluster has one (with `--auth` only).
    pub bootstrap_token: Option<String>,
    pub tuning: Tuning,
}

impl NodeConfig {
    pub fn from_mode(mode: Mode) -> anyhow::Result<NodeConfig> {
        let config = match mode {
            Mode::Dev {
                data_dir,
                listen,
                peer_listen,
                access,
                mut tuning,
            } => {
                // A one-member cluster never calls a peer, so with --auth its peer port can
                // take a secret nobody knows: the port then refuses every request.
                if access.auth && tuning.cluster_secret.is_none() && tuning.peer_tls().is_none() {
                    tuning.cluster_secret = Some(format!("{:032x}", rand::random::<u128>()));
                }
                check_access(listen, peer_listen, &access, &tuning)?;
                let me = Member {
                    api_addr: listen.to_string(),
                    peer_addr: peer_listen.to_string(),
                };
                NodeConfig {
                    id: 1,
                    data_dir,
                    listen,
                    peer_listen,
                    initial_cluster: Some(BTreeMap::from([(1, me)])),
                    auth: access.auth,
                    bootstrap_token: bootstrap_token(access.auth)?,
                    tuning,
                }
            }
            Mode::Run {
                id,
                data_dir,
                listen,
                peer_listen,
                initial_cluster,
                access,
                tuning,
            } => {
                check_access(listen, peer_listen, &access, &tuning)?;
                NodeConfig {
                    id,
                    data_dir,
                    listen,
                    peer_listen,
                    initial_cluster: initial_cluster
                        .as_deref()
                        .map(parse_initial_cluster)
                        .transpose()?,
                    auth: access.auth,
                    bootstrap_token: bootstrap_token(access.auth)?,
                    tuning,
                }
            }
            Mode::Restore(_) | Mode::Recover(_) => {
                bail!("`batond restore` and `batond recover` write a data dir and serve nothing")
            }
        };
        if config.id == 0 {
            bail!("--id must be a positive integer");
        }
        if let Some(members) = &config.initial_cluster {
            if !members.contains_key(&config.id) {
                bail!("--initial-cluster must list this node's --id {}", config.id);
            }
        }
        let tuning = &config.tuning;
        if tuning.heartbeat_ms == 0 || tuning.election_timeout_ms <= tuning.heartbeat_ms * 2 {
            bail!(
                "--election-timeout-ms must be more than twice --heartbeat-ms (and both positive)"
            );
        }
        if tuning.tick_ms == 0
            || tuning.sweep_ms == 0
            || tuning.snapshot_log_entries == 0
            || tuning.group_commit_max == 0
            || tuning.event_streams_max == 0
            || tuning.event_streams_per_token_max == 0
            || tuning.request_header_timeout_ms == 0
            || tuning.idle_timeout_ms == 0
        {
            bail!("--tick-ms, --sweep-ms, --snapshot-log-entries, --group-commit-max, --event-streams-max, --event-streams-per-token-max, --request-header-timeout-ms and --idle-timeout-ms must be positive");
        }
        Ok(config)
    }
}

/// `BATON_BOOTSTRAP_TOKEN`, checked, when access control is on.
fn bootstrap_token(auth: bool) -> anyhow::Result<Option<String>> {
    match std::env::var(BOOTSTRAP_TOKEN_ENV) {
        Ok(secret) if auth => {
            check_secret(&secret)
                .map_err(|problem| anyhow::anyhow!("{BOOTSTRAP_TOKEN_ENV}: {problem}"))?;
            Ok(Some(secret))
        }
        _ => Ok(None),
    }
}

/// Refuses to serve anyone who can reach the node without a check on who they are.
///
/// - With `--auth`, the peer port must be authenticated (a `--cluster-secret` or peer TLS),
///   whatever its address and even with `--insecure`: the peer port carries the log, the
///   votes and the write relay, so an open one would let anyone who reaches it (any local
///   user, on loopback) mint an admin token or depose the leader, and `--auth` would protect
///   nothing.
/// - Without `--insecure`, a non-loopback client address needs `--auth`, and a non-loopback
///   peer address a `--cluster-secret` or peer TLS.
fn check_access(
    listen: SocketAddr,
    peer_listen: SocketAddr,
    access: &Access,
    tuning: &Tuning,
) -> anyhow::Result<()> {
    let peers_checked = tuning.cluster_secret.is_some() || tuning.peer_tls().is_some();
    if access.auth && !peers_checked {
        bail!(
            "--auth protects the client API, but the peer port {peer_listen} is not \
             authenticated: anyone who reaches it could write to the log or depose the leader. \
             Give every node the same --cluster-secret (BATON_CLUSTER_SECRET) or peer TLS \
             (--peer-tls-cert, --peer-tls-key, --peer-ca)"
        );
    }
    if access.insecure {
        return Ok(());
    }
    if !listen.ip().is_loopback() && !access.auth {
        bail!(
            "--listen {listen} is reachable from other hosts but --auth is off: start with \
             --auth (and {BOOTSTRAP_TOKEN_ENV} for the first admin token), listen on 127.0.0.1, \
             or pass --insecure on a private network"
        );
    }
    if !peer_listen.ip().is_loopback() && !peers_checked {
        bail!(
            "--peer-listen {peer_listen} is reachable from other hosts but peers are not \
             authenticated: give every node peer TLS (--peer-tls-cert, --peer-tls-key, \
             --peer-ca) or the same --cluster-secret (BATON_CLUSTER_SECRET), or pass \
             --insecure on a private network"
        );
    }
    Ok(())
}

/// Parses `1=127.0.0.1:7420@127.0.0.1:7421,2=...`.
pub fn parse_initial_cluster(text: &str) -> anyhow::Result<BTreeMap<u64, Member>> {
    let mut members = BTreeMap::new();
    for item in text
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
    {
        let (id, addresses) = item
            .split_once('=')
            .with_context(|| format!("--initial-cluster member {item:?} is not id=api@peer"))?;
        let (api_addr, peer_addr) = addresses
            .split_once('@')
            .with_context(|| format!("--initial-cluster member {item:?} is not id=api@peer"))?;
        let id: u64 = id
            .parse()
            .with_context(|| format!("--initial-cluster id {id:?} is not a number"))?;
        for address in [api_addr, peer_addr] {
            address.parse::<SocketAddr>().with_context(|| {
                format!("--initial-cluster address {address:?} is not host:port")
            })?;
        }
        let member = Member {
            api_addr: api_addr.to_owned(),
            peer_addr: peer_addr.to_owned(),
        };
        if members.insert(id, member).is_some() {
            bail!("--initial-cluster lists id {id} twice");
        }
    }
    if members.is_empty() {
        bail!("--initial-cluster names no member");
    }
    Ok(members)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(auth: bool, insecure: bool) -> Access {
        Access { auth, insecure }
    }

    fn tuning(secret: bool, peer_tls: bool) -> Tuning {
        let mut arguments = vec!["batond", "dev"];
        if secret {
            arguments.extend(["--cluster-secret", "a-cluster-secret"]);
        }
        if peer_tls {
            arguments.extend([
                "--peer-tls-cert",
                "cert.pem",
                "--peer-tls-key",
                "key.pem",
                "--peer-ca",
                "ca.pem",
            ]);
        }
        match Cli::try_parse_from(arguments).expect("valid flags").command {
            Mode::Dev { tuning, .. } => tuning,
            _ => unreachable!("parsed dev"),
        }
    }

    #[test]
    fn open_addresses_need_auth_and_authenticated_peers_or_insecure() {
        let loopback: SocketAddr = "127.0.0.1:7420".parse().unwrap();
        let open: SocketAddr = "0.0.0.0:7420".parse().unwrap();
        let check = |listen, peer_listen, access: Access, tuning: Tuning| {
            check_access(listen, peer_listen, &access, &tuning).is_ok()
        };
        let open_peers = || tuning(false, false);
        assert!(check(
            loopback,
            loopback,
            access(false, false),
            open_peers()
        ));
        assert!(!check(open, loopback, access(false, false), open_peers()));
        assert!(check(
            open,
            loopback,
            access(true, false),
            tuning(true, false)
        ));
        assert!(!check(loopback, open, access(false, false), open_peers()));
        assert!(check(
            loopback,
            open,
            access(false, false),
            tuning(true, false)
        ));
        // Peer TLS alone authenticates the peer port.
        assert!(check(
            loopback,
            open,
            access(false, false),
            tuning(false, true)
        ));
        assert!(check(open, open, access(true, false), tuning(false, true)));
        assert!(check(open, open, access(false, true), open_peers()));
    }

    #[test]
    fn auth_refuses_an_open_peer_port_even_on_loopback_or_insecure() {
        let loopback: SocketAddr = "127.0.0.1:7420".parse().unwrap();
        for insecure in [false, true] {
            let refused = check_access(
                loopback,
                loopback,
                &access(true, insecure),
                &tuning(false, false),
            )
            .expect_err("--auth with an open peer port");
            assert!(
                refused.to_string().contains("--cluster-secret"),
                "{refused}"
            );
        }
    }

    #[test]
    fn dev_refuses_an_open_address_without_auth_and_closes_its_peer_port_with_auth() {
        let parse = |arguments: &[&str]| {
            let mut full = vec!["batond", "dev"];
            full.extend(arguments);
            NodeConfig::from_mode(Cli::try_parse_from(full).expect("valid flags").command)
        };
        assert!(parse(&["--listen", "0.0.0.0:7420"]).is_err());
        assert!(parse(&["--listen", "0.0.0.0:7420", "--insecure"]).is_ok());
        let secured = parse(&["--listen", "0.0.0.0:7420", "--auth"]).expect("dev --auth");
        assert!(secured.auth);
        let secret = secured.tuning.cluster_secret.expect("a secret of its own");
        assert_eq!(secret.len(), 32);
        let open = parse(&[]).expect("dev");
        assert!(!open.auth && open.tuning.cluster_secret.is_none());
    }

    #[test]
    fn initial_cluster_parses_and_refuses_bad_members() {
        let members = parse_initial_cluster("1=127.0.0.1:1@127.0.0.1:2, 2=127.0.0.1:3@127.0.0.1:4")
            .expect("valid");
        assert_eq!(members[&2].peer_addr, "127.0.0.1:4");
        for bad in [
            "",
            "1=127.0.0.1:1",
            "x=127.0.0.1:1@127.0.0.1:2",
            "1=a@b",
            "1=127.0.0.1:1@127.0.0.1:2,1=127.0.0.1:3@127.0.0.1:4",
        ] {
            assert!(parse_initial_cluster(bad).is_err(), "{bad:?}");
        }
    }
}
