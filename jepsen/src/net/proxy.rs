//! The fault-injecting TCP proxy mesh on 127.0.0.1, the [`Net`] backend that needs no
//! privileges: every node advertises, in `--initial-cluster`, a proxy address for its peer
//! port and one for its API port (followers forward client requests to the leader's API, and
//! that traffic must obey partitions too). A node reaches a peer only through that peer's
//! proxy. Because every node reaches a peer at the same advertised address (the membership is
//! replicated), a proxy tells the sender of a connection by looking up which node process owns
//! the connection's client socket in `/proc`. A blocked link `from -> to` cuts every open
//! connection from `from` to `to` and black-holes new ones (held open, silent) until it heals,
//! so senders see timeouts as in a real partition. What must never live here: any address
//! other than loopback.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::{Link, Net, Pids};

/// The proxy mesh: for each node, a proxy in front of its peer port and one in front of its
/// API port, all on 127.0.0.1.
pub struct ProxyMesh {
    shared: Arc<MeshShared>,
    /// Node id → (real api address, real peer address), where the node listens.
    real: BTreeMap<u64, (SocketAddr, SocketAddr)>,
    /// Node id → (proxied api address, proxied peer address), what it advertises.
    advertised: BTreeMap<u64, (SocketAddr, SocketAddr)>,
}

struct MeshShared {
    blocked: RwLock<BTreeSet<Link>>,
    changes: watch::Sender<u64>,
    pids: Pids,
    unidentified: AtomicU64,
}

impl fmt::Debug for ProxyMesh {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("ProxyMesh")
            .field("real", &self.real)
            .field("advertised", &self.advertised)
            .field("blocked", &self.blocked())
            .finish()
    }
}

impl ProxyMesh {
    /// Picks free loopback addresses for the nodes `ids`, binds a proxy in front of each and
    /// starts serving them. The proxy tasks end with the runtime.
    pub async fn start(ids: &[u64], pids: Pids) -> anyhow::Result<ProxyMesh> {
        let nodes: Vec<(u64, SocketAddr, SocketAddr)> = ids
            .iter()
            .map(|&id| Ok((id, free_address()?, free_address()?)))
            .collect::<anyhow::Result<_>>()?;
        Self::start_in_front_of(&nodes, pids).await
    }

    /// Binds the proxies for `(id, real api address, real peer address)` of every node and
    /// starts serving them.
    pub async fn start_in_front_of(
        nodes: &[(u64, SocketAddr, SocketAddr)],
        pids: Pids,
    ) -> anyhow::Result<ProxyMesh> {
        let (changes, _) = watch::channel(0);
        let shared = Arc::new(MeshShared {
            blocked: RwLock::new(BTreeSet::new()),
            changes,
            pids,
            unidentified: AtomicU64::new(0),
        });
        let mut advertised = BTreeMap::new();
        let mut real = BTreeMap::new();
        for &(id, api, peer) in nodes {
            real.insert(id, (api, peer));
            let api_listener = TcpListener::bind("127.0.0.1:0").await?;
            let peer_listener = TcpListener::bind("127.0.0.1:0").await?;
            advertised.insert(
                id,
                (api_listener.local_addr()?, peer_listener.local_addr()?),
            );
            tokio::spawn(serve(shared.clone(), api_listener, id, api));
            tokio::spawn(serve(shared.clone(), peer_listener, id, peer));
        }
        Ok(ProxyMesh {
            shared,
            real,
            advertised,
        })
    }
}

impl Net for ProxyMesh {
    fn name(&self) -> &'static str {
        "tcp-proxy-mesh"
    }

    fn set_blocked(&self, links: &BTreeSet<Link>) {
        *self
            .shared
            .blocked
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = links.clone();
        self.shared
            .changes
            .send_modify(|generation| *generation += 1);
    }

    fn blocked(&self) -> BTreeSet<Link> {
        self.shared.blocked_links()
    }

    fn api_addr(&self, id: u64) -> SocketAddr {
        self.real[&id].0
    }

    fn peer_listen_addr(&self, id: u64) -> SocketAddr {
        self.real[&id].1
    }

    fn advertised_api_addr(&self, id: u64) -> String {
        self.advertised[&id].0.to_string()
    }

    fn advertised_peer_addr(&self, id: u64) -> String {
        self.advertised[&id].1.to_string()
    }

    fn unidentified_connections(&self) -> u64 {
        self.shared.unidentified.load(Ordering::Relaxed)
    }
}

impl MeshShared {
    fn blocked_links(&self) -> BTreeSet<Link> {
        self.blocked
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    fn is_blocked(&self, from: Option<u64>, to: u64) -> bool {
        from.is_some_and(|from| self.blocked_links().contains(&(from, to)))
    }
}

/// Accepts connections for node `to` and relays them to `target`.
async fn serve(shared: Arc<MeshShared>, listener: TcpListener, to: u64, target: SocketAddr) {
    let proxy = match listener.local_addr() {
        Ok(address) => address,
        Err(_) => return,
    };
    loop {
        let Ok((inbound, client)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let pids: Vec<(u64, u32)> = shared
                .pids
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .iter()
                .map(|(&id, &pid)| (id, pid))
                .collect();
            let from = tokio::task::spawn_blocking(move || sender_of(client, proxy, &pids))
                .await
                .ok()
                .flatten();
            if from.is_none() {
                shared.unidentified.fetch_add(1, Ordering::Relaxed);
            }
            relay(shared, inbound, from, to, target).await;
        });
    }
}

/// Relays one connection until either side closes it or its link is blocked.
async fn relay(
    shared: Arc<MeshShared>,
    mut inbound: TcpStream,
    from: Option<u64>,
    to: u64,
    target: SocketAddr,
) {
    let mut changes = shared.changes.subscribe();
    if shared.is_blocked(from, to) {
        // Black hole: hold the connection silently until the link heals, then close it so
        // the sender reconnects. Bounded by the sender's own timeouts as well.
        while shared.is_blocked(from, to) {
            if changes.changed().await.is_err() {
                return;
            }
        }
        return;
    }
    let Ok(mut outbound) = TcpStream::connect(target).await else {
        return;
    };
    let _ = outbound.set_nodelay(true);
    let _ = inbound.set_nodelay(true);
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
        () = async {
            loop {
                if changes.changed().await.is_err() || shared.is_blocked(from, to) {
                    break;
                }
            }
        } => {}
    }
}

/// A loopback address with a port free now.
fn free_address() -> anyhow::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?)
}

/// The node whose process owns the client end `client` of a connection to `proxy`, found in
/// `/proc/net/tcp` and the nodes' `/proc/<pid>/fd`. `None` when it is not a node (or gone).
fn sender_of(client: SocketAddr, proxy: SocketAddr, pids: &[(u64, u32)]) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let local = format!(":{:04X}", client.port());
    let remote = format!(":{:04X}", proxy.port());
    let inode = table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.len() > 9 && fields[1].ends_with(&local) && fields[2].ends_with(&remote))
            .then(|| fields[9].to_owned())
    })?;
    let wanted = format!("socket:[{inode}]");
    for &(id, pid) in pids {
        let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for entry in entries.flatten() {
            if std::fs::read_link(entry.path()).is_ok_and(|link| link.to_string_lossy() == wanted) {
                return Some(id);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[tokio::test]
    async fn a_blocked_link_stops_traffic_and_a_heal_restores_it() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // An echo server stands in for a node; this test process is "node 7".
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let echo_address = echo.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let mut buffer = [0u8; 64];
                    while let Ok(read) = stream.read(&mut buffer).await {
                        if read == 0 || stream.write_all(&buffer[..read]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let pids: Pids = Arc::new(Mutex::new(BTreeMap::from([(7, std::process::id())])));
        let mesh = ProxyMesh::start_in_front_of(&[(1, echo_address, echo_address)], pids)
            .await
            .unwrap();
        let peer: SocketAddr = mesh.advertised_peer_addr(1).parse().unwrap();
        let round_trip = || async move {
            let mut stream = TcpStream::connect(peer).await.ok()?;
            stream.write_all(b"ping").await.ok()?;
            let mut buffer = [0u8; 4];
            tokio::time::timeout(Duration::from_millis(300), stream.read_exact(&mut buffer))
                .await
                .ok()?
                .ok()?;
            Some(buffer)
        };
        assert_eq!(round_trip().await, Some(*b"ping"));
        mesh.set_blocked(&BTreeSet::from([(7, 1)]));
        assert_eq!(
            round_trip().await,
            None,
            "a blocked link must carry nothing"
        );
        mesh.heal();
        assert_eq!(round_trip().await, Some(*b"ping"));
        assert_eq!(mesh.unidentified_connections(), 0);
    }
}
