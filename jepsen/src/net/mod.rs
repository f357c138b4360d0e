//! The network between the nodes, and how the harness cuts it.
//!
//! [`Net`] is the one interface the cluster and the nemesis use: where each node listens and
//! what it advertises, how its process is launched, block a set of directed links, heal, tear
//! down. Two backends:
//!
//! - [`netns::NetnsNet`]: one network namespace per node, joined by veth pairs to a bridge in
//!   the root namespace; faults are iptables DROP rules inside the nodes' namespaces. Needs
//!   root, `ip` and `iptables`.
//! - [`proxy::ProxyMesh`]: a fault-injecting TCP proxy mesh on 127.0.0.1; needs nothing.
//!
//! [`choose`] picks one from `--net auto|netns|proxy`: `auto` takes the namespaces only when
//! [`netns::probe`] succeeds (root, the tools run, a throwaway namespace takes a rule) and the
//! proxy mesh otherwise. What must never live here: any address other than loopback or the
//! addresses of namespaces the harness created itself.

pub mod netns;
pub mod proxy;

use std::collections::BTreeSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use std::collections::BTreeMap;

/// A directed link between two nodes: traffic that `from` sends to `to` (and the answers on
/// those connections).
pub type Link = (u64, u64);

/// Where the node processes are: node id → pid, kept current by the cluster on every start.
pub type Pids = Arc<Mutex<BTreeMap<u64, u32>>>;

/// The harness's handle on the network between the nodes.
pub trait Net: Send + Sync + fmt::Debug {
    /// The backend's name, for the report.
    fn name(&self) -> &'static str;
    /// Blocks exactly these directed links (replacing what was blocked before).
    fn set_blocked(&self, links: &BTreeSet<Link>);
    /// Unblocks everything.
    fn heal(&self) {
        self.set_blocked(&BTreeSet::new());
    }
    /// The links blocked now.
    fn blocked(&self) -> BTreeSet<Link>;
    /// Where node `id` serves its API (`--listen`); the harness's clients reach it there.
    fn api_addr(&self, id: u64) -> SocketAddr;
    /// Where node `id` serves its peers (`--peer-listen`).
    fn peer_listen_addr(&self, id: u64) -> SocketAddr;
    /// The API address node `id` advertises to its peers.
    fn advertised_api_addr(&self, id: u64) -> String;
    /// The peer address node `id` advertises to its peers.
    fn advertised_peer_addr(&self, id: u64) -> String;
    /// Connections seen whose sending node could not be told (never blocked).
    fn unidentified_connections(&self) -> u64;
    /// A command that runs `program` as node `id`. The spawned child's pid must be the
    /// program's own (signals go to it).
    fn command(&self, _id: u64, program: &Path) -> Command {
        Command::new(program)
    }
    /// Heals and releases everything the backend set up. Called after every node process is
    /// gone; safe to call more than once; never panics.
    fn shutdown(&self) {
        self.heal();
    }
}

/// `--net`: which backend to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NetChoice {
    /// Namespaces when root and they work here, the proxy mesh otherwise.
    Auto,
    /// Network namespaces with iptables (fails when they are not available).
    Netns,
    /// The TCP proxy mesh on 127.0.0.1.
    Proxy,
}

/// Picks and sets up the backend for nodes `ids`. Returns it and why it was chosen.
pub async fn choose(
    choice: NetChoice,
    ids: &[u64],
    pids: Pids,
) -> anyhow::Result<(Arc<dyn Net>, String)> {
    let reason = match choice {
        NetChoice::Proxy => "--net proxy".to_owned(),
        NetChoice::Netns => {
            let net = tokio::task::spawn_blocking({
                let ids = ids.to_vec();
                move || netns::NetnsNet::setup(&ids)
            })
            .await??;
            return Ok((Arc::new(net), "--net netns".to_owned()));
        }
        NetChoice::Auto => match tokio::task::spawn_blocking(netns::probe).await? {
            Ok(()) => {
                let ids = ids.to_vec();
                match tokio::task::spawn_blocking(move || netns::NetnsNet::setup(&ids)).await? {
                    Ok(net) => {
                        return Ok((Arc::new(net), "auto: root, ip and iptables work".to_owned()))
                    }
                    Err(error) => format!("auto: namespace setup failed ({error:#})"),
                }
            }
            Err(why) => format!("auto: no namespaces ({why:#})"),
        },
    };
    Ok((Arc::new(proxy::ProxyMesh::start(ids, pids).await?), reason))
}

/// All links between `nodes` that cross from `side` to the rest, both ways.
pub fn cut_between(side: &[u64], nodes: &[u64]) -> BTreeSet<Link> {
    let mut links = BTreeSet::new();
    for &inside in side {
        for &outside in nodes.iter().filter(|node| !side.contains(node)) {
            links.insert((inside, outside));
            links.insert((outside, inside));
        }
    }
    links
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_are_symmetric_and_spare_the_inside() {
        let links = cut_between(&[1], &[1, 2, 3]);
        assert_eq!(links, BTreeSet::from([(1, 2), (2, 1), (1, 3), (3, 1)]));
        assert!(cut_between(&[1, 2, 3], &[1, 2, 3]).is_empty());
    }
}
