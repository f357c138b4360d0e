//! The write relay: a follower decides a client's write itself, up to its `Command`, as the
//! leader would, and sends the leader the command instead of the HTTP request; the leader admits
//! and proposes it like one of its own and sends back the machine's answer, which the follower
//! renders. The leader's share of a relayed write is a decode, `admit` and a place in a batch:
//! no HTTP request of the client's, no JSON, no route of the client API.
//!
//! Commands waiting to be relayed to the same leader travel together in one peer message
//! (`POST /raft/relay` on the leader's peer listener, bincode, behind the cluster secret and
//! peer TLS like every peer route), at most `RELAY_COMMANDS_MAX` in one and
//! `RELAY_IN_FLIGHT_MAX` messages in flight; the leader answers a message once every command in
//! it has its answer. A message never waits for another to come back unless that many are out.
//!
//! The bounds and outcomes are forwarding's (forward.rs): a relay to a leader that stops
//! answering gives up after twice the election timeout; no write waits longer than
//! `Service::leader_wait` for a leader; a command that surely did not reach a leader (no
//! connection, or a node that answered it is not the leader) is sent again, to the leader known
//! then, and past the bound is `NO_LEADER`; one that may have reached one is `OUTCOME_UNKNOWN`.
//! Which writes are relayed is the route table's `Served::Relayed` (routes.rs).
//!
//! The peer listener's routes of the relay are `http::relay`'s, which hand each message to
//! `Service::serve_relayed`.
//!
//! Never here: parsing client requests, or deciding anything about a command's content.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use baton_raft_store::machine::{
    admit, decode_value, encode_value, Command, Machine, Rejection, Response,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::{ApiError, Clocks, Leader, Service, RECONNECT_PAUSE};
use crate::metrics::RelayCounters;
use crate::network::{PeerNetwork, PeerPostError, PEER_MESSAGE_BYTES_MAX};
use baton_raft_store::proposer::{Committed, ProposeError};

/// The leader's peer route for relayed commands.
pub const RELAY_PATH: &str = "/raft/relay";
/// The leader's peer route for a follower's read index.
pub const READ_INDEX_PATH: &str = "/raft/read-index";
/// Commands in one relay message at most.
const RELAY_COMMANDS_MAX: usize = 256;
/// Approximate encoded bytes of one relay message at most (well under the peer message limit).
const RELAY_BYTES_MAX: usize = 8 << 20;
/// Relay messages sent and not yet answered, at most. With more, messages stay small and the
/// leader falls behind at fleet scale (32: seconds behind at 50,000 renewing sessions, against
/// a p99 of tens of milliseconds with 4; docs/performance.md, "The write relay").
const RELAY_IN_FLIGHT_MAX: usize = 4;
/// Commands waiting for a relay message; past this, writes are refused as overload.
const RELAY_QUEUE_MAX: usize = 16_384;

/// One relayed command, as it travels.
#[derive(Debug, Serialize, Deserialize)]
struct Relayed {
    command: Command,
    /// The follower's estimate of its encoded size, for the leader's batch bounds.
    size_bytes: u64,
}

/// The leader's answer for one relayed command.
#[derive(Debug, Serialize, Deserialize)]
enum Answer {
    /// Applied: the machine's response, and the cluster time of its entry.
    Committed {
        response: Box<Response>,
        time_ms: u64,
    },
    /// Refused by admission before anything was proposed.
    Refused(Rejection),
    /// Surely not applied: the node is not the leader (any more).
    NotLeader,
    /// Surely not applied: too many requests wait at the leader.
    Overloaded,
    /// Handed to Raft, outcome unknown.
    Unknown(String),
}

/// The leader's answer to a follower's read-index request.
#[derive(Debug, Serialize, Deserialize)]
enum ReadIndex {
    /// The log index a linearizable read must see applied.
    Index(u64),
    /// Not the leader (any more), or it could not confirm it: ask the leader known then.
    NotLeader,
}

/// A follower's relay: the queue of commands waiting to go to the leader, its counters, and
/// the peer network for read indexes.
#[derive(Clone)]
pub struct Relay {
    sender: mpsc::Sender<Outgoing>,
    counters: Arc<RelayCounters>,
    network: PeerNetwork,
}

/// A command waiting to be relayed, and who waits for its answer.
struct Outgoing {
    leader: u64,
    peer_addr: String,
    relayed: Relayed,
    timeout: Duration,
    reply: oneshot::Sender<Result<Answer, PeerPostError>>,
}

impl Relay {
    /// Starts the task that sends relay messages over `network`.
    pub fn spawn(network: PeerNetwork) -> Relay {
        let (sender, receiver) = mpsc::channel(RELAY_QUEUE_MAX);
        let counters = Arc::new(RelayCounters::default());
        tokio::spawn(send_messages(receiver, network.clone(), counters.clone()));
        Relay {
            sender,
            counters,
            network,
        }
    }

    pub fn counters(&self) -> &RelayCounters {
        &self.counters
    }

    /// Sends `command` to the leader `leader` at `peer_addr` with the next relay message and
    /// waits for the answer, at most `timeout` once the message is sent.
    async fn relay(
        &self,
        leader: u64,
        peer_addr: &str,
        command: Command,
        size_bytes: usize,
        timeout: Duration,
    ) -> Result<Answer, PeerPostError> {
        let (reply, answer) = oneshot::channel();
        let outgoing = Outgoing {
            leader,
            peer_addr: peer_addr.to_owned(),
            relayed: Relayed {
                command,
                size_bytes: size_bytes as u64,
            },
            timeout,
            reply,
        };
        if self.sender.try_send(outgoing).is_err() {
            return Ok(Answer::Overloaded);
        }
        answer.await.unwrap_or_else(|_| {
            Err(PeerPostError::MaybeDelivered(
                "the relay stopped before the answer came".to_owned(),
            ))
        })
    }
}

/// Groups what is waiting into messages, one leader at a time, and sends each on its own task.
async fn send_messages(
    mut receiver: mpsc::Receiver<Outgoing>,
    network: PeerNetwork,
    counters: Arc<RelayCounters>,
) {
    let in_flight = Arc::new(Semaphore::new(RELAY_IN_FLIGHT_MAX));
    let mut next: Option<Outgoing> = None;
    loop {
        let first = match next.take() {
            Some(first) => first,
            None => match receiver.recv().await {
                Some(first) => first,
                None => return,
            },
        };
        // While every message is out, what arrives waits here and goes in the next one.
        let permit = in_flight
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let mut bytes = first.relayed.size_bytes as usize;
        let mut message = vec![first];
        while message.len() < RELAY_COMMANDS_MAX && bytes < RELAY_BYTES_MAX {
            match receiver.try_recv() {
                Ok(more) if more.leader == message[0].leader => {
                    bytes += more.relayed.size_bytes as usize;
                    message.push(more);
                }
                Ok(other_leader) => {
                    next = Some(other_leader);
                    break;
                }
                Err(_) => break,
            }
        }
        counters.messages.fetch_add(1, Ordering::Relaxed);
        counters
            .commands
            .fetch_add(message.len() as u64, Ordering::Relaxed);
        tokio::spawn(send_message(network.clone(), message, permit));
    }
}

/// Sends one message and hands each waiter its answer (or the message's failure).
async fn send_message(network: PeerNetwork, message: Vec<Outgoing>, _permit: OwnedSemaphorePermit) {
    let timeout = message
        .iter()
        .map(|outgoing| outgoing.timeout)
        .min()
        .unwrap_or_default();
    let (leader, peer_addr) = (message[0].leader, message[0].peer_addr.clone());
    let (relayed, replies): (Vec<Relayed>, Vec<_>) = message
        .into_iter()
        .map(|outgoing| (outgoing.relayed, outgoing.reply))
        .unzip();
    let body = encode_value(&relayed).expect("commands always encode: they are log entries");
    let answers = match network
        .post((leader, &peer_addr), RELAY_PATH, body, timeout)
        .await
    {
        Ok(bytes) => match decode_value::<Vec<Answer>>(&bytes, PEER_MESSAGE_BYTES_MAX) {
            Ok(answers) if answers.len() == replies.len() => Ok(answers),
            Ok(answers) => Err(PeerPostError::MaybeDelivered(format!(
                "the leader answered {} commands of {}",
                answers.len(),
                replies.len()
            ))),
            Err(error) => Err(PeerPostError::MaybeDelivered(format!(
                "the leader's answer did not decode: {error}"
            ))),
        },
        Err(error) => Err(error),
    };
    match answers {
        Ok(answers) => {
            for (reply, answer) in replies.into_iter().zip(answers) {
                let _ = reply.send(Ok(answer));
            }
        }
        Err(error) => {
            for reply in replies {
                let _ = reply.send(Err(error.clone()));
            }
        }
    }
}

/// Why a relay message was not answered.
#[derive(Debug)]
pub enum RelayRefused {
    /// The message does not decode: a peer's bug, or not a peer.
    Malformed(String),
    /// The answers did not encode.
    Internal(String),
}

impl Service {
    /// The leader's side of `POST /raft/read-index`: confirms leadership for a follower and
    /// answers the read index it must wait for, encoded.
    pub async fn serve_read_index(&self) -> Vec<u8> {
        let answer = match self.read_index_here().await {
            Ok(index) => ReadIndex::Index(index),
            Err(_) => ReadIndex::NotLeader,
        };
        encode_value(&answer).expect("a read index always encodes")
    }

    /// The leader's side of `POST /raft/relay`: admits and proposes every command of the
    /// message, concurrently (so they share batches with everything else waiting), and answers
    /// them all in order, encoded.
    pub async fn serve_relayed(&self, message: &[u8]) -> Result<Vec<u8>, RelayRefused> {
        let relayed: Vec<Relayed> = decode_value(message, PEER_MESSAGE_BYTES_MAX)
            .map_err(|error| RelayRefused::Malformed(error.to_string()))?;
        let answers =
            futures_util::future::join_all(relayed.into_iter().map(|relayed| async move {
                let size_bytes = usize::try_from(relayed.size_bytes).unwrap_or(usize::MAX);
                match self.decide_here(relayed.command, size_bytes).await {
                    Ok(Committed { response, time_ms }) => Answer::Committed {
                        response: Box::new(response),
                        time_ms,
                    },
                    Err(Undecided::Refused(rejection)) => Answer::Refused(rejection),
                    Err(Undecided::Propose(ProposeError::NotLeader { .. })) => Answer::NotLeader,
                    Err(Undecided::Propose(ProposeError::Overloaded)) => Answer::Overloaded,
                    Err(Undecided::Propose(ProposeError::Unknown(reason))) => {
                        Answer::Unknown(reason)
                    }
                }
            }))
            .await;
        encode_value(&answers).map_err(|error| RelayRefused::Internal(error.to_string()))
    }
}

/// Why this node, as leader, did not commit a command.
enum Undecided {
    /// Admission refused it: nothing was proposed.
    Refused(Rejection),
    Propose(ProposeError),
}

impl Service {
    /// Commits `command` and returns its response: proposed here on the leader, relayed to the
    /// leader from a follower (see the module docs for the bounds and outcomes).
    pub async fn decide(&self, command: Command, size_bytes: usize) -> Result<Committed, ApiError> {
        let deadline = Instant::now() + self.leader_wait();
        loop {
            let (id, peer_addr) = match self.wait_for_leader(None, deadline).await {
                Some(Leader::Me) => {
                    return self
                        .decide_here(command, size_bytes)
                        .await
                        .map_err(|undecided| match undecided {
                            Undecided::Refused(rejection) => {
                                ApiError::rejected(rejection, None, None)
                            }
                            Undecided::Propose(error) => error.into(),
                        })
                }
                Some(Leader::Other { id, member }) => (id, member.peer_addr),
                None => return Err(ApiError::no_leader(None).naming_leader(None)),
            };
            let timeout = (self.election_timeout * 2).min(deadline - Instant::now());
            let answer = self
                .relay
                .relay(id, &peer_addr, command.clone(), size_bytes, timeout)
                .await;
            match answer {
                Ok(Answer::Committed { response, time_ms }) => {
                    return Ok(Committed {
                        response: *response,
                        time_ms,
                    })
                }
                Ok(Answer::Refused(rejection)) => {
                    return Err(ApiError::rejected(rejection, None, None))
                }
                Ok(Answer::Overloaded) => {
                    return Err(ApiError::from(ProposeError::Overloaded).naming_leader(Some(id)))
                }
                Ok(Answer::Unknown(reason)) => {
                    let error = ApiError::outcome_unknown(format!(
                        "relayed to the leader, node {id}: {reason}"
                    ));
                    return Err(error.naming_leader(self.leader()));
                }
                Err(PeerPostError::MaybeDelivered(reason)) => {
                    let error = ApiError::outcome_unknown(format!(
                        "relaying to the leader, node {id}, failed: {reason}"
                    ));
                    return Err(error.naming_leader(self.leader()));
                }
                Ok(Answer::NotLeader) => {
                    tracing::debug!(
                        node_id = id,
                        "relayed to a node that is not the leader; trying again"
                    );
                    tokio::time::sleep_until((Instant::now() + RECONNECT_PAUSE).min(deadline))
                        .await;
                }
                Err(PeerPostError::NotDelivered(reason)) => {
                    tracing::debug!(leader_id = id, %reason, "the leader could not be reached; trying again");
                    tokio::time::sleep_until((Instant::now() + RECONNECT_PAUSE).min(deadline))
                        .await;
                }
            }
            if Instant::now() >= deadline {
                return Err(ApiError::no_leader(None).naming_leader(None));
            }
        }
    }

    /// Runs `query` on this node's own applied state once it holds every write acknowledged
    /// before the call: linearizable (G1) on any node. The leader reads after its read index;
    /// a follower asks the leader for it over the peer port and waits until it has applied
    /// that far (for what a follower serves itself, such as event streams). The bounds are
    /// forwarding's: no leader within `leader_wait` is `NO_LEADER`.
    pub async fn read_here<T>(
        &self,
        query: impl FnOnce(&Machine) -> T,
    ) -> Result<(T, Clocks), ApiError> {
        let deadline = Instant::now() + self.leader_wait();
        loop {
            let (id, peer_addr) = match self.wait_for_leader(None, deadline).await {
                Some(Leader::Me) => return self.read(query).await,
                Some(Leader::Other { id, member }) => (id, member.peer_addr),
                None => return Err(ApiError::no_leader(None).naming_leader(None)),
            };
            let timeout = (self.election_timeout * 2).min(deadline - Instant::now());
            let asked = self
                .relay
                .network
                .post((id, &peer_addr), READ_INDEX_PATH, Vec::new(), timeout)
                .await;
            let answer =
                asked.map(|bytes| decode_value::<ReadIndex>(&bytes, PEER_MESSAGE_BYTES_MAX));
            match answer {
                Ok(Ok(ReadIndex::Index(index))) => {
                    let applied = self
                        .raft
                        .wait(Some(deadline.saturating_duration_since(Instant::now())))
                        .applied_index_at_least(Some(index), "a follower's read index")
                        .await;
                    return match applied {
                        Ok(_) => self.query(query),
                        Err(_) => Err(ApiError::no_leader(Some(id))),
                    };
                }
                Ok(Ok(ReadIndex::NotLeader)) => {}
                Ok(Err(error)) => {
                    tracing::warn!(leader_id = id, %error, "the leader's read index did not decode");
                }
                // A read changes nothing: whether or not the request arrived, ask again.
                Err(error) => {
                    tracing::debug!(
                        leader_id = id,
                        ?error,
                        "no read index from the leader; asking again"
                    );
                }
            }
            tokio::time::sleep_until((Instant::now() + RECONNECT_PAUSE).min(deadline)).await;
            if Instant::now() >= deadline {
                return Err(ApiError::no_leader(None).naming_leader(None));
            }
        }
    }

    /// On the leader: admits `command` (machine's admission.rs) and proposes it.
    async fn decide_here(
        &self,
        command: Command,
        size_bytes: usize,
    ) -> Result<Committed, Undecided> {
        // Refused here, a bad request costs no log entry; apply admits it again under the
        // limits of its own moment.
        self.with_limits(|limits| admit(&command, limits))
            .map_err(Undecided::Refused)?;
        self.proposer
            .propose(command, size_bytes)
            .await
            .map_err(Undecided::Propose)
    }
}
