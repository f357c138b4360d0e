//! The proposer: the one place where commands become log entries.
//!
//! Request handlers hand a `Command` to `Proposer::propose`; one batcher task groups whatever
//! is waiting into a `Batch` (group commit: one entry, one append and one flush for many
//! commands), stamps it with the leader's cluster time, and hands it to openraft in stamp order.
//! One batch replicates at a time: the batcher waits for its batch's answer itself and hands
//! each waiter its response; meanwhile new requests queue up and ride in the next batch, so
//! batches grow with load and every log append, flush and replication round carries as many
//! commands as arrived meanwhile. More batches in flight made smaller batches and more flushes
//! and thread wake-ups for the same work, and were slower (docs/performance.md).
//!
//! Time: `store::LeaderTime` holds the rules of the leader clock, pure and unit-tested (it starts once
//! the takeover log is applied, at that state's cluster time, and then follows the node's
//! monotonic clock); this shell feeds it readings and waits where it says. The same task
//! commits an idle tick every `tick_ms` and a bounded `Sweep` when something has expired.
//!
//! Never here: HTTP, request validation, or reading the wall clock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::machine::{Batch, Command, Response};
use crate::store::mutation::{self, Mutation};
use crate::store::{Applied, LeaderTime, MachineHandle, Raft, Stamp, TypeConfig};
use openraft::async_runtime::WatchReceiver;
use openraft::errors::ClientWriteError;
use openraft::impls::ProgressResponder;
use openraft::raft::ClientWriteResult;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

/// The node's monotonic clock, read for stamping: milliseconds from an arbitrary start, never
/// going back. Never the wall clock (docs/guarantees.md, "Time").
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now_ms(&self) -> u64;
}

/// Proposals waiting for the batcher; past this, requests are refused as overload.
const QUEUE_MAX: usize = 16_384;
/// Approximate encoded bytes of one log entry.
const BATCH_BYTES_MAX: usize = 4 << 20;

/// What a committed command produced, and the cluster time it was decided at.
#[derive(Debug)]
pub struct Committed {
    pub response: Response,
    pub time_ms: u64,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum ProposeError {
    /// Surely not applied: this node is not the leader (or stopped being it before appending).
    #[error("this node is not the leader")]
    NotLeader { leader: Option<u64> },
    /// Surely not applied: too many requests are waiting.
    #[error("too many requests are waiting to be replicated")]
    Overloaded,
    /// May or may not have been applied.
    #[error("the outcome is unknown: {0}")]
    Unknown(String),
}

/// How the batcher paces its own entries and sizes batches.
#[derive(Debug, Clone, Copy)]
pub struct ProposerSettings {
    /// An idle leader commits a tick this often, so cluster time keeps pace.
    pub tick: Duration,
    /// How often the leader checks whether something expired and sweeps it.
    pub sweep: Duration,
    /// Dead leases and sessions removed by one sweep entry at most.
    pub sweep_batch_max: u32,
    /// Commands in one log entry at most (group commit; 1 turns it off).
    pub batch_commands_max: usize,
    /// How long a request waits for its entry to be applied (and a new leader for its takeover
    /// log) before the outcome is unknown.
    pub apply_timeout: Duration,
}

#[derive(Debug, Clone)]
pub struct Proposer {
    sender: mpsc::Sender<Proposal>,
    /// The term whose leader clock has started: this node, as leader of that term, has applied
    /// every entry that was in its log at takeover.
    ready_term: watch::Receiver<Option<u64>>,
    apply_timeout: Duration,
    /// Whether a batch is handed to openraft and not yet answered.
    in_flight: Arc<AtomicBool>,
}

#[derive(Debug)]
struct Proposal {
    command: Command,
    size_bytes: usize,
    reply: oneshot::Sender<Result<Committed, ProposeError>>,
}

impl Proposer {
    /// Starts the batcher task for this node.
    pub fn spawn(
        raft: Raft,
        machine: MachineHandle,
        clock: Arc<dyn Clock>,
        node_id: u64,
        settings: ProposerSettings,
    ) -> Proposer {
        let (sender, receiver) = mpsc::channel(QUEUE_MAX);
        let (ready, ready_term) = watch::channel(None);
        let apply_timeout = settings.apply_timeout;
        let in_flight = Arc::new(AtomicBool::new(false));
        let batcher = Batcher {
            ready,
            raft,
            machine,
            clock,
            node_id,
            receiver,
            in_flight: in_flight.clone(),
            leader_time: LeaderTime::default(),
            settings,
        };
        tokio::spawn(batcher.run());
        Proposer {
            sender,
            ready_term,
            apply_timeout,
            in_flight,
        }
    }

    /// Batches handed to openraft whose answer the batcher still waits for (0 or 1).
    pub fn batches_in_flight(&self) -> usize {
        usize::from(self.in_flight.load(Ordering::Relaxed))
    }

    /// Waits until this node, as leader of `term`, has applied every entry that was in its log
    /// when it took over (or resumed after a restart). Before that, its applied state may lack
    /// entries another leader committed, so it must not answer reads. False on timeout.
    pub async fn wait_leader_ready(&self, term: u64, timeout: Duration) -> bool {
        let mut ready_term = self.ready_term.clone();
        let ready =
            tokio::time::timeout(timeout, ready_term.wait_for(|ready| *ready == Some(term))).await;
        matches!(ready, Ok(Ok(_)))
    }

    /// Whether `wait_leader_ready(term)` would return at once.
    pub fn is_leader_ready(&self, term: u64) -> bool {
        *self.ready_term.borrow() == Some(term)
    }

    /// Replicates `command` and returns its response once applied on this node.
    /// `size_bytes` is an estimate of its encoded size, for bounding batches.
    pub async fn propose(
        &self,
        command: Command,
        size_bytes: usize,
    ) -> Result<Committed, ProposeError> {
        let (reply, answer) = oneshot::channel();
        let proposal = Proposal {
            command,
            size_bytes,
            reply,
        };
        self.sender
            .try_send(proposal)
            .map_err(|error| match error {
                mpsc::error::TrySendError::Full(_) => ProposeError::Overloaded,
                mpsc::error::TrySendError::Closed(_) => ProposeError::NotLeader { leader: None },
            })?;
        match tokio::time::timeout(self.apply_timeout, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(ProposeError::Unknown("the proposer stopped".to_owned())),
            Err(_) => Err(ProposeError::Unknown(format!(
                "not applied within {:?}",
                self.apply_timeout
            ))),
        }
    }
}

/// What the waiters of an entry handed to openraft learn from openraft's answer for it.
///
/// openraft 0.10 answers `ForwardToLeader` only for an entry it refused before appending it
/// (this node is not the leader, is handing leadership over, or its leader lease lapsed): surely
/// not applied, so `NotLeader`. An entry it appended and then deleted from a deposed leader's
/// log (a conflict, or a snapshot install) is `LogEntryDiscarded`: a new leader may already
/// have committed and applied it, so that and every other failure after the hand-over is
/// `Unknown`, never `NotLeader` (docs/api.md: `NO_LEADER` means surely not applied).
fn entry_outcome(
    outcome: Result<ClientWriteResult<TypeConfig>, NoAnswer>,
    commands: usize,
) -> Result<Applied, ProposeError> {
    match outcome {
        Ok(Ok(written)) if written.data.responses.len() == commands => Ok(written.data),
        Ok(Ok(written)) => panic!(
            "invariant broken: entry {} applied with {} responses for {commands} commands",
            written.log_id,
            written.data.responses.len(),
        ),
        Ok(Err(ClientWriteError::ForwardToLeader(forward))) => Err(ProposeError::NotLeader {
            leader: forward.leader_id,
        }),
        Ok(Err(ClientWriteError::LogEntryDiscarded(forward)))
            if mutation::active(Mutation::DiscardedIsNotLeader) =>
        {
            Err(ProposeError::NotLeader {
                leader: forward.leader_id,
            })
        }
        Ok(Err(ClientWriteError::LogEntryDiscarded(_))) => Err(ProposeError::Unknown(
            "this node stopped being the leader before the write was known to be committed"
                .to_owned(),
        )),
        Ok(Err(other)) => Err(ProposeError::Unknown(other.to_string())),
        Err(NoAnswer::Dropped) => Err(ProposeError::Unknown("raft dropped the request".to_owned())),
        Err(NoAnswer::TimedOut(timeout)) => Err(ProposeError::Unknown(format!(
            "raft did not answer within {timeout:?}"
        ))),
    }
}

/// Why openraft's answer for an entry never came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NoAnswer {
    Dropped,
    TimedOut(Duration),
}

/// openraft's answer for an entry handed over, waited for at most `timeout`.
///
/// The bound is not a nicety: the batcher waits for that answer before its next batch, and an
/// answer that never came would stop it for good, even once this node is elected leader again.
/// openraft 0.9 never answered an entry a snapshot install replaced without truncating it; 0.10
/// answers it `LogEntryDiscarded`, but the batcher does not bet its life on that. After the
/// bound (the longest a request waits for a leader) the outcome is unknown, as it already is
/// for the request that waits the same time, and the batcher goes on.
async fn answer_within<T>(
    answer: impl std::future::Future<Output = Result<T, oneshot::error::RecvError>>,
    timeout: Duration,
) -> Result<T, NoAnswer> {
    match tokio::time::timeout(timeout, answer).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(_)) => Err(NoAnswer::Dropped),
        Err(_) => Err(NoAnswer::TimedOut(timeout)),
    }
}

struct Batcher {
    ready: watch::Sender<Option<u64>>,
    raft: Raft,
    machine: MachineHandle,
    clock: Arc<dyn Clock>,
    node_id: u64,
    receiver: mpsc::Receiver<Proposal>,
    in_flight: Arc<AtomicBool>,
    leader_time: LeaderTime,
    settings: ProposerSettings,
}

/// The commands of one entry and, aligned with them, who waits for each answer (none for the
/// node's own tick and sweep commands).
#[derive(Default)]
struct Pending {
    commands: Vec<Command>,
    replies: Vec<Option<oneshot::Sender<Result<Committed, ProposeError>>>>,
    size_bytes: usize,
}

impl Pending {
    fn push(&mut self, proposal: Proposal) {
        self.size_bytes += proposal.size_bytes;
        self.commands.push(proposal.command);
        self.replies.push(Some(proposal.reply));
    }

    fn is_full(&self, commands_max: usize) -> bool {
        self.commands.len() >= commands_max || self.size_bytes >= BATCH_BYTES_MAX
    }

    fn fail(self, error: impl Fn() -> ProposeError) {
        for reply in self.replies.into_iter().flatten() {
            let _ = reply.send(Err(error()));
        }
    }
}

impl Batcher {
    async fn run(mut self) {
        let mut tick = tokio::time::interval(self.settings.tick);
        let mut sweep = tokio::time::interval(self.settings.sweep);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_proposed = Instant::now();
        loop {
            let mut pending = Pending::default();
            tokio::select! {
                proposal = self.receiver.recv() => match proposal {
                    Some(proposal) => pending.push(proposal),
                    None => return,
                },
                _ = tick.tick() => {
                    if last_proposed.elapsed() < self.settings.tick || !self.is_leader() {
                        continue;
                    }
                }
                _ = sweep.tick() => {
                    if !self.is_leader() || !self.machine.read(|machine, _| machine.sweep_due()).unwrap_or(false) {
                        continue;
                    }
                    pending.commands.push(Command::Sweep { max: self.settings.sweep_batch_max });
                    pending.replies.push(None);
                }
            }
            // Group commit: everything that queued while the batch before replicated.
            while !pending.is_full(self.settings.batch_commands_max) {
                match self.receiver.try_recv() {
                    Ok(proposal) => pending.push(proposal),
                    Err(_) => break,
                }
            }
            let stamp_ms = match self.leader_stamp().await {
                Ok(stamp_ms) => stamp_ms,
                Err(leader) => {
                    pending.fail(|| ProposeError::NotLeader { leader });
                    continue;
                }
            };
            last_proposed = Instant::now();
            self.submit(stamp_ms, pending).await;
        }
    }

    /// Hands the batch to openraft, waits for its answer (at most the apply timeout) and gives
    /// each waiter its response. Waiting here rather than on a task of its own saves a task
    /// hand-off on every batch's way back.
    async fn submit(&self, stamp_ms: u64, pending: Pending) {
        let Pending {
            commands, replies, ..
        } = pending;
        let (responder, receiver) = ProgressResponder::complete_only();
        match self
            .raft
            .client_write_ff(Batch { stamp_ms, commands }, Some(responder))
            .await
        {
            Ok(()) => {}
            Err(fatal) => {
                tracing::error!(error = %fatal, "raft stopped; refusing proposals");
                for reply in replies.into_iter().flatten() {
                    let _ = reply.send(Err(ProposeError::NotLeader { leader: None }));
                }
                return;
            }
        };
        self.in_flight.store(true, Ordering::Relaxed);
        let timeout = self.settings.apply_timeout;
        let outcome = answer_within(receiver, timeout).await;
        self.in_flight.store(false, Ordering::Relaxed);
        if let Err(NoAnswer::TimedOut(timeout)) = outcome {
            tracing::warn!(
                ?timeout,
                "openraft gave no answer for a batch in time; its outcome is unknown"
            );
        }
        match entry_outcome(outcome, replies.len()) {
            Ok(Applied { time_ms, responses }) => {
                for (reply, response) in replies.into_iter().zip(responses) {
                    if let Some(reply) = reply {
                        let _ = reply.send(Ok(Committed { response, time_ms }));
                    }
                }
            }
            Err(error) => {
                for reply in replies.into_iter().flatten() {
                    let _ = reply.send(Err(error.clone()));
                }
            }
        }
    }

    fn is_leader(&self) -> bool {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow_watched();
        metrics.state.is_leader() && metrics.current_leader == Some(self.node_id)
    }

    /// The cluster time to stamp the next entry with, or the known leader if this node is not
    /// the leader. Waits for the takeover log first when `LeaderTime` says so.
    async fn leader_stamp(&mut self) -> Result<u64, Option<u64>> {
        loop {
            let (term, last_log_index) = {
                let metrics = self.raft.metrics();
                let metrics = metrics.borrow_watched();
                if !metrics.state.is_leader() || metrics.current_leader != Some(self.node_id) {
                    return Err(metrics.current_leader);
                }
                (metrics.current_term, metrics.last_log_index)
            };
            let (applied_index, applied_time_ms) = self
                .machine
                .read(|machine, last_applied| {
                    (last_applied.map(|log_id| log_id.index), machine.time_ms())
                })
                .map_err(|_| None)?;
            let started = self.leader_time.started_term();
            let reading_ms = self.clock.now_ms();
            match self.leader_time.stamp(
                term,
                last_log_index,
                applied_index,
                applied_time_ms,
                reading_ms,
            ) {
                Stamp::At(stamp_ms) => {
                    if self.leader_time.started_term() != started {
                        tracing::info!(term, cluster_time_ms = stamp_ms, "leader clock started");
                        self.ready.send_replace(Some(term));
                    }
                    return Ok(stamp_ms);
                }
                Stamp::ApplyFirst { index } => {
                    let wait = self.raft.wait(Some(self.settings.apply_timeout));
                    if wait
                        .applied_index_at_least(index, "leader clock start")
                        .await
                        .is_err()
                    {
                        let leader = self.raft.metrics().borrow_watched().current_leader;
                        return Err(leader.filter(|id| *id != self.node_id));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::machine::{Reply, Response};
    use crate::store::log_id;
    use openraft::errors::ForwardToLeader;
    use openraft::raft::ClientWriteResponse;

    use super::*;

    fn written(responses: usize) -> ClientWriteResponse<TypeConfig> {
        ClientWriteResponse {
            log_id: log_id(3, 1, 9),
            data: Applied {
                time_ms: 1_234,
                responses: (0..responses)
                    .map(|_| Response {
                        outcome: Ok(Reply::LimitsSet),
                        replayed: None,
                    })
                    .collect(),
            },
            membership: None,
        }
    }

    #[test]
    fn a_refused_entry_is_not_applied_and_a_discarded_one_is_unknown() {
        let refused =
            ClientWriteError::ForwardToLeader(ForwardToLeader::new(2, Default::default()));
        let outcome = entry_outcome(Ok(Err(refused)), 1);
        assert!(
            matches!(outcome, Err(ProposeError::NotLeader { leader: Some(2) })),
            "{outcome:?}"
        );
        let discarded = ClientWriteError::LogEntryDiscarded(ForwardToLeader::empty());
        let outcome = entry_outcome(Ok(Err(discarded)), 1);
        assert!(
            matches!(outcome, Err(ProposeError::Unknown(_))),
            "{outcome:?}"
        );
    }

    #[test]
    fn a_dropped_or_missing_answer_is_unknown() {
        assert!(matches!(
            entry_outcome(Err(NoAnswer::Dropped), 1),
            Err(ProposeError::Unknown(_))
        ));
        assert!(matches!(
            entry_outcome(Err(NoAnswer::TimedOut(Duration::from_secs(1))), 1),
            Err(ProposeError::Unknown(_))
        ));
    }

    #[test]
    #[should_panic(expected = "invariant broken")]
    fn a_response_count_mismatch_is_a_broken_invariant() {
        let _ = entry_outcome(Ok(Ok(written(2))), 3);
    }

    #[test]
    fn an_applied_entry_answers_every_waiter() {
        let applied = entry_outcome(Ok(Ok(written(2))), 2).unwrap();
        assert_eq!(applied.time_ms, 1_234);
        assert_eq!(applied.responses.len(), 2);
    }

    /// openraft keeps some answers forever (see `answer_within`); the wait for one ends at the
    /// bound, and the batcher goes on.
    #[tokio::test]
    async fn an_answer_that_never_comes_is_given_up_at_the_bound() {
        const BOUND: Duration = Duration::from_millis(50);
        let (kept_forever, answer) = oneshot::channel::<()>();
        let outcome = answer_within(answer, BOUND).await;
        assert_eq!(outcome, Err(NoAnswer::TimedOut(BOUND)));
        drop(kept_forever);

        let (dropped, answer) = oneshot::channel::<()>();
        drop(dropped);
        let outcome = answer_within(answer, BOUND).await;
        assert_eq!(outcome, Err(NoAnswer::Dropped));

        let (sender, answer) = oneshot::channel();
        sender.send(7).unwrap();
        assert_eq!(answer_within(answer, BOUND).await, Ok(7));
    }
}
