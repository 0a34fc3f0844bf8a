//! The state the element's three kinds of thread share: the streaming thread (sink pad: cues,
//! events), the synthesis workers (engine requests, audio into the timeline) and the source pad's
//! task (timeline → buffers).
//!
//! ```text
//! sink chain ─► Inner.jobs ─► synthesis workers ─► Engine ─► Timeline.add_audio
//!     └────────► Inner.timeline (cue at its PTS) ◄──────────── output task: next() ─► src pad
//! ```
//!
//! One mutex ([`Inner`]) and one condvar; every change that another thread may wait for calls
//! `notify_all`. Nobody holds the lock while pushing downstream, posting messages, or talking to
//! the engine.

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use crate::element_common::audio::SampleFormat;
use crate::element_common::backend::{Cancel, Request};
use crate::element_common::voice_clone::CloneSpec;
use crate::engine::{EngineRequest, FinishReason, Metrics};

use super::compress::Squeeze;
use super::cue_text::TextFormat;
use super::overflow::Overflow;
use super::timeline::Timeline;
use super::voice::VoiceChange;

/// A cue's synthesis, waiting for a worker.
pub(super) struct Job {
    pub id: u64,
    /// The [`Inner::epoch`] it was queued in (a flush makes it stale).
    pub epoch: u64,
    /// One request per piece of the cue (`split-sentences`), spoken back to back; at least one.
    pub requests: Vec<EngineRequest>,
    /// Base checkpoints: the reference voice, turned into the request's prompt by the worker.
    pub clone: Option<CloneSpec>,
    /// `overflow=compress` and a slot: the worker compresses the whole speech into it.
    pub squeeze: Option<Squeeze>,
    /// `input-mode=fragments`: the utterance whose text is still arriving (token mode: one open
    /// engine request; clause mode: a request per clause); `requests` is then empty.
    pub open: Option<Request>,
}

/// What the element knows of one cue beyond its place on the timeline (for its messages).
pub(super) struct CueInfo {
    pub text: String,
    /// The text buffer's PTS and duration.
    pub pts: Option<gst::ClockTime>,
    pub duration: Option<gst::ClockTime>,
    /// The engine's time to first audio, once reported.
    pub ttfa_ms: Option<f64>,
    /// How its synthesis ended, once it has.
    pub finish: Option<(FinishReason, Metrics)>,
    /// When it arrived.
    pub since: Instant,
}

/// Everything guarded by the one mutex.
pub(super) struct Inner {
    pub timeline: Timeline,
    /// The input segment, which the output carries (without its stop).
    pub segment: gst::FormattedSegment<gst::ClockTime>,
    /// The input segment's stop: cues at or past it are dropped.
    pub segment_stop: Option<gst::ClockTime>,
    /// A SEGMENT event has been received (the output task runs from then on).
    pub have_segment: bool,
    /// A new segment waiting for the output of the current one to end (the task swaps it in).
    pub next_segment: Option<gst::FormattedSegment<gst::ClockTime>>,
    /// The sink caps' text format.
    pub text_format: Option<TextFormat>,
    /// The negotiated output sample format.
    pub format: Option<SampleFormat>,
    /// The cues not yet over, by id.
    pub infos: HashMap<u64, CueInfo>,
    /// Cues waiting for a synthesis worker, in order.
    pub jobs: VecDeque<Job>,
    /// Cancels the requests in flight, by cue id.
    pub cancellers: HashMap<u64, Cancel>,
    /// Bumped by a flush: work of an older epoch is dropped.
    pub epoch: u64,
    pub flushing: bool,
    /// The element is stopping: the workers exit.
    pub shutdown: bool,
    /// The last result of pushing downstream (the sink pad's chain returns an error from it).
    pub flow: Result<gst::FlowSuccess, gst::FlowError>,
    /// Serialized events from upstream, to be pushed when the output reaches their position.
    pub events: VecDeque<(u64, gst::Event)>,
    /// Upstream's answer to the LATENCY query: (live, min, max).
    pub upstream_latency: Option<(bool, gst::ClockTime, Option<gst::ClockTime>)>,
    /// The next cue id (from 1, per start).
    pub next_id: u64,
    /// The next buffer starts a new timeline (start, flush, new segment).
    pub discont: bool,
    /// The voice in effect for the next cue (events and speaker changes).
    pub voice: VoiceChange,
}

impl Inner {
    pub fn new(policy: Overflow) -> Inner {
        Inner {
            timeline: Timeline::new(policy),
            segment: gst::FormattedSegment::new(),
            segment_stop: None,
            have_segment: false,
            next_segment: None,
            text_format: None,
            format: None,
            infos: HashMap::new(),
            jobs: VecDeque::new(),
            cancellers: HashMap::new(),
            epoch: 0,
            flushing: false,
            shutdown: false,
            flow: Ok(gst::FlowSuccess::Ok),
            events: VecDeque::new(),
            upstream_latency: None,
            next_id: 1,
            discont: true,
            voice: VoiceChange::default(),
        }
    }

    /// Drops every cue, job and queued event, cancels the requests in flight and starts a new,
    /// empty timeline (flush, stop). Settings that outlive a flush (caps, voice) stay.
    pub fn reset(&mut self, policy: Overflow) {
        self.epoch += 1;
        for c in self.cancellers.values() {
            c.cancel();
        }
        self.cancellers.clear();
        self.jobs.clear();
        self.infos.clear();
        self.events.clear();
        self.next_segment = None;
        self.segment_stop = None;
        self.have_segment = false;
        self.timeline = Timeline::new(policy);
        self.flow = Ok(gst::FlowSuccess::Ok);
        self.discont = true;
    }
}

/// The mutex and the condvar.
pub(super) struct Shared {
    inner: Mutex<Inner>,
    pub cond: Condvar,
}

impl Shared {
    pub fn new(policy: Overflow) -> Shared {
        Shared {
            inner: Mutex::new(Inner::new(policy)),
            cond: Condvar::new(),
        }
    }

    /// Locks the state. A poisoned lock (a panic while it was held) is taken over: every reader
    /// re-checks what it reads.
    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits on the condvar (with an optional timeout).
    pub fn wait<'a>(
        &self,
        guard: MutexGuard<'a, Inner>,
        timeout: Option<std::time::Duration>,
    ) -> MutexGuard<'a, Inner> {
        match timeout {
            Some(t) => {
                self.cond
                    .wait_timeout(guard, t)
                    .unwrap_or_else(|p| p.into_inner())
                    .0
            }
            None => self.cond.wait(guard).unwrap_or_else(|p| p.into_inner()),
        }
    }
}
