//! The element's run-time half: the queue shared by `create()` (consumer), the text inputs
//! (`text` / `push-text`, producers of utterances) and the worker thread that drives the
//! [`Engine`](crate::engine::Engine).
//!
//! ```text
//! push-text ─► pending (utterances) ─► worker ─► Engine::submit ─► events ─► items (bounded, samples) ─► create()
//! ```
//!
//! Base checkpoints: before submitting, the worker gives the utterance its voice-clone prompt
//! ([`VoiceCloner`]: the reference decoded once per `ref-audio`, encoded once by the engine's
//! cache); a reference that cannot be used refuses only that utterance.
//!
//! One mutex ([`Inner`]) and one condvar guard everything; every state change calls
//! `notify_all`. The worker never holds the lock while talking to the engine, and `create()`
//! never holds it while posting bus messages (a synchronous bus handler may call back into the
//! element).

use std::collections::VecDeque;
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gst::glib;
use gst::prelude::*;

use crate::engine::{Canceller, Engine, EngineEvent, EngineRequest, FinishReason, Metrics};

use super::CAT;
use super::voice_clone::{CloneSpec, VoiceCloner};

/// One queued piece of text with the request built from the properties at the time it was queued.
pub(super) struct Utterance {
    /// Sequence number, unique per element start, from 1.
    pub id: u64,
    /// The text as given (for bus messages).
    pub text: String,
    /// What the engine will be asked to do (without the voice-clone prompt), or why the text was
    /// refused when it was queued: the refusal is then posted in stream order, after the audio
    /// of the utterances queued before it.
    pub request: Result<EngineRequest, String>,
    /// Base checkpoints: the reference voice, turned into `request`'s prompt by the worker.
    pub clone: Option<CloneSpec>,
    /// Live mode: the sample position (stream sample counter) the text arrived at; speech is
    /// scheduled there, or right after the previous utterance. 0 in non-live mode.
    pub start_pos: u64,
}

/// What the worker hands to `create()`, in stream order.
pub(super) enum Item {
    /// An utterance was accepted by the engine.
    Started {
        id: u64,
        text: String,
        start_pos: u64,
    },
    /// 24 kHz mono samples in [-1, 1]; `pos` counts samples already turned into buffers.
    Audio { samples: Vec<f32>, pos: usize },
    /// The engine reported its time to first audio.
    FirstAudio { id: u64, ttfa_ms: f64 },
    /// The engine finished the utterance.
    Done {
        id: u64,
        reason: FinishReason,
        metrics: Metrics,
    },
    /// The utterance was refused (engine validation, unusable reference), nothing was started.
    Refused {
        id: u64,
        text: String,
        error: String,
    },
}

/// The utterance `create()` is currently emitting.
pub(super) struct Current {
    pub id: u64,
    pub text: String,
    /// Sample position of its first buffer.
    pub start: u64,
    /// Audio samples output so far (silence not counted).
    pub samples_out: u64,
    /// Live mode: silence buffers inserted because audio was late.
    pub underruns: u32,
    /// The engine's time to first audio, once reported.
    pub ttfa_ms: Option<f64>,
    /// When `create()` reached its start (for the done message of a cancelled utterance, whose
    /// engine metrics are dropped with it).
    pub since: std::time::Instant,
}

impl Current {
    /// An utterance starting at sample `start`, nothing output yet.
    pub fn new(id: u64, text: String, start: u64) -> Current {
        Current {
            id,
            text,
            start,
            samples_out: 0,
            underruns: 0,
            ttfa_ms: None,
            since: std::time::Instant::now(),
        }
    }
}

/// Everything guarded by the one mutex.
pub(super) struct Inner {
    /// Utterances not yet taken by the worker.
    pub pending: VecDeque<Utterance>,
    /// Output of the worker, consumed by `create()`.
    pub items: VecDeque<Item>,
    /// Samples in `items` not yet consumed.
    pub queued_samples: usize,
    /// Back-pressure bound for `queued_samples` (the worker waits above it).
    pub max_queued_samples: usize,
    /// The worker has taken an utterance and not yet queued its Done/Refused item.
    pub worker_busy: bool,
    /// Live mode: the `start_pos` of the utterance the worker is submitting (its Started item
    /// is not queued yet).
    pub busy_start: Option<u64>,
    /// Cancels the engine request in flight.
    pub canceller: Option<Canceller>,
    /// Bumped by flush and `cancel`: work of an older epoch is discarded.
    pub epoch: u64,
    /// BaseSrc `unlock()` is in effect: `create()` returns FLUSHING.
    pub unlocked: bool,
    /// `stop()`: the worker must exit.
    pub shutdown: bool,
    /// Set when the worker died (panic); `create()` turns it into an element error.
    pub worker_failure: Option<String>,
    /// Non-live: EOS was returned, no more text is accepted.
    pub eos: bool,
    /// Next utterance id.
    pub next_id: u64,
    /// Next sample position: the stream's sample counter (offset of the next buffer).
    pub n: u64,
    /// Buffers output since start (the first gets DISCONT).
    pub buffers: u64,
    /// Live mode: running time of sample 0 (taken at the first `create()`).
    pub r0: Option<gst::ClockTime>,
    /// The utterance being emitted.
    pub current: Option<Current>,
}

/// The queue: one mutex, one condvar.
pub(super) struct Shared {
    pub inner: Mutex<Inner>,
    pub cond: Condvar,
}

impl Shared {
    pub fn new(max_queued_samples: usize) -> Arc<Shared> {
        Arc::new(Shared {
            inner: Mutex::new(Inner {
                pending: VecDeque::new(),
                items: VecDeque::new(),
                queued_samples: 0,
                max_queued_samples,
                worker_busy: false,
                busy_start: None,
                canceller: None,
                epoch: 0,
                unlocked: false,
                shutdown: false,
                worker_failure: None,
                eos: false,
                next_id: 1,
                n: 0,
                buffers: 0,
                r0: None,
                current: None,
            }),
            cond: Condvar::new(),
        })
    }

    /// Locks the queue. A poisoned lock (a panic while it was held) is taken over: the data is
    /// plain bookkeeping and every reader re-checks it.
    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Inner {
    /// Queues an utterance for the worker under the next id; returns it as queued.
    pub fn queue(
        &mut self,
        text: String,
        request: Result<EngineRequest, String>,
        clone: Option<CloneSpec>,
        start_pos: u64,
    ) -> &Utterance {
        let id = self.next_id;
        self.next_id += 1;
        self.pending.push_back(Utterance {
            id,
            text,
            request,
            clone,
            start_pos,
        });
        &self.pending[self.pending.len() - 1]
    }

    /// Drops all queued text and audio, cancels the engine request in flight and retires the
    /// current utterance. Returns the retired utterance (its done message is the caller's to post).
    pub fn discard_all(&mut self) -> Option<Current> {
        self.epoch += 1;
        self.pending.clear();
        self.items.clear();
        self.queued_samples = 0;
        self.busy_start = None;
        if let Some(c) = &self.canceller {
            c.cancel();
        }
        self.current.take()
    }
}

/// Bus message structure names (element messages posted by `omnittssrc`).
pub mod messages {
    /// An utterance's first buffer is being output. Fields: `id` (u64), `text` (string),
    /// `pts` (u64 ns, stream time of its first sample).
    pub const STARTED: &str = "omnitts/utterance-started";
    /// The engine produced the utterance's first audio. Fields: `id`, `ttfa-ms` (f64, from
    /// submission to the first decoded chunk), `pts`.
    pub const FIRST_AUDIO: &str = "omnitts/utterance-first-audio";
    /// The utterance ended. Fields: `id`, `text`, `reason` (`eos`, `length`, `guard`, `cancelled`,
    /// `error`), `error` (string, empty unless `reason` is `error`), `frames` (u64 codec frames
    /// generated), `samples` (u64 audio samples output), `audio-ms` (f64 audio generated),
    /// `ttfa-ms` (f64, -1 if none), `rtf` (f64, wall time / audio time), `wall-ms` (f64),
    /// `ar-ms-per-frame`, `decoder-ms-per-frame` (f64), `underruns` (u32, live mode), `pts`
    /// (start), `duration` (u64 ns from the first to past the last output sample).
    pub const DONE: &str = "omnitts/utterance-done";
}

/// The name a [`FinishReason`] is reported as in the done message, and its error text.
pub(super) fn reason_name(r: &FinishReason) -> (&'static str, String) {
    let error = match r {
        FinishReason::Error(e) => e.clone(),
        _ => String::new(),
    };
    (r.as_str(), error)
}

/// Builds the done message for `cur`, whose last sample ended at position `end`.
pub(super) fn done_message(
    src: &gst::Element,
    cur: &Current,
    end: u64,
    rate: u32,
    reason: &FinishReason,
    metrics: &Metrics,
) -> gst::Message {
    let (reason, error) = reason_name(reason);
    let pts = pts_of(cur.start, rate);
    let duration = pts_of(end, rate).saturating_sub(pts);
    let s = gst::Structure::builder(messages::DONE)
        .field("id", cur.id)
        .field("text", cur.text.as_str())
        .field("reason", reason)
        .field("error", error.as_str())
        .field("frames", metrics.frames as u64)
        .field("samples", cur.samples_out)
        .field("audio-ms", metrics.audio_ms)
        .field("ttfa-ms", metrics.ttfa_ms.unwrap_or(-1.0))
        .field("rtf", metrics.rtf)
        .field("wall-ms", metrics.wall_ms)
        .field("ar-ms-per-frame", metrics.ar_ms_per_frame)
        .field("decoder-ms-per-frame", metrics.decoder_ms_per_frame)
        .field("underruns", cur.underruns)
        .field("pts", pts.nseconds())
        .field("duration", duration.nseconds())
        .build();
    gst::message::Element::builder(s).src(src).build()
}

/// Stream time of sample position `n`: `n * SECOND / rate`, integer, rounded down.
pub(super) fn pts_of(n: u64, rate: u32) -> gst::ClockTime {
    gst::ClockTime::from_nseconds(
        n.mul_div_floor(gst::ClockTime::SECOND.nseconds(), rate as u64)
            .unwrap_or(u64::MAX),
    )
}

/// Sample position of stream time `t` (rounded down).
pub(super) fn pos_of(t: gst::ClockTime, rate: u32) -> u64 {
    t.nseconds()
        .mul_div_floor(rate as u64, gst::ClockTime::SECOND.nseconds())
        .unwrap_or(u64::MAX)
}

/// How long the worker waits on the engine between checks of the stop/cancel flags.
const POLL: Duration = Duration::from_millis(20);
/// How long the worker waits for a cancelled request to report Finished before giving up on it.
const CANCEL_GRACE: Duration = Duration::from_secs(10);

/// Spawns the worker. It holds a reference to the engine until it exits, which happens on
/// `shutdown`; `cloner` comes with the reference decoded at start.
pub(super) fn spawn_worker(
    engine: Arc<Engine>,
    mut cloner: VoiceCloner,
    shared: Arc<Shared>,
    element: glib::WeakRef<gst::Element>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("omnitts-worker".into())
        .spawn(move || {
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                worker_loop(&engine, &mut cloner, &shared, &element)
            }));
            if let Err(panic) = run {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                let mut inner = shared.lock();
                inner.worker_failure = Some(what);
                inner.worker_busy = false;
                inner.canceller = None;
                shared.cond.notify_all();
            }
            // The element's stop() drops the last reference, which joins the stage threads.
            drop(engine);
        })
}

fn worker_loop(
    engine: &Engine,
    cloner: &mut VoiceCloner,
    shared: &Shared,
    element: &glib::WeakRef<gst::Element>,
) {
    loop {
        // Take the next utterance.
        let (utt, epoch) = {
            let mut inner = shared.lock();
            loop {
                if inner.shutdown {
                    return;
                }
                if let Some(u) = inner.pending.pop_front() {
                    inner.worker_busy = true;
                    inner.busy_start = Some(u.start_pos);
                    break (u, inner.epoch);
                }
                inner = shared.cond.wait(inner).unwrap_or_else(|p| p.into_inner());
            }
        };
        let Utterance {
            id,
            text,
            request,
            clone,
            start_pos,
        } = utt;
        gst::debug!(CAT, "worker: submitting utterance {id}: {text:?}");
        let submitted = request.and_then(|mut request| {
            if let Some(spec) = &clone {
                let prompt = cloner.prompt(engine, spec).map_err(|e| e.to_string())?;
                request.voice.voice_clone = Some(prompt);
            }
            engine.submit(request).map_err(|e| e.to_string())
        });
        let handle = match submitted {
            Ok(h) => h,
            Err(error) => {
                let mut inner = shared.lock();
                if inner.epoch == epoch {
                    inner.items.push_back(Item::Refused { id, text, error });
                }
                inner.worker_busy = false;
                inner.busy_start = None;
                shared.cond.notify_all();
                continue;
            }
        };
        {
            let mut inner = shared.lock();
            inner.busy_start = None;
            if inner.epoch == epoch && !inner.shutdown {
                inner.canceller = Some(handle.canceller());
                inner.items.push_back(Item::Started {
                    id,
                    text,
                    start_pos,
                });
            } else {
                handle.cancel();
            }
            shared.cond.notify_all();
        }

        // Forward events until Finished.
        let mut cancelled_at: Option<Instant> = None;
        loop {
            let ev = match handle.recv_timeout(POLL) {
                Ok(ev) => ev,
                Err(RecvTimeoutError::Timeout) => {
                    let inner = shared.lock();
                    let stale = inner.epoch != epoch || inner.shutdown;
                    drop(inner);
                    if stale {
                        handle.cancel();
                        let t = *cancelled_at.get_or_insert_with(Instant::now);
                        if t.elapsed() > CANCEL_GRACE {
                            gst::warning!(
                                CAT,
                                "worker: utterance {id} did not stop within {CANCEL_GRACE:?} of cancel"
                            );
                            break;
                        }
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    // The engine dropped the request without Finished.
                    let mut inner = shared.lock();
                    if inner.epoch == epoch {
                        inner.items.push_back(Item::Done {
                            id,
                            reason: FinishReason::Error(
                                "the engine stopped without finishing the utterance".into(),
                            ),
                            metrics: Metrics::default(),
                        });
                    }
                    shared.cond.notify_all();
                    break;
                }
            };
            match ev {
                EngineEvent::Started => {}
                EngineEvent::Audio(chunk) => {
                    let len = chunk.samples.len();
                    if len == 0 {
                        continue;
                    }
                    let mut inner = shared.lock();
                    // Back-pressure: wait for room (always accept into an empty queue).
                    while inner.epoch == epoch
                        && !inner.shutdown
                        && inner.queued_samples > 0
                        && inner.queued_samples + len > inner.max_queued_samples
                    {
                        inner = shared.cond.wait(inner).unwrap_or_else(|p| p.into_inner());
                    }
                    if inner.epoch == epoch && !inner.shutdown {
                        inner.queued_samples += len;
                        inner.items.push_back(Item::Audio {
                            samples: chunk.samples,
                            pos: 0,
                        });
                        shared.cond.notify_all();
                    } else {
                        drop(inner);
                        handle.cancel();
                        cancelled_at.get_or_insert_with(Instant::now);
                    }
                }
                EngineEvent::FirstAudio { ttfa_ms } => {
                    let mut inner = shared.lock();
                    if inner.epoch == epoch {
                        inner.items.push_back(Item::FirstAudio { id, ttfa_ms });
                        shared.cond.notify_all();
                    }
                }
                EngineEvent::Finished { reason, metrics } => {
                    gst::debug!(
                        CAT,
                        "worker: utterance {id} finished: {reason:?}, {} frames",
                        metrics.frames
                    );
                    let mut inner = shared.lock();
                    if inner.epoch == epoch {
                        inner.items.push_back(Item::Done {
                            id,
                            reason,
                            metrics,
                        });
                    } else if let FinishReason::Error(e) = &reason {
                        // Discarded utterance, but an engine error is still worth a log line.
                        gst::warning!(CAT, "worker: discarded utterance {id} failed: {e}");
                    }
                    shared.cond.notify_all();
                    break;
                }
            }
        }
        let mut inner = shared.lock();
        inner.canceller = None;
        inner.worker_busy = false;
        shared.cond.notify_all();
        drop(inner);
        if element.upgrade().is_none() {
            return;
        }
    }
}
