//! Waking the requests that wait for a path: `ChangeWatch`.
//!
//! A waiting acquire (`wait_ms`) must learn at once that it was granted or lost its place, but
//! it must not look at the state after every applied entry: with a thousand agents waiting on
//! one hot lock, reading the machine a thousand times per entry (and per heartbeat, when it
//! followed openraft's metrics) took most of the leader's CPU. So each waiter watches its path,
//! and after every entry the store wakes only the watchers of the paths that entry's events
//! named. A waiter's grant, its leaving the line (on request, with its session, or its session
//! ending) and every change of its position are events on its own path; an installed snapshot,
//! which replaces the state without events, wakes every watcher.
//!
//! An event stream watches for any event: it is woken after every entry that recorded one,
//! not by entries without events or by heartbeats, and after every entry that revoked a token
//! (or changed the limits), so that it checks at once whether its token may still read.
//!
//! A claim that waits (`wait_ms` on claim-next) watches its queue the same way: every task event
//! naming the queue (enqueued, claimed, completed, failed, released, expired, dead) wakes it.
//! Tasks that a delay or a dependency holds back become ready with no event of their own, so a
//! waiter on a queue with such tasks must also look again after every applied entry (the HTTP
//! handler does).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::machine::{Event, EventKind, Name, Namespace, ResourcePath};

/// What is watched: a path or a queue, in a namespace.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Watched {
    Path(Namespace, ResourcePath),
    Queue(Namespace, Name),
    /// Any event at all, in any namespace (an event stream).
    Events,
}

/// The watchers of each watched path. Cloning is cheap; every clone is the same watch.
#[derive(Debug, Clone, Default)]
pub struct ChangeWatch {
    watched: Arc<Mutex<HashMap<Watched, Arc<Notify>>>>,
}

/// One watcher's hold on a path; dropping it stops watching.
#[derive(Debug)]
pub struct Watching {
    key: Watched,
    notify: Arc<Notify>,
    watch: ChangeWatch,
}

impl ChangeWatch {
    /// Starts watching `resource` in `namespace`.
    pub fn watch(&self, namespace: &Namespace, resource: &ResourcePath) -> Watching {
        self.start(Watched::Path(namespace.clone(), resource.clone()))
    }

    /// Starts watching the tasks of `queue` in `namespace`.
    pub fn watch_queue(&self, namespace: &Namespace, queue: &Name) -> Watching {
        self.start(Watched::Queue(namespace.clone(), queue.clone()))
    }

    /// Starts watching for any new event (an event stream, which reads every namespace's
    /// events to keep its place in the window).
    pub fn watch_events(&self) -> Watching {
        self.start(Watched::Events)
    }

    fn start(&self, key: Watched) -> Watching {
        let notify = self
            .lock()
            .entry(key.clone())
            .or_insert_with(|| Arc::new(Notify::new()))
            .clone();
        Watching {
            key,
            notify,
            watch: self.clone(),
        }
    }

    /// Wakes the watchers of every path `events` name.
    pub(super) fn changed<'a>(&self, events: impl IntoIterator<Item = &'a Event>) {
        let watched = self.lock();
        if watched.is_empty() {
            return;
        }
        let mut any = false;
        for event in events {
            any = true;
            let key = match &event.kind {
                EventKind::Granted { resource, .. }
                | EventKind::Released { resource, .. }
                | EventKind::Expired { resource, .. }
                | EventKind::Queued { resource, .. }
                | EventKind::LeftLine { resource, .. } => {
                    Watched::Path(event.namespace.clone(), resource.clone())
                }
                EventKind::TaskEnqueued { queue, .. }
                | EventKind::TaskClaimed { queue, .. }
                | EventKind::TaskCompleted { queue, .. }
                | EventKind::TaskFailed { queue, .. }
                | EventKind::TaskReleased { queue, .. }
                | EventKind::TaskExpired { queue, .. }
                | EventKind::TaskDead { queue, .. } => {
                    Watched::Queue(event.namespace.clone(), queue.clone())
                }
                _ => continue,
            };
            if let Some(notify) = watched.get(&key) {
                notify.notify_waiters();
            }
        }
        if any {
            if let Some(notify) = watched.get(&Watched::Events) {
                notify.notify_waiters();
            }
        }
    }

    /// Wakes the event streams: a token may have been revoked.
    pub(super) fn changed_access(&self) {
        if let Some(notify) = self.lock().get(&Watched::Events) {
            notify.notify_waiters();
        }
    }

    /// Wakes every watcher (the state was replaced without events).
    pub(super) fn changed_all(&self) {
        for notify in self.lock().values() {
            notify.notify_waiters();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Watched, Arc<Notify>>> {
        // The map holds no invariant a panicking holder could break halfway.
        self.watched
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Watching {
    /// Resolves at the next change of the path after this call (a `Notified` receives every
    /// `notify_waiters` made after it was created, polled or not). Create it before reading
    /// the state and await it after, so a change in between is not missed.
    pub fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        let mut watched = self.watch.lock();
        // The map's own reference and this one: nobody else watches the path any more.
        if Arc::strong_count(&self.notify) == 2 {
            watched.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn event(namespace: &str, kind: EventKind) -> Event {
        Event {
            revision: 1,
            time_ms: 0,
            namespace: Namespace::new(namespace).expect("a namespace"),
            kind,
            by: None,
        }
    }

    fn released(namespace: &str, resource: &str) -> Event {
        let resource = ResourcePath::new(resource).expect("a path");
        event(namespace, EventKind::Released { resource, fence: 1 })
    }

    fn task_event(namespace: &str, queue: &str) -> Event {
        let queue = Name::new("queue", queue).expect("a queue name");
        let task_id = Name::new("task id", "t-1").expect("a task id");
        event(namespace, EventKind::TaskEnqueued { queue, task_id })
    }

    async fn woken(changed: tokio::sync::futures::Notified<'_>) -> bool {
        tokio::time::timeout(Duration::from_millis(20), changed)
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_watcher_is_woken_by_its_own_path_only_and_forgotten_when_dropped() {
        let watch = ChangeWatch::default();
        let namespace = Namespace::new("default").expect("a namespace");
        let hot = ResourcePath::new("hot/lock").expect("a path");
        let first = watch.watch(&namespace, &hot);
        let second = watch.watch(&namespace, &hot);

        // Another path, the same path in another namespace: nobody wakes.
        let changed = first.changed();
        watch.changed(&[
            released("default", "hot/other"),
            released("team-b", "hot/lock"),
        ]);
        assert!(!woken(changed).await);

        // A change made after the future was created but before it is awaited is not lost, and
        // wakes every watcher of the path.
        let (one, two) = (first.changed(), second.changed());
        watch.changed(&[released("default", "hot/lock")]);
        assert!(woken(one).await);
        assert!(woken(two).await);

        // A snapshot install wakes everyone.
        let changed = second.changed();
        watch.changed_all();
        assert!(woken(changed).await);

        drop(first);
        assert_eq!(watch.lock().len(), 1, "still watched by the second");
        drop(second);
        assert!(watch.lock().is_empty(), "nobody watches the path any more");
    }

    #[tokio::test]
    async fn a_queue_watcher_is_woken_by_its_queues_task_events_only() {
        let watch = ChangeWatch::default();
        let namespace = Namespace::new("default").expect("a namespace");
        let jobs = watch.watch_queue(
            &namespace,
            &Name::new("queue", "jobs").expect("a queue name"),
        );
        // A lease path of the same name is another thing to watch.
        let path = watch.watch(&namespace, &ResourcePath::new("jobs").expect("a path"));

        let (queue_changed, path_changed) = (jobs.changed(), path.changed());
        watch.changed(&[task_event("default", "other"), task_event("team-b", "jobs")]);
        assert!(!woken(queue_changed).await, "another queue or namespace");
        assert!(!woken(path_changed).await);

        let (queue_changed, path_changed) = (jobs.changed(), path.changed());
        watch.changed(&[released("default", "jobs")]);
        assert!(
            !woken(queue_changed).await,
            "a lease event is not the queue's"
        );
        assert!(woken(path_changed).await);

        let (queue_changed, path_changed) = (jobs.changed(), path.changed());
        watch.changed(&[task_event("default", "jobs")]);
        assert!(woken(queue_changed).await);
        assert!(!woken(path_changed).await, "a task event is not the path's");

        let changed = jobs.changed();
        watch.changed_all();
        assert!(woken(changed).await);
        drop((jobs, path));
        assert!(watch.lock().is_empty());
    }

    #[tokio::test]
    async fn an_events_watcher_is_woken_by_any_event_and_only_by_events() {
        let watch = ChangeWatch::default();
        let stream = watch.watch_events();
        let changed = stream.changed();
        watch.changed(&[]);
        assert!(!woken(changed).await, "an entry without events");
        for event in [released("team-b", "x"), task_event("default", "jobs")] {
            let changed = stream.changed();
            watch.changed(std::slice::from_ref(&event));
            assert!(woken(changed).await, "{event:?}");
        }
        drop(stream);
        assert!(watch.lock().is_empty());
    }
}
