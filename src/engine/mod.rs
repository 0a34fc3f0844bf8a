//! The two-stage engine: stage 0 (AR: talker + code predictor) and stage 1 (Code2Wav) tasks, each
//! on its own thread with its own device context, joined by the async-chunk buffer.
//!
//! ```text
//! submit(EngineRequest) ──► stage 0 thread ──frames (Vec<u32>, host)──► ChunkBuffer ──► stage 1 thread
//!   │                      ArModel on ar_device                  bounded,     Code2Wav on decoder_device
//!   ▼                                                            per request          │
//! RequestHandle ◄──────── Started · FirstAudio · Audio{samples, offset} · Finished{reason, metrics}
//! ```
//!
//! Only codes (plain `u32`s on the host) cross between the stages, so each stage can live on its own
//! device. The engine knows nothing of GStreamer. Design notes: docs/architecture.md,
//! docs/field-lessons.md §1 (sample-exact chunks), §3 (runaway guard), docs/qwen3-tts.md §9 (stage
//! split and the async-chunk protocol).
//!
//! Lifecycle of a request: `submit` validates it synchronously and queues it on both stages.
//! Stage 0 takes it when it has a free slot (`max_num_seqs`), sends `Started`, runs the prefill and
//! then one frame per step into the request's [`ChunkBuffer`] (blocking — never dropping — when
//! stage 1 falls behind). Stage 1 decodes each scheduled chunk (exact streaming, windowed, or the
//! whole utterance in batch mode) and sends `FirstAudio` then `Audio`. When both stages are done
//! with it, stage 1 sends `Finished` with the reason and the [`Metrics`]; nothing follows it.
//!
//! Voice cloning (Base): [`Engine::voice_clone_prompt`] encodes a reference recording on stage 0
//! (which owns the speaker and codec encoders) and caches the prompt; each request carries its own
//! copy in `VoiceRequest::voice_clone`, so concurrent requests with different voices share nothing.

mod chunk_buffer;
mod config;
mod device;
mod error;
mod first_chunk_lane;
mod first_frame;
mod metrics;
mod pass_plan;
mod queue;
pub mod registry;
mod request;
mod stage0;
mod stage1;
mod stages;
mod text_feed;
mod turn_trace;
mod voice_clone;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use std::{fmt, path::PathBuf};

pub use chunk_buffer::{ChunkBuffer, ChunkPolicy, ChunkRamp, PushError, Signal, Take};
pub use config::{
    ArStageConfig, DEFAULT_ASYNC_YAML, DEFAULT_BATCH_YAML, DecoderStageConfig,
    DecoderStreamingMode, GuardConfig, SamplingOverrides, StageConfig,
};
pub use device::{DTypeSpec, DeviceSpec};
pub use error::EngineError;
pub use metrics::{BatchStats, Metrics, TIMED_FRAMES};
pub use text_feed::TextSender;
pub use voice_clone::{VOICE_CLONE_CACHE_ENTRIES, VoiceCloneStats};

use crate::models::registry as families;
use crate::models::tts::{
    ModelDescription, ModelError, SamplingParams, VoiceClonePrompt, VoiceRequest, VoiceRules,
};
use crate::nn::WeightForm;
pub use first_chunk_lane::FirstChunkLane;
use queue::StageQueue;
pub use registry::SharedEngine;
use request::{AdmissionControl, RequestCore, RequestShared};
use stage0::EncodeJob;
pub(crate) use stages::panic_message;
pub use stages::{BatchGraphs, CudaGraphs};
use stages::{LoadedInfo, Threads};
use voice_clone::{CloneCache, CloneKey};

/// What [`Engine::load`] needs.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// The checkpoint directory (config.json, model.safetensors, tokenizer, speech_tokenizer/).
    pub model_dir: PathBuf,
    /// Stage configuration (chunking, guard, sampling overrides, …).
    pub stage_config: StageConfig,
    /// Device of stage 0 (talker + code predictor). Authoritative: the stage config's
    /// `runtime.devices` only seeds it in [`EngineOptions::new`].
    pub ar_device: DeviceSpec,
    /// Device of stage 1 (Code2Wav).
    pub decoder_device: DeviceSpec,
}

impl EngineOptions {
    /// Options with the devices taken from the stage config's `runtime.devices`.
    pub fn new(model_dir: impl Into<PathBuf>, stage_config: StageConfig) -> Self {
        EngineOptions {
            model_dir: model_dir.into(),
            ar_device: stage_config.ar.device,
            decoder_device: stage_config.decoder.device,
            stage_config,
        }
    }
}

/// One utterance to synthesize.
#[derive(Debug, Clone)]
pub struct EngineRequest {
    /// Text and voice (speaker, language, instruct, prompt mode).
    pub voice: VoiceRequest,
    /// Sampling; start from [`Engine::default_sampling_params`].
    pub sampling: SamplingParams,
    /// Overrides `initial_codec_chunk_frames` (0 = no separate first chunk). Ignored in batch mode.
    pub initial_chunk_frames: Option<usize>,
    /// Overrides `codec_chunk_frames` (≥ 1). Ignored in batch mode.
    pub chunk_frames: Option<usize>,
}

impl EngineRequest {
    /// A request for `voice` with the given sampling and the stage config's chunking.
    pub fn new(voice: VoiceRequest, sampling: SamplingParams) -> Self {
        EngineRequest {
            voice,
            sampling,
            initial_chunk_frames: None,
            chunk_frames: None,
        }
    }
}

/// A piece of the utterance's audio.
#[derive(Debug, Clone, PartialEq)]
pub struct AudioChunk {
    /// Mono f32 samples in [-1, 1] at [`Engine::sample_rate`] (24 kHz); always a whole number of
    /// frames (`frames × samples_per_frame`).
    pub samples: Vec<f32>,
    /// Index of `samples[0]` in the utterance (samples since its start).
    pub offset: u64,
}

/// Why an utterance ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// The talker emitted the codec end-of-speech token.
    Eos,
    /// `max_new_tokens` was reached.
    Length,
    /// The runaway guard's frame budget (relative to the text length) was reached.
    Guard,
    /// Cancelled by the caller (or the engine was dropped).
    Cancelled,
    /// A stage failed; the message names the stage and the cause. Audio already sent is valid.
    Error(String),
}

impl FinishReason {
    /// Short lower-case name: `eos`, `length`, `guard`, `cancelled`, `error`.
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishReason::Eos => "eos",
            FinishReason::Length => "length",
            FinishReason::Guard => "guard",
            FinishReason::Cancelled => "cancelled",
            FinishReason::Error(_) => "error",
        }
    }
}

impl fmt::Display for FinishReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FinishReason::Error(m) => write!(f, "error: {m}"),
            other => f.write_str(other.as_str()),
        }
    }
}

/// What a [`RequestHandle`] delivers, in this order: `Started`, then `FirstAudio` right before the
/// first `Audio`, more `Audio`, and exactly one `Finished` last (possibly without any audio).
#[derive(Debug, Clone, PartialEq)]
pub enum EngineEvent {
    /// Stage 0 took the request (it is no longer queued).
    Started,
    /// Audio, in order, contiguous (`offset` = sum of previous chunk lengths).
    Audio(AudioChunk),
    /// The first audio chunk is ready; `ttfa_ms` = submit → now.
    FirstAudio {
        /// Time to first audio, ms.
        ttfa_ms: f64,
    },
    /// The request is over; both stages have let go of it.
    Finished {
        /// Why.
        reason: FinishReason,
        /// Timing.
        metrics: Metrics,
    },
}

/// Cancels one request from any thread. Cheap to clone.
#[derive(Clone)]
pub struct Canceller {
    shared: Arc<RequestCore>,
}

impl fmt::Debug for Canceller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Canceller")
            .field("request", &self.shared.id)
            .finish()
    }
}

impl Canceller {
    /// Stops both stages' work on the request within about one frame of work and releases its
    /// buffers; the handle then receives `Finished { reason: Cancelled }` (unless it had already
    /// finished). Idempotent.
    pub fn cancel(&self) {
        self.shared.cancel();
    }
}

/// The receiving end of one request.
pub struct RequestHandle {
    shared: Arc<RequestCore>,
    events: Receiver<EngineEvent>,
    done: AtomicBool,
}

impl fmt::Debug for RequestHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestHandle")
            .field("request", &self.shared.id)
            .field("done", &self.done.load(Ordering::Relaxed))
            .finish()
    }
}

impl RequestHandle {
    /// The engine-wide request number (1, 2, …).
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    fn note(&self, ev: &EngineEvent) {
        if matches!(ev, EngineEvent::Finished { .. }) {
            self.done.store(true, Ordering::Release);
        }
    }

    /// The stages dropped the request without finishing it (a stage thread died): report it once
    /// as an error.
    fn lost(&self) -> EngineEvent {
        self.done.store(true, Ordering::Release);
        EngineEvent::Finished {
            reason: FinishReason::Error(
                "engine stage thread ended without finishing the request".to_string(),
            ),
            metrics: Metrics::default(),
        }
    }

    /// Blocks for the next event; `None` once `Finished` was delivered.
    pub fn recv(&self) -> Option<EngineEvent> {
        if self.done.load(Ordering::Acquire) {
            return None;
        }
        let ev = match self.events.recv() {
            Ok(ev) => ev,
            Err(_) => return Some(self.lost()),
        };
        self.note(&ev);
        Some(ev)
    }

    /// As [`RequestHandle::recv`] with a timeout; `Disconnected` once `Finished` was delivered.
    pub fn recv_timeout(&self, d: Duration) -> Result<EngineEvent, RecvTimeoutError> {
        if self.done.load(Ordering::Acquire) {
            return Err(RecvTimeoutError::Disconnected);
        }
        let ev = match self.events.recv_timeout(d) {
            Ok(ev) => ev,
            Err(RecvTimeoutError::Timeout) => return Err(RecvTimeoutError::Timeout),
            Err(RecvTimeoutError::Disconnected) => return Ok(self.lost()),
        };
        self.note(&ev);
        Ok(ev)
    }

    /// Non-blocking poll; `None` when nothing is waiting or after `Finished`.
    pub fn try_recv(&self) -> Option<EngineEvent> {
        if self.done.load(Ordering::Acquire) {
            return None;
        }
        let ev = match self.events.try_recv() {
            Ok(ev) => ev,
            Err(mpsc::TryRecvError::Empty) => return None,
            Err(mpsc::TryRecvError::Disconnected) => return Some(self.lost()),
        };
        self.note(&ev);
        Some(ev)
    }

    /// Whether `Finished` was delivered.
    pub fn is_finished(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Cancels the request (see [`Canceller::cancel`]).
    pub fn cancel(&self) {
        self.shared.cancel();
    }

    /// A cancel handle usable from other threads.
    pub fn canceller(&self) -> Canceller {
        Canceller {
            shared: self.shared.clone(),
        }
    }

    /// Drains events until `Finished`: the concatenated audio, the reason and the metrics.
    /// Checks that chunks are contiguous (`offset` = samples so far).
    pub fn collect(&self) -> Result<(Vec<f32>, FinishReason, Metrics), EngineError> {
        let mut audio = Vec::new();
        while let Some(ev) = self.recv() {
            match ev {
                EngineEvent::Audio(c) => {
                    if c.offset != audio.len() as u64 {
                        return Err(EngineError::Stage {
                            stage: 1,
                            msg: format!(
                                "audio chunk at offset {} after {} samples",
                                c.offset,
                                audio.len()
                            ),
                        });
                    }
                    audio.extend_from_slice(&c.samples);
                }
                EngineEvent::Finished { reason, metrics } => return Ok((audio, reason, metrics)),
                EngineEvent::Started | EngineEvent::FirstAudio { .. } => {}
            }
        }
        Err(EngineError::Stage {
            stage: 1,
            msg: "event stream ended without Finished".to_string(),
        })
    }
}

impl Drop for RequestHandle {
    /// Dropping an unfinished handle cancels its request.
    fn drop(&mut self) {
        if !self.done.load(Ordering::Acquire) {
            self.shared.cancel();
        }
    }
}

static LOADS: AtomicU64 = AtomicU64::new(0);

/// The loaded two-stage engine. Dropping it cancels every request still running (their handles get
/// `Finished { Cancelled }`) and joins both stage threads.
pub struct Engine {
    config: StageConfig,
    /// The checkpoint's description and request checks.
    rules: Arc<dyn VoiceRules>,
    default_sampling: SamplingParams,
    info: LoadedInfo,
    ar_queue: Arc<StageQueue>,
    dec_queue: Arc<StageQueue>,
    next_id: AtomicU64,
    threads: Mutex<Option<Threads>>,
    /// Encoded voice-clone references ([`Engine::voice_clone_prompt`]).
    voice_clones: Mutex<CloneCache>,
    /// Stage 0's places: `max_num_seqs` running + `max_waiting` waiting.
    admission: Arc<AdmissionControl>,
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("model", &self.rules.description().name)
            .field("ar_device", &self.info.ar_device)
            .field("decoder_device", &self.info.decoder_device)
            .field("async_chunk", &self.config.async_chunk)
            .finish()
    }
}

impl Engine {
    /// Opens the checkpoint, spawns the two stage threads, and waits until each has opened its
    /// device and loaded its model (in parallel). Errors: unreadable checkpoint, a device this
    /// build cannot open (`cuda:N` without the `cuda` feature), model load failures (naming the
    /// stage), or stages that disagree (code groups versus codec quantizers).
    pub fn load(opts: EngineOptions) -> Result<Engine, EngineError> {
        opts.ar_device.check_supported()?;
        opts.decoder_device.check_supported()?;
        let load_err = |e| EngineError::Load {
            stage: 0,
            name: "model",
            source: e,
        };
        let family = families::detect(&opts.model_dir).map_err(load_err)?;
        opts.stage_config.check_family(family)?;
        let rules = family.rules(&opts.model_dir).map_err(load_err)?;
        let default_sampling = opts
            .stage_config
            .ar
            .sampling
            .apply(rules.default_sampling());
        let (info, ar_queue, dec_queue, threads) = family.visit(stages::Spawn(&opts))?;
        let d = rules.description();
        if (info.sample_rate, info.samples_per_frame) != (d.sample_rate, d.samples_per_frame) {
            return Err(EngineError::Mismatch(format!(
                "the codec decoder makes {} Hz, {} samples a frame, but the checkpoint's \
                 configs say {} Hz, {} samples a frame",
                info.sample_rate, info.samples_per_frame, d.sample_rate, d.samples_per_frame
            )));
        }
        LOADS.fetch_add(1, Ordering::Relaxed);
        let ar = &opts.stage_config.ar;
        let admission = AdmissionControl::new(ar.max_num_seqs + ar.max_waiting);
        Ok(Engine {
            config: opts.stage_config,
            rules,
            default_sampling,
            info,
            ar_queue,
            dec_queue,
            next_id: AtomicU64::new(1),
            threads: Mutex::new(Some(threads)),
            voice_clones: Mutex::new(CloneCache::default()),
            admission,
        })
    }

    /// Requests stage 0 holds now, running or waiting (at most `max_num_seqs + max_waiting`).
    pub fn requests_in_stage0(&self) -> usize {
        self.admission.held()
    }

    /// Engines loaded in this process so far (every successful [`Engine::load`]; a diagnostic for
    /// the sharing of [`registry`]).
    pub fn loads_in_process() -> u64 {
        LOADS.load(Ordering::Relaxed)
    }

    /// What the checkpoint is and accepts: family, output rate, frame size, codebooks,
    /// speakers, languages, instruct, voice cloning.
    pub fn description(&self) -> &ModelDescription {
        self.rules.description()
    }

    /// Preset speakers (Qwen3-TTS CustomVoice), lower case.
    pub fn speakers(&self) -> Vec<String> {
        self.rules.description().speakers.clone()
    }

    /// Languages a request may name (incl. `auto`).
    pub fn languages(&self) -> Vec<String> {
        self.rules.description().languages.clone()
    }

    /// Output sample rate, Hz (24000 for Qwen3-TTS, 44100 for Fish S2 Pro), from the codec.
    pub fn sample_rate(&self) -> u32 {
        self.info.sample_rate
    }

    /// Samples per codec frame (1920 for Qwen3-TTS, 2048 for Fish S2 Pro), from the codec.
    pub fn samples_per_frame(&self) -> usize {
        self.info.samples_per_frame
    }

    /// The stage configuration in use.
    pub fn stage_config(&self) -> &StageConfig {
        &self.config
    }

    /// The devices the stages actually run on (after resolving `auto`).
    pub fn devices(&self) -> (DeviceSpec, DeviceSpec) {
        (self.info.ar_device, self.info.decoder_device)
    }

    /// How stage 0's linear weights are stored (`engine_args.quantization`): for each form, the
    /// layers and their bytes, dense first.
    pub fn weight_forms(&self) -> &[WeightForm] {
        &self.info.weight_forms
    }

    /// Whether stage 0's code predictor replays CUDA graphs (captured during [`Engine::load`]).
    pub fn cuda_graphs(&self) -> &CudaGraphs {
        &self.info.cuda_graphs
    }

    /// Whether stage 0's batched frames replay CUDA graphs, and for which batch sizes (captured
    /// during [`Engine::load`]).
    pub fn batch_graphs(&self) -> &BatchGraphs {
        &self.info.batch_graphs
    }

    /// Whether stage 1 decodes new requests' first chunks on a decoder of their own
    /// (`first_chunk_lane` in the stage config; started during [`Engine::load`]).
    pub fn first_chunk_lane(&self) -> &FirstChunkLane {
        &self.info.first_chunk_lane
    }

    /// Whether stage 1's decoder replays CUDA graphs (captured during [`Engine::load`]; Code2Wav:
    /// a fresh stream's one-frame first chunk, `OMNITTS_DECODER_FIRST_GRAPH`).
    pub fn decoder_graphs(&self) -> &CudaGraphs {
        &self.info.decoder_graphs
    }

    /// The model's sampling defaults (Qwen3-TTS: `generation_config.json`; Fish S2 Pro: its
    /// reference's) overridden by the stage config's `default_sampling_params` /
    /// `subtalker_sampling_params`.
    pub fn default_sampling_params(&self) -> SamplingParams {
        self.default_sampling.clone()
    }

    /// The voice-clone prompt of a reference recording (checkpoints that clone: Qwen3-TTS Base,
    /// Fish S2 Pro), for `VoiceRequest::voice_clone`: Qwen3-TTS Base's x-vector and, unless
    /// `x_vector_only`, the reference codes (its codec encoder, `ceil(samples / 1920)` frames)
    /// and `ref_text` for ICL — the reference wrapper's `create_voice_clone_prompt`; Fish S2
    /// Pro's codes (`ceil(samples / 2048)` frames) and `ref_text` (no x-vector mode).
    ///
    /// `audio`: mono samples at the model's reference rate
    /// ([`ModelDescription::reference`]: 24 kHz Qwen3-TTS, 44.1 kHz Fish), nominally in
    /// [-1, 1], within its length limits (0.5 s to 60 s for both).
    /// `ref_text`: the transcript of the recording, required unless `x_vector_only` (then it is
    /// ignored, as in the reference `generate_voice_clone`).
    ///
    /// Encoding runs on stage 0 (which owns the Base model's encoders) between two rounds of
    /// frames; the result is cached (see [`VOICE_CLONE_CACHE_ENTRIES`], [`Engine::voice_clone_stats`]),
    /// so calling this per utterance with the same reference costs a hash of the samples.
    /// Blocks until stage 0 has encoded the reference (a cache miss) or returns at once (a hit).
    ///
    /// Errors: [`EngineError::InvalidRequest`] with `field` `model` (not a Base checkpoint),
    /// `ref_audio` (too short, too long, non-finite or silent: peak below −60 dBFS) or `ref_text`
    /// (missing in ICL mode); [`EngineError::Stage`] if stage 0 failed or is gone.
    pub fn voice_clone_prompt(
        &self,
        audio: &[f32],
        ref_text: Option<&str>,
        x_vector_only: bool,
    ) -> Result<Arc<VoiceClonePrompt>, EngineError> {
        let key = CloneKey::new(audio, ref_text, x_vector_only);
        let cache = || {
            self.voice_clones
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
        };
        if let Some(hit) = cache().get(&key) {
            return Ok(hit);
        }
        let (reply, answer) = mpsc::sync_channel(1);
        let job = EncodeJob {
            audio: audio.to_vec(),
            ref_text: key.ref_text().map(str::to_string),
            x_vector_only,
            reply,
        };
        let gone = || EngineError::Stage {
            stage: 0,
            msg: "the stage thread is no longer running".to_string(),
        };
        self.ar_queue.push_job(job).map_err(|_| gone())?;
        let prompt = Arc::new(answer.recv().map_err(|_| gone())??);
        cache().insert(key, prompt.clone());
        Ok(prompt)
    }

    /// How many references [`Engine::voice_clone_prompt`] encoded and how many it found cached.
    pub fn voice_clone_stats(&self) -> VoiceCloneStats {
        self.voice_clones
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .stats()
    }

    /// Checks `req` as [`Engine::submit`] does, without queueing it: the voice (text, speaker,
    /// language, voice-clone prompt; the model's rules), the sampling values and chunk sizes, and
    /// that the text is not too long for one utterance (its prompt and the frame cap within the
    /// AR stage's positions; a long text is tokenized here for it).
    /// Errors: [`EngineError::InvalidRequest`] naming the field (`voice.text`,
    /// `sampling.top_p`, `chunk_frames`, …) and the value.
    pub fn validate(&self, req: &EngineRequest) -> Result<(), EngineError> {
        let bad = |field: &str, value: String, msg: &str| EngineError::InvalidRequest {
            field: field.to_string(),
            value,
            msg: msg.to_string(),
        };
        // Same rules as the model (case-insensitive speaker/language, empty text, …).
        self.rules
            .check(&req.voice)
            .map_err(|e| voice_error(e, &req.voice))?;
        req.sampling
            .validate()
            .and_then(|()| self.rules.check_sampling(&req.sampling))
            .map_err(|e| match e {
                ModelError::InvalidRequest { field, value, msg } => EngineError::InvalidRequest {
                    field: format!("sampling.{field}"),
                    value,
                    msg,
                },
                other => bad("sampling", String::new(), &other.to_string()),
            })?;
        if req.chunk_frames == Some(0) {
            return Err(bad("chunk_frames", "0".to_string(), "must be ≥ 1"));
        }
        // Last, as it may tokenize a long text: a prompt past the AR stage's positions.
        self.rules
            .check_length(&req.voice, req.sampling.max_new_tokens)
            .map_err(|e| match e {
                ModelError::InvalidRequest { field, value, msg } if field == "max_new_tokens" => {
                    EngineError::InvalidRequest {
                        field: format!("sampling.{field}"),
                        value,
                        msg,
                    }
                }
                e => voice_error(e, &req.voice),
            })?;
        Ok(())
    }

    /// Validates and queues a request. Validation errors (empty text, unknown speaker or language,
    /// out-of-range sampling values, `chunk_frames` 0) come back here; failures while running come
    /// as `Finished { reason: Error(..) }` on the handle.
    pub fn submit(&self, req: EngineRequest) -> Result<RequestHandle, EngineError> {
        self.submit_inner(req, None)
    }

    /// [`Engine::submit`] that also delivers every frame's codes (`num_code_groups` u32s each, in
    /// order, exactly the frames stage 1 decodes) on the returned receiver, for tools and tests
    /// that keep or compare the codes. Every frame is sent before `Finished`, so after `Finished`
    /// the receiver holds all of them.
    pub fn submit_tapped(
        &self,
        req: EngineRequest,
    ) -> Result<(RequestHandle, Receiver<Vec<u32>>), EngineError> {
        let (tx, rx) = mpsc::channel();
        Ok((self.submit_inner(req, Some(tx))?, rx))
    }

    /// The batch tallies of stage 0 (`[0]`: frames per batched step) and stage 1 (`[1]`: chunks
    /// per batched exact-streaming decode pass) since the engine loaded.
    pub fn batch_stats(&self) -> [BatchStats; 2] {
        [self.info.batches[0].get(), self.info.batches[1].get()]
    }

    /// Queues a request whose text is still arriving (an LLM's reply streamed into speech):
    /// `req.voice.text` is the text so far (may be empty), the rest comes through the returned
    /// [`TextSender`] (`append`, then `end`; dropping it ends the text). Streaming prompt mode
    /// only: the talker takes one text id per codec frame, so the utterance starts once the
    /// prefill's first text id is final (the incremental tokenizer of `text_stream.rs` holds back
    /// what later text could change) and a frame whose text id has not arrived waits out stage
    /// 0's steps while the other requests go on; the codes (greedy, or sampled with the seed)
    /// are those of the whole text given to [`Engine::submit`] in streaming prompt mode, however
    /// the text was cut and whenever it came.
    ///
    /// Checked here: speaker, language, sampling and chunk values as [`Engine::submit`], and
    /// the prompt mode (it must resolve to `streaming`: field `voice.prompt_mode`) and voice
    /// clone (no ICL: `voice.voice_clone`). Checked when the text ends, failing the request with
    /// `Finished { reason: Error(..) }`: the whole text (nothing to speak, no letter or digit,
    /// too long for the talker's positions) and its bytes (not UTF-8, naming the offset).
    pub fn submit_open(
        &self,
        req: EngineRequest,
    ) -> Result<(RequestHandle, TextSender), EngineError> {
        self.submit_open_inner(req, None)
    }

    /// [`Engine::submit_open`] with every frame's codes delivered as [`Engine::submit_tapped`]
    /// does.
    pub fn submit_open_tapped(
        &self,
        req: EngineRequest,
    ) -> Result<(RequestHandle, TextSender, Receiver<Vec<u32>>), EngineError> {
        let (tx, rx) = mpsc::channel();
        let (h, s) = self.submit_open_inner(req, Some(tx))?;
        Ok((h, s, rx))
    }

    fn submit_open_inner(
        &self,
        mut req: EngineRequest,
        codes_tap: Option<mpsc::Sender<Vec<u32>>>,
    ) -> Result<(RequestHandle, TextSender), EngineError> {
        let first = std::mem::take(&mut req.voice.text);
        // The text is checked when it ends; a speakable stand-in passes the other checks.
        req.voice.text = "x".into();
        self.validate(&req)?;
        self.rules
            .check_open(&req.voice)
            .map_err(|e| voice_error(e, &req.voice))?;
        let feed = text_feed::TextFeed::new(self.ar_queue.signal.clone());
        let sender = TextSender::new(feed.clone());
        sender.append(&first)?;
        let handle = self.submit_checked(req, codes_tap, Some(feed))?;
        Ok((handle, sender))
    }

    fn submit_inner(
        &self,
        req: EngineRequest,
        codes_tap: Option<mpsc::Sender<Vec<u32>>>,
    ) -> Result<RequestHandle, EngineError> {
        self.validate(&req)?;
        self.submit_checked(req, codes_tap, None)
    }

    fn submit_checked(
        &self,
        req: EngineRequest,
        codes_tap: Option<mpsc::Sender<Vec<u32>>>,
        text: Option<Arc<text_feed::TextFeed>>,
    ) -> Result<RequestHandle, EngineError> {
        let ar = &self.config.ar;
        let admission = self.admission.admit().map_err(|held| EngineError::Busy {
            held,
            max_num_seqs: ar.max_num_seqs,
            max_waiting: ar.max_waiting,
        })?;
        let policy = self
            .config
            .chunk_policy(req.initial_chunk_frames, req.chunk_frames);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(RequestShared::new(
            id,
            req,
            policy,
            self.config.decoder.codec_buffer_frames,
            self.ar_queue.signal.clone(),
            self.dec_queue.signal.clone(),
            tx,
            Instant::now(),
            admission,
            codes_tap,
            text,
        ));
        let core = shared.core.clone();
        // Stage 1 first, so it is watching the buffer before stage 0 fills it.
        let queued = self
            .dec_queue
            .push(shared.clone())
            .map_err(|_| 1)
            .and_then(|()| self.ar_queue.push(shared).map_err(|_| 0));
        if let Err(stage) = queued {
            core.cancel();
            return Err(EngineError::Stage {
                stage,
                msg: "the stage thread is no longer running".to_string(),
            });
        }
        Ok(RequestHandle {
            shared: core,
            events: rx,
            done: AtomicBool::new(false),
        })
    }
}

/// A model's refusal of a request's voice as the engine reports it: the field under `voice.`.
fn voice_error(e: ModelError, voice: &VoiceRequest) -> EngineError {
    match e {
        ModelError::InvalidRequest { field, value, msg } => EngineError::InvalidRequest {
            field: format!("voice.{field}"),
            value,
            msg,
        },
        other => EngineError::InvalidRequest {
            field: "voice".to_string(),
            value: format!("{:?}", voice.text),
            msg: other.to_string(),
        },
    }
}

impl Drop for Engine {
    /// Stage 0 first: it cancels and lets go of every request it has; then stage 1, which sends
    /// each request's `Finished { Cancelled }`.
    fn drop(&mut self) {
        let threads = self
            .threads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        self.ar_queue.shut_down();
        if let Some((stage0, stage1)) = threads {
            let _ = stage0.join();
            self.dec_queue.shut_down();
            let _ = stage1.join();
        } else {
            self.dec_queue.shut_down();
        }
    }
}
