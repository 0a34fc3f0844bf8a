//! The synthesis workers: [`WORKERS`] threads that take the cues' requests in arrival order, submit
//! them to the engine (so that the next cue is synthesised while the one before it still plays, and
//! batched with it by the engine), and put the audio into the timeline as it streams back.
//!
//! Back-pressure: a worker takes no new cue while [`MAX_BUFFERED_SAMPLES`] of synthesised audio
//! wait for the output. A flush bumps the epoch: the work of older epochs is cancelled and dropped.

use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gst::glib;
use gst::prelude::*;

use crate::element_common::audio::{RATE, pts_of};
use crate::element_common::messages;
use crate::element_common::voice_clone::VoiceCloner;
use crate::engine::{Engine, EngineEvent, EngineRequest, FinishReason, Metrics, SharedEngine};

use super::CAT;
use super::shared::{Job, Shared};

/// Cues synthesised at the same time.
pub(super) const WORKERS: usize = 2;
/// Synthesised audio that may wait for the output before workers pause: 30 s.
pub(super) const MAX_BUFFERED_SAMPLES: u64 = 30 * RATE as u64;
/// How often a worker waiting on the engine checks for a flush or stop.
const POLL: Duration = Duration::from_millis(20);

/// Starts the workers; they hold the engine until the element's stop sets `shutdown`.
pub(super) fn spawn_workers(
    engine: Arc<SharedEngine>,
    cloner: VoiceCloner,
    shared: Arc<Shared>,
    element: glib::WeakRef<gst::Element>,
) -> std::io::Result<Vec<std::thread::JoinHandle<()>>> {
    let cloner = Arc::new(Mutex::new(cloner));
    (0..WORKERS)
        .map(|i| {
            let (engine, cloner, shared, element) = (
                engine.clone(),
                cloner.clone(),
                shared.clone(),
                element.clone(),
            );
            std::thread::Builder::new()
                .name(format!("omnittssynth-{i}"))
                .spawn(move || worker_loop(&engine, &cloner, &shared, &element))
        })
        .collect()
}

fn worker_loop(
    engine: &Engine,
    cloner: &Mutex<VoiceCloner>,
    shared: &Shared,
    element: &glib::WeakRef<gst::Element>,
) {
    loop {
        let job = {
            let mut inner = shared.lock();
            loop {
                if inner.shutdown {
                    return;
                }
                if inner.timeline.buffered() < MAX_BUFFERED_SAMPLES
                    && let Some(job) = inner.jobs.pop_front()
                {
                    break job;
                }
                inner = shared.wait(inner, None);
            }
        };
        // A panic in one request must not take the element down: it ends that cue with an error.
        let (id, epoch) = (job.id, job.epoch);
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            synthesise(engine, cloner, shared, element, job)
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
/// (cancelled, clipped, an error), and reports the other requests' figures added up.
fn synthesise(
    engine: &Engine,
    cloner: &Mutex<VoiceCloner>,
    shared: &Shared,
    element: &glib::WeakRef<gst::Element>,
    job: Job,
) {
    let Job {
        id,
        epoch,
        requests,
        clone,
    } = job;
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
            synthesise_one(engine, shared, element, id, epoch, request, i)
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
    gst::debug!(
        CAT,
        "cue {id}: finished ({reason}), {} frames",
        metrics.frames
    );
    finish(shared, id, epoch, reason, metrics)
}

/// The figures of two requests spoken one after the other: frames, audio and wall time added,
/// the first's time to first audio, per-frame times weighted by frames, RTF over the whole.
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
    }
}

/// Runs request `index` of cue `id` to its end, its audio into the cue: its finish reason and
/// figures, or `None` when the cue was flushed or the element stopped meanwhile (the request is
/// cancelled by dropping its handle).
fn synthesise_one(
    engine: &Engine,
    shared: &Shared,
    element: &glib::WeakRef<gst::Element>,
    id: u64,
    epoch: u64,
    request: EngineRequest,
    index: usize,
) -> Option<(FinishReason, Metrics)> {
    gst::debug!(CAT, "cue {id}: submitting {:?}", request.voice.text);
    let handle = match engine.submit(request) {
        Ok(h) => h,
        Err(e) => return Some((FinishReason::Error(e.to_string()), Metrics::default())),
    };
    {
        let mut inner = shared.lock();
        if inner.epoch != epoch || inner.shutdown {
            // Flushed meanwhile: dropping the handle cancels the request.
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
                let mut inner = shared.lock();
                if inner.epoch != epoch || inner.shutdown {
                    return None;
                }
                if !inner.timeline.add_audio(id, &chunk.samples) {
                    // Clipped: the rest of its speech would never be heard.
                    handle.cancel();
                }
                shared.cond.notify_all();
            }
            EngineEvent::FirstAudio { ttfa_ms } if index == 0 => {
                let pts = {
                    let mut inner = shared.lock();
                    if let Some(info) = inner.infos.get_mut(&id) {
                        info.ttfa_ms = Some(ttfa_ms);
                    }
                    let start = inner.segment.start().unwrap_or(gst::ClockTime::ZERO);
                    start + pts_of(inner.timeline.position())
                };
                if let Some(e) = element.upgrade() {
                    let _ = e.post_message(messages::first_audio(&e, id, ttfa_ms, pts));
                }
            }
            EngineEvent::FirstAudio { .. } => {}
            EngineEvent::Finished { reason, metrics } => return Some((reason, metrics)),
        }
    }
}
