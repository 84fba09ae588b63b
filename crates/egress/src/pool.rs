//! A small pool of blocking worker threads. Starting a thread costs tens of
//! microseconds on a VM (stack mapping, first-touch page faults); a new
//! egress connection needs two, so idle workers are kept for reuse. The pool
//! grows without bound (one thread per live connection direction, as with
//! plain spawning) and idle workers exit after [`IDLE_EXIT`].

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::THREAD_STACK;

/// How long an idle worker waits for work before exiting.
pub(crate) const IDLE_EXIT: Duration = Duration::from_secs(30);

type Job = Box<dyn FnOnce() + Send + 'static>;

#[derive(Clone)]
pub(crate) struct Pool {
    inner: Arc<Inner>,
}

struct Inner {
    name: &'static str,
    tx: Sender<Job>,
    rx: Mutex<Receiver<Job>>,
    /// Workers waiting for a job, minus jobs sent and not yet taken.
    idle: AtomicUsize,
}

impl Pool {
    pub(crate) fn new(name: &'static str) -> Self {
        let (tx, rx) = channel();
        Self {
            inner: Arc::new(Inner {
                name,
                tx,
                rx: Mutex::new(rx),
                idle: AtomicUsize::new(0),
            }),
        }
    }

    /// Runs `job` on an idle worker, or on a new thread when none is idle.
    pub(crate) fn run(&self, job: impl FnOnce() + Send + 'static) -> io::Result<()> {
        let job: Job = Box::new(job);
        if claim(&self.inner.idle) {
            // A worker is committed to take it: the receiver lives in `inner`,
            // so this send cannot fail while `self` exists.
            return self
                .inner
                .tx
                .send(job)
                .map_err(|_| io::Error::other("worker pool channel closed"));
        }
        let inner = Arc::clone(&self.inner);
        std::thread::Builder::new()
            .name(self.inner.name.into())
            .stack_size(THREAD_STACK)
            .spawn(move || {
                job();
                worker(&inner);
            })
            .map(drop)
    }
}

/// Takes one idle slot if there is one.
fn claim(idle: &AtomicUsize) -> bool {
    idle.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
        .is_ok()
}

fn worker(inner: &Inner) {
    loop {
        inner.idle.fetch_add(1, Ordering::AcqRel);
        loop {
            let got = match inner.rx.lock() {
                Ok(rx) => rx.recv_timeout(IDLE_EXIT),
                Err(_) => return,
            };
            match got {
                Ok(job) => {
                    job();
                    break;
                }
                // Leave only if no job is on its way to an idle worker.
                Err(RecvTimeoutError::Timeout) if claim(&inner.idle) => return,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::mpsc::sync_channel;

    #[test]
    fn jobs_run_and_workers_are_reused() {
        let pool = Pool::new("test-pool");
        let (tx, rx) = sync_channel(0);
        for i in 0..50 {
            let tx = tx.clone();
            pool.run(move || tx.send((i, std::thread::current().id())).unwrap())
                .unwrap();
            let (got, _) = rx.recv().unwrap();
            assert_eq!(got, i);
        }
        // Many jobs at once, each blocking until all have started.
        let n = 20;
        let barrier = Arc::new(std::sync::Barrier::new(n + 1));
        for _ in 0..n {
            let b = barrier.clone();
            pool.run(move || {
                b.wait();
            })
            .unwrap();
        }
        barrier.wait();
    }
}
