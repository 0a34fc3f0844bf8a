//! The two stage threads and the per-request state they share.
//!
//! Each stage thread opens its own device context, loads its model, reports back to
//! [`super::Engine::load`], and then serves requests: it keeps a FIFO of requests not yet started
//! and up to `max_num_seqs` active ones, gives every active request one unit of work per round
//! (stage 0: one AR frame; stage 1: one scheduled chunk), and sleeps on its stage [`Signal`] when
//! none can progress. The signal is advanced by new requests, by the request buffers (space freed,
//! frames pushed, finish, cancel) and by shutdown, so no wake-up is lost. Stage 0 also runs the
//! voice-clone encoding jobs of [`super::Engine::voice_clone_prompt`] (Base: speaker encoder and
//! codec encoder, owned by its `ArModel`), each before its next round of frames.
//!
//! Stage 0 lets go of a request by recording its outcome and then finishing (or cancelling) the
//! request's buffer; stage 1 sends `Finished` only after that, so when a handle sees `Finished`
//! neither stage holds the request's session, decoder state or frames any more.

use std::any::Any;
use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Instant;

use super::chunk_buffer::{ChunkBuffer, ChunkPolicy, PushError, Signal, Take};
use super::config::{ArStageConfig, DecoderStageConfig, DecoderStreamingMode};
use super::metrics::{ArTiming, DecoderTiming};
use super::{
    AudioChunk, DeviceSpec, EngineError, EngineEvent, EngineOptions, EngineRequest, FinishReason,
    Metrics,
};
use crate::models::qwen3_tts::code2wav::{Code2Wav, Code2WavStream};
use crate::models::qwen3_tts::{
    self as model, ArModel, ArSession, ArStep, Checkpoint, ModelError, ModelVariant,
};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn panic_message(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
}

/// Runs `f`, turning a panic into an error message (a panic inside a model call fails only the
/// request, never the stage thread).
fn guarded<T>(f: impl FnOnce() -> Result<T, ModelError>) -> Result<T, String> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(p) => Err(format!("panicked: {}", panic_message(p.as_ref()))),
    }
}

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
        }
    }

    fn send(&self, ev: EngineEvent) {
        // The handle may be gone; then nobody listens (and the request was cancelled on drop).
        let _ = self.events.send(ev);
    }

    fn ar_outcome(&self) -> Option<ArOutcome> {
        lock(&self.ar_outcome).clone()
    }

    /// Stage 0 lets go: record the outcome, then finish or cancel the buffer (which wakes stage 1).
    fn release_from_ar(&self, reason: FinishReason, timing: ArTiming) {
        let cancelled = reason == FinishReason::Cancelled;
        *lock(&self.ar_outcome) = Some(ArOutcome { reason, timing });
        if cancelled {
            self.buffer.cancel();
        } else {
            self.buffer.finish();
        }
    }
}

/// A voice-clone reference to encode on stage 0 ([`super::Engine::voice_clone_prompt`]); the
/// result goes back on `reply` (dropped unanswered if the stage shuts down first).
pub(crate) struct EncodeJob {
    pub audio_24k: Vec<f32>,
    pub ref_text: Option<String>,
    pub x_vector_only: bool,
    pub reply: mpsc::SyncSender<Result<model::VoiceClonePrompt, EngineError>>,
}

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
    fn new() -> Arc<Self> {
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

    fn take_jobs(&self) -> Vec<EncodeJob> {
        lock(&self.state).jobs.drain(..).collect()
    }

    pub fn shut_down(&self) {
        lock(&self.state).shutdown = true;
        self.signal.notify();
    }

    fn drain(&self) -> (Vec<Arc<RequestShared>>, bool) {
        let mut g = lock(&self.state);
        (g.items.drain(..).collect(), g.shutdown)
    }
}

/// Marks a stage's queue dead when its thread exits (normally or by a panic) and drops what is
/// still queued, so that no request waits on a stage that is gone.
struct DeadOnExit(Arc<StageQueue>);

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

/// What the stages report after loading.
#[derive(Debug, Clone)]
pub(crate) struct LoadedInfo {
    pub variant: ModelVariant,
    pub speakers: Vec<String>,
    pub languages: Vec<String>,
    pub sample_rate: u32,
    pub samples_per_frame: usize,
    pub ar_device: DeviceSpec,
    pub decoder_device: DeviceSpec,
    pub cuda_graphs: CudaGraphs,
}

/// Whether stage 0 replays CUDA graphs (the code predictor's steps and the talker's decode step).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CudaGraphs {
    /// Stage 0 is not on a CUDA device.
    NotApplicable,
    /// Captured at load, before the engine reported ready; every frame replays them.
    Enabled,
    /// Capture failed; frames run eagerly. The reason names the CUDA call.
    Fallback(String),
}

struct ArInfo {
    cuda_graphs: CudaGraphs,
    variant: ModelVariant,
    speakers: Vec<String>,
    languages: Vec<String>,
    groups: usize,
    device: DeviceSpec,
}

struct DecInfo {
    sample_rate: u32,
    samples_per_frame: usize,
    quantizers: usize,
    device: DeviceSpec,
}

/// The stage-0 and stage-1 threads.
pub(crate) type Threads = (JoinHandle<()>, JoinHandle<()>);

/// Spawns both stage threads and waits for them to load.
pub(crate) fn spawn(
    ckpt: Checkpoint,
    opts: &EngineOptions,
) -> Result<(LoadedInfo, Arc<StageQueue>, Arc<StageQueue>, Threads), EngineError> {
    let ar_queue = StageQueue::new();
    let dec_queue = StageQueue::new();
    let mut threads: Vec<JoinHandle<()>> = Vec::new();

    let (ar_tx, ar_rx) = mpsc::sync_channel::<Result<ArInfo, EngineError>>(1);
    let ar_cfg = opts.stage_config.ar.clone();
    let ar_device = opts.ar_device;
    let q = ar_queue.clone();
    let stage0 = thread::Builder::new()
        .name("omnitts-stage0-ar".to_string())
        .spawn(move || ar_thread(ckpt, ar_device, ar_cfg, q, ar_tx));

    let (dec_tx, dec_rx) = mpsc::sync_channel::<Result<DecInfo, EngineError>>(1);
    let dec_cfg = opts.stage_config.decoder.clone();
    let dec_device = opts.decoder_device;
    let dir = opts.model_dir.clone();
    let q = dec_queue.clone();
    let stage1 = thread::Builder::new()
        .name("omnitts-stage1-code2wav".to_string())
        .spawn(move || dec_thread(dir, dec_device, dec_cfg, q, dec_tx));

    let spawn_err = |stage, e: std::io::Error| EngineError::Stage {
        stage,
        msg: format!("cannot spawn the stage thread: {e}"),
    };
    let mut first_err = None;
    match stage0 {
        Ok(h) => threads.push(h),
        Err(e) => first_err = Some(spawn_err(0, e)),
    }
    match stage1 {
        Ok(h) => threads.push(h),
        Err(e) => first_err = first_err.or(Some(spawn_err(1, e))),
    }
    let died = |stage| EngineError::Stage {
        stage,
        msg: "the stage thread exited while loading".to_string(),
    };
    let ar = ar_rx.recv().unwrap_or_else(|_| Err(died(0)));
    let dec = dec_rx.recv().unwrap_or_else(|_| Err(died(1)));
    let result = match (first_err, ar, dec) {
        (Some(e), _, _) | (None, Err(e), _) | (None, Ok(_), Err(e)) => Err(e),
        (None, Ok(ar), Ok(dec)) if ar.groups != dec.quantizers => {
            Err(EngineError::Mismatch(format!(
                "talker_config.num_code_groups = {} but the codec decoder has {} quantizers",
                ar.groups, dec.quantizers
            )))
        }
        (None, Ok(ar), Ok(dec)) => Ok(LoadedInfo {
            variant: ar.variant,
            speakers: ar.speakers,
            languages: ar.languages,
            sample_rate: dec.sample_rate,
            samples_per_frame: dec.samples_per_frame,
            ar_device: ar.device,
            decoder_device: dec.device,
            cuda_graphs: ar.cuda_graphs,
        }),
    };
    match result {
        Ok(info) => {
            let mut it = threads.into_iter();
            match (it.next(), it.next()) {
                (Some(t0), Some(t1)) => Ok((info, ar_queue, dec_queue, (t0, t1))),
                _ => unreachable!("both threads were spawned when loading succeeded"),
            }
        }
        Err(e) => {
            ar_queue.shut_down();
            dec_queue.shut_down();
            for t in threads {
                let _ = t.join();
            }
            Err(e)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Stage 0

fn ar_thread(
    ckpt: Checkpoint,
    device: DeviceSpec,
    cfg: ArStageConfig,
    queue: Arc<StageQueue>,
    ready: mpsc::SyncSender<Result<ArInfo, EngineError>>,
) {
    let _dead_on_exit = DeadOnExit(queue.clone());
    let loaded = (|| {
        let dev = device.open()?;
        let dtype = cfg.dtype.for_device(&dev);
        let model = match catch_unwind(AssertUnwindSafe(|| ArModel::load(&ckpt, &dev, dtype))) {
            Ok(r) => r.map_err(|e| EngineError::Load {
                stage: 0,
                name: "qwen3_tts",
                source: e,
            })?,
            Err(p) => {
                return Err(EngineError::Stage {
                    stage: 0,
                    msg: format!("panicked while loading: {}", panic_message(p.as_ref())),
                });
            }
        };
        // Capture the code predictor's graphs before reporting ready (field-lessons.md §5): the
        // stream is still ours alone. A failed capture leaves the model eager.
        let mut model = model;
        let graphs = if dev.is_cuda() {
            match model.enable_cuda_graphs() {
                Ok(()) => CudaGraphs::Enabled,
                Err(e) => CudaGraphs::Fallback(e.to_string()),
            }
        } else {
            CudaGraphs::NotApplicable
        };
        Ok((model, graphs))
    })();
    let (model, cuda_graphs) = match loaded {
        Ok(m) => m,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let info = ArInfo {
        cuda_graphs,
        variant: model.variant(),
        speakers: model.speakers(),
        languages: model.languages(),
        groups: model.num_code_groups(),
        device: device.resolve(),
    };
    let groups = info.groups;
    if ready.send(Ok(info)).is_err() {
        return;
    }
    drop(ready);
    ArStage {
        model: &model,
        cfg: &cfg,
        groups,
    }
    .run(&queue);
}

struct ArStage<'m> {
    model: &'m ArModel,
    cfg: &'m ArStageConfig,
    groups: usize,
}

/// One request being generated on stage 0.
struct ArActive<'m> {
    req: Arc<RequestShared>,
    session: ArSession<'m>,
    timing: ArTiming,
    /// Frames pushed so far.
    frames: usize,
    /// The runaway guard's budget for this request.
    budget: Option<usize>,
}

enum ArStepResult {
    /// Nothing could be done now (buffer full).
    Blocked,
    /// A frame was produced.
    Progress,
    /// The request is over for stage 0.
    Done(FinishReason),
}

/// Text tokens of the request (the model's tokenizer on the user text), for the runaway guard.
/// Should the tokenizer fail — `start` succeeded, so it cannot in practice — the character count
/// stands in, which errs on the generous side (BPE tokens rarely outnumber characters).
fn text_tokens(model: &ArModel, req: &EngineRequest) -> usize {
    model
        .tokenizer()
        .encode(&req.voice.text)
        .map(|ids| ids.len())
        .unwrap_or_else(|_| req.voice.text.chars().count())
}

impl<'m> ArStage<'m> {
    fn run(&self, queue: &StageQueue) {
        let mut waiting: VecDeque<Arc<RequestShared>> = VecDeque::new();
        let mut active: Vec<ArActive<'m>> = Vec::new();
        loop {
            let seen = queue.signal.epoch();
            let (new, shutdown) = queue.drain();
            waiting.extend(new);
            let jobs = queue.take_jobs();
            if shutdown {
                drop(jobs);
                for a in active.drain(..) {
                    a.req.cancel();
                    a.req.release_from_ar(FinishReason::Cancelled, a.timing);
                }
                for r in waiting.drain(..) {
                    r.cancel();
                    r.release_from_ar(FinishReason::Cancelled, ArTiming::default());
                }
                return;
            }
            let mut progress = !jobs.is_empty();
            for job in jobs {
                self.encode(job);
            }
            // Cancelled before they started: let go at once.
            waiting.retain(|r| {
                if r.is_cancelled() {
                    r.release_from_ar(FinishReason::Cancelled, ArTiming::default());
                    progress = true;
                    false
                } else {
                    true
                }
            });
            while active.len() < self.cfg.max_num_seqs {
                let Some(r) = waiting.pop_front() else { break };
                progress = true;
                if let Some(a) = self.start(r) {
                    active.push(a);
                }
            }
            let mut i = 0;
            while i < active.len() {
                match self.step(&mut active[i]) {
                    ArStepResult::Blocked => i += 1,
                    ArStepResult::Progress => {
                        progress = true;
                        i += 1;
                    }
                    ArStepResult::Done(reason) => {
                        progress = true;
                        let a = active.remove(i);
                        let ArActive {
                            req,
                            session,
                            timing,
                            ..
                        } = a;
                        // Free the KV cache before stage 1 can report Finished.
                        drop(session);
                        req.release_from_ar(reason, timing);
                    }
                }
            }
            if !progress {
                queue.signal.wait_past(seen, None);
            }
        }
    }

    /// Runs one voice-clone encoding job (speaker encoder + codec encoder) and answers it. Invalid
    /// references come back as `InvalidRequest` naming the field (`ref_audio`, `ref_text`,
    /// `model`); a model failure or panic as a stage-0 error.
    fn encode(&self, job: EncodeJob) {
        let result = catch_unwind(AssertUnwindSafe(|| {
            self.model.create_voice_clone_prompt(
                &job.audio_24k,
                job.ref_text.as_deref(),
                job.x_vector_only,
            )
        }));
        let result = match result {
            Ok(Ok(prompt)) => Ok(prompt),
            Ok(Err(ModelError::InvalidRequest { field, value, msg })) => {
                Err(EngineError::InvalidRequest { field, value, msg })
            }
            Ok(Err(e)) => Err(EngineError::Stage {
                stage: 0,
                msg: format!("encoding the voice-clone reference: {e}"),
            }),
            Err(p) => Err(EngineError::Stage {
                stage: 0,
                msg: format!(
                    "encoding the voice-clone reference panicked: {}",
                    panic_message(p.as_ref())
                ),
            }),
        };
        // The caller may have given up; then nobody listens.
        let _ = job.reply.send(result);
    }

    fn start(&self, req: Arc<RequestShared>) -> Option<ArActive<'m>> {
        let started = Instant::now();
        req.send(EngineEvent::Started);
        let r = &req.request;
        let result = guarded(|| {
            self.model
                .start_until(&r.voice, &r.sampling, &|| req.is_cancelled())
        });
        let timing = ArTiming {
            started: Some(started),
            prefill: started.elapsed(),
            ..ArTiming::default()
        };
        match result {
            Ok(session) => {
                let budget = self.cfg.guard.budget(text_tokens(self.model, r));
                Some(ArActive {
                    req,
                    session,
                    timing,
                    frames: 0,
                    budget,
                })
            }
            Err(_) if req.is_cancelled() => {
                // stopped between prefill chunks (or failed after the cancel): nobody waits for it
                req.release_from_ar(FinishReason::Cancelled, timing);
                None
            }
            Err(msg) => {
                req.release_from_ar(
                    FinishReason::Error(format!("stage 0 (qwen3_tts) prefill: {msg}")),
                    timing,
                );
                None
            }
        }
    }

    fn step(&self, a: &mut ArActive<'m>) -> ArStepResult {
        if a.req.is_cancelled() {
            return ArStepResult::Done(FinishReason::Cancelled);
        }
        if !a.req.buffer.has_space() {
            return ArStepResult::Blocked;
        }
        let t = Instant::now();
        let step = guarded(|| a.session.next_frame());
        a.timing.steps += t.elapsed();
        match step {
            Ok(ArStep::Frame(codes)) => {
                if codes.len() != self.groups {
                    return ArStepResult::Done(FinishReason::Error(format!(
                        "stage 0 (qwen3_tts) frame {}: {} codes, expected num_code_groups = {}",
                        a.frames,
                        codes.len(),
                        self.groups
                    )));
                }
                if a.budget.is_some_and(|b| a.frames >= b) {
                    // This frame would pass the budget: drop it and stop.
                    return ArStepResult::Done(FinishReason::Guard);
                }
                match a.req.buffer.try_push(codes) {
                    Ok(()) => {
                        a.frames += 1;
                        a.timing.frames += 1;
                        ArStepResult::Progress
                    }
                    Err(PushError::Cancelled(_)) => ArStepResult::Done(FinishReason::Cancelled),
                    Err(PushError::Full(_)) | Err(PushError::Finished(_)) => {
                        // Only this thread pushes, and it checked for space above.
                        ArStepResult::Done(FinishReason::Error(
                            "stage 0: async-chunk buffer refused a frame".to_string(),
                        ))
                    }
                }
            }
            Ok(ArStep::Finished(model::FinishReason::Eos)) => ArStepResult::Done(FinishReason::Eos),
            Ok(ArStep::Finished(model::FinishReason::Length)) => {
                ArStepResult::Done(FinishReason::Length)
            }
            Err(msg) => ArStepResult::Done(FinishReason::Error(format!(
                "stage 0 (qwen3_tts) frame {}: {msg}",
                a.frames
            ))),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Stage 1

fn dec_thread(
    dir: PathBuf,
    device: DeviceSpec,
    cfg: DecoderStageConfig,
    queue: Arc<StageQueue>,
    ready: mpsc::SyncSender<Result<DecInfo, EngineError>>,
) {
    let _dead_on_exit = DeadOnExit(queue.clone());
    let loaded = (|| {
        let dev = device.open()?;
        match catch_unwind(AssertUnwindSafe(|| Code2Wav::load(&dir, &dev))) {
            Ok(r) => r.map_err(|e| EngineError::Load {
                stage: 1,
                name: "code2wav",
                source: e,
            }),
            Err(p) => Err(EngineError::Stage {
                stage: 1,
                msg: format!("panicked while loading: {}", panic_message(p.as_ref())),
            }),
        }
    })();
    let c2w = match loaded {
        Ok(m) => m,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let info = DecInfo {
        sample_rate: c2w.sample_rate(),
        samples_per_frame: c2w.samples_per_frame(),
        quantizers: c2w.num_quantizers(),
        device: device.resolve(),
    };
    if ready.send(Ok(info)).is_err() {
        return;
    }
    drop(ready);
    DecStage {
        c2w: &c2w,
        cfg: &cfg,
    }
    .run(&queue);
}

struct DecStage<'c> {
    c2w: &'c Code2Wav,
    cfg: &'c DecoderStageConfig,
}

enum DecState<'c> {
    /// Batch: one whole-utterance decode after the ICL reference codes (empty otherwise).
    Whole(Vec<Vec<u32>>),
    /// Stateful exact streaming.
    Exact(Code2WavStream<'c>),
    /// Stateless windows; the last `codec_left_context_frames` frames decoded so far.
    Windowed(Vec<Vec<u32>>),
}

/// One request on stage 1.
struct DecActive<'c> {
    req: Arc<RequestShared>,
    state: DecState<'c>,
    timing: DecoderTiming,
}

enum DecPoll {
    Idle,
    Progress,
    Done(FinishReason),
}

impl<'c> DecStage<'c> {
    fn run(&self, queue: &StageQueue) {
        let mut waiting: VecDeque<Arc<RequestShared>> = VecDeque::new();
        let mut active: Vec<DecActive<'c>> = Vec::new();
        loop {
            let seen = queue.signal.epoch();
            let (new, shutdown) = queue.drain();
            waiting.extend(new);
            if shutdown {
                let all = active
                    .drain(..)
                    .map(|a| (a.req, a.timing))
                    .chain(waiting.drain(..).map(|r| (r, DecoderTiming::default())));
                for (req, timing) in all {
                    req.cancel();
                    Self::finish(&req, FinishReason::Cancelled, &timing, self.sample_rate());
                }
                return;
            }
            let mut progress = false;
            // Cancelled before they started here: finish once stage 0 has let go.
            waiting.retain(|r| {
                if r.is_cancelled() && r.ar_outcome().is_some() {
                    Self::finish(
                        r,
                        FinishReason::Cancelled,
                        &DecoderTiming::default(),
                        self.sample_rate(),
                    );
                    progress = true;
                    false
                } else {
                    true
                }
            });
            while active.len() < self.cfg.max_num_seqs {
                let Some(req) = waiting.pop_front() else {
                    break;
                };
                progress = true;
                let mut timing = DecoderTiming::default();
                let state = match self.init_state(&req, &mut timing) {
                    Ok(state) => state,
                    Err(msg) => {
                        req.cancel();
                        let reason = FinishReason::Error(format!(
                            "stage 1 (code2wav) reference codes: {msg}"
                        ));
                        Self::finish(&req, reason, &timing, self.sample_rate());
                        continue;
                    }
                };
                active.push(DecActive { req, state, timing });
            }
            let mut i = 0;
            while i < active.len() {
                match self.poll(&mut active[i]) {
                    DecPoll::Idle => i += 1,
                    DecPoll::Progress => {
                        progress = true;
                        i += 1;
                    }
                    DecPoll::Done(reason) => {
                        progress = true;
                        let a = active.remove(i);
                        let DecActive { req, state, timing } = a;
                        drop(state);
                        Self::finish(&req, reason, &timing, self.sample_rate());
                    }
                }
            }
            if !progress {
                queue.signal.wait_past(seen, None);
            }
        }
    }

    fn sample_rate(&self) -> u32 {
        self.c2w.sample_rate()
    }

    /// The decoder state a request starts with. For Base ICL the reference codes are the decoder's
    /// left context for the whole utterance (field-lessons.md §4): the exact stream is primed with
    /// them and their audio dropped, the windowed history starts with their tail, and a whole
    /// decode prepends them.
    fn init_state(
        &self,
        req: &RequestShared,
        timing: &mut DecoderTiming,
    ) -> Result<DecState<'c>, String> {
        let context = req
            .request
            .voice
            .voice_clone
            .as_ref()
            .filter(|vc| vc.icl)
            .and_then(|vc| vc.ref_codes.clone())
            .unwrap_or_default();
        Ok(match (req.buffer.policy(), self.cfg.streaming_mode) {
            (ChunkPolicy::Whole, _) => DecState::Whole(context),
            (_, DecoderStreamingMode::Exact) => {
                let mut stream = self.c2w.stream();
                if !context.is_empty() {
                    let t = Instant::now();
                    guarded(|| stream.decode_chunk(&context))?;
                    timing.decode += t.elapsed();
                }
                DecState::Exact(stream)
            }
            (_, DecoderStreamingMode::Windowed) => {
                let keep = self.cfg.codec_left_context_frames;
                DecState::Windowed(context[context.len().saturating_sub(keep)..].to_vec())
            }
        })
    }

    fn finish(req: &RequestShared, reason: FinishReason, timing: &DecoderTiming, rate: u32) {
        let ar = req.ar_outcome();
        let ar_timing = ar.as_ref().map(|o| o.timing.clone()).unwrap_or_default();
        let metrics = Metrics::build(req.submitted, Instant::now(), &ar_timing, timing, rate);
        req.send(EngineEvent::Finished { reason, metrics });
    }

    /// The reason stage 0 recorded; it is always set before the buffer reports Done.
    fn ar_reason(req: &RequestShared) -> FinishReason {
        req.ar_outcome().map(|o| o.reason).unwrap_or_else(|| {
            FinishReason::Error("stage 1: stage 0 finished without a reason".to_string())
        })
    }

    fn poll(&self, a: &mut DecActive<'c>) -> DecPoll {
        match a.req.buffer.try_take() {
            Take::NotReady => DecPoll::Idle,
            // Wait until stage 0 has let go as well.
            Take::Cancelled if a.req.ar_outcome().is_none() => DecPoll::Idle,
            Take::Cancelled => DecPoll::Done(FinishReason::Cancelled),
            Take::Done => DecPoll::Done(Self::ar_reason(&a.req)),
            Take::Chunk {
                frames,
                first,
                last,
            } => {
                if a.req.is_cancelled() {
                    return DecPoll::Progress;
                }
                let spf = self.c2w.samples_per_frame();
                let t = Instant::now();
                let decoded = match &mut a.state {
                    DecState::Whole(context) => {
                        guarded(|| self.c2w.decode_window(context, &frames))
                    }
                    DecState::Exact(stream) => guarded(|| stream.decode_chunk(&frames)),
                    DecState::Windowed(history) => {
                        let r = guarded(|| self.c2w.decode_window(history, &frames));
                        history.extend(frames.iter().cloned());
                        let keep = self.cfg.codec_left_context_frames;
                        if history.len() > keep {
                            history.drain(..history.len() - keep);
                        }
                        r
                    }
                };
                a.timing.decode += t.elapsed();
                let samples = match decoded {
                    Ok(s) => s,
                    Err(msg) => {
                        return DecPoll::Done(FinishReason::Error(format!(
                            "stage 1 (code2wav) frames {first}..{}: {msg}",
                            first + frames.len()
                        )));
                    }
                };
                if samples.len() != frames.len() * spf {
                    return DecPoll::Done(FinishReason::Error(format!(
                        "stage 1 (code2wav) frames {first}..{}: decoder returned {} samples, \
                         expected {} × {spf} = {}",
                        first + frames.len(),
                        samples.len(),
                        frames.len(),
                        frames.len() * spf
                    )));
                }
                if let Some(bad) = samples.iter().position(|x| !x.is_finite()) {
                    return DecPoll::Done(FinishReason::Error(format!(
                        "stage 1 (code2wav) frames {first}..{}: non-finite sample {} at {}",
                        first + frames.len(),
                        samples[bad],
                        a.timing.samples + bad as u64
                    )));
                }
                if a.req.is_cancelled() {
                    return DecPoll::Progress;
                }
                if a.timing.first_audio.is_none() {
                    let now = Instant::now();
                    a.timing.first_audio = Some(now);
                    a.req.send(EngineEvent::FirstAudio {
                        ttfa_ms: super::metrics::ms(now.saturating_duration_since(a.req.submitted)),
                    });
                }
                let offset = a.timing.samples;
                a.timing.samples += samples.len() as u64;
                a.timing.frames += frames.len();
                a.req
                    .send(EngineEvent::Audio(AudioChunk { samples, offset }));
                if last {
                    DecPoll::Done(Self::ar_reason(&a.req))
                } else {
                    DecPoll::Progress
                }
            }
        }
    }
}
