//! Stage 0: the autoregressive model's thread (see `stages.rs` for the request lifecycle),
//! generic over the model family's [`Stage0Model`] (monomorphised: no dynamic dispatch per
//! frame).

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::chunk_buffer::PushError;
use super::config::ArStageConfig;
use super::device::{StreamRole, TrimPoolOnExit};
use super::first_frame::{AloneBudget, FirstFrameRules};
use super::metrics::{ArTiming, BatchCounters, FirstFrame};
use super::queue::{DeadOnExit, StageQueue};
use super::request::RequestShared;
use super::stages::{BatchGraphs, CudaGraphs, guarded, panic_message};
use super::turn_trace::{Turn, TurnTrace};
use super::{DeviceSpec, EngineError, EngineEvent, EngineRequest, FinishReason};
use crate::models::tts::text::{no_words_to_speak, unspeakable};
use crate::models::tts::{
    self as model, ArStep, IncrementalText, ModelError, Stage0Model, Stage0Options, Stage0Prefill,
    Stage0Session,
};
use crate::nn::WeightForm;
use crate::nn::switches::{StreamPriority, Switches};
use crate::nn::transformer::PREFILL_CHUNK;

/// Writes a turn's line to the trace, if one is open; a failed write closes it.
fn trace_turn(trace: &mut Option<TurnTrace>, start: Instant, turn: &Turn) {
    if let Some(t) = trace
        && !t.record(start, Instant::now(), turn)
    {
        *trace = None;
    }
}

/// Positions of each step's prefill budget ([`PREFILL_CHUNK`]) kept for running requests' later
/// prompts while any has one (a quarter of a smaller budget set by `OMNITTS_PREFILL_BUDGET`): new
/// prompts take the rest first.
const LATER_PROMPT_SHARE: usize = PREFILL_CHUNK / 4;

/// A voice-clone reference to encode on stage 0 ([`super::Engine::voice_clone_prompt`]); the
/// result goes back on `reply` (dropped unanswered if the stage shuts down first).
pub(crate) struct EncodeJob {
    /// Mono samples at the model's reference rate.
    pub audio: Vec<f32>,
    pub ref_text: Option<String>,
    pub x_vector_only: bool,
    pub reply: mpsc::SyncSender<Result<model::VoiceClonePrompt, EngineError>>,
}

/// What stage 0 reports after loading.
pub(crate) struct ArInfo {
    pub cuda_graphs: CudaGraphs,
    pub batch_graphs: BatchGraphs,
    pub weight_forms: Vec<WeightForm>,
    pub groups: usize,
    pub device: DeviceSpec,
}

/// Stage 0's thread: loads the model on `device` (its CUDA stream at `priority`'s rank for stage
/// 0), reports on `ready`, then runs the batching loop on `queue` until shutdown; `first_frame`:
/// how new requests get their first frame.
#[allow(clippy::too_many_arguments)]
pub(crate) fn ar_thread<A: Stage0Model>(
    dir: PathBuf,
    device: DeviceSpec,
    cfg: ArStageConfig,
    first_frame: FirstFrameRules,
    priority: StreamPriority,
    queue: Arc<StageQueue>,
    ready: mpsc::SyncSender<Result<ArInfo, EngineError>>,
    batches: Arc<BatchCounters>,
) {
    let _dead_on_exit = DeadOnExit(queue.clone());
    // Declared before the model: dropped after it.
    let mut pool = TrimPoolOnExit::default();
    let loaded = (|| {
        let dev = device.open_as(StreamRole::Ar, priority)?;
        pool.watch(&dev);
        let dtype = cfg.dtype.for_device(&dev);
        let opts = Stage0Options {
            dtype,
            quantization: cfg.quantization,
        };
        let model = match catch_unwind(AssertUnwindSafe(|| A::load(&dir, &dev, &opts))) {
            Ok(r) => r.map_err(|e| EngineError::Load {
                stage: 0,
                name: A::NAME,
                source: e,
            })?,
            Err(p) => {
                return Err(EngineError::Stage {
                    stage: 0,
                    msg: format!("panicked while loading: {}", panic_message(p.as_ref())),
                });
            }
        };
        // Capture the code predictor's graphs before reporting ready (docs/field-lessons.md §5):
        // the stream is still ours alone. A failed capture leaves the model eager.
        let mut model = model;
        let graphs = if dev.is_cuda() {
            match model.enable_cuda_graphs() {
                Ok(()) => CudaGraphs::Enabled,
                Err(e) => CudaGraphs::Fallback(e.to_string()),
            }
        } else {
            CudaGraphs::NotApplicable
        };
        // The batched frames' graphs, one per batch bucket up to `max_num_seqs`, also before
        // ready; a failure leaves batched frames eager.
        let batch = if graphs == CudaGraphs::Enabled && cfg.max_num_seqs > 1 {
            match model.enable_batch_graphs(cfg.max_num_seqs) {
                Ok(sizes) => BatchGraphs::Enabled(sizes),
                Err(e) => BatchGraphs::Fallback(e.to_string()),
            }
        } else {
            BatchGraphs::NotApplicable
        };
        Ok((model, graphs, batch))
    })();
    let (model, cuda_graphs, batch_graphs) = match loaded {
        Ok(m) => m,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let info = ArInfo {
        cuda_graphs,
        batch_graphs,
        weight_forms: model.weight_forms(),
        groups: model.num_codebooks(),
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
        first_frame,
        groups,
        batches: &batches,
    }
    .run(&queue);
}

struct ArStage<'m, A: Stage0Model> {
    model: &'m A,
    cfg: &'m ArStageConfig,
    /// How new requests get their first frame ([`AloneBudget`]).
    first_frame: FirstFrameRules,
    groups: usize,
    batches: &'m BatchCounters,
}

/// A request whose prompt is still running through the model, a chunk per scheduler step.
struct Prefilling<'m, A: Stage0Model> {
    req: Arc<RequestShared>,
    pending: A::Prefill<'m>,
    timing: ArTiming,
    open: Option<OpenText<'m, A>>,
}

/// The text of an open request ([`super::Engine::submit_open`]) as stage 0 tokenizes it.
struct OpenText<'m, A: Stage0Model> {
    tok: A::OpenText<'m>,
    /// The ids the session has been given.
    given: usize,
    /// The bytes received while none of them made a word; `None` once the text has a letter or
    /// digit. Its prefill waits for one, so that a text of punctuation alone is refused whole
    /// when it ends instead of spoken as noise until then.
    wordless: Option<Vec<u8>>,
}

impl<'m, A: Stage0Model> OpenText<'m, A> {
    fn new(model: &'m A) -> Result<Self, ModelError> {
        Ok(OpenText {
            tok: model.open_text()?,
            given: 0,
            wordless: Some(Vec::new()),
        })
    }

    /// Takes what arrived on `req`'s feed into the tokenizer. Returns whether anything changed.
    fn poll(&mut self, req: &RequestShared) -> Result<bool, String> {
        let Some(feed) = &req.text else {
            return Ok(false);
        };
        if self.tok.is_finished() {
            return Ok(false);
        }
        let (bytes, ended) = feed.take();
        let mut changed = false;
        if !bytes.is_empty() {
            self.tok.push_bytes(&bytes)?;
            changed = true;
            if let Some(head) = &mut self.wordless {
                head.extend_from_slice(&bytes);
                if !no_words_to_speak(&String::from_utf8_lossy(head)) {
                    self.wordless = None;
                }
            }
        }
        if ended {
            self.tok.finish()?;
            changed = true;
        }
        Ok(changed)
    }

    /// The whole text, once ended.
    fn text(&self) -> Option<&str> {
        self.tok.text()
    }
}

/// An open request taken from the queue, waiting for its prefill's first text id.
struct Opening<'m, A: Stage0Model> {
    req: Arc<RequestShared>,
    open: OpenText<'m, A>,
    timing: ArTiming,
}

/// One request in the decode batch.
struct ArActive<'m, A: Stage0Model> {
    req: Arc<RequestShared>,
    session: A::Session<'m>,
    timing: ArTiming,
    /// Frames pushed so far.
    frames: usize,
    /// The runaway guard's budget for this request.
    budget: Option<usize>,
    /// Open text still arriving.
    open: Option<OpenText<'m, A>>,
}

/// Text tokens of the request (the model's tokenizer on the user text), for the runaway guard.
/// Should the tokenizer fail — `begin` succeeded, so it cannot in practice — the character count
/// stands in, which errs on the generous side (BPE tokens rarely outnumber characters).
fn text_tokens<A: Stage0Model>(model: &A, req: &EngineRequest) -> usize {
    model.text_tokens(&req.voice.text)
}

/// A stage-0 failure's reason, naming the stage's model and the step (`prefill`, `text`).
fn failed<A: Stage0Model>(step: &str, msg: impl std::fmt::Display) -> FinishReason {
    FinishReason::Error(format!("stage 0 ({}) {step}: {msg}", A::NAME))
}

impl<'m, A: Stage0Model> ArStage<'m, A> {
    /// The continuous-batching loop. Each step:
    /// 1. voice-clone encoding jobs, then requests cancelled while waiting let go;
    /// 2. admission: waiting requests (FIFO) start while fewer than `max_num_seqs` are prefilling
    ///    or decoding (`Started` is sent; the prompt is planned and embedded);
    /// 3. prefilling requests, oldest first, run prompt positions up to a budget of
    ///    [`PREFILL_CHUNK`] positions a step (`OMNITTS_PREFILL_BUDGET` sets another for A/B
    ///    runs; a long prompt takes a chunk of it, short ones share
    ///    it: a burst of arrivals starts together instead of one request a step), so a prompt
    ///    joining the batch delays the running streams by at most one budget's work a step; the
    ///    step's prompts go to the model in one [`Stage0Model::prefill_steps`] call (a model
    ///    may run several whole prompts as one batched pass); a finished prefill joins the
    ///    decode batch;
    /// 4. with `first_frame_alone`, requests whose prefill has just ended get their first frame in
    ///    a step of their own first, while [`AloneBudget`] allows it (`engine/first_frame.rs`);
    ///    with [`FirstFrameRules::arrivals_first`], when requests arrived during such a step the
    ///    loop goes back to 1 once (no encode jobs, the rest of the step's prefill budget), so
    ///    that they start before the batched step;
    /// 5. every decoding request that is not blocked (its chunk buffer full, its next text id
    ///    or its next prompt still to come) advances one frame in one batched forward
    ///    ([`Stage0Model::next_frames`]); requests that end (EOS, length, guard, cancel, error)
    ///    leave the batch at once. A running request's later prompt
    ///    ([`Stage0Session::has_pending_prompt`]: a dialogue's next generation batch) runs in
    ///    step 3, after the new requests' prompts, within the same budget, of which it keeps
    ///    [`LATER_PROMPT_SHARE`] positions.
    ///
    /// Sleeps on the stage signal only when no step could do anything. With
    /// `OMNITTS_STAGE0_TRACE` set, each turn that did something is a line of the trace
    /// (`turn_trace.rs`).
    fn run(&self, queue: &StageQueue) {
        // Waiting requests with stage 0's step count at their arrival.
        let mut waiting: VecDeque<(Arc<RequestShared>, u64)> = VecDeque::new();
        let mut prefilling: VecDeque<Prefilling<'m, A>> = VecDeque::new();
        let mut active: Vec<ArActive<'m, A>> = Vec::new();
        // Open requests waiting for their first text id (they hold a slot).
        let mut opening: Vec<Opening<'m, A>> = Vec::new();
        let mut alone = AloneBudget::new(self.first_frame.alone_share);
        let step_budget = Switches::get().prefill_budget.unwrap_or(PREFILL_CHUNK);
        let mut budget = step_budget;
        // A step alone just ran and the loop went back for arrivals before the batched step.
        let mut after_alone = false;
        let mut trace = Switches::get()
            .stage0_trace
            .as_deref()
            .and_then(TurnTrace::open_next);
        loop {
            let seen = queue.signal.epoch();
            let turn_start = Instant::now();
            let mut turn = Turn::default();
            let (new, shutdown) = queue.drain();
            let arrival = self.batches.get().steps;
            turn.arrived = new.len();
            waiting.extend(new.into_iter().map(|r| (r, arrival)));
            // The pass back after a step alone is for arrivals only: no encode jobs, and the
            // prefill budget left from the pass before.
            let jobs = if after_alone {
                Vec::new()
            } else {
                budget = step_budget;
                queue.take_jobs()
            };
            if shutdown {
                drop(jobs);
                for a in active.drain(..) {
                    a.req.cancel();
                    a.req.release_from_ar(FinishReason::Cancelled, a.timing);
                }
                for p in prefilling.drain(..) {
                    p.req.cancel();
                    p.req.release_from_ar(FinishReason::Cancelled, p.timing);
                }
                for o in opening.drain(..) {
                    o.req.cancel();
                    o.req.release_from_ar(FinishReason::Cancelled, o.timing);
                }
                for (r, _) in waiting.drain(..) {
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
            waiting.retain(|(r, _)| {
                if r.is_cancelled() {
                    r.release_from_ar(FinishReason::Cancelled, ArTiming::default());
                    progress = true;
                    false
                } else {
                    true
                }
            });
            let admitting = Instant::now();
            while active.len() + prefilling.len() + opening.len() < self.cfg.max_num_seqs {
                let Some((r, arrival)) = waiting.pop_front() else {
                    break;
                };
                progress = true;
                turn.admitted += 1;
                if r.text.is_some() {
                    let started = Instant::now();
                    r.send(EngineEvent::Started);
                    let timing = ArTiming {
                        started: Some(started),
                        arrival_step: arrival,
                        ..ArTiming::default()
                    };
                    match OpenText::new(self.model) {
                        Ok(open) => opening.push(Opening {
                            req: r,
                            open,
                            timing,
                        }),
                        Err(e) => r.release_from_ar(failed::<A>("text", e), timing),
                    }
                } else if let Some(p) = self.begin(r, arrival) {
                    prefilling.push_back(p);
                }
            }
            turn.admit = admitting.elapsed();
            turn.waiting = waiting.len();
            // Open requests: start those whose prefill's text has arrived.
            let mut i = 0;
            while i < opening.len() {
                match self.open_step(&mut opening[i]) {
                    OpenStep::Wait => i += 1,
                    step => {
                        progress = true;
                        let o = opening.remove(i);
                        match step {
                            OpenStep::Begin => {
                                if let Some(p) = self.begin_open(o) {
                                    prefilling.push_back(p);
                                }
                            }
                            OpenStep::Release(reason) => o.req.release_from_ar(reason, o.timing),
                            OpenStep::Wait => {}
                        }
                    }
                }
            }
            // A running request's later prompt keeps a share of the budget, so that new prompts
            // that would take all of it step after step (a burst of long ones) do not hold a
            // dialogue's next batch back.
            let reserve = if active.iter().any(|a| a.session.has_pending_prompt()) {
                LATER_PROMPT_SHARE.min(step_budget / 4).min(budget)
            } else {
                0
            };
            let mut work = Vec::new();
            while budget > reserve
                && let Some(p) = prefilling.pop_front()
            {
                progress = true;
                let n = p.pending.remaining().clamp(1, budget - reserve);
                budget -= n;
                turn.positions += n;
                work.push((p, n));
            }
            // One call for the step's prompts (the model may run whole ones in one pass); a
            // prompt with positions still to run goes back to the front, in order.
            let mut more = Vec::new();
            turn.prefills = work.len();
            let prefill_start = Instant::now();
            for outcome in self.prefill_chunks(work) {
                match outcome {
                    Prefill::More(p) => more.push(p),
                    Prefill::Done(a) => active.push(a),
                    Prefill::Released => {}
                }
            }
            for p in more.into_iter().rev() {
                prefilling.push_front(p);
            }
            turn.prefill = prefill_start.elapsed();
            turn.queued = prefilling.len();
            // Running requests' later prompts (a dialogue's next generation batch) take what is
            // left of the budget, at least the reserved share, oldest request first; their rows
            // sit the batched steps out meanwhile. New prompts go first: a new request has no
            // audio yet, a running one has its earlier batches' audio (a batch is tens of frames
            // at least) still to play.
            let mut i = 0;
            while budget > 0 && i < active.len() {
                if !active[i].session.has_pending_prompt() {
                    i += 1;
                    continue;
                }
                progress = true;
                match self.prefill_pending(&mut active[i], budget) {
                    Ok(n) => {
                        budget = budget.saturating_sub(n.max(1));
                        i += 1;
                    }
                    Err(reason) => {
                        let a = active.remove(i);
                        self.release(a, reason);
                    }
                }
            }
            // Open requests in the batch: the text that arrived becomes their next text rows.
            let mut i = 0;
            while i < active.len() {
                match self.extend_open(&mut active[i]) {
                    Ok(changed) => {
                        progress |= changed;
                        i += 1;
                    }
                    Err(reason) => {
                        progress = true;
                        let a = active.remove(i);
                        self.release(a, reason);
                    }
                }
            }
            let running = active.iter().filter(|a| a.frames > 0).count();
            if self.first_frame.alone
                && alone.allows(
                    Instant::now(),
                    running,
                    self.cfg.max_num_seqs,
                    waiting.len(),
                )
            {
                let (stepped, ran) = self.decode_step(&mut active, Rows::New);
                progress |= stepped;
                if let Some((took, rows)) = ran {
                    alone.record(Instant::now(), took, true);
                    (turn.alone, turn.alone_rows) = (took, rows);
                    // Requests that arrived during the step alone start (prefill, and their
                    // own step alone if allowed) before the batched step, not after it; once a
                    // batched step, so the running streams wait at most two steps alone.
                    if self.first_frame.arrivals_first && !after_alone && queue.has_requests() {
                        after_alone = true;
                        trace_turn(&mut trace, turn_start, &turn);
                        continue;
                    }
                }
            }
            after_alone = false;
            let (stepped, ran) = self.decode_step(&mut active, Rows::All);
            progress |= stepped;
            if let Some((took, rows)) = ran {
                alone.record(Instant::now(), took, false);
                (turn.step, turn.rows) = (took, rows);
            }
            if progress {
                trace_turn(&mut trace, turn_start, &turn);
            } else {
                queue.signal.wait_past(seen, None);
            }
        }
    }

    /// Runs one voice-clone encoding job (speaker encoder + codec encoder) and answers it. Invalid
    /// references come back as `InvalidRequest` naming the field (`ref_audio`, `ref_text`,
    /// `model`); a model failure or panic as a stage-0 error.
    fn encode(&self, job: EncodeJob) {
        let result = catch_unwind(AssertUnwindSafe(|| {
            self.model
                .encode_reference(&job.audio, job.ref_text.as_deref(), job.x_vector_only)
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

    /// Takes a waiting request that arrived at step `arrival`: sends `Started`, validates it and
    /// builds its prompt (no talker work yet). A refused request lets go with its error.
    fn begin(&self, req: Arc<RequestShared>, arrival: u64) -> Option<Prefilling<'m, A>> {
        let started = Instant::now();
        req.send(EngineEvent::Started);
        let r = &req.request;
        let result = guarded(|| self.model.begin(&r.voice, &r.sampling));
        let timing = ArTiming {
            started: Some(started),
            prefill: started.elapsed(),
            arrival_step: arrival,
            ..ArTiming::default()
        };
        match result {
            Ok(pending) => Some(Prefilling {
                req,
                pending,
                timing,
                open: None,
            }),
            Err(msg) => {
                req.release_from_ar(failed::<A>("prefill", msg), timing);
                None
            }
        }
    }

    /// Polls an open request still waiting for its first text id: begin once the prefill's id
    /// is final (or the text has ended), release on a text error or cancel.
    fn open_step(&self, o: &mut Opening<'m, A>) -> OpenStep {
        if o.req.is_cancelled() {
            return OpenStep::Release(FinishReason::Cancelled);
        }
        if let Err(msg) = o.open.poll(&o.req) {
            return OpenStep::Release(failed::<A>("text", msg));
        }
        if o.open.tok.is_finished() || (o.open.wordless.is_none() && o.open.tok.ids().len() >= 4) {
            OpenStep::Begin
        } else {
            OpenStep::Wait
        }
    }

    /// Starts an open request's prefill: the whole-text path when its text has already ended
    /// (the same prompt exactly), else the open one over the ids committed so far.
    fn begin_open(&self, o: Opening<'m, A>) -> Option<Prefilling<'m, A>> {
        let Opening {
            req,
            open,
            mut timing,
        } = o;
        let t = Instant::now();
        let r = &req.request;
        let result = match open.text() {
            Some(text) => {
                let mut voice = r.voice.clone();
                voice.text = text.to_string();
                guarded(|| self.model.begin(&voice, &r.sampling)).map(|p| (p, None))
            }
            None => guarded(|| self.model.begin_open(&r.voice, &r.sampling, open.tok.ids()))
                .map(|p| (p, Some(open))),
        };
        timing.prefill += t.elapsed();
        match result {
            Ok((pending, open)) => Some(Prefilling {
                req,
                pending,
                timing,
                open: open.map(|mut o| {
                    o.given = o.tok.ids().len();
                    o
                }),
            }),
            Err(msg) => {
                req.release_from_ar(failed::<A>("prefill", msg), timing);
                None
            }
        }
    }

    /// An open request in the batch: takes what arrived on its feed and gives the session the
    /// new ids; at the end, checks the whole text and sets the runaway guard's budget. Returns
    /// whether anything changed; `Err` ends the request.
    fn extend_open(&self, a: &mut ArActive<'m, A>) -> Result<bool, FinishReason> {
        let Some(open) = &mut a.open else {
            return Ok(false);
        };
        let text_err = |msg: String| failed::<A>("text", msg);
        let mut changed = open.poll(&a.req).map_err(text_err)?;
        let ended = open.tok.is_finished();
        if open.given < open.tok.ids().len() || (ended && a.session.text_open()) {
            let ids = open.tok.ids();
            if ended {
                let text = open.text().unwrap_or("");
                if let Some(why) = unspeakable(text) {
                    return Err(text_err(ModelError::invalid("text", text, why).to_string()));
                }
            }
            guarded(|| a.session.extend_text(ids, ended)).map_err(text_err)?;
            open.given = ids.len();
            changed = true;
            if ended {
                let text = open.text().unwrap_or("").to_string();
                if let Err(e) = a
                    .session
                    .check_text_budget(&text, a.req.request.sampling.max_new_tokens)
                {
                    return Err(text_err(e.to_string()));
                }
                let tokens = self.model.text_tokens(&text);
                a.budget = self.cfg.guard.budget(tokens);
                a.open = None;
            }
        }
        Ok(changed)
    }

    /// Runs one step's prefill work, `work[i]` a request and the prompt positions it may run
    /// (fewer at its end), in one [`Stage0Model::prefill_steps`] call: the model may run whole
    /// prompts together. Each request's prefill time counts the whole call, which its prompt
    /// waited for. Cancelled requests let go first; a panic fails every request of the call.
    fn prefill_chunks(&self, work: Vec<(Prefilling<'m, A>, usize)>) -> Vec<Prefill<'m, A>> {
        let mut live = Vec::with_capacity(work.len());
        for (p, n) in work {
            if p.req.is_cancelled() {
                p.req.release_from_ar(FinishReason::Cancelled, p.timing);
            } else {
                live.push((p, n));
            }
        }
        if live.is_empty() {
            return Vec::new();
        }
        let t = Instant::now();
        let steps = {
            let mut steps: Vec<(&mut A::Prefill<'m>, usize)> =
                live.iter_mut().map(|(p, n)| (&mut p.pending, *n)).collect();
            match catch_unwind(AssertUnwindSafe(|| self.model.prefill_steps(&mut steps))) {
                Ok(results) if results.len() == steps.len() => results
                    .into_iter()
                    .map(|r| r.map_err(|e| e.to_string()))
                    .collect(),
                Ok(results) => {
                    let msg = format!("{} results for {} prompts", results.len(), steps.len());
                    vec![Err(msg); steps.len()]
                }
                Err(p) => {
                    vec![Err(format!("panicked: {}", panic_message(p.as_ref()))); steps.len()]
                }
            }
        };
        let took = t.elapsed();
        live.into_iter()
            .zip(steps)
            .map(|((mut p, _), step)| {
                p.timing.prefill += took;
                self.prefill_outcome(p, step)
            })
            .collect()
    }

    /// What one prefill step's result makes of its request: more to run, the decode batch, or
    /// let go (failed or cancelled).
    fn prefill_outcome(&self, p: Prefilling<'m, A>, step: Result<bool, String>) -> Prefill<'m, A> {
        let failed = |req: Arc<RequestShared>, timing: ArTiming, msg: String| {
            req.release_from_ar(failed::<A>("prefill", msg), timing);
            Prefill::Released
        };
        match step {
            Ok(false) => Prefill::More(p),
            Ok(true) => {
                let Prefilling {
                    req,
                    pending,
                    timing,
                    open,
                } = p;
                match guarded(|| pending.into_session()) {
                    Ok(session) => {
                        // An open text's budget is set when the text ends.
                        let budget = match &open {
                            None => self.cfg.guard.budget(text_tokens(self.model, &req.request)),
                            Some(_) => None,
                        };
                        Prefill::Done(ArActive {
                            req,
                            session,
                            timing,
                            frames: 0,
                            budget,
                            open,
                        })
                    }
                    Err(msg) => failed(req, timing, msg),
                }
            }
            Err(_) if p.req.is_cancelled() => {
                // stopped between prefill chunks (or failed after the cancel)
                p.req.release_from_ar(FinishReason::Cancelled, p.timing);
                Prefill::Released
            }
            Err(msg) => failed(p.req, p.timing, msg),
        }
    }

    /// Runs up to `positions` positions of running request `a`'s pending prompt
    /// ([`Stage0Session::prefill_pending`]), counted as prefill time; how many ran, or why the
    /// request ends (cancelled, a model failure).
    fn prefill_pending(
        &self,
        a: &mut ArActive<'m, A>,
        positions: usize,
    ) -> Result<usize, FinishReason> {
        if a.req.is_cancelled() {
            return Err(FinishReason::Cancelled);
        }
        let t = Instant::now();
        let ran = guarded(|| a.session.prefill_pending(positions));
        a.timing.prefill += t.elapsed();
        ran.map_err(|msg| failed::<A>("prefill", msg))
    }

    /// One frame for every request of `rows` in `active` that can take one, in one batched
    /// forward; ends and removes the requests that are over. [`Rows::New`] steps only when some
    /// of the ready rows have frames already (otherwise the step of all is the same step).
    /// Returns whether anything happened, and how long the forward took and how many rows it
    /// ran, if one ran.
    fn decode_step(
        &self,
        active: &mut Vec<ArActive<'m, A>>,
        rows: Rows,
    ) -> (bool, Option<(Duration, usize)>) {
        let mut progress = false;
        // Cancelled requests leave first; blocked ones (chunk buffer full) sit this step out.
        let mut i = 0;
        while i < active.len() {
            if active[i].req.is_cancelled() {
                let a = active.remove(i);
                self.release(a, FinishReason::Cancelled);
                progress = true;
            } else {
                i += 1;
            }
        }
        // Rows whose next text id has not arrived wait too (no padding is fed, no RNG drawn),
        // and so do rows whose next prompt is still to run.
        let mut ready: Vec<usize> = (0..active.len())
            .filter(|&i| {
                let s = &active[i].session;
                active[i].req.buffer.has_space() && !s.waits_for_text() && !s.has_pending_prompt()
            })
            .collect();
        if rows == Rows::New {
            let all = ready.len();
            ready.retain(|&i| active[i].frames == 0);
            if ready.len() == all {
                return (progress, None);
            }
        }
        if ready.is_empty() {
            return (progress, None);
        }
        let t = Instant::now();
        let results = {
            let mut rows: Vec<&mut A::Session<'m>> = Vec::with_capacity(ready.len());
            let mut rest: &mut [ArActive<'m, A>] = active;
            let mut base = 0;
            for &i in &ready {
                let (_, tail) = rest.split_at_mut(i - base);
                let (row, tail) = tail.split_at_mut(1);
                rows.push(&mut row[0].session);
                rest = tail;
                base = i + 1;
            }
            let n = rows.len();
            match guarded(|| Ok(self.model.next_frames(&mut rows))) {
                Ok(r) if r.len() == n => r,
                Ok(r) => (0..n)
                    .map(|_| {
                        Err(ModelError::Candle(candle_core::Error::Msg(format!(
                            "batched step returned {} results for {n} rows",
                            r.len()
                        ))))
                    })
                    .collect(),
                Err(msg) => (0..n)
                    .map(|_| Err(ModelError::Candle(candle_core::Error::Msg(msg.clone()))))
                    .collect(),
            }
        };
        let elapsed = t.elapsed();
        self.batches.step(ready.len());
        let mut done: Vec<(usize, FinishReason)> = Vec::new();
        for (&i, result) in ready.iter().zip(results) {
            let a = &mut active[i];
            a.timing.steps += elapsed;
            if let Some(reason) = self.push_frame(a, result, ready.len()) {
                done.push((i, reason));
            }
        }
        progress = true;
        // Remove from the back so the indices stay valid.
        for (i, reason) in done.into_iter().rev() {
            let a = active.remove(i);
            self.release(a, reason);
        }
        (progress, Some((elapsed, ready.len())))
    }

    /// Lets go of a request: frees its KV cache before stage 1 can report Finished.
    fn release(&self, a: ArActive<'m, A>, reason: FinishReason) {
        let ArActive {
            req,
            session,
            timing,
            ..
        } = a;
        drop(session);
        req.release_from_ar(reason, timing);
    }

    /// Hands a row's frame, made in a step of `rows` rows, to its chunk buffer; `Some(reason)`
    /// when the request is over.
    fn push_frame(
        &self,
        a: &mut ArActive<'m, A>,
        step: Result<ArStep, ModelError>,
        rows: usize,
    ) -> Option<FinishReason> {
        match step {
            Ok(ArStep::Frame(codes)) => {
                if codes.len() != self.groups {
                    return Some(FinishReason::Error(format!(
                        "stage 0 ({}) frame {}: {} codes, expected {} codebooks",
                        A::NAME,
                        a.frames,
                        codes.len(),
                        self.groups
                    )));
                }
                if a.budget.is_some_and(|b| a.frames >= b) {
                    // This frame would pass the budget: drop it and stop.
                    return Some(FinishReason::Guard);
                }
                let tap = a.req.codes_tap.as_ref().map(|tap| (tap, codes.clone()));
                match a.req.buffer.try_push(codes) {
                    Ok(()) => {
                        if let Some((tap, codes)) = tap {
                            // A listener that went away only stops listening.
                            let _ = tap.send(codes);
                        }
                        let now = Instant::now();
                        if a.frames == 0 {
                            let steps = self
                                .batches
                                .get()
                                .steps
                                .saturating_sub(a.timing.arrival_step);
                            a.timing.first_frame = Some(FirstFrame {
                                at: now,
                                steps,
                                rows,
                            });
                        }
                        a.frames += 1;
                        a.timing.pushed(now);
                        None
                    }
                    Err(PushError::Cancelled(_)) => Some(FinishReason::Cancelled),
                    Err(PushError::Full(_)) | Err(PushError::Finished(_)) => {
                        // Only this thread pushes, and it checked for space before the step.
                        Some(FinishReason::Error(
                            "stage 0: async-chunk buffer refused a frame".to_string(),
                        ))
                    }
                }
            }
            Ok(ArStep::Finished(model::FinishReason::Eos)) => Some(FinishReason::Eos),
            Ok(ArStep::Finished(model::FinishReason::Length)) => Some(FinishReason::Length),
            Err(e) => Some(FinishReason::Error(format!(
                "stage 0 ({}) frame {}: {e}",
                A::NAME,
                a.frames
            ))),
        }
    }
}

/// Which rows a decode step runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rows {
    /// Every row that can take a frame.
    All,
    /// Only the rows that have no frame yet (their prefill has just ended).
    New,
}

/// What an open request waiting for its first text id does next.
enum OpenStep {
    Wait,
    Begin,
    Release(FinishReason),
}

/// What one prefill chunk left.
enum Prefill<'m, A: Stage0Model> {
    /// More prompt positions to run.
    More(Prefilling<'m, A>),
    /// The prompt is in the model's KV cache: the request joins the decode batch.
    Done(ArActive<'m, A>),
    /// The request was cancelled or failed and has let go.
    Released,
}

#[cfg(test)]
mod tests {
    //! Stage 0's loop on a stand-in model whose steps the test can hold.

    use std::collections::HashMap;
    use std::path::Path;
    use std::sync::mpsc::{Receiver, channel};
    use std::sync::{Condvar, LazyLock, Mutex, MutexGuard, PoisonError};

    use super::*;
    use crate::engine::chunk_buffer::{ChunkPolicy, ChunkRamp, Signal};
    use crate::engine::config::StageConfig;
    use crate::engine::request::AdmissionControl;
    use crate::models::tts::{
        ArStep, ModelError, NoOpenText, SamplingParams, Stage0Prefill, Stage0Session,
        VoiceClonePrompt, VoiceRequest,
    };

    fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
        m.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The test's side of the stand-in, found by the checkpoint directory it is "loaded" from.
    #[derive(Default)]
    struct Gate {
        /// The rows (their texts) of every step, in order.
        steps: Mutex<Vec<Vec<String>>>,
        /// A step whose rows include this text's first frame waits until it is cleared.
        hold: Mutex<Option<String>>,
        /// Whether a step is waiting on `hold`.
        holding: Mutex<bool>,
        /// The texts of the prompts of every `prefill_steps` call, in order.
        prefill_calls: Mutex<Vec<Vec<String>>>,
        cv: Condvar,
    }

    static GATES: LazyLock<Mutex<HashMap<PathBuf, Arc<Gate>>>> = LazyLock::new(Default::default);

    fn gate(dir: &Path) -> Arc<Gate> {
        lock(&GATES).entry(dir.to_path_buf()).or_default().clone()
    }

    /// Frames of two codes; a step takes `STEP`.
    struct StandIn {
        gate: Arc<Gate>,
    }

    const STEP: Duration = Duration::from_millis(1);

    fn refused(what: &str) -> ModelError {
        ModelError::InvalidRequest {
            field: "model".into(),
            value: "stand_in".into(),
            msg: format!("the stand-in takes no {what}"),
        }
    }

    /// A prompt of one position, or of [`LONG_PROMPT`] for a text `long …` (its chunks logged in
    /// the steps as `prompt N`).
    struct Pending {
        text: String,
        left: usize,
        gate: Arc<Gate>,
    }

    const LONG_PROMPT: usize = 2 * PREFILL_CHUNK;

    /// A session of text `dialogue …` takes a later prompt of [`LATER_PROMPT`] positions after
    /// its third frame, as a dialogue's next generation batch does.
    struct Session {
        text: String,
        frames: usize,
        /// Positions of its later prompt still to run.
        pending: usize,
        gate: Arc<Gate>,
    }

    const LATER_PROMPT: usize = 3 * PREFILL_CHUNK + 5;

    impl Session {
        /// Runs up to `positions` of the later prompt, logged in the steps as `prefill N`.
        fn run_pending(&mut self, positions: usize) -> usize {
            let n = positions.max(1).min(self.pending);
            if n > 0 {
                self.pending -= n;
                lock(&self.gate.steps).push(vec![format!("prefill {n}")]);
            }
            n
        }
    }

    impl Stage0Prefill for Pending {
        type Session = Session;
        fn remaining(&self) -> usize {
            self.left
        }
        fn step(&mut self, positions: usize) -> Result<bool, ModelError> {
            let n = positions.min(self.left);
            self.left -= n;
            if self.text.starts_with("long") {
                lock(&self.gate.steps).push(vec![format!("prompt {n}")]);
            }
            Ok(self.left == 0)
        }
        fn into_session(self) -> Result<Session, ModelError> {
            Ok(Session {
                text: self.text,
                frames: 0,
                pending: 0,
                gate: self.gate,
            })
        }
    }

    impl Stage0Session for Session {
        fn extend_text(&mut self, _: &[u32], _: bool) -> Result<(), ModelError> {
            Ok(())
        }
        fn check_text_budget(&self, _: &str, _: usize) -> Result<(), ModelError> {
            Ok(())
        }
        fn has_pending_prompt(&self) -> bool {
            self.pending > 0
        }
        fn prefill_pending(&mut self, positions: usize) -> Result<usize, ModelError> {
            Ok(self.run_pending(positions))
        }
    }

    impl Stage0Model for StandIn {
        const NAME: &'static str = "stand_in";
        type Prefill<'m> = Pending;
        type Session<'m> = Session;
        type OpenText<'m> = NoOpenText;

        fn load(
            dir: &Path,
            _: &candle_core::Device,
            _: &Stage0Options,
        ) -> Result<Self, ModelError> {
            Ok(StandIn { gate: gate(dir) })
        }
        fn enable_cuda_graphs(&mut self) -> Result<(), ModelError> {
            Ok(())
        }
        fn enable_batch_graphs(&mut self, _: usize) -> Result<Vec<usize>, ModelError> {
            Ok(Vec::new())
        }
        fn weight_forms(&self) -> Vec<WeightForm> {
            Vec::new()
        }
        fn num_codebooks(&self) -> usize {
            2
        }
        fn text_tokens(&self, text: &str) -> usize {
            text.len()
        }
        fn begin(&self, v: &VoiceRequest, _: &SamplingParams) -> Result<Pending, ModelError> {
            Ok(Pending {
                left: if v.text.starts_with("long") {
                    LONG_PROMPT
                } else {
                    1
                },
                text: v.text.clone(),
                gate: self.gate.clone(),
            })
        }
        fn open_text(&self) -> Result<NoOpenText, ModelError> {
            Err(refused("open text"))
        }
        fn begin_open(
            &self,
            _: &VoiceRequest,
            _: &SamplingParams,
            _: &[u32],
        ) -> Result<Pending, ModelError> {
            Err(refused("open text"))
        }
        fn prefill_steps(
            &self,
            steps: &mut [(&mut Pending, usize)],
        ) -> Vec<Result<bool, ModelError>> {
            let texts = steps.iter().map(|(p, _)| p.text.clone()).collect();
            lock(&self.gate.prefill_calls).push(texts);
            steps.iter_mut().map(|(p, n)| p.step(*n)).collect()
        }
        fn next_frames(&self, rows: &mut [&mut Session]) -> Vec<Result<ArStep, ModelError>> {
            // A row stepped with its later prompt pending runs all of it first, inside the step.
            for r in rows.iter_mut() {
                r.run_pending(usize::MAX);
            }
            let texts: Vec<String> = rows.iter().map(|r| r.text.clone()).collect();
            lock(&self.gate.steps).push(texts);
            let hold = lock(&self.gate.hold).clone();
            if rows
                .iter()
                .any(|r| r.frames == 0 && Some(&r.text) == hold.as_ref())
            {
                *lock(&self.gate.holding) = true;
                self.gate.cv.notify_all();
                let held = lock(&self.gate.hold);
                drop(
                    self.gate
                        .cv
                        .wait_while(held, |h| h.is_some())
                        .unwrap_or_else(PoisonError::into_inner),
                );
                *lock(&self.gate.holding) = false;
            }
            std::thread::sleep(STEP);
            rows.iter_mut()
                .map(|r| {
                    r.frames += 1;
                    if r.frames == 3 && r.text.starts_with("dialogue") {
                        r.pending = LATER_PROMPT;
                    }
                    Ok(ArStep::Frame(vec![1, r.frames as u32]))
                })
                .collect()
        }
        fn encode_reference(
            &self,
            _: &[f32],
            _: Option<&str>,
            _: bool,
        ) -> Result<VoiceClonePrompt, ModelError> {
            Err(refused("voice clone"))
        }
    }

    /// Stage 0 on the stand-in with steps alone, in a thread of its own.
    struct Stage0 {
        queue: Arc<StageQueue>,
        gate: Arc<Gate>,
        admission: Arc<AdmissionControl>,
        thread: Option<std::thread::JoinHandle<()>>,
    }

    impl Stage0 {
        fn start(name: &str, arrivals_first: bool) -> Stage0 {
            let dir = PathBuf::from(format!("/stand-in/{name}"));
            let mut cfg = StageConfig::default_async().ar;
            cfg.max_num_seqs = 16;
            cfg.guard.enabled = false;
            let queue = StageQueue::new();
            let (tx, rx) = mpsc::sync_channel::<Result<ArInfo, EngineError>>(1);
            let (q, d) = (queue.clone(), dir.clone());
            let thread = std::thread::spawn(move || {
                // No share limit: the test's hold counts as time alone, however long the
                // machine takes to come back to it.
                let rules = FirstFrameRules {
                    alone: true,
                    alone_share: 1.0,
                    arrivals_first,
                };
                ar_thread::<StandIn>(
                    d,
                    DeviceSpec::Cpu,
                    cfg,
                    rules,
                    StreamPriority::default(),
                    q,
                    tx,
                    Arc::default(),
                )
            });
            rx.recv().expect("stage 0 reports").expect("stage 0 loads");
            Stage0 {
                queue,
                gate: gate(&dir),
                admission: AdmissionControl::new(32),
                thread: Some(thread),
            }
        }

        /// Queues a request of `text` on stage 0 (room for 100,000 frames, nobody takes them).
        fn submit(&self, text: &str) -> (Arc<RequestShared>, Receiver<EngineEvent>) {
            let voice = VoiceRequest {
                text: text.into(),
                ..VoiceRequest::default()
            };
            let (tx, rx) = channel();
            let req = Arc::new(RequestShared::new(
                0,
                EngineRequest::new(voice, SamplingParams::plain_greedy(100_000, 0)),
                ChunkPolicy::Streaming {
                    initial: 1,
                    chunk: 4,
                    ramp: ChunkRamp::Off,
                },
                100_000,
                self.queue.signal.clone(),
                Signal::new(),
                tx,
                Instant::now(),
                self.admission.admit().expect("a place"),
                None,
                None,
            ));
            assert!(self.queue.push(req.clone()).is_ok());
            (req, rx)
        }

        /// Waits (10 s at most) until a step holds on the gate.
        fn wait_holding(&self) {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !*lock(&self.gate.holding) {
                assert!(Instant::now() < deadline, "no step held in 10 s");
                std::thread::sleep(Duration::from_millis(1));
            }
        }

        fn steps(&self) -> Vec<Vec<String>> {
            lock(&self.gate.steps).clone()
        }
    }

    impl Drop for Stage0 {
        fn drop(&mut self) {
            *lock(&self.gate.hold) = None;
            self.gate.cv.notify_all();
            self.queue.shut_down();
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }

    /// The steps from the first frame of a request "first" on: 4 streams run, "first" arrives
    /// and its step alone is held until "second" has arrived too.
    fn steps_around_a_step_alone(name: &str, arrivals_first: bool) -> Vec<Vec<String>> {
        let s = Stage0::start(name, arrivals_first);
        let _running: Vec<_> = (0..4).map(|k| s.submit(&format!("running {k}"))).collect();
        // The running streams have joined and step together.
        let deadline = Instant::now() + Duration::from_secs(20);
        while s.steps().len() < 50 {
            assert!(
                Instant::now() < deadline,
                "stage 0 did not step 50 times in 20 s"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        *lock(&s.gate.hold) = Some("first".into());
        let _first = s.submit("first");
        s.wait_holding();
        let _second = s.submit("second");
        *lock(&s.gate.hold) = None;
        s.gate.cv.notify_all();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let steps = s.steps();
            let at = steps
                .iter()
                .position(|st| st.iter().any(|r| r == "first"))
                .expect("the first request's step");
            if steps[at..]
                .iter()
                .filter(|st| st.iter().any(|r| r == "second"))
                .count()
                >= 2
            {
                return steps[at..].to_vec();
            }
            assert!(
                Instant::now() < deadline,
                "the second request did not step twice"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A running request's later prompt (a dialogue's next generation batch) runs between the
    /// batched steps, a chunk of at most [`PREFILL_CHUNK`] positions at a time, while the other
    /// streams go on stepping without it; then it steps with them again.
    #[test]
    fn a_later_prompt_runs_in_chunks_between_the_other_streams_steps() {
        let s = Stage0::start("later-prompt", false);
        let _running: Vec<_> = (0..2).map(|k| s.submit(&format!("running {k}"))).collect();
        let _dialogue = s.submit("dialogue");
        let deadline = Instant::now() + Duration::from_secs(20);
        let steps = loop {
            let steps = s.steps();
            if steps
                .iter()
                .filter(|st| st.iter().any(|r| r == "dialogue"))
                .count()
                >= 6
            {
                break steps;
            }
            assert!(
                Instant::now() < deadline,
                "no 6 steps of the dialogue in 20 s"
            );
            std::thread::sleep(Duration::from_millis(2));
        };
        let with = |st: &Vec<String>, text: &str| st.iter().any(|r| r == text);
        let third = steps
            .iter()
            .enumerate()
            .filter(|(_, st)| with(st, "dialogue"))
            .nth(2)
            .map(|(i, _)| i)
            .expect("a third step of the dialogue");
        let fourth = steps[third + 1..]
            .iter()
            .position(|st| with(st, "dialogue"))
            .map(|i| third + 1 + i)
            .expect("a fourth step of the dialogue");
        let between = &steps[third + 1..fourth];
        let chunks: Vec<usize> = between
            .iter()
            .filter_map(|st| st[0].strip_prefix("prefill ")?.parse().ok())
            .collect();
        assert_eq!(
            chunks,
            [PREFILL_CHUNK, PREFILL_CHUNK, PREFILL_CHUNK, 5],
            "the later prompt in chunks of the step's budget: {between:?}"
        );
        let others = between.iter().filter(|st| with(st, "running 0")).count();
        assert!(
            others >= 3,
            "the other streams step between the chunks: {between:?}"
        );
    }

    /// New prompts that would take the whole prefill budget step after step (a burst of long
    /// ones) leave a running request's later prompt its share ([`LATER_PROMPT_SHARE`]) of each
    /// step's budget, instead of holding it back until they have all run.
    #[test]
    fn a_later_prompt_keeps_its_share_beside_a_burst_of_long_prompts() {
        let s = Stage0::start("later-prompt-share", false);
        let _running = s.submit("running 0");
        // The long prompts arrive while the dialogue's first frame is held, so they are
        // prefilling when its later prompt comes, two frames on.
        *lock(&s.gate.hold) = Some("dialogue".into());
        let _dialogue = s.submit("dialogue");
        s.wait_holding();
        let _long: Vec<_> = (0..12).map(|k| s.submit(&format!("long {k}"))).collect();
        *lock(&s.gate.hold) = None;
        s.gate.cv.notify_all();
        let deadline = Instant::now() + Duration::from_secs(20);
        let steps = loop {
            let steps = s.steps();
            let prompts = steps
                .iter()
                .filter(|st| st[0].starts_with("prompt "))
                .count();
            if prompts >= 12 * LONG_PROMPT / PREFILL_CHUNK
                && steps.iter().any(|st| st[0].starts_with("prefill "))
            {
                break steps;
            }
            assert!(
                Instant::now() < deadline,
                "the long prompts and the later prompt did not run in 20 s"
            );
            std::thread::sleep(Duration::from_millis(2));
        };
        let chunk = |prefix: &str| {
            let p = prefix.to_string();
            move |(i, st): (usize, &Vec<String>)| {
                st[0]
                    .strip_prefix(&p)?
                    .parse::<usize>()
                    .ok()
                    .map(|n| (i, n))
            }
        };
        let long: Vec<(usize, usize)> = steps
            .iter()
            .enumerate()
            .filter_map(chunk("prompt "))
            .collect();
        let last_long = long.last().expect("long prompt chunks").0;
        let later: Vec<usize> = steps
            .iter()
            .enumerate()
            .filter_map(chunk("prefill "))
            .filter(|&(i, _)| i < last_long)
            .map(|(_, n)| n)
            .collect();
        assert!(
            !later.is_empty(),
            "the later prompt ran only after every long prompt: {steps:?}"
        );
        let mut expected = vec![LATER_PROMPT_SHARE; LATER_PROMPT / LATER_PROMPT_SHARE];
        expected.push(LATER_PROMPT % LATER_PROMPT_SHARE);
        assert_eq!(
            later, expected,
            "the later prompt's chunks beside the long prompts"
        );
    }

    /// The prompts of a burst that arrives during a step reach the model in one
    /// `prefill_steps` call (so a model can run them in one pass), oldest first, and the
    /// running stream's frames go on.
    #[test]
    fn a_burst_of_prompts_goes_to_the_model_in_one_call() {
        let s = Stage0::start("burst-prefill", false);
        *lock(&s.gate.hold) = Some("running".into());
        let _running = s.submit("running");
        s.wait_holding();
        let burst: Vec<String> = (0..8).map(|k| format!("burst {k}")).collect();
        let _reqs: Vec<_> = burst.iter().map(|t| s.submit(t)).collect();
        *lock(&s.gate.hold) = None;
        s.gate.cv.notify_all();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let calls = lock(&s.gate.prefill_calls).clone();
            let seen = calls
                .iter()
                .flatten()
                .filter(|t| t.starts_with("burst"))
                .count();
            if seen == burst.len() {
                let with_burst: Vec<&Vec<String>> = calls
                    .iter()
                    .filter(|c| c.iter().any(|t| t.starts_with("burst")))
                    .collect();
                assert_eq!(with_burst, [&burst], "the burst's prefill calls: {calls:?}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the burst was not prefilled in 20 s: {calls:?}"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn a_request_that_arrives_during_a_step_alone_starts_before_the_batched_step() {
        let steps = steps_around_a_step_alone("arrivals-first", true);
        assert_eq!(
            steps[0],
            ["first"],
            "the first frame of \"first\" alone: {steps:?}"
        );
        assert_eq!(steps[1], ["second"], "\"second\" next, alone: {steps:?}");
        assert_eq!(
            steps[2].len(),
            6,
            "then the batched step of all six: {steps:?}"
        );
        // Without the rule the batched step of the five goes first.
        let steps = steps_around_a_step_alone("batched-first", false);
        assert_eq!(steps[0], ["first"], "{steps:?}");
        assert_eq!(
            steps[1].len(),
            5,
            "the batched step without \"second\": {steps:?}"
        );
        assert_eq!(steps[2], ["second"], "{steps:?}");
    }
}
