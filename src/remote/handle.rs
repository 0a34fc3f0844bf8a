//! The receiving end of one streaming request, and its cancel switch.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::engine::{EngineEvent, FinishReason, Metrics};

/// How long after a cancel the handle waits for the request thread's own `Finished` before it
/// reports `Finished { Cancelled }` itself (the thread may be inside a name lookup or a TCP
/// connect, which nothing interrupts; it ends by itself within the server timeout).
pub const CANCEL_REPORT: Duration = Duration::from_millis(250);

/// Shared by a request's thread, its handle and its cancellers.
#[derive(Default)]
pub(crate) struct CancelState {
    inner: Mutex<CancelInner>,
    wake: Condvar,
}

#[derive(Default)]
struct CancelInner {
    cancelled_at: Option<Instant>,
    /// The agent of the attempt in flight: shutting it down closes its socket, which unblocks a
    /// read or write at once.
    agent: Option<ureq::Agent>,
}

impl CancelState {
    fn lock(&self) -> MutexGuard<'_, CancelInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn cancel(&self) {
        let agent = {
            let mut g = self.lock();
            g.cancelled_at.get_or_insert_with(Instant::now);
            g.agent.take()
        };
        if let Some(a) = agent {
            a.shutdown();
        }
        self.wake.notify_all();
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.lock().cancelled_at.is_some()
    }

    fn cancelled_at(&self) -> Option<Instant> {
        self.lock().cancelled_at
    }

    /// Makes `agent` the one a cancel shuts down; false (and the agent shut down) when the
    /// request is already cancelled.
    pub(crate) fn set_agent(&self, agent: ureq::Agent) -> bool {
        let mut g = self.lock();
        if g.cancelled_at.is_some() {
            drop(g);
            agent.shutdown();
            return false;
        }
        g.agent = Some(agent);
        true
    }

    /// Sleeps for `d` unless cancelled first; returns whether the full time passed.
    pub(crate) fn sleep(&self, d: Duration) -> bool {
        let until = Instant::now() + d;
        let mut g = self.lock();
        while g.cancelled_at.is_none() {
            let now = Instant::now();
            if now >= until {
                return true;
            }
            g = self
                .wake
                .wait_timeout(g, until - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        false
    }
}

/// Cancels one request from any thread: closes its connection (a blocked read returns at once)
/// and stops its retries. Cheap to clone; idempotent.
#[derive(Clone)]
pub struct RemoteCanceller {
    pub(crate) state: Arc<CancelState>,
}

impl RemoteCanceller {
    /// Cancels the request; its handle then receives `Finished { reason: Cancelled }` within
    /// [`CANCEL_REPORT`] (unless it had already finished).
    pub fn cancel(&self) {
        self.state.cancel();
    }
}

impl fmt::Debug for RemoteCanceller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteCanceller")
            .field("cancelled", &self.state.is_cancelled())
            .finish()
    }
}

/// The events of one utterance synthesised by the server, in the order and form of the local
/// engine's [`RequestHandle`](crate::engine::RequestHandle): `Started` when the server has
/// accepted the request (answered 200), `FirstAudio` right before the first `Audio`, more
/// `Audio` (contiguous, 24 kHz mono f32), and exactly one `Finished` last. Failures before the
/// audio (connection, TLS, HTTP errors) come as `Finished { Error }` without `Started`.
pub struct RemoteHandle {
    pub(crate) events: Receiver<EngineEvent>,
    pub(crate) canceller: RemoteCanceller,
    pub(crate) done: AtomicBool,
}

impl fmt::Debug for RemoteHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteHandle")
            .field("done", &self.done.load(Ordering::Relaxed))
            .field("cancelled", &self.canceller.state.is_cancelled())
            .finish()
    }
}

impl RemoteHandle {
    fn finish(&self, reason: FinishReason) -> EngineEvent {
        self.done.store(true, Ordering::Release);
        EngineEvent::Finished {
            reason,
            metrics: Metrics::default(),
        }
    }

    /// Waits up to `d` for the next event; `Disconnected` once `Finished` was delivered.
    pub fn recv_timeout(&self, d: Duration) -> Result<EngineEvent, RecvTimeoutError> {
        if self.done.load(Ordering::Acquire) {
            return Err(RecvTimeoutError::Disconnected);
        }
        let report_at = self
            .canceller
            .state
            .cancelled_at()
            .map(|t| t + CANCEL_REPORT);
        let wait = match report_at {
            Some(t) => d.min(t.saturating_duration_since(Instant::now())),
            None => d,
        };
        match self.events.recv_timeout(wait) {
            Ok(ev) => {
                if matches!(ev, EngineEvent::Finished { .. }) {
                    self.done.store(true, Ordering::Release);
                }
                Ok(ev)
            }
            Err(RecvTimeoutError::Timeout) => match report_at {
                Some(t) if Instant::now() >= t => Ok(self.finish(FinishReason::Cancelled)),
                _ => Err(RecvTimeoutError::Timeout),
            },
            Err(RecvTimeoutError::Disconnected) => Ok(self.finish(FinishReason::Error(
                "the request thread ended without finishing the utterance".to_string(),
            ))),
        }
    }

    /// Blocks for the next event; `None` once `Finished` was delivered.
    pub fn recv(&self) -> Option<EngineEvent> {
        loop {
            match self.recv_timeout(Duration::from_secs(3600)) {
                Ok(ev) => return Some(ev),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return None,
            }
        }
    }

    /// Whether `Finished` was delivered.
    pub fn is_finished(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Cancels the request (see [`RemoteCanceller::cancel`]).
    pub fn cancel(&self) {
        self.canceller.cancel();
    }

    /// A cancel handle usable from other threads.
    pub fn canceller(&self) -> RemoteCanceller {
        self.canceller.clone()
    }

    /// Drains events until `Finished`: the concatenated audio, the reason and the metrics.
    /// `None` if the audio chunks were not contiguous.
    pub fn collect(&self) -> Option<(Vec<f32>, FinishReason, Metrics)> {
        let mut audio = Vec::new();
        while let Some(ev) = self.recv() {
            match ev {
                EngineEvent::Audio(c) => {
                    if c.offset != audio.len() as u64 {
                        return None;
                    }
                    audio.extend_from_slice(&c.samples);
                }
                EngineEvent::Finished { reason, metrics } => {
                    return Some((audio, reason, metrics));
                }
                EngineEvent::Started | EngineEvent::FirstAudio { .. } => {}
            }
        }
        None
    }
}

impl Drop for RemoteHandle {
    /// Dropping an unfinished handle cancels its request.
    fn drop(&mut self) {
        if !self.done.load(Ordering::Acquire) {
            self.canceller.cancel();
        }
    }
}
