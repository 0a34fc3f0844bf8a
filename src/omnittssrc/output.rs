//! The element's output logic: from what the worker has queued ([`Item`]s, in stream order) and
//! the clock, what `create()` does next ([`Output::next`]): output a buffer of audio or of GAP
//! silence, end the stream, or wait. It keeps the stream's sample counter, the utterance being
//! output and the notices (bus messages, warnings) that go with each step; it does no I/O, so it
//! is tested without a pipeline.
//!
//! Non-live: the audio of each utterance, back to back, then EOS once nothing is left; PTS =
//! sample position × 10⁹ / 24000.
//!
//! Live: the output paces itself by the running time. The PTS of a buffer is the running time it
//! is output at, as GStreamer's live sources timestamp (BaseSrc's live sync, audiotestsrc
//! is-live=true): the first buffer's PTS is the running time of the first step, and each later
//! one's that plus its sample position × 10⁹ / 24000, so the timeline counts samples exactly; a
//! buffer is returned once the running time reaches its PTS. Between utterances, and before an
//! utterance whose text arrived at a later running time, GAP silence; an utterance whose audio is
//! late (past the buffer's PTS plus the latency) gets silence too: at its start (it waits in the
//! engine's queue behind other requests, or its first chunk is slow: the wait, reported in its
//! done message and warned once) or in its middle (underruns). An utterance's done
//! message spans its audio and the silence inserted into it (`samples` + `silence-samples`
//! samples from `pts`). After
//! PAUSED → PLAYING the timeline goes on where it stopped (the running time stood still); if the
//! running time moved on meanwhile (a pipeline without a start time, a clock jump), the timeline
//! jumps to it and that buffer is DISCONT.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use crate::element_common::audio::{OutBuffer, Samples, pts_of};
use crate::element_common::backend::OpenText;
use crate::element_common::messages::{Refusal, UtteranceDone};
use crate::engine::{FinishReason, Metrics};

/// What the worker hands to the output, in stream order.
#[derive(Debug)]
pub(super) enum Item {
    /// An utterance was accepted by the engine; live, it is due at sample `start_pos`. `open`:
    /// an open utterance's text (`append-text`), whose done message gives all of it, also when
    /// it is cancelled before the engine's done item.
    Started {
        id: u64,
        text: String,
        start_pos: u64,
        open: Option<Arc<OpenText>>,
    },
    /// 24 kHz mono samples in [-1, 1]; `pos` counts samples already turned into buffers.
    Audio { samples: Vec<f32>, pos: usize },
    /// The engine reported its time to first audio.
    FirstAudio { id: u64, ttfa_ms: f64 },
    /// The engine finished the utterance. `text`: its whole text when it was not known at its
    /// start (an open utterance's, `append-text`), for the done message.
    Done {
        id: u64,
        reason: FinishReason,
        metrics: Metrics,
        text: Option<String>,
    },
    /// The utterance was refused (when queued, or by the engine), nothing was started.
    Refused(Refusal),
}

/// What the output cannot see itself: the text the worker has not queued yet.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Upstream {
    /// No text is waiting and the worker is not working on any (non-live: the end is reached
    /// once the items are out).
    pub idle: bool,
    /// The worker is submitting an utterance (its Started item will follow).
    pub submitting: bool,
    /// Live: the sample position the next utterance not yet started is due at.
    pub next_start: Option<u64>,
}

/// What `create()` does next.
#[derive(Debug, PartialEq)]
pub(super) enum Step {
    /// Output this buffer.
    Buffer(OutBuffer),
    /// Non-live: everything has been spoken.
    Eos,
    /// Nothing to output yet: wait until the worker queues more, or (live) until the running
    /// time `until` at the latest, then ask again.
    Wait { until: Option<gst::ClockTime> },
    /// The element is unlocked (flushing, stopping): return FLUSHING.
    Flushing,
    /// The worker died: an element error with this text.
    Failed(String),
}

/// Something to tell the application (a bus message or a log line), produced with a step and
/// posted by the element without any lock held.
#[derive(Debug)]
pub(super) enum Notice {
    /// An utterance's first buffer is next; it starts at sample `pos`.
    Started {
        id: u64,
        text: String,
        pos: u64,
        pts: gst::ClockTime,
    },
    FirstAudio {
        id: u64,
        ttfa_ms: f64,
        pts: gst::ClockTime,
    },
    Done(Box<UtteranceDone>),
    Refused(Refusal),
    /// Live: the utterance's audio was late at sample `pos`; silence inserted (`count` so far).
    Underrun {
        id: u64,
        pos: u64,
        count: u32,
    },
    /// Live: the utterance's first audio came later than the latency; speech starts late, after
    /// silence (once per utterance: at its first silence buffer, or when it starts if silence
    /// was output for it before it started).
    LateFirstAudio {
        id: u64,
        latency: gst::ClockTime,
    },
}

/// The utterance being output.
#[derive(Debug)]
struct Current {
    id: u64,
    text: String,
    /// Sample position of its first buffer.
    start: u64,
    /// Audio samples output so far (silence not counted).
    samples_out: u64,
    /// Live mode: silence buffers inserted in its middle because audio was late.
    underruns: u32,
    /// Live mode: samples of silence inserted before its first audio (the wait).
    wait_samples: u64,
    /// Live mode: samples of silence inserted in all (the wait and the underruns).
    silence_samples: u64,
    /// The engine's time to first audio, once reported.
    ttfa_ms: Option<f64>,
    /// Its first-audio notice waits for its first audio buffer (whose PTS it carries): posted
    /// with that buffer's step, never for audio that is not output.
    first_audio_due: bool,
    /// When the output reached its start (for the done message of a cancelled utterance, whose
    /// engine metrics are dropped with it).
    since: Instant,
    /// An open utterance's text, still growing after its start (`append-text`).
    open: Option<Arc<OpenText>>,
}

impl Current {
    fn new(id: u64, text: String, start: u64, open: Option<Arc<OpenText>>) -> Current {
        Current {
            id,
            text,
            open,
            start,
            samples_out: 0,
            underruns: 0,
            wait_samples: 0,
            silence_samples: 0,
            ttfa_ms: None,
            first_audio_due: false,
            since: Instant::now(),
        }
    }
}

/// Live mode's clock.
#[derive(Debug)]
struct Live {
    /// The latency reported downstream: how late audio may be before silence replaces it.
    latency: gst::ClockTime,
    /// Where the timeline is anchored: taken at the first step, moved by a jump of the timeline,
    /// taken again after a flush that moved the running time (`flush`).
    anchor: Option<Anchor>,
    /// Where a flush is: text arriving from its start to the first step after its end is due at
    /// once; that step checks the running time against the timeline.
    flush: Flush,
    /// The running time when the stream was paused (PLAYING → PAUSED).
    paused_at: Option<gst::ClockTime>,
    /// How far the running time moved on while paused, for the next step to jump by.
    jump: Option<gst::ClockTime>,
}

/// Live: a flush, from FLUSH_START to the first step after FLUSH_STOP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flush {
    None,
    /// FLUSH_START came, FLUSH_STOP not yet.
    Started,
    /// FLUSH_STOP came; the next step has not run.
    Stopped,
}

/// Live: sample position `pos` is output at running time `at`; a later position `n` at
/// `at + (n × 10⁹ / rate − pos × 10⁹ / rate)`.
#[derive(Debug, Clone, Copy)]
struct Anchor {
    pos: u64,
    at: gst::ClockTime,
}

impl Anchor {
    /// The running time sample position `n` (≥ `pos`) is output at; counted from sample 0, so
    /// that every PTS less its sample position's time is the same (no rounding from `pos`).
    fn pts(self, n: u64, rate: u32) -> gst::ClockTime {
        self.at + (pts_of(n.max(self.pos), rate) - pts_of(self.pos, rate))
    }

    /// The sample position output at running time `now` (`pos` before `at`).
    fn pos_at(self, now: gst::ClockTime, rate: u32) -> u64 {
        self.pos + crate::element_common::audio::pos_of(now.saturating_sub(self.at), rate)
    }
}

/// The output logic of one stream (from start to stop).
#[derive(Debug)]
pub(super) struct Output {
    /// The model's sample rate, Hz: every PTS and duration is counted in it.
    rate: u32,
    samples_per_buffer: u64,
    live: Option<Live>,
    items: VecDeque<Item>,
    /// Samples in `items` not yet output.
    queued_samples: usize,
    /// Back-pressure bound for `queued_samples`.
    max_queued_samples: usize,
    /// The stream's sample counter: the offset of the next buffer.
    n: u64,
    /// The next buffer starts the timeline or follows a jump of it: DISCONT.
    discont: bool,
    current: Option<Current>,
    /// Live: the position of the first silence output while an utterance was due and not yet
    /// started (its Started item still to come: the worker submitting it, or still busy with a
    /// cancelled one). That silence is the next utterance's wait: it starts there.
    due_silence_from: Option<u64>,
    /// Non-live: EOS was returned.
    eos: bool,
}

impl Output {
    /// The output of a stream of buffers of at most `samples_per_buffer` samples; live with
    /// `live_latency` when `Some`, at `rate` Hz (the model's). The worker waits while
    /// `max_queued_samples` are queued.
    pub fn new(
        samples_per_buffer: u32,
        live_latency: Option<gst::ClockTime>,
        max_queued_samples: usize,
        rate: u32,
    ) -> Output {
        Output {
            rate,
            samples_per_buffer: samples_per_buffer.max(1) as u64,
            live: live_latency.map(|latency| Live {
                latency,
                anchor: None,
                flush: Flush::None,
                paused_at: None,
                jump: None,
            }),
            items: VecDeque::new(),
            queued_samples: 0,
            max_queued_samples,
            n: 0,
            discont: true,
            current: None,
            due_silence_from: None,
            eos: false,
        }
    }

    /// Whether `len` more samples may be queued now (always into an empty queue).
    pub fn has_room(&self, len: usize) -> bool {
        self.queued_samples == 0 || self.queued_samples + len <= self.max_queued_samples
    }

    /// Queues an item from the worker.
    pub fn push(&mut self, item: Item) {
        if let Item::Audio { samples, pos } = &item {
            self.queued_samples += samples.len() - pos;
        }
        self.items.push_back(item);
    }

    /// Non-live: the stream has ended (EOS returned); no more text is accepted.
    pub fn ended(&self) -> bool {
        self.eos
    }

    /// Whether utterance `id` is being output or has items queued here.
    pub fn holds(&self, id: u64) -> bool {
        self.current.as_ref().is_some_and(|c| c.id == id)
            || self.items.iter().any(|i| match i {
                Item::Started { id: u, .. } | Item::Done { id: u, .. } => *u == id,
                _ => false,
            })
    }

    /// The utterance being output, if any: `(id, text)`.
    pub fn in_progress(&self) -> Option<(u64, &str)> {
        self.current.as_ref().map(|c| (c.id, c.text.as_str()))
    }

    /// The utterances whose audio is queued here but not begun, in stream order: `(id, text)`.
    pub fn not_begun(&self) -> impl Iterator<Item = (u64, &str)> {
        self.items.iter().filter_map(|i| match i {
            Item::Started { id, text, .. } => Some((*id, text.as_str())),
            _ => None,
        })
    }

    /// Whether anything is queued or being output.
    pub fn busy(&self) -> bool {
        self.current.is_some() || !self.items.is_empty()
    }

    /// Live: the sample position that text arriving at running time `now` is due at (0 before the
    /// first step, and in non-live mode; the next sample from a flush's start to the first step
    /// after it, where the timeline may start again).
    pub fn arrival_pos(&self, now: Option<gst::ClockTime>) -> u64 {
        match (self.live.as_ref(), now) {
            (Some(live), _) if live.flush != Flush::None => self.n,
            (
                Some(Live {
                    anchor: Some(anchor),
                    ..
                }),
                Some(now),
            ) => anchor.pos_at(now, self.rate),
            _ => 0,
        }
    }

    /// Live: the stream is paused (PLAYING → PAUSED) at running time `now`.
    pub fn pause(&mut self, now: gst::ClockTime) {
        if let Some(live) = self.live.as_mut() {
            live.paused_at = Some(now);
        }
    }

    /// Live: the stream resumes (PAUSED → PLAYING) at running time `now`. A pipeline's running
    /// time stands still while it is paused; if it moved on by more than the latency (a pipeline
    /// with no start time, a clock that jumped), the timeline jumps by as much at the next step.
    pub fn resume(&mut self, now: gst::ClockTime) {
        if let Some(live) = self.live.as_mut()
            && let Some(paused_at) = live.paused_at.take()
        {
            let moved = now.saturating_sub(paused_at);
            live.jump = (moved > live.latency).then_some(moved);
        }
    }

    /// A flush ended: the buffer that was on its way when it began was dropped at the pad (its
    /// samples are missing from the timeline), so the next buffer is DISCONT. Live, where the
    /// running time of the next step is more than the latency away from the timeline's (a
    /// pipeline's flush with `reset_time` sets it back to 0), the timeline starts again there;
    /// the sample counter goes on.
    pub fn flush_stopped(&mut self) {
        self.discont = true;
        if let Some(live) = self.live.as_mut() {
            live.flush = Flush::Stopped;
        }
    }

    /// A flush began (FLUSH_START): live, text arriving from now until the first step after the
    /// FLUSH_STOP is due at once (the running time may start again from 0).
    pub fn flush_started(&mut self) {
        if let Some(live) = self.live.as_mut() {
            live.flush = Flush::Started;
        }
    }

    /// Removes the refusals still queued (an EOS event ends the stream before they are reached).
    pub fn take_refusals(&mut self) -> Vec<Refusal> {
        let mut refused = Vec::new();
        let mut kept = VecDeque::new();
        for item in self.items.drain(..) {
            match item {
                Item::Refused(r) => refused.push(r),
                other => kept.push_back(other),
            }
        }
        self.items = kept;
        refused
    }

    /// Drops everything queued and retires the current utterance; returns its done message
    /// (reason `cancelled`), with the figures the output saw (`samples_per_frame` turns its
    /// samples into frames).
    pub fn cancel(&mut self, samples_per_frame: usize) -> Option<UtteranceDone> {
        self.items.clear();
        self.queued_samples = 0;
        self.due_silence_from = None;
        let mut cur = self.current.take()?;
        if let Some(open) = &cur.open {
            // All its text so far: the engine's done item, which carries it, is dropped.
            cur.text = open.text();
        }
        let metrics = Metrics::seen(
            cur.samples_out,
            samples_per_frame,
            self.rate,
            cur.ttfa_ms,
            cur.since,
        );
        Some(self.done(cur, FinishReason::Cancelled, metrics))
    }

    /// PTS of sample position `n`: live, on the running-time timeline.
    fn pts(&self, n: u64) -> gst::ClockTime {
        match self.live.as_ref().and_then(|l| l.anchor) {
            Some(anchor) => anchor.pts(n, self.rate),
            None => pts_of(n, self.rate),
        }
    }

    fn done(&self, cur: Current, reason: FinishReason, metrics: Metrics) -> UtteranceDone {
        let pts = self.pts(cur.start);
        UtteranceDone {
            id: cur.id,
            text: cur.text,
            reason,
            metrics,
            samples: cur.samples_out,
            underruns: cur.underruns,
            wait_samples: cur.wait_samples,
            silence_samples: cur.silence_samples,
            pts,
            duration: self.pts(self.n).saturating_sub(pts),
            rate: self.rate,
            splittable: cur.open.is_none(),
        }
    }

    /// A buffer of `samples` at the sample counter, which it advances.
    fn emit(&mut self, samples: Samples) -> Step {
        let len = samples.len() as u64;
        let (pts, end) = (self.pts(self.n), self.pts(self.n + len));
        let buffer = OutBuffer {
            samples,
            offset: self.n,
            pts,
            duration: end - pts,
            discont: self.discont,
        };
        self.n += len;
        self.discont = false;
        Step::Buffer(buffer)
    }

    /// What to do next, at running time `now` (used in live mode only); notices to post go to
    /// `notices`, in stream order.
    pub fn next(&mut self, up: &Upstream, now: gst::ClockTime, notices: &mut Vec<Notice>) -> Step {
        let spb = self.samples_per_buffer;
        if let Some(live) = self.live.as_mut() {
            let n = self.n;
            if live.flush == Flush::Stopped {
                live.flush = Flush::None;
                // After a flush: the running time may have started again from 0.
                if let Some(anchor) = live.anchor {
                    let due = anchor.pts(n, self.rate);
                    if now + live.latency < due || now > due + live.latency {
                        live.anchor = None;
                        live.jump = None;
                    }
                }
            }
            let anchor = live.anchor.get_or_insert(Anchor { pos: n, at: now });
            if let Some(jump) = live.jump.take() {
                // The running time went on while the stream stood still: so does the timeline.
                anchor.at += jump;
                self.discont = true;
            }
            let due = anchor.pts(n, self.rate);
            if now < due {
                // Paced: the next buffer is output at its PTS.
                return Step::Wait { until: Some(due) };
            }
        }
        loop {
            let n = self.n;
            match self.items.front_mut() {
                Some(Item::Started { start_pos, .. })
                    if self.live.is_some() && *start_pos > n && self.current.is_none() =>
                {
                    // Live: the text arrived at a later running time; silence until then.
                    let len = (*start_pos - n).min(spb);
                    return self.emit(Samples::Silence(len as usize));
                }
                Some(Item::Audio { samples, pos }) => {
                    let len = (samples.len() - *pos).min(spb as usize);
                    let chunk = samples[*pos..*pos + len].to_vec();
                    *pos += len;
                    if *pos >= samples.len() {
                        self.items.pop_front();
                    }
                    self.queued_samples = self.queued_samples.saturating_sub(len);
                    let pts = self.pts(n);
                    if let Some(cur) = self.current.as_mut() {
                        cur.samples_out += len as u64;
                        if std::mem::take(&mut cur.first_audio_due)
                            && let Some(ttfa_ms) = cur.ttfa_ms
                        {
                            notices.push(Notice::FirstAudio {
                                id: cur.id,
                                ttfa_ms,
                                pts,
                            });
                        }
                    }
                    return self.emit(Samples::Audio(chunk));
                }
                Some(_) => {
                    if let Some(item) = self.items.pop_front() {
                        self.handle_event(item, notices);
                    }
                }
                None => return self.when_empty(up, now, notices),
            }
        }
    }

    /// Turns a non-audio item into notices and bookkeeping.
    fn handle_event(&mut self, item: Item, notices: &mut Vec<Notice>) {
        let n = self.n;
        match item {
            Item::Started {
                id,
                text,
                start_pos,
                open,
            } => {
                // Live: silence output since the utterance was due (not before its text came)
                // is its late start, counted as its wait (and warned, as that silence came only
                // after the latency).
                let start = self
                    .due_silence_from
                    .take()
                    .map_or(n, |from| from.max(start_pos).min(n));
                notices.push(Notice::Started {
                    id,
                    text: text.clone(),
                    pos: start,
                    pts: self.pts(start),
                });
                let mut cur = Current::new(id, text, start, open);
                let waited = n - start;
                if waited > 0
                    && let Some(live) = &self.live
                {
                    cur.wait_samples = waited;
                    cur.silence_samples = waited;
                    notices.push(Notice::LateFirstAudio {
                        id,
                        latency: live.latency,
                    });
                }
                self.current = Some(cur);
            }
            Item::FirstAudio { id, ttfa_ms } => {
                // The engine sends it right before the audio, which may not be queued yet: the
                // notice goes with the first audio buffer (an EOS event or a flush before that
                // drops the audio, and no message says it was output).
                let mut at = Some(n);
                if let Some(cur) = self.current.as_mut().filter(|c| c.id == id) {
                    cur.ttfa_ms = Some(ttfa_ms);
                    cur.first_audio_due = cur.samples_out == 0;
                    // Audio before it (never from the engine): its first sample's position.
                    at = (!cur.first_audio_due).then_some(cur.start + cur.wait_samples);
                }
                if let Some(at) = at {
                    notices.push(Notice::FirstAudio {
                        id,
                        ttfa_ms,
                        pts: self.pts(at),
                    });
                }
            }
            Item::Done {
                id,
                reason,
                metrics,
                text,
            } => {
                let mut cur = self
                    .current
                    .take()
                    .unwrap_or_else(|| Current::new(id, String::new(), n, None));
                if let Some(text) = text {
                    cur.text = text;
                }
                notices.push(Notice::Done(Box::new(self.done(cur, reason, metrics))));
            }
            Item::Refused(r) => notices.push(Notice::Refused(r)),
            // Output by `next()`, never handed here.
            Item::Audio { .. } => {}
        }
    }

    /// No item queued: EOS or wait (non-live); silence or wait (live).
    fn when_empty(
        &mut self,
        up: &Upstream,
        now: gst::ClockTime,
        notices: &mut Vec<Notice>,
    ) -> Step {
        let n = self.n;
        let spb = self.samples_per_buffer;
        let Some(live) = self.live.as_ref() else {
            if up.idle {
                self.eos = true;
                return Step::Eos;
            }
            return Step::Wait { until: None };
        };
        let due = self.current.is_some() || up.submitting || up.next_start.is_some_and(|s| s <= n);
        if !due {
            // Nothing is due, so no utterance is waiting.
            self.due_silence_from = None;
            let len = match up.next_start {
                Some(s) => (s - n).min(spb),
                None => spb,
            };
            return self.emit(Samples::Silence(len as usize));
        }
        // Audio is due: wait for it until this buffer's running time plus the latency.
        let deadline = self.pts(n) + live.latency;
        if now < deadline {
            return Step::Wait {
                until: Some(deadline),
            };
        }
        // Audio is late: keep the clock going with silence, counted in the utterance (or in
        // the next one to start, when its Started item has not come yet).
        let latency = live.latency;
        if self.current.is_none() {
            self.due_silence_from.get_or_insert(n);
        }
        if let Some(cur) = self.current.as_mut() {
            cur.silence_samples += spb;
            if cur.samples_out > 0 {
                cur.underruns += 1;
                notices.push(Notice::Underrun {
                    id: cur.id,
                    pos: n,
                    count: cur.underruns,
                });
            } else {
                if cur.wait_samples == 0 {
                    notices.push(Notice::LateFirstAudio {
                        id: cur.id,
                        latency,
                    });
                }
                cur.wait_samples += spb;
            }
        }
        self.emit(Samples::Silence(spb as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDLE: Upstream = Upstream {
        idle: true,
        submitting: false,
        next_start: None,
    };
    const BUSY: Upstream = Upstream {
        idle: false,
        submitting: false,
        next_start: None,
    };
    const T0: gst::ClockTime = gst::ClockTime::ZERO;

    fn ms(v: u64) -> gst::ClockTime {
        gst::ClockTime::from_mseconds(v)
    }

    fn started(id: u64, start_pos: u64) -> Item {
        Item::Started {
            id,
            text: format!("utterance {id}"),
            start_pos,
            open: None,
        }
    }

    fn audio(len: usize) -> Item {
        Item::Audio {
            samples: vec![0.25; len],
            pos: 0,
        }
    }

    fn done(id: u64) -> Item {
        Item::Done {
            id,
            reason: FinishReason::Eos,
            text: None,
            metrics: Metrics {
                frames: 7,
                ..Metrics::default()
            },
        }
    }

    /// The buffer of a step (panics on any other step).
    fn buffer(step: Step) -> OutBuffer {
        match step {
            Step::Buffer(b) => b,
            other => panic!("expected a buffer, got {other:?}"),
        }
    }

    #[test]
    fn non_live_audio_back_to_back_then_eos() {
        let mut out = Output::new(480, None, 10_000, 24_000);
        let mut notices = Vec::new();
        for item in [
            started(1, 0),
            Item::FirstAudio {
                id: 1,
                ttfa_ms: 5.0,
            },
            audio(1000),
        ] {
            out.push(item);
        }
        let mut n = 0;
        for (want_len, discont) in [(480, true), (480, false), (40, false)] {
            let b = buffer(out.next(&BUSY, T0, &mut notices));
            assert_eq!(b.samples, Samples::Audio(vec![0.25; want_len]));
            assert_eq!((b.offset, b.discont), (n, discont));
            assert_eq!(b.pts, pts_of(n, 24_000));
            assert_eq!(
                b.duration,
                pts_of(n + want_len as u64, 24_000) - pts_of(n, 24_000)
            );
            n += want_len as u64;
        }
        assert!(matches!(
            &notices[..],
            [
                Notice::Started { id: 1, pos: 0, .. },
                Notice::FirstAudio { id: 1, .. }
            ]
        ));
        notices.clear();
        // The worker is still busy: wait for it, never EOS.
        assert_eq!(
            out.next(&BUSY, T0, &mut notices),
            Step::Wait { until: None }
        );
        out.push(done(1));
        out.push(started(2, 0));
        out.push(audio(100));
        let b = buffer(out.next(&IDLE, T0, &mut notices));
        assert_eq!((b.offset, b.samples.len(), b.discont), (1000, 100, false));
        let [
            Notice::Done(d),
            Notice::Started {
                id: 2, pos: 1000, ..
            },
        ] = &notices[..]
        else {
            panic!("{notices:?}");
        };
        assert_eq!((d.id, d.samples, d.metrics.frames), (1, 1000, 7));
        assert_eq!((d.pts, d.duration), (T0, pts_of(1000, 24_000)));
        assert!(!out.ended());
        notices.clear();
        out.push(done(2));
        assert_eq!(out.next(&IDLE, T0, &mut notices), Step::Eos);
        assert!(out.ended());
        assert!(matches!(&notices[..], [Notice::Done(d)] if d.id == 2 && d.samples == 100));
    }

    #[test]
    fn a_refusal_keeps_its_place_in_the_stream() {
        let mut out = Output::new(480, None, 10_000, 24_000);
        let mut notices = Vec::new();
        out.push(started(1, 0));
        out.push(audio(10));
        out.push(done(1));
        out.push(Item::Refused(Refusal {
            id: 2,
            text: "bad".into(),
            error: "speaker 'x': unknown".into(),
        }));
        assert_eq!(buffer(out.next(&IDLE, T0, &mut notices)).samples.len(), 10);
        assert_eq!(notices.len(), 1, "only the start before the audio");
        assert_eq!(out.next(&IDLE, T0, &mut notices), Step::Eos);
        assert!(matches!(
            &notices[1..],
            [Notice::Done(_), Notice::Refused(Refusal { id: 2, .. })]
        ));
    }

    #[test]
    fn back_pressure_bounds_the_queue() {
        let mut out = Output::new(480, None, 1000, 24_000);
        assert!(out.has_room(5000), "an empty queue takes any chunk");
        out.push(audio(600));
        assert!(out.has_room(400));
        assert!(!out.has_room(401));
        let mut notices = Vec::new();
        out.next(&BUSY, T0, &mut notices);
        assert!(out.has_room(880), "output samples make room");
        assert!(!out.has_room(881));
    }

    /// The engine's FirstAudio comes right before its audio, and the output may see it alone:
    /// its notice waits for the first audio buffer and carries that buffer's PTS, so that an EOS
    /// or a flush in between never leaves a first-audio message for audio that was not output.
    #[test]
    fn first_audio_is_told_with_its_buffer() {
        for live in [false, true] {
            let latency = ms(80);
            let mut out = Output::new(480, live.then_some(latency), 10_000, 24_000);
            let mut notices = Vec::new();
            let r0 = ms(100);
            out.push(started(1, 0));
            out.push(Item::FirstAudio {
                id: 1,
                ttfa_ms: 7.0,
            });
            let step = out.next(&BUSY, r0, &mut notices);
            assert!(matches!(step, Step::Wait { .. }), "{step:?}");
            assert!(
                matches!(&notices[..], [Notice::Started { id: 1, .. }]),
                "live={live}: {notices:?}"
            );
            notices.clear();
            // Live: the audio is late, silence first; the message is the audio's, not the wait's.
            let mut t = r0;
            if live {
                t = r0 + latency;
                let b = buffer(out.next(&BUSY, t, &mut notices));
                assert_eq!(b.samples, Samples::Silence(480));
                assert!(
                    matches!(&notices[..], [Notice::LateFirstAudio { id: 1, .. }]),
                    "{notices:?}"
                );
                notices.clear();
                t += pts_of(480, 24_000);
            }
            out.push(audio(960));
            let b = buffer(out.next(&BUSY, t, &mut notices));
            assert_eq!(b.samples, Samples::Audio(vec![0.25; 480]));
            let [
                Notice::FirstAudio {
                    id: 1,
                    ttfa_ms,
                    pts,
                },
            ] = &notices[..]
            else {
                panic!("live={live}: {notices:?}");
            };
            assert_eq!((*ttfa_ms, *pts), (7.0, b.pts), "live={live}");
            notices.clear();
            buffer(out.next(&BUSY, t + pts_of(480, 24_000), &mut notices));
            assert!(notices.is_empty(), "told once: {notices:?}");
            // Done without audio after its FirstAudio: no first-audio message at all.
            out.push(done(1));
            out.push(started(2, 0));
            out.push(Item::FirstAudio {
                id: 2,
                ttfa_ms: 3.0,
            });
            out.push(done(2));
            notices.clear();
            let _ = out.next(&IDLE, t + pts_of(960, 24_000), &mut notices);
            let _ = out.next(&IDLE, t + pts_of(960, 24_000), &mut notices);
            assert!(
                !notices
                    .iter()
                    .any(|n| matches!(n, Notice::FirstAudio { id: 2, .. })),
                "live={live}: {notices:?}"
            );
        }
    }

    #[test]
    fn cancel_reports_what_was_output() {
        let mut out = Output::new(480, None, 10_000, 24_000);
        let mut notices = Vec::new();
        out.push(started(1, 0));
        out.push(Item::FirstAudio {
            id: 1,
            ttfa_ms: 12.5,
        });
        out.push(audio(1920 * 3));
        for _ in 0..8 {
            buffer(out.next(&BUSY, T0, &mut notices));
        }
        assert!(out.busy());
        let d = out.cancel(1920).expect("a current utterance");
        assert_eq!((d.id, d.reason.as_str()), (1, "cancelled"));
        assert_eq!((d.samples, d.metrics.frames), (3840, 2));
        assert_eq!(d.metrics.ttfa_ms, Some(12.5));
        assert!((d.metrics.audio_ms - 160.0).abs() < 1e-9);
        assert!(!out.busy(), "queued audio dropped");
        assert!(out.cancel(1920).is_none());
        assert_eq!(out.next(&IDLE, T0, &mut notices), Step::Eos);
    }

    /// Live: the step at the running time the next buffer is due (the pacing wait skipped).
    fn paced(out: &mut Output, up: &Upstream, notices: &mut Vec<Notice>) -> Step {
        match out.next(up, out.pts(out.n), notices) {
            Step::Wait { until: Some(t) } if t == out.pts(out.n) => out.next(up, t, notices),
            step => step,
        }
    }

    #[test]
    fn live_buffers_wait_for_their_running_time() {
        let mut out = Output::new(480, Some(ms(80)), 10_000, 24_000);
        let mut notices = Vec::new();
        let r0 = ms(30);
        // The first step starts the timeline at its running time.
        let b = buffer(out.next(&BUSY, r0, &mut notices));
        assert_eq!((b.offset, b.pts, b.discont), (0, r0, true));
        // The next buffer is due 20 ms later: wait until then, then output it.
        let due = r0 + pts_of(480, 24_000);
        assert_eq!(
            out.next(&BUSY, r0 + ms(5), &mut notices),
            Step::Wait { until: Some(due) }
        );
        let b = buffer(out.next(&BUSY, due, &mut notices));
        assert_eq!((b.offset, b.pts, b.discont), (480, due, false));
        assert_eq!(b.duration, pts_of(960, 24_000) - pts_of(480, 24_000));
    }

    #[test]
    fn live_silence_until_the_text_is_due() {
        let mut out = Output::new(480, Some(ms(80)), 10_000, 24_000);
        let mut notices = Vec::new();
        let r0 = ms(30);
        // Nothing queued: GAP silence, one full buffer each step, the first DISCONT.
        let b = buffer(out.next(&BUSY, r0, &mut notices));
        assert_eq!(
            (b.samples, b.offset, b.discont),
            (Samples::Silence(480), 0, true)
        );
        // Text arriving 30 ms after the start is due at sample 720.
        assert_eq!(out.arrival_pos(Some(r0 + ms(30))), 720);
        // The next utterance is due at 1000: silence up to it, then its audio.
        let waiting = Upstream {
            next_start: Some(1000),
            ..BUSY
        };
        assert_eq!(
            buffer(paced(&mut out, &waiting, &mut notices)).samples,
            Samples::Silence(480)
        );
        out.push(started(1, 1000));
        out.push(audio(100));
        assert_eq!(
            buffer(paced(&mut out, &BUSY, &mut notices)).samples,
            Samples::Silence(40)
        );
        assert!(notices.is_empty());
        let b = buffer(paced(&mut out, &BUSY, &mut notices));
        assert_eq!(
            (b.offset, b.samples.len(), b.pts),
            (1000, 100, r0 + pts_of(1000, 24_000))
        );
        // The started message has the PTS of the utterance's first buffer.
        assert!(matches!(
            &notices[..],
            [Notice::Started { id: 1, pos: 1000, pts, .. }] if *pts == b.pts
        ));
        // Live never ends by itself.
        out.push(done(1));
        let b = buffer(paced(&mut out, &IDLE, &mut notices));
        assert_eq!((b.offset, b.samples), (1100, Samples::Silence(480)));
        assert!(!out.ended());
    }

    #[test]
    fn live_late_audio_waits_for_the_deadline_then_underruns() {
        let latency = ms(80);
        let mut out = Output::new(480, Some(latency), 10_000, 24_000);
        let mut notices = Vec::new();
        let r0 = ms(10);
        // The worker is submitting: audio is due, wait until sample 0's time plus the latency.
        let submitting = Upstream {
            submitting: true,
            ..BUSY
        };
        assert_eq!(
            out.next(&submitting, r0, &mut notices),
            Step::Wait {
                until: Some(r0 + latency)
            }
        );
        out.push(started(1, 0));
        assert_eq!(
            out.next(&BUSY, r0 + ms(50), &mut notices),
            Step::Wait {
                until: Some(r0 + latency)
            }
        );
        // Past the deadline before any audio: speech starts late, silence keeps the clock.
        notices.clear();
        let b = buffer(out.next(&BUSY, r0 + latency, &mut notices));
        assert_eq!(b.samples, Samples::Silence(480));
        assert!(matches!(
            &notices[..],
            [Notice::LateFirstAudio { id: 1, .. }]
        ));
        notices.clear();
        out.push(audio(480));
        buffer(out.next(&BUSY, r0 + latency, &mut notices));
        // Audio ran out mid-utterance: the next buffer is due at 40 ms + latency.
        let deadline = r0 + pts_of(960, 24_000) + latency;
        assert_eq!(
            out.next(&BUSY, deadline - ms(1), &mut notices),
            Step::Wait {
                until: Some(deadline)
            }
        );
        let b = buffer(out.next(&BUSY, deadline, &mut notices));
        assert_eq!((b.offset, b.samples), (960, Samples::Silence(480)));
        assert!(matches!(
            &notices[..],
            [Notice::Underrun {
                id: 1,
                pos: 960,
                count: 1
            }]
        ));
        out.push(done(1));
        notices.clear();
        buffer(out.next(&IDLE, deadline, &mut notices));
        let [Notice::Done(d)] = &notices[..] else {
            panic!("{notices:?}");
        };
        // The late start is the wait, the gap in the middle an underrun.
        assert_eq!((d.samples, d.underruns), (480, 1));
        assert_eq!((d.wait_samples, d.silence_samples), (480, 960));
        assert_eq!((d.pts, d.duration), (r0, pts_of(1440, 24_000)));
    }

    /// Live: each step of `out` right at its buffer's deadline (running time plus latency),
    /// until the sample counter reaches `until` (notices to `notices`).
    fn late_steps(out: &mut Output, up: &Upstream, until: u64, notices: &mut Vec<Notice>) {
        while out.n < until {
            let pts = out.pts(out.n);
            let latency = out
                .live
                .as_ref()
                .map_or(gst::ClockTime::ZERO, |l| l.latency);
            buffer(out.next(up, pts + latency, notices));
        }
    }

    /// The done message among `notices` (panics when there is none).
    fn done_in(notices: &[Notice]) -> &UtteranceDone {
        notices
            .iter()
            .find_map(|n| match n {
                Notice::Done(d) => Some(&**d),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no done message: {notices:?}"))
    }

    #[test]
    fn live_silence_while_a_later_text_is_submitted_is_not_its_wait() {
        // The worker submits a text due at 2400 while the output is at 480 (downstream pulled
        // late): the silence before 2400 is not the text's wait, and no late start is warned.
        let mut out = Output::new(480, Some(ms(80)), 10_000, 24_000);
        let mut notices = Vec::new();
        let r0 = ms(10);
        buffer(out.next(&BUSY, r0, &mut notices));
        let submitting = Upstream {
            submitting: true,
            next_start: Some(2400),
            ..BUSY
        };
        late_steps(&mut out, &submitting, 1920, &mut notices);
        out.push(started(1, 2400));
        out.push(audio(480));
        out.push(done(1));
        late_steps(&mut out, &BUSY, 2880, &mut notices);
        buffer(out.next(&IDLE, out.pts(out.n) + ms(80), &mut notices));
        assert!(
            !notices
                .iter()
                .any(|n| matches!(n, Notice::LateFirstAudio { .. })),
            "{notices:?}"
        );
        let d = done_in(&notices);
        assert_eq!((d.wait_samples, d.silence_samples), (0, 0));
        assert_eq!(d.pts, r0 + pts_of(2400, 24_000));
    }

    #[test]
    fn live_wait_for_a_text_counts_from_its_due_time_across_a_refusal_before_it() {
        // Text A (due at 900) is refused by the engine; text B, due at 1000, was queued behind
        // it and waits for the worker: B's wait is the silence from 1000, not from the refusal.
        let mut out = Output::new(480, Some(ms(80)), 10_000, 24_000);
        let mut notices = Vec::new();
        buffer(out.next(&BUSY, ms(10), &mut notices));
        let a_due = Upstream {
            next_start: Some(900),
            ..BUSY
        };
        buffer(paced(&mut out, &a_due, &mut notices));
        late_steps(&mut out, &a_due, 1380, &mut notices);
        out.push(Item::Refused(Refusal {
            id: 1,
            text: "A".into(),
            error: "refused".into(),
        }));
        let b_due = Upstream {
            next_start: Some(1000),
            ..BUSY
        };
        late_steps(&mut out, &b_due, 2340, &mut notices);
        out.push(started(2, 1000));
        out.push(audio(480));
        out.push(done(2));
        late_steps(&mut out, &BUSY, 2820, &mut notices);
        buffer(out.next(&IDLE, out.pts(out.n) + ms(80), &mut notices));
        let d = done_in(&notices);
        assert_eq!(d.id, 2);
        assert_eq!((d.wait_samples, d.silence_samples), (1340, 1340));
        assert_eq!(d.pts, ms(10) + pts_of(1000, 24_000));
    }

    #[test]
    fn live_text_due_while_a_cancelled_utterance_ends_starts_at_its_due_time() {
        // `cancel` retires utterance 1 at once, but the worker is busy until the engine stops it
        // (a prefill in flight): the next text, due at sample 900, waits in the queue. The
        // silence output for it once due is its wait: it starts there, not where its Started
        // item comes, and the done message counts the wait.
        let latency = ms(80);
        let mut out = Output::new(480, Some(latency), 10_000, 24_000);
        let mut notices = Vec::new();
        let r0 = ms(10);
        out.push(started(1, 0));
        out.push(audio(480));
        buffer(out.next(&BUSY, r0, &mut notices));
        assert!(out.cancel(1920).is_some());
        notices.clear();
        // Utterance 1's worker is still busy; text 2 is queued, due at 900.
        let queued = Upstream {
            next_start: Some(900),
            ..BUSY
        };
        let b = buffer(paced(&mut out, &queued, &mut notices));
        assert_eq!((b.offset, b.samples), (480, Samples::Silence(420)));
        // Due from 900: silence only after the latency, three buffers of it.
        let mut silence_from = None;
        for _ in 0..3 {
            let pts = out.pts(out.n);
            assert_eq!(
                out.next(&queued, pts, &mut notices),
                Step::Wait {
                    until: Some(pts + latency)
                }
            );
            let b = buffer(out.next(&queued, pts + latency, &mut notices));
            assert_eq!(b.samples, Samples::Silence(480));
            silence_from.get_or_insert(b.offset);
        }
        assert_eq!(silence_from, Some(900));
        assert!(notices.is_empty(), "{notices:?}");
        // The worker is free: utterance 2 starts, its audio comes.
        out.push(started(2, 900));
        out.push(audio(480));
        out.push(done(2));
        let now = out.pts(out.n) + latency;
        let b = buffer(out.next(&BUSY, now, &mut notices));
        assert_eq!((b.offset, b.samples.len()), (2340, 480));
        assert!(
            matches!(
                &notices[..],
                [
                    Notice::Started { id: 2, pos: 900, pts, .. },
                    Notice::LateFirstAudio { id: 2, .. },
                ] if *pts == r0 + pts_of(900, 24_000)
            ),
            "{notices:?}"
        );
        notices.clear();
        buffer(out.next(&IDLE, now, &mut notices));
        let [Notice::Done(d)] = &notices[..] else {
            panic!("{notices:?}");
        };
        assert_eq!((d.samples, d.underruns), (480, 0));
        assert_eq!((d.wait_samples, d.silence_samples), (1440, 1440));
        assert_eq!(d.pts, r0 + pts_of(900, 24_000));
        assert_eq!(d.duration, pts_of(1920, 24_000));
    }

    #[test]
    fn live_wait_in_the_engine_queue_is_counted_warned_once_and_spans_the_done_message() {
        // An utterance queued behind other requests of a shared engine: no audio for 5 buffers
        // past its deadline. Silence keeps the clock; the wait is counted and warned once, and
        // the done message's samples + silence-samples make its duration.
        let latency = ms(80);
        let mut out = Output::new(480, Some(latency), 10_000, 24_000);
        let mut notices = Vec::new();
        let r0 = ms(10);
        out.push(started(1, 0));
        assert!(matches!(
            out.next(&BUSY, r0, &mut notices),
            Step::Wait { .. }
        ));
        let mut late = 0;
        for i in 0..5u64 {
            let b = buffer(out.next(&BUSY, r0 + pts_of(480 * i, 24_000) + latency, &mut notices));
            assert_eq!(b.samples, Samples::Silence(480));
            late += notices
                .iter()
                .filter(|n| matches!(n, Notice::LateFirstAudio { id: 1, .. }))
                .count();
            notices.clear();
        }
        assert_eq!(late, 1, "the wait is warned once");
        out.push(audio(960));
        out.push(done(1));
        let now = r0 + pts_of(480 * 7, 24_000);
        buffer(out.next(&BUSY, now, &mut notices));
        buffer(out.next(&BUSY, now, &mut notices));
        notices.clear();
        buffer(out.next(&IDLE, now, &mut notices));
        let [Notice::Done(d)] = &notices[..] else {
            panic!("{notices:?}");
        };
        assert_eq!(d.samples, 960);
        assert_eq!(d.underruns, 0);
        assert_eq!((d.wait_samples, d.silence_samples), (2400, 2400));
        assert_eq!(d.pts, r0);
        assert_eq!(d.duration, pts_of(d.samples + d.silence_samples, 24_000));
    }

    #[test]
    fn live_resume_continues_or_jumps_with_discont() {
        let latency = ms(80);
        let mut out = Output::new(480, Some(latency), 10_000, 24_000);
        let mut notices = Vec::new();
        let r0 = ms(10);
        buffer(out.next(&BUSY, r0, &mut notices));
        // Paused and resumed with the running time where it stopped: the timeline goes on,
        // however late the next step is (a sink holding the streaming thread).
        out.pause(r0 + ms(15));
        out.resume(r0 + ms(18));
        let due = r0 + pts_of(480, 24_000);
        let b = buffer(out.next(&BUSY, due + ms(150), &mut notices));
        assert_eq!((b.offset, b.pts, b.discont), (480, due, false));
        // A first PLAYING (no pause before it) is no jump either.
        out.resume(r0 + ms(900));
        let b = buffer(out.next(&BUSY, r0 + pts_of(960, 24_000), &mut notices));
        assert_eq!((b.pts, b.discont), (r0 + pts_of(960, 24_000), false));
        // The running time went on for 500 ms while paused: the timeline jumps by as much.
        out.pause(r0 + ms(70));
        out.resume(r0 + ms(570));
        let due = r0 + pts_of(1440, 24_000) + ms(500);
        assert_eq!(
            out.next(&BUSY, due - ms(10), &mut notices),
            Step::Wait { until: Some(due) }
        );
        let b = buffer(out.next(&BUSY, due, &mut notices));
        assert_eq!((b.offset, b.pts, b.discont), (1440, due, true));
        // Text arriving now is due at the next sample; then the timeline tiles again.
        assert_eq!(out.arrival_pos(Some(due + pts_of(480, 24_000))), 1920);
        let b = buffer(paced(&mut out, &BUSY, &mut notices));
        assert_eq!(
            (b.offset, b.pts, b.discont),
            (1920, due + pts_of(480, 24_000), false)
        );
        // Moving on by no more than the latency is no jump.
        out.pause(due);
        out.resume(due + latency);
        let b = buffer(out.next(&BUSY, due + latency, &mut notices));
        assert_eq!((b.offset, b.discont), (2400, false));
    }

    #[test]
    fn the_first_buffer_after_a_flush_is_discont() {
        let mut out = Output::new(480, None, 10_000, 24_000);
        let mut notices = Vec::new();
        out.push(started(1, 0));
        out.push(audio(1440));
        assert!(buffer(out.next(&BUSY, T0, &mut notices)).discont);
        assert!(!buffer(out.next(&BUSY, T0, &mut notices)).discont);
        out.flush_stopped();
        let b = buffer(out.next(&BUSY, T0, &mut notices));
        assert_eq!(
            (b.offset, b.pts, b.discont),
            (960, pts_of(960, 24_000), true)
        );
    }

    /// Live, the timeline starts again at the first step after a flush: where a pipeline's flush
    /// set the running time back to 0, the next buffer is output at once (not when the old
    /// timeline's PTS comes round again), and text arriving then is due at its running time.
    #[test]
    fn live_timeline_starts_again_after_a_flush() {
        let latency = ms(80);
        let mut out = Output::new(480, Some(latency), 10_000, 24_000);
        let mut notices = Vec::new();
        let r0 = ms(10);
        buffer(out.next(&BUSY, r0, &mut notices));
        for _ in 1..100 {
            buffer(paced(&mut out, &BUSY, &mut notices));
        }
        assert_eq!(out.pts(out.n), r0 + pts_of(48_000, 24_000));
        // A flush that leaves the running time going on (one on the pad alone): the timeline
        // goes on, its next buffer DISCONT.
        out.flush_stopped();
        let b = buffer(out.next(&BUSY, r0 + ms(2000) + ms(30), &mut notices));
        assert_eq!(
            (b.offset, b.pts, b.discont),
            (47_520 + 480, r0 + ms(2000), true)
        );
        // Before the next step, PTS stay on the old timeline (a done message of the flush);
        // text arriving from the flush's start to that step is due at the next sample.
        out.flush_started();
        assert_eq!(out.arrival_pos(Some(r0 + ms(3000))), 48_480);
        out.flush_stopped();
        assert_eq!(out.arrival_pos(Some(ms(1))), 48_480);
        assert_eq!(out.pts(48_480), r0 + ms(2020));
        // The running time started again from 0 (reset_time): output goes on at once.
        let now = ms(3);
        let b = buffer(out.next(&BUSY, now, &mut notices));
        assert_eq!((b.offset, b.pts, b.discont), (48_480, now, true));
        assert_eq!(
            out.next(&BUSY, now + ms(5), &mut notices),
            Step::Wait {
                until: Some(now + pts_of(480, 24_000))
            }
        );
        let b = buffer(paced(&mut out, &BUSY, &mut notices));
        assert_eq!((b.offset, b.pts, b.discont), (48_960, now + ms(20), false));
        // Text pushed 100 ms after the flush is due 100 ms into the new timeline.
        let pos = out.arrival_pos(Some(now + ms(100)));
        assert_eq!(pos, 48_480 + 2400);
        out.push(started(1, pos));
        out.push(audio(480));
        let b = loop {
            let b = buffer(paced(&mut out, &BUSY, &mut notices));
            if matches!(b.samples, Samples::Audio(_)) {
                break b;
            }
        };
        assert_eq!((b.offset, b.pts), (pos, now + ms(100)));
    }

    #[test]
    fn queued_refusals_are_taken_in_order() {
        let mut out = Output::new(480, None, 10_000, 24_000);
        out.push(started(1, 0));
        out.push(audio(10));
        for id in [2, 3] {
            out.push(Item::Refused(Refusal {
                id,
                text: format!("bad {id}"),
                error: "nothing to speak".into(),
            }));
        }
        let ids: Vec<u64> = out.take_refusals().iter().map(|r| r.id).collect();
        assert_eq!(ids, [2, 3]);
        assert!(out.take_refusals().is_empty());
        let mut notices = Vec::new();
        assert_eq!(buffer(out.next(&IDLE, T0, &mut notices)).samples.len(), 10);
    }
}
