//! The state of one request that the stages share: the part its handle holds (enough to cancel
//! it), the rest the stages hold, and the admission slot it occupies on stage 0.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::chunk_buffer::{ChunkBuffer, ChunkPolicy, Signal};
use super::metrics::ArTiming;
use super::stages::lock;
use super::{EngineEvent, EngineRequest, FinishReason};

/// What stage 0 reports when it lets go of a request.
#[derive(Debug, Clone)]
pub(crate) struct ArOutcome {
    pub reason: FinishReason,
    pub timing: ArTiming,
}

/// The part of a request that its handle holds: enough to cancel it. The stages hold the rest
/// ([`RequestShared`], including the event sender), so if every stage lets go of a request
/// without finishing it (a stage thread died), the handle's channel disconnects instead of hanging.
pub(crate) struct RequestCore {
    pub id: u64,
    pub buffer: ChunkBuffer<Vec<u32>>,
    cancelled: AtomicBool,
}

impl RequestCore {
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
        // Drops queued frames and wakes both stages.
        self.buffer.cancel();
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }
}

/// State of one request held by the stages (and their inboxes).
pub(crate) struct RequestShared {
    pub core: Arc<RequestCore>,
    pub request: EngineRequest,
    events: Sender<EngineEvent>,
    pub submitted: Instant,
    ar_outcome: Mutex<Option<ArOutcome>>,
    /// Receives each frame's codes as stage 0 hands them to stage 1 ([`super::Engine::submit_tapped`]).
    pub codes_tap: Option<Sender<Vec<u32>>>,
    /// The place the request holds on stage 0 (waiting or running) until stage 0 lets go.
    admission: Mutex<Option<Admission>>,
    /// Open text ([`super::Engine::submit_open`]): where its fragments arrive.
    pub text: Option<Arc<super::text_feed::TextFeed>>,
}

/// Stage 0's admission control: how many requests it holds (running + waiting) against its limit
/// `max_num_seqs + max_waiting`. Shared by the engine (which admits in `submit`) and the requests
/// (which give their place back when stage 0 lets go of them).
#[derive(Debug)]
pub(crate) struct AdmissionControl {
    held: AtomicUsize,
    limit: usize,
}

impl AdmissionControl {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(AdmissionControl {
            held: AtomicUsize::new(0),
            limit,
        })
    }

    /// Takes a place, or `Err(held)` when all `limit` places are taken.
    pub fn admit(self: &Arc<Self>) -> Result<Admission, usize> {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .map(|_| Admission(self.clone()))
    }

    /// Places taken now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }
}

/// One place on stage 0; given back when dropped.
#[derive(Debug)]
pub(crate) struct Admission(Arc<AdmissionControl>);

impl Drop for Admission {
    fn drop(&mut self) {
        self.0.held.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::ops::Deref for RequestShared {
    type Target = RequestCore;

    fn deref(&self) -> &RequestCore {
        &self.core
    }
}

impl RequestShared {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: u64,
        request: EngineRequest,
        policy: ChunkPolicy,
        capacity: usize,
        ar_signal: Arc<Signal>,
        dec_signal: Arc<Signal>,
        events: Sender<EngineEvent>,
        submitted: Instant,
        admission: Admission,
        codes_tap: Option<Sender<Vec<u32>>>,
        text: Option<Arc<super::text_feed::TextFeed>>,
    ) -> Self {
        RequestShared {
            core: Arc::new(RequestCore {
                id,
                buffer: ChunkBuffer::with_signals(policy, capacity, ar_signal, dec_signal),
                cancelled: AtomicBool::new(false),
            }),
            request,
            events,
            submitted,
            ar_outcome: Mutex::new(None),
            admission: Mutex::new(Some(admission)),
            codes_tap,
            text,
        }
    }

    pub(crate) fn send(&self, ev: EngineEvent) {
        // The handle may be gone; then nobody listens (and the request was cancelled on drop).
        let _ = self.events.send(ev);
    }

    pub(crate) fn ar_outcome(&self) -> Option<ArOutcome> {
        lock(&self.ar_outcome).clone()
    }

    /// Stage 0 lets go: record the outcome, then finish or cancel the buffer (which wakes stage 1).
    pub(crate) fn release_from_ar(&self, reason: FinishReason, timing: ArTiming) {
        let cancelled = reason == FinishReason::Cancelled;
        *lock(&self.ar_outcome) = Some(ArOutcome { reason, timing });
        lock(&self.admission).take();
        if let Some(feed) = &self.text {
            feed.close();
        }
        if cancelled {
            self.buffer.cancel();
        } else {
            self.buffer.finish();
        }
    }
}
