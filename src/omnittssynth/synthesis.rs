//! The synthesis workers: [`WORKERS`] threads that take the cues' requests in arrival order, submit
//! them to the engine (so that the next cue is synthesised while the one before it still plays, and
//! batched with it by the engine), and put the audio into the timeline as it streams back.
//!
//! Back-pressure: a worker takes no new cue while [`MAX_BUFFERED_SECONDS`] of synthesised audio
//! wait for the output, unless the output needs that cue to go on ([`next_job`]): a cue that is
//! due (playing, or its start reached) is always taken, so that any number of cues playing at
//! the same time, of any length, cannot hold the output and the workers waiting for each other.
//! A flush bumps the epoch: the work of older epochs is cancelled and dropped.
//!
//! `input-mode=fragments`: a job may be an utterance whose text is still arriving
//! ([`Job::open`]): in token mode one open engine request that takes the text as the sink pad
//! appends it, in clause mode one request per clause as each completes, through the driver
//! `omnittssrc` uses too ([`speak_clauses`]). Its audio goes into the timeline as it streams.

use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::element_common::backend::{Backend, Cancel, Handle, Request};
use crate::element_common::clause_speech::{ClauseSink, speak_clauses};
use crate::element_common::voice_clone::VoiceCloner;
use crate::engine::{Engine, EngineEvent, EngineRequest, FinishReason, Metrics, SharedEngine};

use super::CAT;
use super::compress::{Squeeze, compress};
use super::shared::{Job, Shared};
use super::timeline::Timeline;

/// Cues synthesised at the same time.
pub(super) const WORKERS: usize = 2;
/// Synthesised audio that may wait for the output before workers pause: 30 s.
pub(super) const MAX_BUFFERED_SECONDS: u64 = 30;

/// [`MAX_BUFFERED_SECONDS`] in samples at `rate` Hz.
pub(super) fn max_buffered(rate: u32) -> u64 {
    MAX_BUFFERED_SECONDS * u64::from(rate)
}
/// How often a worker waiting on the engine checks for a flush or stop.
const POLL: Duration = Duration::from_millis(20);

/// Starts the workers; they hold the engine until the element's stop sets `shutdown`.
pub(super) fn spawn_workers(
    engine: Arc<SharedEngine>,
    cloner: VoiceCloner,
    shared: Arc<Shared>,
) -> std::io::Result<Vec<std::thread::JoinHandle<()>>> {
    let cloner = Arc::new(Mutex::new(cloner));
    (0..WORKERS)
        .map(|i| {
            let (engine, cloner, shared) = (engine.clone(), cloner.clone(), shared.clone());
            std::thread::Builder::new()
                .name(format!("omnittssynth-{i}"))
                .spawn(move || worker_loop(&engine, &cloner, &shared))
        })
        .collect()
}

fn worker_loop(engine: &Arc<SharedEngine>, cloner: &Mutex<VoiceCloner>, shared: &Shared) {
    loop {
        let job = {
            let mut inner = shared.lock();
            loop {
                if inner.shutdown {
                    return;
                }
                let ids = inner.jobs.iter().map(|j| j.id);
                if let Some(i) = next_job(ids, &inner.timeline, max_buffered(engine.sample_rate()))
                    && let Some(job) = inner.jobs.remove(i)
                {
                    break job;
                }
                inner = shared.wait(inner, None);
            }
        };
        // A panic in one request must not take the element down: it ends that cue with an error.
        let (id, epoch) = (job.id, job.epoch);
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match job.open {
            Some(open) => synthesise_open(engine, shared, id, epoch, open),
            None => synthesise(engine, cloner, shared, job),
        }));
        if let Err(panic) = run {
            let what = crate::engine::panic_message(&*panic);
            finish(
                shared,
                id,
                epoch,
                FinishReason::Error(format!("synthesis panicked: {what}")),
                Metrics::default(),
            );
        }
    }
}

/// Which of the queued jobs (their cue ids, in order) a free worker takes next: the first whose
/// cue the output needs now ([`Timeline::needs`]: it is due, so the output waits for its audio),
/// whatever is buffered; otherwise the first, while fewer than `limit` synthesised samples wait
/// for the output. `None`: none for now.
pub(super) fn next_job(
    ids: impl Iterator<Item = u64>,
    timeline: &Timeline,
    limit: u64,
) -> Option<usize> {
    let mut first = None;
    for (i, id) in ids.enumerate() {
        if timeline.needs(id) {
            return Some(i);
        }
        first.get_or_insert(i);
    }
    first.filter(|_| timeline.buffered() < limit)
}

/// Records how cue `id` ended and lets the output go past it.
fn finish(shared: &Shared, id: u64, epoch: u64, reason: FinishReason, metrics: Metrics) {
    let mut inner = shared.lock();
    inner.cancellers.remove(&id);
    if inner.epoch == epoch {
        inner.timeline.finish(id);
        if let Some(info) = inner.infos.get_mut(&id) {
            info.finish = Some((reason, metrics));
        }
    }
    shared.cond.notify_all();
}

/// Runs one cue's requests (its sentences) to their end, back to back, as that cue's audio; the
/// cue ends with the first request that does not end by the model's EOS, length or guard
/// (cancelled, clipped, an error), and reports the other requests' figures added up. With
/// `overflow=compress` the speech is held until it is whole, then compressed into the slot.
fn synthesise(engine: &Engine, cloner: &Mutex<VoiceCloner>, shared: &Shared, job: Job) {
    let Job {
        id,
        epoch,
        requests,
        clone,
        squeeze,
        open: _,
    } = job;
    // overflow=compress: the speech is held here until it is whole, then compressed.
    let mut held: Vec<f32> = Vec::new();
    let prompt = match &clone {
        Some(spec) => match cloner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .prompt(engine, spec)
        {
            Ok(p) => Some(p),
            Err(e) => {
                return finish(
                    shared,
                    id,
                    epoch,
                    FinishReason::Error(e.to_string()),
                    Metrics::default(),
                );
            }
        },
        None => None,
    };
    let pieces = requests.len();
    let mut total: Option<(FinishReason, Metrics)> = None;
    for (i, mut request) in requests.into_iter().enumerate() {
        if prompt.is_some() {
            request.voice.voice_clone = prompt.clone();
        }
        let Some((reason, metrics)) =
            synthesise_one(engine, shared, id, epoch, request, i, squeeze, &mut held)
        else {
            // Flushed or stopped: nothing to report.
            return;
        };
        gst::debug!(
            CAT,
            "cue {id}: sentence {}/{pieces} finished ({reason}), {} frames",
            i + 1,
            metrics.frames
        );
        let go_on = matches!(
            reason,
            FinishReason::Eos | FinishReason::Length | FinishReason::Guard
        );
        total = Some(match total {
            None => (reason, metrics),
            Some((before, sum)) => {
                // The first limit reached (length, guard) stays the cue's reason unless a later
                // sentence ends it otherwise.
                let reason = match (&before, &reason) {
                    (FinishReason::Eos, _) => reason,
                    (_, FinishReason::Eos | FinishReason::Length | FinishReason::Guard) => before,
                    _ => reason,
                };
                (reason, add_metrics(&sum, &metrics))
            }
        });
        if !go_on {
            break;
        }
    }
    let (reason, metrics) = total.unwrap_or((FinishReason::Eos, Metrics::default()));
    release(shared, id, epoch, squeeze, held);
    gst::debug!(
        CAT,
        "cue {id}: finished ({reason}), {} frames",
        metrics.frames
    );
    finish(shared, id, epoch, reason, metrics)
}

/// The figures of two requests spoken one after the other: frames, audio and wall time added,
/// the first's time to first audio (and its frames' times, those of the second when the first
/// made none), per-frame times weighted by frames, RTF over the whole.
fn add_metrics(a: &Metrics, b: &Metrics) -> Metrics {
    let frames = a.frames + b.frames;
    let weighted = |x: f64, y: f64| {
        if frames == 0 {
            0.0
        } else {
            (x * a.frames as f64 + y * b.frames as f64) / frames as f64
        }
    };
    let audio_ms = a.audio_ms + b.audio_ms;
    let busy_ms = a.rtf * a.audio_ms + b.rtf * b.audio_ms;
    Metrics {
        frames,
        audio_ms,
        ttfa_ms: a.ttfa_ms.or(b.ttfa_ms),
        ar_ms_per_frame: weighted(a.ar_ms_per_frame, b.ar_ms_per_frame),
        decoder_ms_per_frame: weighted(a.decoder_ms_per_frame, b.decoder_ms_per_frame),
        rtf: if audio_ms > 0.0 {
            busy_ms / audio_ms
        } else {
            0.0
        },
        wall_ms: a.wall_ms + b.wall_ms,
        queue_ms: a.queue_ms + b.queue_ms,
        ar_prefill_ms: a.ar_prefill_ms + b.ar_prefill_ms,
        first_frame_ms: a.first_frame_ms.or(b.first_frame_ms),
        first_frame_steps: a.first_frame_steps.or(b.first_frame_steps),
        first_frame_rows: a.first_frame_rows.or(b.first_frame_rows),
        first_pass_frames: a.first_pass_frames.or(b.first_pass_frames),
        frames_ready_ms: if a.frames_ready_ms.is_empty() {
            b.frames_ready_ms.clone()
        } else {
            a.frames_ready_ms.clone()
        },
    }
}

/// Runs request `index` of cue `id` to its end, its audio into the cue (with `squeeze`, into
/// `held` instead): its finish reason and figures, or `None` when the cue was flushed or the
/// element stopped meanwhile (the request is cancelled by dropping its handle).
#[allow(clippy::too_many_arguments)]
fn synthesise_one(
    engine: &Engine,
    shared: &Shared,
    id: u64,
    epoch: u64,
    request: EngineRequest,
    index: usize,
    squeeze: Option<Squeeze>,
    held: &mut Vec<f32>,
) -> Option<(FinishReason, Metrics)> {
    gst::debug!(CAT, "cue {id}: submitting {:?}", request.voice.text);
    let handle = match engine.submit(request) {
        Ok(h) => Handle::Local(h),
        Err(e) => return Some((FinishReason::Error(e.to_string()), Metrics::default())),
    };
    forward(shared, id, epoch, &handle, index, squeeze, held)
}

/// Forwards the events of cue `id`'s submitted request `handle` (its `index`th) until it
/// finishes: see [`synthesise_one`].
#[allow(clippy::too_many_arguments)]
fn forward(
    shared: &Shared,
    id: u64,
    epoch: u64,
    handle: &Handle,
    index: usize,
    squeeze: Option<Squeeze>,
    held: &mut Vec<f32>,
) -> Option<(FinishReason, Metrics)> {
    {
        let mut inner = shared.lock();
        if inner.epoch != epoch || inner.shutdown {
            // Flushed meanwhile.
            handle.cancel();
            return None;
        }
        inner.cancellers.insert(id, handle.canceller());
    }
    loop {
        let ev = match handle.recv_timeout(POLL) {
            Ok(ev) => ev,
            Err(RecvTimeoutError::Timeout) => {
                let inner = shared.lock();
                if inner.epoch != epoch || inner.shutdown {
                    handle.cancel();
                    return None;
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => {
                let e = "the engine stopped without finishing the cue".to_string();
                return Some((FinishReason::Error(e), Metrics::default()));
            }
        };
        match ev {
            EngineEvent::Started => {}
            EngineEvent::Audio(chunk) => {
                if let Some(sq) = squeeze {
                    if shared.lock().epoch != epoch {
                        handle.cancel();
                        return None;
                    }
                    held.extend_from_slice(&chunk.samples);
                    if held.len() as u64 > sq.enough() {
                        // Even compressed by the most allowed, the rest would be clipped.
                        handle.cancel();
                    }
                    continue;
                }
                let mut inner = shared.lock();
                if inner.epoch != epoch || inner.shutdown {
                    handle.cancel();
                    return None;
                }
                if !inner.timeline.add_audio(id, &chunk.samples) {
                    // Clipped: the rest of its speech would never be heard.
                    handle.cancel();
                }
                shared.cond.notify_all();
            }
            EngineEvent::FirstAudio { ttfa_ms } if index == 0 => {
                // Kept for the output task, which posts the first-audio message when the cue's
                // first sample goes out (after its started message, with that sample's PTS).
                let mut inner = shared.lock();
                if let Some(info) = inner.infos.get_mut(&id) {
                    info.ttfa_ms = Some(ttfa_ms);
                }
            }
            EngineEvent::FirstAudio { .. } => {}
            EngineEvent::Finished { reason, metrics } => return Some((reason, metrics)),
        }
    }
}

/// `input-mode=fragments`: speaks cue `id`, an utterance whose text is still arriving, to its
/// end: token mode (`Request::LocalOpen`) as one open engine request, clause mode
/// (`Request::Clauses`) clause by clause; its audio into the timeline as it streams.
fn synthesise_open(
    engine: &Arc<SharedEngine>,
    shared: &Shared,
    id: u64,
    epoch: u64,
    request: Request,
) {
    let backend = Backend::Local(engine.clone());
    let (reason, metrics) = match request {
        Request::Clauses(clauses) => {
            let sink = TimelineClauses { shared, id, epoch };
            match speak_clauses(&backend, &clauses, &sink) {
                Some(outcome) => (outcome.reason, outcome.metrics),
                None => return,
            }
        }
        request => {
            gst::debug!(CAT, "cue {id}: submitting an open utterance");
            let handle = match backend.submit(request) {
                Ok(h) => h,
                Err(e) => {
                    return finish(
                        shared,
                        id,
                        epoch,
                        FinishReason::Error(e),
                        Metrics::default(),
                    );
                }
            };
            match forward(shared, id, epoch, &handle, 0, None, &mut Vec::new()) {
                Some(done) => done,
                None => return,
            }
        }
    };
    gst::debug!(
        CAT,
        "cue {id}: open utterance finished ({reason}), {} frames",
        metrics.frames
    );
    finish(shared, id, epoch, reason, metrics)
}

/// Clause mode's audio into cue `id` on the timeline.
struct TimelineClauses<'a> {
    shared: &'a Shared,
    id: u64,
    epoch: u64,
}

impl ClauseSink for TimelineClauses<'_> {
    fn current(&self) -> bool {
        let inner = self.shared.lock();
        inner.epoch == self.epoch && !inner.shutdown
    }

    fn started(&self, cancel: Cancel, _text: String) -> bool {
        self.next_request(cancel);
        self.current()
    }

    fn next_request(&self, cancel: Cancel) {
        let mut inner = self.shared.lock();
        if inner.epoch == self.epoch {
            inner.cancellers.insert(self.id, cancel);
        }
    }

    fn first_audio(&self, ttfa_ms: f64) {
        let mut inner = self.shared.lock();
        if let Some(info) = inner.infos.get_mut(&self.id) {
            info.ttfa_ms = Some(ttfa_ms);
        }
    }

    fn audio(&self, samples: Vec<f32>) -> bool {
        let mut inner = self.shared.lock();
        if inner.epoch != self.epoch || inner.shutdown {
            return false;
        }
        let go_on = inner.timeline.add_audio(self.id, &samples);
        self.shared.cond.notify_all();
        go_on
    }

    fn debug(&self, what: &str) {
        gst::debug!(CAT, "cue {}: {what}", self.id);
    }
}

/// `overflow=compress`: puts cue `id`'s whole speech `held` into the timeline, compressed into its
/// slot (by at most the maximum; the timeline clips what still does not fit). The stretching runs
/// without the lock.
fn release(shared: &Shared, id: u64, epoch: u64, squeeze: Option<Squeeze>, held: Vec<f32>) {
    let Some(sq) = squeeze else {
        return;
    };
    let original = held.len() as u64;
    let factor = sq.factor(original);
    let audio = if factor > 1.0 {
        compress(&held, factor, sq.rate)
    } else {
        None
    };
    if let Some(a) = &audio {
        gst::debug!(
            CAT,
            "cue {id}: {original} samples compressed {factor:.3}× into {} (slot {})",
            a.len(),
            sq.slot
        );
    }
    let mut inner = shared.lock();
    if inner.epoch != epoch {
        return;
    }
    match audio {
        Some(a) => {
            inner.timeline.add_audio(id, &a);
            inner.timeline.compressed(id, original);
        }
        None => {
            inner.timeline.add_audio(id, &held);
        }
    }
    shared.cond.notify_all();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::omnittssynth::overflow::Overflow;
    use crate::omnittssynth::timeline::{CueKind, CueStart, Need, Pace, Step};

    #[test]
    fn a_cue_the_output_waits_for_is_taken_whatever_is_buffered() {
        for policy in [Overflow::Clip, Overflow::Overlap] {
            // Three cues at one start, a fourth later: two workers have synthesised cues 1 and
            // 2, more than the buffer's bound, and the output waits for cue 3.
            let mut t = Timeline::new(policy);
            for id in 1..=3 {
                t.push_cue(id, CueStart::At(0), None, CueKind::Speech);
            }
            t.push_cue(4, CueStart::At(48_000_000), None, CueKind::Speech);
            let long = vec![0.1; (max_buffered(24_000) / 2 + 1) as usize];
            for id in 1..=2 {
                t.add_audio(id, &long);
                t.finish(id);
            }
            assert_eq!(t.next(480, Pace::Exact), Step::Wait(Need::Audio));
            assert!(t.buffered() >= max_buffered(24_000));
            assert!(t.needs(3) && !t.needs(4), "{policy:?}");
            assert_eq!(
                next_job([3, 4].into_iter(), &t, max_buffered(24_000)),
                Some(0),
                "{policy:?}: the cue the output waits for"
            );
            // Queued in another order, the due one is still found.
            assert_eq!(
                next_job([4, 3].into_iter(), &t, max_buffered(24_000)),
                Some(1)
            );
            // A cue not yet due waits while the buffer is full, and goes once it is not.
            assert_eq!(next_job([4].into_iter(), &t, max_buffered(24_000)), None);
            assert_eq!(next_job([4].into_iter(), &t, u64::MAX), Some(0));
            assert_eq!(next_job(std::iter::empty(), &t, u64::MAX), None);
        }
    }
}
