//! Group commit: the writes of every thread that records to one store go
//! into as few transactions as the load allows.
//!
//! A transaction's fixed cost (its locks, the WAL frames of the pages every
//! record touches: the chain head, the last leaf of the table and of its
//! indexes, the commit) is most of what one record costs. Under `serve`
//! every session writes a call's start (on its way to the server) and its
//! outcome (in the background) to the one store of its policy, so at many
//! clients many writes are waiting at the same moment. Here each waits in
//! one queue; a thread that finds no transaction under way writes all that
//! is queued, its own included, in one, and the others wait for it and take
//! their answers. Nobody waits for a batch to fill: alone, a write is a
//! transaction of its own at once, as before.
//!
//! Every write returns only once the transaction that holds it ended, so a
//! call's start is committed before [`crate::Sink::commit`] answers `Ok`
//! (the relay's fail-closed rule), and an error reaches the commit it is
//! about. The order of the queue is the order of the log.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};

use crate::{Event, Unwritten};

/// One write handed to the group.
#[derive(Debug)]
pub(crate) enum Write {
    /// [`crate::Sink::record`]: never fails (kept in memory on an error).
    Record(Event),
    /// [`crate::Sink::commit`]: written, or refused with why.
    Commit(Event),
}

/// The writes of one transaction, in order, each with the ticket of the
/// call that queued it.
pub(crate) type Batch = Vec<(u64, Write)>;

/// The answers of a batch's commits, by ticket.
pub(crate) type Answers = Vec<(u64, Result<(), Unwritten>)>;

#[derive(Debug, Default)]
struct Queue {
    waiting: Batch,
    /// The last ticket handed out.
    last: u64,
    /// A thread is writing a batch now.
    writing: bool,
    /// Every ticket up to this one is written (or refused).
    done_through: u64,
    /// Commits' answers not yet taken by their callers.
    answers: HashMap<u64, Result<(), Unwritten>>,
}

/// The queue of one store, shared by every thread that writes to it.
#[derive(Debug, Default)]
pub(crate) struct Group {
    queue: Mutex<Queue>,
    turn: Condvar,
}

/// Gives the writer's turn back if its write unwinds, so the others do
/// not wait for ever.
struct Turn<'a>(&'a Group);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut q = self.0.lock();
        if q.writing {
            q.writing = false;
            self.0.turn.notify_all();
        }
    }
}

impl Group {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `writes` (in order, together) and returns once a transaction
    /// holding them ended: written by this thread (with everything queued
    /// meanwhile) when no other is writing, else by the one that is or the
    /// next. `write` writes one batch and answers its commits. Returns the
    /// answer of the commit among `writes`, if there is one.
    pub(crate) fn submit(
        &self,
        writes: Vec<Write>,
        write: impl Fn(Batch) -> Answers,
    ) -> Option<Result<(), Unwritten>> {
        let commits = writes.iter().any(|w| matches!(w, Write::Commit(_)));
        let mut q = self.lock();
        q.last += 1;
        let ticket = q.last;
        q.waiting.extend(writes.into_iter().map(|w| (ticket, w)));
        loop {
            if q.done_through >= ticket {
                return if commits {
                    q.answers.remove(&ticket)
                } else {
                    None
                };
            }
            if q.writing {
                q = self.turn.wait(q).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            // our turn: everything queued, ours included (not yet written:
            // done_through < ticket), in one transaction
            q.writing = true;
            let batch = std::mem::take(&mut q.waiting);
            let through = q.last;
            drop(q);
            let turn = Turn(self);
            let answers = write(batch);
            q = self.lock();
            q.answers.extend(answers);
            q.done_through = through;
            q.writing = false;
            std::mem::forget(turn);
            self.turn.notify_all();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn ev(n: i64) -> Event {
        Event {
            time_ms: n,
            ..Event::default()
        }
    }

    #[test]
    fn alone_a_write_is_a_batch_of_its_own_and_a_commit_gets_its_answer() {
        let g = Group::default();
        let seen = Mutex::new(Vec::new());
        let answer = g.submit(vec![Write::Commit(ev(7))], |batch| {
            seen.lock().unwrap().push(batch.len());
            batch
                .into_iter()
                .map(|(t, _)| {
                    let e = crate::Error::io("write", std::path::Path::new("x"))(
                        std::io::Error::other("full"),
                    );
                    (t, Err(Unwritten::from(e)))
                })
                .collect()
        });
        assert!(answer.unwrap().is_err());
        assert_eq!(*seen.lock().unwrap(), vec![1]);
        let none = g.submit(vec![Write::Record(ev(1)), Write::Record(ev(2))], |batch| {
            seen.lock().unwrap().push(batch.len());
            Vec::new()
        });
        assert!(none.is_none());
        assert_eq!(*seen.lock().unwrap(), vec![1, 2]);
    }

    #[test]
    fn writes_queued_while_one_is_written_go_together_in_order() {
        // The first writer holds its transaction until the others queued;
        // the next transaction holds all of theirs, each thread's in order.
        let g = Arc::new(Group::default());
        let log = Arc::new(Mutex::new(Vec::<Vec<i64>>::new()));
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let go_rx = Mutex::new(go_rx);
        let first = {
            let (g, log) = (g.clone(), log.clone());
            std::thread::spawn(move || {
                g.submit(vec![Write::Commit(ev(0))], |batch| {
                    let _ = started_tx.send(());
                    go_rx.lock().unwrap().recv().unwrap();
                    log.lock()
                        .unwrap()
                        .push(batch.iter().map(|(_, w)| time(w)).collect());
                    batch.into_iter().map(|(t, _)| (t, Ok(()))).collect()
                })
            })
        };
        started_rx.recv().unwrap();
        let others: Vec<_> = (1..=3)
            .map(|n| {
                let (g, log) = (g.clone(), log.clone());
                std::thread::spawn(move || {
                    g.submit(
                        vec![Write::Record(ev(n * 10)), Write::Commit(ev(n * 10 + 1))],
                        |batch| {
                            log.lock()
                                .unwrap()
                                .push(batch.iter().map(|(_, w)| time(w)).collect());
                            batch.into_iter().map(|(t, _)| (t, Ok(()))).collect()
                        },
                    )
                })
            })
            .collect();
        // all three queued behind the first
        while g.lock().waiting.len() < 6 {
            std::thread::yield_now();
        }
        go_tx.send(()).unwrap();
        assert!(first.join().unwrap().unwrap().is_ok());
        for o in others {
            assert!(o.join().unwrap().unwrap().is_ok());
        }
        let log = log.lock().unwrap();
        assert_eq!(log.len(), 2, "{log:?}");
        assert_eq!(log[0], vec![0]);
        let mut second = log[1].clone();
        assert_eq!(second.len(), 6);
        for pair in second.chunks(2) {
            assert_eq!(
                pair[1],
                pair[0] + 1,
                "a thread's writes stay together, in order"
            );
        }
        second.sort_unstable();
        assert_eq!(second, vec![10, 11, 20, 21, 30, 31]);
    }

    fn time(w: &Write) -> i64 {
        match w {
            Write::Record(e) | Write::Commit(e) => e.time_ms,
        }
    }
}
