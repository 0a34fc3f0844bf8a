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
use crate::engine::{Engine, EngineEvent, FinishReason, Metrics, SharedEngine};

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

/// Runs one cue's request to its end.
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
        mut request,
        clone,
    } = job;
    gst::debug!(CAT, "cue {id}: submitting {:?}", request.voice.text);
    let submitted = (|| {
        if let Some(spec) = &clone {
            let prompt = cloner
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .prompt(engine, spec)
                .map_err(|e| e.to_string())?;
            request.voice.voice_clone = Some(prompt);
        }
        engine.submit(request).map_err(|e| e.to_string())
    })();
    let handle = match submitted {
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
    {
        let mut inner = shared.lock();
        if inner.epoch != epoch || inner.shutdown {
            // Flushed meanwhile: dropping the handle cancels the request.
            return;
        }
        inner.cancellers.insert(id, handle.canceller());
    }
    loop {
        let ev = match handle.recv_timeout(POLL) {
            Ok(ev) => ev,
            Err(RecvTimeoutError::Timeout) => {
                let inner = shared.lock();
                if inner.epoch != epoch || inner.shutdown {
                    return;
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => {
                let e = "the engine stopped without finishing the cue".to_string();
                return finish(
                    shared,
                    id,
                    epoch,
                    FinishReason::Error(e),
                    Metrics::default(),
                );
            }
        };
        match ev {
            EngineEvent::Started => {}
            EngineEvent::Audio(chunk) => {
                let mut inner = shared.lock();
                if inner.epoch != epoch || inner.shutdown {
                    return;
                }
                if !inner.timeline.add_audio(id, &chunk.samples) {
                    // Clipped: the rest of its speech would never be heard.
                    handle.cancel();
                }
                shared.cond.notify_all();
            }
            EngineEvent::FirstAudio { ttfa_ms } => {
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
            EngineEvent::Finished { reason, metrics } => {
                gst::debug!(
                    CAT,
                    "cue {id}: finished ({reason}), {} frames",
                    metrics.frames
                );
                return finish(shared, id, epoch, reason, metrics);
            }
        }
    }
}
