//! The source pad's task: asks the [`Timeline`](super::timeline::Timeline) for the next piece of
//! output and pushes it as a buffer (F32LE or S16LE, contiguous offsets, PTS from the sample
//! count, GAP-flagged silence), with the serialized events and bus messages that belong before it;
//! EOS when the timeline ends.
//!
//! Pacing: when upstream answers the LATENCY query as live, the output follows the pipeline clock
//! (see [`Pacing`]): silence for a stretch of time goes out once all input timestamped before it
//! must have arrived (running time + upstream latency), and a cue's audio is due by its running
//! time + upstream latency + the `latency` property; what is not synthesised by then is replaced by
//! silence and handled by the overflow policy. Not live, the task waits for input and synthesis:
//! the timeline is exact however slow synthesis is.

use std::sync::Arc;
use std::time::Duration;

use gst::glib;
use gst::prelude::*;

use crate::element_common::audio::{self, OutBuffer, SampleFormat, Samples, pos_of, pts_of};
use crate::element_common::messages::{self, UtteranceDone};
use crate::engine::{FinishReason, Metrics};

use super::CAT;
use super::cue_message::cue_message;
use super::overflow::{Action, Overflow};
use super::shared::{Inner, Shared};
use super::timeline::{Need, Notice, Pace, Step, Timeline};

/// Largest output buffer: 20 ms.
pub(super) const MAX_BUFFER_SAMPLES: usize = 480;
/// Longest wait between looks at the clock (live).
const MAX_WAIT: Duration = Duration::from_millis(50);

/// What the task needs besides the shared state; fixed from start to stop.
pub(super) struct Output {
    pub shared: Arc<Shared>,
    pub srcpad: gst::Pad,
    pub element: glib::WeakRef<gst::Element>,
    /// The `latency` property.
    pub latency: gst::ClockTime,
    pub policy: Overflow,
    /// Audio samples per codec frame (for the figures of a cue cut before its synthesis ended).
    pub samples_per_frame: usize,
    /// The model's sample rate, Hz: every PTS, duration and message is counted in it.
    pub rate: u32,
    /// `input-mode=fragments`: a cue is a running utterance's fragments, which
    /// `split-sentences` does not split (its limit warnings do not suggest it).
    pub fragments: bool,
}

/// How the next step is paced, and how long to wait at most when it cannot be taken.
struct Pacing {
    pace: Pace,
    timeout: Option<Duration>,
}

/// Why the task stops.
enum Stop {
    /// A flow return from downstream (or FLUSHING / EOS).
    Flow(gst::FlowError),
    /// An error already posted on the bus; the flow return the sink pad gives upstream.
    Posted(gst::FlowError),
}

/// What downstream takes of the element's audio caps at `rate`: the caps (fixated, in
/// downstream's order of preference: F32LE unless it prefers S16LE) and their sample format; else
/// the negotiation error, which names the element's caps.
pub(super) fn negotiate(srcpad: &gst::Pad, rate: u32) -> Result<(gst::Caps, SampleFormat), String> {
    let ours = audio::caps(rate);
    let peer = srcpad.peer_query_caps(Some(&ours));
    let mut caps = peer.intersect_with_mode(&ours, gst::CapsIntersectMode::First);
    if caps.is_empty() {
        return Err(audio::refused_by_downstream("omnittssynth", &ours));
    }
    caps.fixate();
    let format = SampleFormat::from_caps(&caps, rate)?;
    Ok((caps, format))
}

impl Output {
    /// One iteration of the task: pushes one buffer, or EOS, or pauses the task.
    pub fn step(&self) {
        let Some(element) = self.element.upgrade() else {
            let _ = self.srcpad.pause_task();
            return;
        };
        let stop = match self.produce(&element) {
            Ok(()) => return,
            Err(stop) => stop,
        };
        let flow = match stop {
            Stop::Flow(f) | Stop::Posted(f) => f,
        };
        {
            let mut inner = self.shared.lock();
            inner.flow = Err(flow);
            self.shared.cond.notify_all();
        }
        if let Stop::Flow(f) = stop
            && !matches!(f, gst::FlowError::Flushing | gst::FlowError::Eos)
        {
            gst::element_error!(
                element,
                gst::StreamError::Failed,
                ("omnittssynth: streaming stopped, reason {:?}", f),
                ["pushing audio downstream returned {:?}", f]
            );
        }
        gst::debug!(CAT, obj = element, "task paused: {flow:?}");
        let _ = self.srcpad.pause_task();
    }

    pub(super) fn post(element: &gst::Element, msgs: &mut Vec<gst::Message>) {
        for m in msgs.drain(..) {
            let _ = element.post_message(m);
        }
    }

    fn produce(&self, element: &gst::Element) -> Result<(), Stop> {
        let mut msgs = Vec::new();
        let mut inner = self.shared.lock();
        loop {
            if inner.flushing || inner.shutdown {
                return Err(Stop::Flow(gst::FlowError::Flushing));
            }
            let pacing = self.pacing(element, &inner);
            let at = inner.timeline.position();
            let queued = inner.timeline.cues();
            let step = inner.timeline.next(MAX_BUFFER_SAMPLES, pacing.pace);
            if inner.timeline.cues() < queued || step == Step::Wait(Need::Input) {
                // Cues are over, or the output waits for input: the sink pad may be holding
                // upstream back (imp.rs, queue_cue).
                self.shared.cond.notify_all();
            }
            self.notices(element, &mut inner, &mut msgs);
            let samples = match step {
                Step::Audio(s) => Samples::Audio(s),
                Step::Silence(len) => Samples::Silence(len),
                Step::Wait(need) => {
                    if !msgs.is_empty() {
                        drop(inner);
                        Self::post(element, &mut msgs);
                        inner = self.shared.lock();
                        continue;
                    }
                    gst::trace!(CAT, obj = element, "at sample {at}: waiting for {need:?}");
                    inner = self.shared.wait(inner, pacing.timeout);
                    continue;
                }
                Step::Refused { id, error } => {
                    let events = drain_events(&mut inner, u64::MAX);
                    drop(inner);
                    Self::post(element, &mut msgs);
                    self.push_events(events);
                    gst::warning!(CAT, obj = element, "cue {id} refused: {error}");
                    let stop = self.stopped(gst::FlowError::Error);
                    gst::element_error!(
                        element,
                        gst::StreamError::Format,
                        ("{}", error),
                        ["cue {id}; the audio of the cues before it was output"]
                    );
                    return Err(stop);
                }
                Step::End => {
                    let events = drain_events(&mut inner, u64::MAX);
                    if let Some(segment) = inner.next_segment.take() {
                        // A new segment: the next timeline starts at its start.
                        inner.timeline = Timeline::new(self.policy);
                        inner.segment = segment.clone();
                        inner.discont = true;
                        self.shared.cond.notify_all();
                        drop(inner);
                        Self::post(element, &mut msgs);
                        self.push_events(events);
                        self.srcpad.push_event(gst::event::Segment::new(&segment));
                        inner = self.shared.lock();
                        continue;
                    }
                    // A stream that output nothing (no cue, or none in its segment) still gets
                    // a buffer, an empty one: downstream that writes its length once its data
                    // ends (wavenc) then writes a valid empty file.
                    let empty = match inner.format {
                        Some(format) if at == 0 => OutBuffer {
                            samples: Samples::Silence(0),
                            offset: 0,
                            pts: inner.segment.start().unwrap_or(gst::ClockTime::ZERO),
                            duration: gst::ClockTime::ZERO,
                            discont: std::mem::take(&mut inner.discont),
                        }
                        .to_buffer(format)
                        .ok(),
                        _ => None,
                    };
                    drop(inner);
                    Self::post(element, &mut msgs);
                    self.push_events(events);
                    if let Some(buffer) = empty {
                        // EOS follows whatever downstream answers.
                        let _ = self.srcpad.push(buffer);
                    }
                    gst::debug!(CAT, obj = element, "all cues spoken: EOS at sample {at}");
                    self.srcpad.push_event(gst::event::Eos::new());
                    return Err(Stop::Flow(gst::FlowError::Eos));
                }
            };
            let Some(format) = inner.format else {
                drop(inner);
                let stop = self.stopped(gst::FlowError::Error);
                gst::element_error!(
                    element,
                    gst::CoreError::Negotiation,
                    ("no output caps negotiated (the text stream had no CAPS event)")
                );
                return Err(stop);
            };
            let start = inner.segment.start().unwrap_or(gst::ClockTime::ZERO);
            let len = samples.len() as u64;
            let out = OutBuffer {
                samples,
                offset: at,
                pts: start + pts_of(at, self.rate),
                duration: pts_of(at + len, self.rate) - pts_of(at, self.rate),
                discont: std::mem::take(&mut inner.discont),
            };
            let events = drain_events(&mut inner, at);
            drop(inner);
            Self::post(element, &mut msgs);
            self.push_events(events);
            let format = self.renegotiated(element, format)?;
            let buffer = out.to_buffer(format).map_err(Stop::Flow)?;
            return self.srcpad.push(buffer).map(|_| ()).map_err(Stop::Flow);
        }
    }

    /// The sample format of the next buffer: `format`, unless downstream asked for a new
    /// negotiation (a RECONFIGURE event: the source pad's flag, checked before each buffer as
    /// GstBaseSrc does). Then what downstream takes now, its CAPS event pushed before the buffer
    /// when the format changes, so the switch falls between two buffers and no sample is lost or
    /// repeated. When downstream takes none of the element's caps any more, the error of the
    /// start (naming them) is posted and the output stops: the audio pushed before stays pushed.
    fn renegotiated(
        &self,
        element: &gst::Element,
        format: SampleFormat,
    ) -> Result<SampleFormat, Stop> {
        if !self.srcpad.check_reconfigure() {
            return Ok(format);
        }
        match negotiate(&self.srcpad, self.rate) {
            Ok((caps, new)) => {
                if new != format {
                    gst::info!(CAT, obj = element, "downstream asked for new caps: {caps}");
                    self.shared.lock().format = Some(new);
                    // Refused after all: the buffer's push returns not-negotiated.
                    let _ = self.srcpad.push_event(gst::event::Caps::new(&caps));
                }
                Ok(new)
            }
            Err(why) => {
                self.srcpad.mark_reconfigure();
                let stop = self.stopped(gst::FlowError::NotNegotiated);
                gst::element_error!(element, gst::CoreError::Negotiation, ("{}", why));
                Err(stop)
            }
        }
    }

    /// Stops the output with `flow` (which the sink pad returns upstream from then on), before
    /// the caller posts the error: an EOS sent on the error finds the output stopped and goes
    /// straight downstream.
    fn stopped(&self, flow: gst::FlowError) -> Stop {
        let mut inner = self.shared.lock();
        inner.flow = Err(flow);
        self.shared.cond.notify_all();
        Stop::Posted(flow)
    }

    fn push_events(&self, events: Vec<gst::Event>) {
        for e in events {
            self.srcpad.push_event(e);
        }
    }

    /// The pace of the next step: exact when upstream is not live (or its latency is unknown);
    /// live, from the running time `now`: `settled` = the position of `now` − upstream latency,
    /// `late` = `now` is past the next sample's deadline (its running time + upstream latency +
    /// `latency`). The wait is until that deadline or until the next chunk of silence settles.
    fn pacing(&self, element: &gst::Element, inner: &Inner) -> Pacing {
        let Some((true, upstream, _)) = inner.upstream_latency else {
            return Pacing {
                pace: Pace::Exact,
                timeout: None,
            };
        };
        let Some(now) = element.current_running_time() else {
            // No clock yet (not PLAYING): only what the input has told.
            return Pacing {
                pace: Pace::Live {
                    settled: 0,
                    late: false,
                },
                timeout: Some(MAX_WAIT),
            };
        };
        let seg = &inner.segment;
        let start = seg.start().unwrap_or(gst::ClockTime::ZERO);
        let running = |p: u64| seg.to_running_time(start + pts_of(p, self.rate));
        let n = inner.timeline.position();
        let settled = seg
            .position_from_running_time(now.saturating_sub(upstream))
            .map_or(0, |pos| pos_of(pos.saturating_sub(start), self.rate));
        let deadline = running(n).map(|r| r + upstream + self.latency);
        let next_settles = running(n + MAX_BUFFER_SAMPLES as u64).map(|r| r + upstream);
        let wake = [deadline, next_settles]
            .into_iter()
            .flatten()
            .filter(|t| *t > now)
            .min();
        Pacing {
            pace: Pace::Live {
                settled,
                late: deadline.is_some_and(|d| now > d),
            },
            timeout: Some(
                wake.map_or(MAX_WAIT, |t| Duration::from_nanos((t - now).nseconds()))
                    .min(MAX_WAIT),
            ),
        }
    }

    /// Turns the timeline's notices into bus messages (posted by the caller, unlocked) and
    /// cancels the requests of clipped cues.
    pub(super) fn notices(
        &self,
        element: &gst::Element,
        inner: &mut Inner,
        msgs: &mut Vec<gst::Message>,
    ) {
        let start = inner.segment.start().unwrap_or(gst::ClockTime::ZERO);
        for notice in inner.timeline.take_notices() {
            match notice {
                Notice::Started { id, at } => {
                    // As omnittssrc posts them: started, then first audio, both with the PTS of
                    // the cue's first output sample (its synthesis reported its TTFA before any
                    // of its audio reached the timeline).
                    let (text, ttfa_ms) = inner.infos.get(&id).map_or(("", 0.0), |i| {
                        let ttfa = i
                            .ttfa_ms
                            .unwrap_or_else(|| i.since.elapsed().as_secs_f64() * 1000.0);
                        (i.text.as_str(), ttfa)
                    });
                    let pts = start + pts_of(at, self.rate);
                    gst::info!(CAT, obj = element, "cue {id} starts at sample {at}");
                    msgs.push(messages::started(element, id, text, pts));
                    msgs.push(messages::first_audio(element, id, ttfa_ms, pts));
                }
                Notice::Late { id, at } => {
                    let due = inner.infos.get(&id).and_then(|i| i.pts);
                    gst::warning!(CAT, obj = element, "cue {id}: audio late at sample {at}");
                    msgs.push(
                        gst::message::Warning::builder(
                            gst::StreamError::Failed,
                            &format!(
                                "cue {id} (PTS {}): its audio was not synthesised by its deadline \
                                 (latency {} ms); overflow={} handles the delay — a larger \
                                 latency avoids it",
                                due.display(),
                                self.latency.mseconds(),
                                self.policy.nick()
                            ),
                        )
                        .src(element)
                        .build(),
                    );
                }
                Notice::Cancel { id } => {
                    if let Some(c) = inner.cancellers.get(&id) {
                        c.cancel();
                    }
                }
                Notice::Done(report) => {
                    let Some(info) = inner.infos.remove(&report.id) else {
                        continue;
                    };
                    let first = report.first.unwrap_or(report.end);
                    // A cue a flush dropped before its first sample never started: its cue
                    // message only.
                    if (report.speech > 0 || info.finish.is_some()) && !report.never_started() {
                        let (reason, metrics) = match info.finish.clone() {
                            // Dropped by a flush while it played: cancelled, whatever its
                            // synthesis had come to.
                            Some((_, metrics)) if report.action == Action::Flushed => {
                                (FinishReason::Cancelled, metrics)
                            }
                            Some(finish) => finish,
                            None => {
                                // Cut while its synthesis ran: what the element saw of it.
                                let metrics = Metrics::seen(
                                    report.speech,
                                    self.samples_per_frame,
                                    self.rate,
                                    info.ttfa_ms,
                                    info.since,
                                );
                                (FinishReason::Cancelled, metrics)
                            }
                        };
                        let done = UtteranceDone {
                            id: report.id,
                            text: info.text.clone(),
                            reason,
                            metrics,
                            samples: report.output,
                            underruns: report.late,
                            wait_samples: 0,
                            silence_samples: 0,
                            pts: start + pts_of(first, self.rate),
                            duration: pts_of(report.end, self.rate) - pts_of(first, self.rate),
                            rate: self.rate,
                            splittable: !self.fragments,
                        };
                        msgs.push(done.message(element));
                        if let Some(m) = done.failure_message(element) {
                            msgs.push(m);
                        }
                        // Cut at max-new-tokens or by the runaway guard: said as omnittssrc
                        // says it.
                        if let Some(w) = done.limit_warning("cue") {
                            gst::warning!(CAT, obj = element, "{w}");
                            msgs.push(
                                gst::message::Warning::builder(gst::StreamError::Failed, &w)
                                    .src(element)
                                    .build(),
                            );
                        }
                    }
                    gst::info!(
                        CAT,
                        obj = element,
                        "cue {} over: {} ({} of {} samples output, end {})",
                        report.id,
                        report.action.as_str(),
                        report.output,
                        report.speech,
                        report.end
                    );
                    msgs.push(cue_message(
                        element,
                        &report,
                        &info,
                        start,
                        self.policy,
                        self.rate,
                    ));
                }
            }
        }
    }
}

/// The queued events at or before position `at`, in order.
fn drain_events(inner: &mut Inner, at: u64) -> Vec<gst::Event> {
    let mut out = Vec::new();
    while inner.events.front().is_some_and(|(p, _)| *p <= at) {
        if let Some((_, e)) = inner.events.pop_front() {
            out.push(e);
        }
    }
    out
}
