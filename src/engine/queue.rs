//! A stage's inbox: the requests (and, on stage 0, the voice-clone encoding jobs) queued for it,
//! and the [`Signal`] that wakes the stage thread.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use super::chunk_buffer::Signal;
use super::request::RequestShared;
use super::stage0::EncodeJob;
use super::stages::lock;

#[derive(Default)]
struct QueueState {
    items: VecDeque<Arc<RequestShared>>,
    /// Stage 0 only: references to encode, served before the next round of frames.
    jobs: VecDeque<EncodeJob>,
    shutdown: bool,
    /// The stage thread has exited; nothing will serve this queue any more.
    dead: bool,
}

/// A stage's inbox.
pub(crate) struct StageQueue {
    state: Mutex<QueueState>,
    pub signal: Arc<Signal>,
}

impl StageQueue {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(StageQueue {
            state: Mutex::new(QueueState::default()),
            signal: Signal::new(),
        })
    }

    /// Queues a request; refused when the stage thread has exited.
    pub fn push(&self, r: Arc<RequestShared>) -> Result<(), Arc<RequestShared>> {
        {
            let mut g = lock(&self.state);
            if g.dead || g.shutdown {
                return Err(r);
            }
            g.items.push_back(r);
        }
        self.signal.notify();
        Ok(())
    }

    /// Queues an encoding job; refused when the stage thread has exited or is shutting down.
    pub fn push_job(&self, job: EncodeJob) -> Result<(), EncodeJob> {
        {
            let mut g = lock(&self.state);
            if g.dead || g.shutdown {
                return Err(job);
            }
            g.jobs.push_back(job);
        }
        self.signal.notify();
        Ok(())
    }

    pub(crate) fn take_jobs(&self) -> Vec<EncodeJob> {
        lock(&self.state).jobs.drain(..).collect()
    }

    pub fn shut_down(&self) {
        lock(&self.state).shutdown = true;
        self.signal.notify();
    }

    /// Whether [`Self::shut_down`] was called.
    pub(crate) fn is_shut_down(&self) -> bool {
        lock(&self.state).shutdown
    }

    /// Whether requests wait to be drained.
    pub(crate) fn has_requests(&self) -> bool {
        !lock(&self.state).items.is_empty()
    }

    pub(crate) fn drain(&self) -> (Vec<Arc<RequestShared>>, bool) {
        let mut g = lock(&self.state);
        (g.items.drain(..).collect(), g.shutdown)
    }
}

/// Marks a stage's queue dead when its thread exits (normally or by a panic) and drops what is
/// still queued, so that no request waits on a stage that is gone.
pub(crate) struct DeadOnExit(pub(crate) Arc<StageQueue>);

impl Drop for DeadOnExit {
    fn drop(&mut self) {
        let (left, jobs) = {
            let mut g = lock(&self.0.state);
            g.dead = true;
            (std::mem::take(&mut g.items), std::mem::take(&mut g.jobs))
        };
        // Unanswered jobs: their callers see the reply channel close.
        drop(jobs);
        for r in left {
            r.cancel();
        }
    }
}
