//! GObject/GStreamer implementation of `omnittssrc` (see the module docs in `mod.rs`).

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gst::glib;
use gst::prelude::*;
use gst::subclass::prelude::*;
use gst_base::prelude::*;
use gst_base::subclass::base_src::CreateSuccess;
use gst_base::subclass::prelude::*;

use crate::engine::{
    DeviceSpec, Engine, EngineOptions, EngineRequest, FinishReason, Metrics, StageConfig,
};
use crate::models::qwen3_tts::prompt::{NOTHING_TO_SPEAK, nothing_to_speak};
use crate::models::qwen3_tts::{
    GenerationConfig, MAX_REF_AUDIO_SAMPLES, MIN_REF_AUDIO_SAMPLES, ModelVariant, PromptMode,
    SamplingParams, VoiceRequest,
};

use super::hub;
use super::runtime::{self, Current, Item, Shared, done_message, messages, pos_of, pts_of};
use super::sentences::split_sentences;
use super::voice_clone::{CloneSpec, VoiceCloner, clone_spec};
use super::{CAT, InputError, input_error};

/// The only rate the element produces (Qwen3-TTS 12 Hz codec output); `audioresample` adapts.
pub(super) const RATE: u32 = 24_000;

/// The bundled English voice (`models/omnitts-en` of the source tree this plugin was built from): a small
/// CustomVoice checkpoint in the real Qwen3-TTS layout, so the element speaks with no download.
const DEFAULT_MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/models/omnitts-en");
const DEFAULT_LANGUAGE: &str = "auto";
const DEFAULT_INITIAL_CHUNK_FRAMES: u32 = 0;
const DEFAULT_CHUNK_FRAMES: u32 = 0;
/// 20 ms at 24 kHz: fine-grained live pacing, one Opus frame.
const DEFAULT_SAMPLES_PER_BUFFER: u32 = 480;
const DEFAULT_IS_LIVE: bool = false;
/// Back-pressure bound between the engine and `create()`: 10 s of audio.
const MAX_QUEUED_SAMPLES: usize = 10 * RATE as usize;

/// What gst-inspect shows as the sampling defaults: the built-in stage config's
/// `default_sampling_params` (configs/qwen3_tts.yaml: max-new-tokens and seed), else the released
/// checkpoints' `generation_config.json` values (qwen3-tts.md §1.4). An unset property takes the
/// loaded stage config's value, else the loaded checkpoint's (the bundled voice's: greedy).
struct SamplingDefaults {
    do_sample: bool,
    temperature: f64,
    top_k: u32,
    top_p: f64,
    repetition_penalty: f64,
    max_new_tokens: u32,
    seed: u64,
}

static SAMPLING_DEFAULTS: LazyLock<SamplingDefaults> = LazyLock::new(|| {
    // The released generation_config.json (the reference wrapper's defaults, max_new_tokens 8192),
    // under the built-in stage config, merged as the engine merges them for a loaded checkpoint.
    let released = GenerationConfig {
        max_new_tokens: 8192,
        ..GenerationConfig::default()
    };
    let s = StageConfig::default_async()
        .ar
        .sampling
        .apply(SamplingParams::from_generation_config(&released));
    SamplingDefaults {
        do_sample: s.do_sample,
        temperature: s.temperature,
        top_k: s.top_k.min(u32::MAX as usize) as u32,
        top_p: s.top_p,
        repetition_penalty: s.repetition_penalty,
        max_new_tokens: s.max_new_tokens.min(u32::MAX as usize) as u32,
        seed: s.seed,
    }
});

/// The `prompt-mode` property: where the text goes in the prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, glib::Enum)]
#[repr(u32)]
#[enum_type(name = "GstOmniTtsPromptMode")]
enum PromptModeSetting {
    /// The variant's reference default.
    #[default]
    #[enum_value(
        name = "The checkpoint variant's default: non-streaming for CustomVoice and VoiceDesign, \
                streaming for Base",
        nick = "auto"
    )]
    Auto = 0,
    /// One text token per codec frame.
    #[enum_value(
        name = "Streaming: text fed one token per codec frame (qwen-tts non_streaming_mode=False)",
        nick = "streaming"
    )]
    Streaming = 1,
    /// All of the text in the prefill.
    #[enum_value(
        name = "Non-streaming: all of the text in the prompt (qwen-tts non_streaming_mode=True)",
        nick = "non-streaming"
    )]
    NonStreaming = 2,
}

impl PromptModeSetting {
    fn prompt_mode(self) -> Option<PromptMode> {
        match self {
            PromptModeSetting::Auto => None,
            PromptModeSetting::Streaming => Some(PromptMode::Streaming),
            PromptModeSetting::NonStreaming => Some(PromptMode::NonStreaming),
        }
    }
}

/// Property values. Sampling fields and devices are `None` until set: then the stage config
/// (and, for sampling, the checkpoint's `generation_config.json`) decides.
#[derive(Debug, Clone)]
struct Settings {
    text: Option<String>,
    model: String,
    stage_config: Option<String>,
    ar_device: Option<String>,
    decoder_device: Option<String>,
    speaker: Option<String>,
    language: String,
    instruct: Option<String>,
    prompt_mode: PromptModeSetting,
    ref_audio: Option<String>,
    ref_text: Option<String>,
    x_vector_only: bool,
    do_sample: Option<bool>,
    temperature: Option<f64>,
    top_k: Option<u32>,
    top_p: Option<f64>,
    repetition_penalty: Option<f64>,
    max_new_tokens: Option<u32>,
    seed: Option<u64>,
    initial_chunk_frames: u32,
    chunk_frames: u32,
    samples_per_buffer: u32,
    is_live: bool,
    split_sentences: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            text: None,
            model: DEFAULT_MODEL.to_string(),
            stage_config: None,
            ar_device: None,
            decoder_device: None,
            speaker: None,
            language: DEFAULT_LANGUAGE.to_string(),
            instruct: None,
            prompt_mode: PromptModeSetting::Auto,
            ref_audio: None,
            ref_text: None,
            x_vector_only: false,
            do_sample: None,
            temperature: None,
            top_k: None,
            top_p: None,
            repetition_penalty: None,
            max_new_tokens: None,
            seed: None,
            initial_chunk_frames: DEFAULT_INITIAL_CHUNK_FRAMES,
            chunk_frames: DEFAULT_CHUNK_FRAMES,
            samples_per_buffer: DEFAULT_SAMPLES_PER_BUFFER,
            is_live: DEFAULT_IS_LIVE,
            split_sentences: false,
        }
    }
}

impl Settings {
    /// The utterances one text becomes: one a sentence with `split-sentences`, else the text.
    fn utterance_texts(&self, text: &str) -> Vec<String> {
        let pieces = if self.split_sentences {
            split_sentences(text)
        } else {
            Vec::new()
        };
        if pieces.is_empty() {
            vec![text.to_string()]
        } else {
            pieces
        }
    }
}

/// The negotiated sample format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SampleFormat {
    F32,
    S16,
}

impl SampleFormat {
    fn bytes(self) -> usize {
        match self {
            SampleFormat::F32 => 4,
            SampleFormat::S16 => 2,
        }
    }
}

/// What start() learnt about the loaded model; fixed until stop().
#[derive(Debug, Clone)]
struct ModelInfo {
    /// The `model` property as given (for messages).
    model: String,
    dir: PathBuf,
    variant: ModelVariant,
    speakers: Vec<String>,
    languages: Vec<String>,
    /// The engine's defaults: generation_config.json overridden by the stage config.
    base_sampling: SamplingParams,
    samples_per_frame: usize,
    /// Live latency: the first chunk's duration (at least one buffer).
    latency: gst::ClockTime,
    /// Chunk size of requests when the `chunk-frames` property is 0 (`None`: the stage config's).
    default_chunk_frames: Option<usize>,
    live: bool,
    samples_per_buffer: u32,
}

/// Exists between start() and stop().
struct Runtime {
    /// Shared with the worker, which submits the utterances.
    engine: Arc<Engine>,
    shared: Arc<Shared>,
    worker: Option<std::thread::JoinHandle<()>>,
    info: ModelInfo,
}

#[derive(Default)]
struct State {
    runtime: Option<Runtime>,
    format: Option<SampleFormat>,
    /// Text pushed with `push-text` before start(); queued at start().
    early_texts: Vec<String>,
}

/// The element's instance data: property values and stream state, each behind its own lock
/// (lock order: settings, then state, then the runtime queue).
#[derive(Default)]
pub struct OmniTtsSrc {
    settings: Mutex<Settings>,
    state: Mutex<State>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[glib::object_subclass]
impl ObjectSubclass for OmniTtsSrc {
    const NAME: &'static str = "GstOmniTtsSrc";
    type Type = super::OmniTtsSrc;
    type ParentType = gst_base::PushSrc;
}

/// Parses a device property the way the engine does and checks that this build can use it;
/// `None` (unset) takes the stage config's device.
fn parse_device(
    property: &'static str,
    value: Option<&str>,
    from_stage_config: DeviceSpec,
) -> Result<DeviceSpec, InputError> {
    let Some(value) = value else {
        return Ok(from_stage_config);
    };
    let spec =
        DeviceSpec::from_str(value).map_err(|e| input_error(property, value, e.to_string()))?;
    spec.check_supported()
        .map_err(|e| input_error(property, value, e.to_string()))?;
    Ok(spec)
}

/// Matches `value` case-insensitively against `list`, returning the list's spelling.
fn find_ci<'a>(list: &'a [String], value: &str) -> Option<&'a String> {
    list.iter().find(|s| s.eq_ignore_ascii_case(value.trim()))
}

/// Builds the engine request for `text` from the property values `s`, and the reference voice it
/// is to be spoken in (Base checkpoints; the worker turns it into the request's voice-clone prompt).
fn build_request(
    s: &Settings,
    info: &ModelInfo,
    text: &str,
) -> Result<(EngineRequest, Option<CloneSpec>), InputError> {
    if nothing_to_speak(text) {
        return Err(input_error("text", text, NOTHING_TO_SPEAK));
    }
    let speaker = match s
        .speaker
        .as_deref()
        .map(str::trim)
        .filter(|v| !v.is_empty())
    {
        Some(v) => match find_ci(&info.speakers, v) {
            Some(name) => Some(name.clone()),
            None if info.speakers.is_empty() => {
                return Err(input_error(
                    "speaker",
                    v,
                    format!(
                        "this {:?} checkpoint has no preset speakers; leave speaker unset",
                        info.variant
                    ),
                ));
            }
            None => {
                return Err(input_error(
                    "speaker",
                    v,
                    format!("unknown speaker; available: {}", info.speakers.join(", ")),
                ));
            }
        },
        // CustomVoice needs a speaker: take the checkpoint's first.
        None if info.variant == ModelVariant::CustomVoice => info.speakers.first().cloned(),
        None => None,
    };
    let lang = s.language.trim();
    let language = if lang.is_empty() || lang.eq_ignore_ascii_case("auto") {
        None
    } else {
        match find_ci(&info.languages, lang) {
            Some(l) => Some(l.clone()),
            None => {
                return Err(input_error(
                    "language",
                    lang,
                    format!(
                        "unknown language; available: auto, {}",
                        info.languages
                            .iter()
                            .filter(|l| !l.eq_ignore_ascii_case("auto"))
                            .cloned()
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
        }
    };
    let instruct = s
        .instruct
        .as_deref()
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_string);
    let clone = clone_spec(
        info.variant,
        &info.model,
        s.ref_audio.as_deref(),
        s.ref_text.as_deref(),
        s.x_vector_only,
    )?;

    let mut sampling = info.base_sampling.clone();
    if let Some(v) = s.temperature {
        sampling.temperature = v;
    }
    if let Some(v) = s.top_k {
        sampling.top_k = v as usize;
    }
    if let Some(v) = s.top_p {
        sampling.top_p = v;
    }
    if let Some(v) = s.repetition_penalty {
        sampling.repetition_penalty = v;
    }
    if let Some(v) = s.max_new_tokens {
        sampling.max_new_tokens = v as usize;
    }
    if let Some(v) = s.seed {
        sampling.seed = v;
    }
    if let Some(v) = s.do_sample {
        sampling.do_sample = v;
    }
    if !sampling.do_sample || sampling.temperature <= 0.0 {
        sampling = sampling.greedy();
    }
    let request = EngineRequest {
        voice: VoiceRequest {
            text: text.to_string(),
            speaker,
            language,
            instruct,
            prompt_mode: s.prompt_mode.prompt_mode(),
            voice_clone: None,
        },
        sampling,
        initial_chunk_frames: (s.initial_chunk_frames > 0)
            .then_some(s.initial_chunk_frames as usize),
        chunk_frames: if s.chunk_frames > 0 {
            Some(s.chunk_frames as usize)
        } else {
            info.default_chunk_frames
        },
    };
    Ok((request, clone))
}

impl OmniTtsSrc {
    fn settings(&self) -> Settings {
        lock(&self.settings).clone()
    }

    fn post_input_error(&self, e: &InputError) {
        gst::element_imp_error!(self, gst::ResourceError::Settings, ("{}", e));
    }

    /// Queues `text` as an utterance (the `push-text` action and `text` set while running).
    /// Returns false when the text is refused, with an element error that names the property
    /// and value: at once before start, and while running in stream order, after the audio of
    /// the utterances queued before it (none of which is lost).
    fn push_text(&self, text: &str) -> bool {
        let settings = self.settings();
        let mut state = lock(&self.state);
        let Some(rt) = state.runtime.as_ref() else {
            if nothing_to_speak(text) {
                drop(state);
                self.post_input_error(&input_error("text", text, NOTHING_TO_SPEAK));
                return false;
            }
            gst::debug!(CAT, imp = self, "not started: keeping {text:?} for start()");
            state.early_texts.push(text.to_string());
            return true;
        };
        let shared = rt.shared.clone();
        let info = rt.info.clone();
        drop(state);
        let built: Result<Vec<_>, InputError> = settings
            .utterance_texts(text)
            .into_iter()
            .map(|piece| {
                build_request(&settings, &info, &piece)
                    .map(|(request, clone)| (piece, Ok(request), clone))
            })
            .collect();
        // A refused text is queued whole, as one utterance whose error keeps its place in the stream.
        let (utterances, accepted) = match built {
            Ok(u) => (u, true),
            Err(e) => (vec![(text.to_string(), Err(e.to_string()), None)], false),
        };
        let now = if info.live {
            self.obj().current_running_time()
        } else {
            None
        };
        let mut inner = shared.lock();
        if inner.eos {
            drop(inner);
            gst::warning!(CAT, imp = self, "text {text:?} arrived after EOS, refused");
            return false;
        }
        let start_pos = match (inner.r0, now) {
            (Some(r0), Some(now)) => pos_of(now.saturating_sub(r0), RATE),
            _ => 0,
        };
        for (text, request, clone) in utterances {
            let u = inner.queue(text, request, clone, start_pos);
            gst::info!(
                CAT,
                imp = self,
                "queued utterance {} at sample {start_pos}: {:?}",
                u.id,
                u.text
            );
        }
        shared.cond.notify_all();
        accepted
    }

    /// Drops queued text and audio and stops the utterance in flight (flush, `cancel`).
    /// Returns whether anything was dropped.
    fn discard(&self, why: &str) -> bool {
        let (shared, spf) = {
            let state = lock(&self.state);
            match state.runtime.as_ref() {
                Some(rt) => (rt.shared.clone(), rt.info.samples_per_frame),
                None => return false,
            }
        };
        let mut inner = shared.lock();
        let had = inner.current.is_some()
            || inner.worker_busy
            || !inner.pending.is_empty()
            || !inner.items.is_empty();
        let cur = inner.discard_all();
        let end = inner.n;
        shared.cond.notify_all();
        drop(inner);
        gst::debug!(
            CAT,
            imp = self,
            "{why}: discarded queued text and audio (had any: {had})"
        );
        if let Some(cur) = cur {
            // The engine's own metrics went with the discarded items: what the element saw.
            let audio_ms = cur.samples_out as f64 * 1000.0 / RATE as f64;
            let wall_ms = cur.since.elapsed().as_secs_f64() * 1000.0;
            let metrics = Metrics {
                frames: (cur.samples_out / spf.max(1) as u64) as usize,
                audio_ms,
                ttfa_ms: cur.ttfa_ms,
                wall_ms,
                rtf: if audio_ms > 0.0 {
                    wall_ms / audio_ms
                } else {
                    0.0
                },
                ..Metrics::default()
            };
            let msg = done_message(
                self.obj().upcast_ref(),
                &cur,
                end,
                RATE,
                &FinishReason::Cancelled,
                &metrics,
            );
            let _ = self.obj().post_message(msg);
        }
        had
    }

    /// Resolves, validates and loads everything `start()` needs: the engine, what it tells about
    /// the model, and (Base) the reference voice, decoded and encoded once here so that a bad
    /// reference fails the state change. Errors name the property.
    fn load(&self, s: &Settings) -> Result<(Engine, ModelInfo, VoiceCloner), gst::ErrorMessage> {
        let settings_error =
            |e: InputError| gst::error_msg!(gst::ResourceError::Settings, ("{}", e));
        if let Some(t) = &s.text
            && !t.is_empty()
            && nothing_to_speak(t)
        {
            return Err(settings_error(input_error("text", t, NOTHING_TO_SPEAK)));
        }
        let (stage_config, warnings) = match s.stage_config.as_deref().map(str::trim) {
            Some(p) if !p.is_empty() => StageConfig::from_yaml_file(Path::new(p))
                .map_err(|e| settings_error(input_error("stage-config", p, e.to_string())))?,
            _ => (StageConfig::default_async(), Vec::new()),
        };
        for w in &warnings {
            gst::element_imp_warning!(
                self,
                gst::ResourceError::Settings,
                (
                    "stage-config '{}': {}",
                    s.stage_config.as_deref().unwrap_or(""),
                    w
                )
            );
        }
        let ar_device = parse_device("ar-device", s.ar_device.as_deref(), stage_config.ar.device)
            .map_err(settings_error)?;
        let decoder_device = parse_device(
            "decoder-device",
            s.decoder_device.as_deref(),
            stage_config.decoder.device,
        )
        .map_err(settings_error)?;

        let resolved = hub::resolve_model(&s.model, &hub::HubOptions::from_env()).map_err(|e| {
            let kind = match e {
                hub::HubError::NotCached { .. } | hub::HubError::NotFound { .. } => {
                    gst::ResourceError::NotFound
                }
                _ => gst::ResourceError::Settings,
            };
            gst::error_msg!(kind, ("{}", e))
        })?;
        gst::info!(
            CAT,
            imp = self,
            "model '{}' → {} ({:?})",
            s.model,
            resolved.dir.display(),
            resolved.source
        );
        let opts = EngineOptions {
            model_dir: resolved.dir.clone(),
            stage_config: stage_config.clone(),
            ar_device,
            decoder_device,
        };
        let engine = Engine::load(opts).map_err(|e| {
            gst::error_msg!(
                gst::ResourceError::OpenRead,
                (
                    "model '{}' ({}) could not be loaded (ar-device {}, decoder-device {}): {}",
                    s.model,
                    resolved.dir.display(),
                    ar_device,
                    decoder_device,
                    e
                )
            )
        })?;
        if engine.sample_rate() != RATE {
            return Err(gst::error_msg!(
                gst::ResourceError::Settings,
                (
                    "model '{}': the checkpoint outputs {} Hz, omnittssrc produces {} Hz only",
                    s.model,
                    engine.sample_rate(),
                    RATE
                )
            ));
        }
        let samples_per_frame = engine.samples_per_frame();
        let initial = (s.initial_chunk_frames > 0).then_some(s.initial_chunk_frames as usize);
        let chunk = (s.chunk_frames > 0).then_some(s.chunk_frames as usize);
        let first_chunk_frames = match stage_config.chunk_policy(initial, chunk).next_boundary(0) {
            Some(frames) => frames,
            None => {
                // async_chunk: false decodes whole utterances: no audio before the end.
                if s.is_live {
                    gst::element_imp_warning!(
                        self,
                        gst::ResourceError::Settings,
                        (
                            "stage-config '{}' decodes whole utterances (async_chunk: false): in \
                             live mode speech starts only after each utterance is synthesised",
                            s.stage_config.as_deref().unwrap_or("")
                        )
                    );
                }
                stage_config.decoder.codec_chunk_frames
            }
        };
        // Live: later chunks as small as the first unless chunk-frames is set. Chunk k+1 then takes
        // as long to synthesise as chunk k takes to play whenever synthesis is faster than real
        // time, so a latency of one first chunk holds for the whole utterance. (The stage config's
        // default, 1 then 25 frames, would leave a gap after the first 80 ms unless RTF < 0.04.)
        let default_chunk_frames = (s.is_live && chunk.is_none() && stage_config.async_chunk)
            .then_some(first_chunk_frames);
        let chunk_time = pts_of((first_chunk_frames * samples_per_frame) as u64, RATE);
        let buffer_time = pts_of(s.samples_per_buffer as u64, RATE);
        let info = ModelInfo {
            model: s.model.clone(),
            dir: resolved.dir,
            variant: engine.variant(),
            speakers: engine.speakers(),
            languages: engine.languages(),
            base_sampling: engine.default_sampling_params(),
            samples_per_frame,
            latency: chunk_time.max(buffer_time),
            default_chunk_frames,
            live: s.is_live,
            samples_per_buffer: s.samples_per_buffer,
        };
        // Validate the voice settings now, so that a bad speaker/language/reference fails the
        // state change; this also puts the reference's prompt in the engine's cache.
        let probe_text = "probe";
        let (_, clone) = build_request(s, &info, probe_text).map_err(settings_error)?;
        let mut cloner = VoiceCloner::default();
        if let Some(spec) = clone {
            if spec.x_vector_only
                && let Some(t) = s.ref_text.as_deref().filter(|t| !t.trim().is_empty())
            {
                gst::element_imp_warning!(
                    self,
                    gst::ResourceError::Settings,
                    (
                        "ref-text '{}': ignored, x-vector-only=true clones from the speaker \
                         embedding alone (as qwen-tts generate_voice_clone does)",
                        t
                    )
                );
            }
            let t = Instant::now();
            cloner.prompt(&engine, &spec).map_err(settings_error)?;
            gst::info!(
                CAT,
                imp = self,
                "reference voice '{}' ({}) ready in {:.0} ms",
                spec.location,
                if spec.x_vector_only {
                    "x-vector only"
                } else {
                    "ICL"
                },
                t.elapsed().as_secs_f64() * 1000.0
            );
        }
        Ok((engine, info, cloner))
    }

    /// Turns a non-audio item into bus messages and bookkeeping (called by `create()` with the
    /// queue locked; messages are collected, posted later).
    fn handle_event_item(
        &self,
        item: Item,
        inner: &mut runtime::Inner,
        src: &gst::Element,
        msgs: &mut Vec<gst::Message>,
    ) {
        let n = inner.n;
        match item {
            Item::Started { id, text, .. } => {
                let s = gst::Structure::builder(messages::STARTED)
                    .field("id", id)
                    .field("text", text.as_str())
                    .field("pts", pts_of(n, RATE).nseconds())
                    .build();
                msgs.push(gst::message::Element::builder(s).src(src).build());
                gst::info!(CAT, imp = self, "utterance {id} starts at sample {n}");
                inner.current = Some(Current::new(id, text, n));
            }
            Item::FirstAudio { id, ttfa_ms } => {
                if let Some(cur) = inner.current.as_mut().filter(|c| c.id == id) {
                    cur.ttfa_ms = Some(ttfa_ms);
                }
                let s = gst::Structure::builder(messages::FIRST_AUDIO)
                    .field("id", id)
                    .field("ttfa-ms", ttfa_ms)
                    .field("pts", pts_of(n, RATE).nseconds())
                    .build();
                msgs.push(gst::message::Element::builder(s).src(src).build());
            }
            Item::Done {
                id,
                reason,
                metrics,
            } => {
                let cur = inner
                    .current
                    .take()
                    .unwrap_or_else(|| Current::new(id, String::new(), n));
                gst::info!(
                    CAT,
                    imp = self,
                    "utterance {id} done: {reason:?}, {} frames, {} samples, RTF {:.3}",
                    metrics.frames,
                    cur.samples_out,
                    metrics.rtf
                );
                msgs.push(done_message(src, &cur, n, RATE, &reason, &metrics));
                if let FinishReason::Error(e) = &reason {
                    msgs.push(
                        gst::message::Error::builder(
                            gst::StreamError::Failed,
                            &format!("synthesis of utterance {id} failed: {e}"),
                        )
                        .src(src)
                        .build(),
                    );
                }
            }
            Item::Refused { id, text, error } => {
                msgs.push(
                    gst::message::Error::builder(
                        gst::ResourceError::Settings,
                        &format!("utterance {id} refused: {error}"),
                    )
                    .debug(&format!("text: {text:?}"))
                    .src(src)
                    .build(),
                );
            }
            Item::Audio { .. } => {
                gst::error!(CAT, imp = self, "audio item handled as an event (bug)");
            }
        }
    }

    /// Posts `msgs` (never called with the queue lock held).
    fn post_all(&self, msgs: &mut Vec<gst::Message>) {
        for m in msgs.drain(..) {
            let _ = self.obj().post_message(m);
        }
    }

    /// Live mode: the wall-clock instant by which the buffer at sample `n` must be ready: its
    /// running time plus the reported latency.
    fn live_deadline(&self, r0: gst::ClockTime, n: u64, latency: gst::ClockTime) -> Instant {
        let due = r0 + pts_of(n, RATE) + latency;
        let wait = match self.obj().current_running_time() {
            Some(now) => due.saturating_sub(now),
            None => latency,
        };
        Instant::now() + Duration::from_nanos(wait.nseconds())
    }
}

/// What is at the head of the item queue (copied out so the queue can be mutated).
enum Front {
    Empty,
    Started(u64),
    Audio,
    Event,
}

/// A buffer of `len` samples at position `n`; `samples` None means silence (GAP).
fn make_buffer(
    samples: Option<&[f32]>,
    len: usize,
    format: SampleFormat,
    n: u64,
    discont: bool,
) -> Result<gst::Buffer, gst::FlowError> {
    let mut buffer =
        gst::Buffer::with_size(len * format.bytes()).map_err(|_| gst::FlowError::Error)?;
    {
        let b = buffer.get_mut().ok_or(gst::FlowError::Error)?;
        {
            let mut map = b.map_writable().map_err(|_| gst::FlowError::Error)?;
            let out = map.as_mut_slice();
            match (samples, format) {
                (None, _) => out.fill(0),
                (Some(s), SampleFormat::F32) => {
                    for (o, x) in out.chunks_exact_mut(4).zip(s) {
                        o.copy_from_slice(&x.to_le_bytes());
                    }
                }
                (Some(s), SampleFormat::S16) => {
                    for (o, x) in out.chunks_exact_mut(2).zip(s) {
                        let v = (x.clamp(-1.0, 1.0) * 32767.0).round() as i16;
                        o.copy_from_slice(&v.to_le_bytes());
                    }
                }
            }
        }
        let pts = pts_of(n, RATE);
        let end = pts_of(n + len as u64, RATE);
        b.set_pts(pts);
        b.set_duration(end - pts);
        b.set_offset(n);
        b.set_offset_end(n + len as u64);
        let mut flags = gst::BufferFlags::empty();
        if samples.is_none() {
            flags |= gst::BufferFlags::GAP;
        }
        if discont {
            flags |= gst::BufferFlags::DISCONT;
        }
        b.set_flags(flags);
    }
    Ok(buffer)
}

impl ObjectImpl for OmniTtsSrc {
    fn properties() -> &'static [glib::ParamSpec] {
        static PROPERTIES: LazyLock<Vec<glib::ParamSpec>> = LazyLock::new(|| {
            vec![
                glib::ParamSpecString::builder("text")
                    .nick("Text")
                    .blurb(
                        "Text to speak. Set before start: the first utterance. Set in PAUSED or \
                         PLAYING: each new value is queued as another utterance",
                    )
                    .mutable_playing()
                    .build(),
                glib::ParamSpecBoolean::builder("split-sentences")
                    .nick("Split sentences")
                    .blurb(
                        "Speak each sentence of a text as its own utterance, queued back to back \
                         (blank lines, and Unicode sentence boundaries within a paragraph; a single \
                         line break is a space; titles such as Mr. and initials kept inside a \
                         sentence), each with its own utterance messages. Keeps long \
                         text on track with voices trained on single sentences, such as the \
                         bundled voice. Applies to text queued after it is set",
                    )
                    .default_value(false)
                    .mutable_playing()
                    .build(),
                glib::ParamSpecString::builder("model")
                    .nick("Model")
                    .blurb(
                        "Qwen3-TTS checkpoint: a local directory, or a Hugging Face repo id \
                         resolved through the HF cache (HF_HOME / HF_HUB_CACHE) and downloaded \
                         when online (HF_ENDPOINT, HF_HUB_OFFLINE); default: the bundled small \
                         English voice (speaker joe) in the source tree's models/omnitts-en",
                    )
                    .default_value(Some(DEFAULT_MODEL))
                    .mutable_ready()
                    .build(),
                glib::ParamSpecString::builder("stage-config")
                    .nick("Stage config")
                    .blurb(
                        "YAML file with the engine's stage configuration (chunk sizes, queues); \
                         unset: the built-in async-chunk configuration (configs/qwen3_tts.yaml)",
                    )
                    .mutable_ready()
                    .build(),
                glib::ParamSpecString::builder("ar-device")
                    .nick("AR device")
                    .blurb(
                        "Device of stage 0 (talker + code predictor): cpu, cuda:N, or auto (CUDA \
                         device 0 in a CUDA build with a GPU, else cpu); unset: the stage config's \
                         runtime.devices (auto in the built-in one)",
                    )
                    .mutable_ready()
                    .build(),
                glib::ParamSpecString::builder("decoder-device")
                    .nick("Decoder device")
                    .blurb(
                        "Device of stage 1 (Code2Wav decoder): cpu, cuda:N, or auto; unset: the \
                         stage config's runtime.devices (auto in the built-in one)",
                    )
                    .mutable_ready()
                    .build(),
                glib::ParamSpecString::builder("speaker")
                    .nick("Speaker")
                    .blurb(
                        "Preset speaker of a CustomVoice checkpoint (case-insensitive, see \
                         available-speakers); unset: the checkpoint's alphabetically first speaker \
                         (joe in the bundled voice, aiden in the released checkpoints). Applies to text queued after it is set",
                    )
                    .mutable_playing()
                    .build(),
                glib::ParamSpecString::builder("language")
                    .nick("Language")
                    .blurb(
                        "Language of the text (case-insensitive, see available-languages), or \
                         auto. Applies to text queued after it is set",
                    )
                    .default_value(Some(DEFAULT_LANGUAGE))
                    .mutable_playing()
                    .build(),
                glib::ParamSpecString::builder("instruct")
                    .nick("Instruct")
                    .blurb(
                        "Style instruction (1.7B CustomVoice) or voice description (VoiceDesign); \
                         ignored by 0.6B CustomVoice. Applies to text queued after it is set",
                    )
                    .mutable_playing()
                    .build(),
                glib::ParamSpecEnum::builder_with_default("prompt-mode", PromptModeSetting::Auto)
                    .nick("Prompt mode")
                    .blurb(
                        "Where the text goes in the model's prompt: fed one token per frame \
                         (streaming) or all at once (non-streaming); auto: the variant's default. \
                         Applies to text queued after it is set",
                    )
                    .mutable_playing()
                    .build(),
                glib::ParamSpecString::builder("ref-audio")
                    .nick("Reference audio")
                    .blurb(&format!(
                        "Base checkpoints only (required there): the recording whose voice is \
                         cloned, a file path or URI in any format GStreamer decodes (resampled \
                         to 24 kHz mono); {:.1} s to {:.0} s, not silent (peak above -60 dBFS). \
                         Decoded once and encoded once per recording. Applies to text queued \
                         after it is set",
                        MIN_REF_AUDIO_SAMPLES as f64 / RATE as f64,
                        MAX_REF_AUDIO_SAMPLES as f64 / RATE as f64
                    ))
                    .mutable_playing()
                    .build(),
                glib::ParamSpecString::builder("ref-text")
                    .nick("Reference text")
                    .blurb(
                        "Base checkpoints only: the transcript of ref-audio, for in-context \
                         (ICL) cloning from the reference's speaker embedding and codec codes; \
                         required unless x-vector-only=true (then ignored). Applies to text \
                         queued after it is set",
                    )
                    .mutable_playing()
                    .build(),
                glib::ParamSpecBoolean::builder("x-vector-only")
                    .nick("X-vector only")
                    .blurb(
                        "Base checkpoints only: clone from the speaker embedding (x-vector) of \
                         ref-audio alone, without its transcript and codes (ref-text ignored); \
                         false: ICL cloning, which needs ref-text. Applies to text queued after \
                         it is set",
                    )
                    .default_value(false)
                    .mutable_playing()
                    .build(),
                glib::ParamSpecBoolean::builder("do-sample")
                    .nick("Sample")
                    .blurb(
                        "Sample codes (true) or decode greedily, talker and code predictor \
                         (false, deterministic). Unset sampling properties: the stage config's \
                         default_sampling_params, else the checkpoint's generation_config.json \
                         (the defaults shown are the released checkpoints'; the bundled voice's \
                         is greedy)",
                    )
                    .default_value(SAMPLING_DEFAULTS.do_sample)
                    .mutable_playing()
                    .build(),
                glib::ParamSpecDouble::builder("temperature")
                    .nick("Temperature")
                    .blurb("Sampling temperature of the talker (0 = greedy)")
                    .minimum(0.0)
                    .maximum(2.0)
                    .default_value(SAMPLING_DEFAULTS.temperature)
                    .mutable_playing()
                    .build(),
                glib::ParamSpecUInt::builder("top-k")
                    .nick("Top-k")
                    .blurb("Talker: sample among the k most likely codes (0 = no limit)")
                    .minimum(0)
                    .maximum(4096)
                    .default_value(SAMPLING_DEFAULTS.top_k)
                    .mutable_playing()
                    .build(),
                glib::ParamSpecDouble::builder("top-p")
                    .nick("Top-p")
                    .blurb("Talker: nucleus sampling probability mass (1 = off)")
                    .minimum(0.01)
                    .maximum(1.0)
                    .default_value(SAMPLING_DEFAULTS.top_p)
                    .mutable_playing()
                    .build(),
                glib::ParamSpecDouble::builder("repetition-penalty")
                    .nick("Repetition penalty")
                    .blurb("Talker: penalty on codes already generated (1 = off)")
                    .minimum(1.0)
                    .maximum(2.0)
                    .default_value(SAMPLING_DEFAULTS.repetition_penalty)
                    .mutable_playing()
                    .build(),
                glib::ParamSpecUInt::builder("max-new-tokens")
                    .nick("Max new tokens")
                    .blurb(
                        "Longest utterance in codec frames (12.5 per second of audio); the stage \
                         config's runaway guard may end it earlier",
                    )
                    .minimum(2)
                    .maximum(65536)
                    .default_value(SAMPLING_DEFAULTS.max_new_tokens)
                    .mutable_playing()
                    .build(),
                glib::ParamSpecUInt64::builder("seed")
                    .nick("Seed")
                    .blurb("Random seed of every utterance (same seed and text: same audio)")
                    .default_value(SAMPLING_DEFAULTS.seed)
                    .mutable_playing()
                    .build(),
                glib::ParamSpecUInt::builder("initial-chunk-frames")
                    .nick("Initial chunk frames")
                    .blurb(
                        "Codec frames (80 ms each) in the first audio chunk of an utterance; \
                         smaller = earlier first audio. 0 = the stage config's value. Sets the \
                         live latency",
                    )
                    .minimum(0)
                    .maximum(1000)
                    .default_value(DEFAULT_INITIAL_CHUNK_FRAMES)
                    .mutable_ready()
                    .build(),
                glib::ParamSpecUInt::builder("chunk-frames")
                    .nick("Chunk frames")
                    .blurb(
                        "Codec frames (80 ms each) per audio chunk after the first. 0 = the stage \
                         config's value; live: the first chunk's size, so that audio keeps pace \
                         with the latency",
                    )
                    .minimum(0)
                    .maximum(1000)
                    .default_value(DEFAULT_CHUNK_FRAMES)
                    .mutable_playing()
                    .build(),
                glib::ParamSpecUInt::builder("samples-per-buffer")
                    .nick("Samples per buffer")
                    .blurb("Largest number of samples per output buffer (480 = 20 ms)")
                    .minimum(1)
                    .maximum(10 * RATE)
                    .default_value(DEFAULT_SAMPLES_PER_BUFFER)
                    .mutable_ready()
                    .build(),
                glib::ParamSpecBoolean::builder("is-live")
                    .nick("Is live")
                    .blurb(
                        "Live source: paced by the clock, GAP silence between utterances, text \
                         spoken at the running time it arrives, never EOS by itself",
                    )
                    .default_value(DEFAULT_IS_LIVE)
                    .mutable_ready()
                    .build(),
                glib::ParamSpecString::builder("available-speakers")
                    .nick("Available speakers")
                    .blurb(
                        "Preset speakers of the loaded checkpoint, comma-separated (after start)",
                    )
                    .read_only()
                    .build(),
                glib::ParamSpecString::builder("available-languages")
                    .nick("Available languages")
                    .blurb("Languages of the loaded checkpoint, comma-separated (after start)")
                    .read_only()
                    .build(),
                glib::ParamSpecUInt64::builder("voice-clone-encodes")
                    .nick("Voice-clone encodes")
                    .blurb(
                        "Base checkpoints: how many times the engine has encoded a reference \
                         (speaker and codec encoders) since start; utterances reusing a \
                         reference take it from the engine's cache (0 before start)",
                    )
                    .read_only()
                    .build(),
            ]
        });
        PROPERTIES.as_ref()
    }

    fn signals() -> &'static [glib::subclass::Signal] {
        static SIGNALS: LazyLock<Vec<glib::subclass::Signal>> = LazyLock::new(|| {
            vec![
                glib::subclass::Signal::builder("push-text")
                    .param_types([String::static_type()])
                    .return_type::<bool>()
                    .action()
                    .class_handler(|args| {
                        let element = args[0].get::<super::OmniTtsSrc>().ok()?;
                        let text = args[1].get::<Option<String>>().ok().flatten();
                        let ok = element.imp().push_text(text.as_deref().unwrap_or(""));
                        Some(ok.to_value())
                    })
                    .build(),
                glib::subclass::Signal::builder("cancel")
                    .return_type::<bool>()
                    .action()
                    .class_handler(|args| {
                        let element = args[0].get::<super::OmniTtsSrc>().ok()?;
                        Some(element.imp().discard("cancel").to_value())
                    })
                    .build(),
            ]
        });
        SIGNALS.as_ref()
    }

    fn set_property(&self, _id: usize, value: &glib::Value, pspec: &glib::ParamSpec) {
        let name = pspec.name();
        // Properties that the model load or the caps depend on (flagged mutable in NULL/READY)
        // keep their value once started; a warning on the bus says so.
        let ready_only = pspec.flags().bits() & gst::ffi::GST_PARAM_MUTABLE_READY as u32 != 0;
        if ready_only && lock(&self.state).runtime.is_some() {
            gst::warning!(CAT, imp = self, "{name} can only change in NULL or READY");
            gst::element_imp_warning!(
                self,
                gst::CoreError::StateChange,
                (
                    "property '{name}' can only be changed in the NULL or READY state; {:?} \
                     ignored, the element keeps its current value",
                    value
                )
            );
            return;
        }
        let mut s = lock(&self.settings);
        gst::debug!(CAT, imp = self, "set {name} = {value:?}");
        match name {
            "text" => {
                let t: Option<String> = value.get().expect("type checked upstream");
                s.text = t.clone();
                drop(s);
                let running = lock(&self.state).runtime.is_some();
                if running && let Some(t) = t {
                    self.push_text(&t);
                }
            }
            "model" => {
                s.model = value
                    .get::<Option<String>>()
                    .expect("type checked upstream")
                    .unwrap_or_default()
            }
            "stage-config" => s.stage_config = value.get().expect("type checked upstream"),
            "ar-device" => s.ar_device = value.get().expect("type checked upstream"),
            "decoder-device" => s.decoder_device = value.get().expect("type checked upstream"),
            "speaker" => s.speaker = value.get().expect("type checked upstream"),
            "language" => {
                s.language = value
                    .get::<Option<String>>()
                    .expect("type checked upstream")
                    .unwrap_or_else(|| DEFAULT_LANGUAGE.into())
            }
            "instruct" => s.instruct = value.get().expect("type checked upstream"),
            "prompt-mode" => s.prompt_mode = value.get().expect("type checked upstream"),
            "ref-audio" => s.ref_audio = value.get().expect("type checked upstream"),
            "ref-text" => s.ref_text = value.get().expect("type checked upstream"),
            "x-vector-only" => s.x_vector_only = value.get().expect("type checked upstream"),
            "do-sample" => s.do_sample = Some(value.get().expect("type checked upstream")),
            "temperature" => s.temperature = Some(value.get().expect("type checked upstream")),
            "top-k" => s.top_k = Some(value.get().expect("type checked upstream")),
            "top-p" => s.top_p = Some(value.get().expect("type checked upstream")),
            "repetition-penalty" => {
                s.repetition_penalty = Some(value.get().expect("type checked upstream"))
            }
            "max-new-tokens" => {
                s.max_new_tokens = Some(value.get().expect("type checked upstream"))
            }
            "seed" => s.seed = Some(value.get().expect("type checked upstream")),
            "initial-chunk-frames" => {
                s.initial_chunk_frames = value.get().expect("type checked upstream")
            }
            "chunk-frames" => s.chunk_frames = value.get().expect("type checked upstream"),
            "samples-per-buffer" => {
                s.samples_per_buffer = value.get().expect("type checked upstream")
            }
            "is-live" => s.is_live = value.get().expect("type checked upstream"),
            "split-sentences" => s.split_sentences = value.get().expect("type checked upstream"),
            other => gst::warning!(CAT, imp = self, "unknown property {other}"),
        }
    }

    fn property(&self, _id: usize, pspec: &glib::ParamSpec) -> glib::Value {
        let s = lock(&self.settings);
        match pspec.name() {
            "text" => s.text.to_value(),
            "model" => s.model.to_value(),
            "stage-config" => s.stage_config.to_value(),
            "ar-device" => s.ar_device.to_value(),
            "decoder-device" => s.decoder_device.to_value(),
            "speaker" => s.speaker.to_value(),
            "language" => s.language.to_value(),
            "instruct" => s.instruct.to_value(),
            "prompt-mode" => s.prompt_mode.to_value(),
            "ref-audio" => s.ref_audio.to_value(),
            "ref-text" => s.ref_text.to_value(),
            "x-vector-only" => s.x_vector_only.to_value(),
            "voice-clone-encodes" => {
                drop(s);
                let state = lock(&self.state);
                state
                    .runtime
                    .as_ref()
                    .map_or(0, |rt| rt.engine.voice_clone_stats().encodes)
                    .to_value()
            }
            "do-sample" => s
                .do_sample
                .unwrap_or(SAMPLING_DEFAULTS.do_sample)
                .to_value(),
            "temperature" => s
                .temperature
                .unwrap_or(SAMPLING_DEFAULTS.temperature)
                .to_value(),
            "top-k" => s.top_k.unwrap_or(SAMPLING_DEFAULTS.top_k).to_value(),
            "top-p" => s.top_p.unwrap_or(SAMPLING_DEFAULTS.top_p).to_value(),
            "repetition-penalty" => s
                .repetition_penalty
                .unwrap_or(SAMPLING_DEFAULTS.repetition_penalty)
                .to_value(),
            "max-new-tokens" => s
                .max_new_tokens
                .unwrap_or(SAMPLING_DEFAULTS.max_new_tokens)
                .to_value(),
            "seed" => s.seed.unwrap_or(SAMPLING_DEFAULTS.seed).to_value(),
            "initial-chunk-frames" => s.initial_chunk_frames.to_value(),
            "chunk-frames" => s.chunk_frames.to_value(),
            "samples-per-buffer" => s.samples_per_buffer.to_value(),
            "is-live" => s.is_live.to_value(),
            "split-sentences" => s.split_sentences.to_value(),
            "available-speakers" | "available-languages" => {
                drop(s);
                let state = lock(&self.state);
                state
                    .runtime
                    .as_ref()
                    .map(|rt| {
                        if pspec.name() == "available-speakers" {
                            rt.info.speakers.join(",")
                        } else {
                            rt.info.languages.join(",")
                        }
                    })
                    .to_value()
            }
            other => {
                gst::warning!(CAT, imp = self, "unknown property {other}");
                pspec.default_value().clone()
            }
        }
    }

    fn constructed(&self) {
        self.parent_constructed();
        let obj = self.obj();
        obj.set_format(gst::Format::Time);
        obj.set_live(DEFAULT_IS_LIVE);
    }
}

impl GstObjectImpl for OmniTtsSrc {}

impl ElementImpl for OmniTtsSrc {
    fn metadata() -> Option<&'static gst::subclass::ElementMetadata> {
        // Cheap and model-free: the registry reads this without loading any model.
        static METADATA: LazyLock<gst::subclass::ElementMetadata> = LazyLock::new(|| {
            gst::subclass::ElementMetadata::new(
                "Qwen3-TTS text-to-speech source",
                "Source/Audio",
                "Speaks text with Qwen3-TTS (candle): streaming 24 kHz mono audio, live or not",
                "omnitts developers",
            )
        });
        Some(&*METADATA)
    }

    fn pad_templates() -> &'static [gst::PadTemplate] {
        static PAD_TEMPLATES: LazyLock<Vec<gst::PadTemplate>> = LazyLock::new(|| {
            let caps = gst_audio::AudioCapsBuilder::new_interleaved()
                .format_list([gst_audio::AudioFormat::F32le, gst_audio::AudioFormat::S16le])
                .rate(RATE as i32)
                .channels(1)
                .build();
            let src = gst::PadTemplate::new(
                "src",
                gst::PadDirection::Src,
                gst::PadPresence::Always,
                &caps,
            )
            .expect("static pad template");
            vec![src]
        });
        PAD_TEMPLATES.as_ref()
    }

    fn change_state(
        &self,
        transition: gst::StateChange,
    ) -> Result<gst::StateChangeSuccess, gst::StateChangeError> {
        if transition == gst::StateChange::ReadyToPaused {
            let live = lock(&self.settings).is_live;
            self.obj().set_live(live);
        }
        self.parent_change_state(transition)
    }

    fn send_event(&self, event: gst::Event) -> bool {
        if let gst::EventView::FlushStart(_) = event.view() {
            self.discard("flush-start");
        }
        self.parent_send_event(event)
    }
}

impl BaseSrcImpl for OmniTtsSrc {
    fn start(&self) -> Result<(), gst::ErrorMessage> {
        let settings = self.settings();
        let (live, initial) = (settings.is_live, settings.text.clone());
        let early = std::mem::take(&mut lock(&self.state).early_texts);
        let has_text =
            initial.as_deref().is_some_and(|t| !nothing_to_speak(t)) || !early.is_empty();
        if !live && !has_text && initial.as_deref().is_none_or(str::is_empty) {
            return Err(gst::error_msg!(
                gst::ResourceError::Settings,
                ("text '': nothing to speak; set text, push-text before start, or use \
                     is-live=true to wait for push-text")
            ));
        }
        let _ = self.obj().post_message(
            gst::message::Progress::builder(
                gst::ProgressType::Start,
                "load",
                &format!("loading model {}", settings.model),
            )
            .src(&*self.obj())
            .build(),
        );
        let t0 = Instant::now();
        let (engine, info, cloner) = match self.load(&settings) {
            Ok(v) => v,
            Err(e) => {
                let _ = self.obj().post_message(
                    gst::message::Progress::builder(
                        gst::ProgressType::Error,
                        "load",
                        "model loading failed",
                    )
                    .src(&*self.obj())
                    .build(),
                );
                return Err(e);
            }
        };
        let load_ms = t0.elapsed().as_secs_f64() * 1000.0;

        let shared = Shared::new(MAX_QUEUED_SAMPLES);
        let mut texts: Vec<String> = Vec::new();
        if let Some(t) = initial.filter(|t| !nothing_to_speak(t)) {
            texts.push(t);
        }
        texts.extend(early);
        {
            let mut inner = shared.lock();
            for text in texts.iter().flat_map(|t| settings.utterance_texts(t)) {
                let (request, clone) = build_request(&settings, &info, &text)
                    .map_err(|e| gst::error_msg!(gst::ResourceError::Settings, ("{}", e)))?;
                inner.queue(text, Ok(request), clone, 0);
            }
        }
        let element: gst::Element = self.obj().clone().upcast();
        let engine = Arc::new(engine);
        let worker =
            runtime::spawn_worker(engine.clone(), cloner, shared.clone(), element.downgrade())
                .map_err(|e| {
                    gst::error_msg!(
                        gst::ResourceError::Failed,
                        ("could not start the worker thread: {}", e)
                    )
                })?;
        let ready = format!(
            "omnittssrc: model '{}' ready ({}; {:?}; {} speakers; loaded in {:.0} ms; live latency {} ms)",
            settings.model,
            info.dir.display(),
            info.variant,
            info.speakers.len(),
            load_ms,
            info.latency.mseconds()
        );
        gst::info!(CAT, imp = self, "{ready}");
        {
            let mut state = lock(&self.state);
            state.runtime = Some(Runtime {
                engine,
                shared,
                worker: Some(worker),
                info,
            });
        }
        // gst-launch prints only the debug part of an info message: the text goes there too
        gst::element_imp_info!(
            self,
            gst::ResourceError::Settings,
            ("{}", ready),
            ["{}", ready]
        );
        let _ = self.obj().post_message(
            gst::message::Progress::builder(gst::ProgressType::Complete, "load", &ready)
                .src(&*self.obj())
                .build(),
        );
        if live {
            let _ = self
                .obj()
                .post_message(gst::message::Latency::builder().src(&*self.obj()).build());
        }
        Ok(())
    }

    fn stop(&self) -> Result<(), gst::ErrorMessage> {
        let rt = {
            let mut state = lock(&self.state);
            state.format = None;
            state.runtime.take()
        };
        if let Some(mut rt) = rt {
            {
                let mut inner = rt.shared.lock();
                inner.shutdown = true;
                inner.unlocked = true;
                inner.discard_all();
                rt.shared.cond.notify_all();
            }
            if let Some(w) = rt.worker.take()
                && w.join().is_err()
            {
                gst::warning!(CAT, imp = self, "worker thread panicked");
            }
            // The worker has let go of the engine: dropping the last reference joins its stages.
            drop(rt);
            gst::debug!(CAT, imp = self, "stopped: worker joined, engine dropped");
        }
        Ok(())
    }

    fn is_seekable(&self) -> bool {
        false
    }

    fn set_caps(&self, caps: &gst::Caps) -> Result<(), gst::LoggableError> {
        let info = gst_audio::AudioInfo::from_caps(caps)
            .map_err(|_| gst::loggable_error!(CAT, "invalid caps {caps}"))?;
        let format = match info.format() {
            gst_audio::AudioFormat::F32le => SampleFormat::F32,
            gst_audio::AudioFormat::S16le => SampleFormat::S16,
            f => return Err(gst::loggable_error!(CAT, "unsupported format {f:?}")),
        };
        if info.rate() != RATE || info.channels() != 1 {
            return Err(gst::loggable_error!(CAT, "unsupported caps {caps}"));
        }
        gst::debug!(CAT, imp = self, "negotiated {caps}");
        lock(&self.state).format = Some(format);
        let _ = self
            .obj()
            .post_message(gst::message::Latency::builder().src(&*self.obj()).build());
        Ok(())
    }

    fn query(&self, query: &mut gst::QueryRef) -> bool {
        if let gst::QueryViewMut::Latency(q) = query.view_mut() {
            let latency = {
                let state = lock(&self.state);
                state
                    .runtime
                    .as_ref()
                    .filter(|rt| rt.info.live)
                    .map(|rt| rt.info.latency)
            };
            if let Some(latency) = latency {
                gst::debug!(CAT, imp = self, "latency: live, min {latency}");
                q.set(true, latency, gst::ClockTime::NONE);
                return true;
            }
        }
        BaseSrcImplExt::parent_query(self, query)
    }

    fn event(&self, event: &gst::Event) -> bool {
        if let gst::EventView::FlushStart(_) = event.view() {
            self.discard("flush-start");
        }
        self.parent_event(event)
    }

    fn times(&self, buffer: &gst::BufferRef) -> (Option<gst::ClockTime>, Option<gst::ClockTime>) {
        if self.obj().is_live() {
            match (buffer.pts(), buffer.duration()) {
                (Some(pts), Some(d)) => (Some(pts), Some(pts + d)),
                (pts, _) => (pts, None),
            }
        } else {
            (None, None)
        }
    }

    fn unlock(&self) -> Result<(), gst::ErrorMessage> {
        let state = lock(&self.state);
        if let Some(rt) = state.runtime.as_ref() {
            let mut inner = rt.shared.lock();
            inner.unlocked = true;
            rt.shared.cond.notify_all();
        }
        Ok(())
    }

    fn unlock_stop(&self) -> Result<(), gst::ErrorMessage> {
        let state = lock(&self.state);
        if let Some(rt) = state.runtime.as_ref() {
            let mut inner = rt.shared.lock();
            inner.unlocked = false;
            rt.shared.cond.notify_all();
        }
        Ok(())
    }
}

impl PushSrcImpl for OmniTtsSrc {
    fn create(
        &self,
        _buffer: Option<&mut gst::BufferRef>,
    ) -> Result<CreateSuccess, gst::FlowError> {
        let (shared, info, format) = {
            let state = lock(&self.state);
            let Some(rt) = state.runtime.as_ref() else {
                return Err(gst::FlowError::Flushing);
            };
            let Some(format) = state.format else {
                drop(state);
                gst::element_imp_error!(
                    self,
                    gst::CoreError::Negotiation,
                    ("create() before caps were negotiated")
                );
                return Err(gst::FlowError::NotNegotiated);
            };
            (rt.shared.clone(), rt.info.clone(), format)
        };
        let live = info.live;
        let spb = info.samples_per_buffer as u64;
        let src: gst::Element = self.obj().clone().upcast();
        let mut msgs: Vec<gst::Message> = Vec::new();
        let mut deadline: Option<Instant> = None;
        let mut inner = shared.lock();
        if live && inner.r0.is_none() {
            inner.r0 = Some(
                self.obj()
                    .current_running_time()
                    .unwrap_or(gst::ClockTime::ZERO),
            );
        }
        loop {
            if inner.unlocked {
                drop(inner);
                self.post_all(&mut msgs);
                return Err(gst::FlowError::Flushing);
            }
            if let Some(what) = inner.worker_failure.take() {
                drop(inner);
                self.post_all(&mut msgs);
                gst::element_imp_error!(
                    self,
                    gst::StreamError::Failed,
                    ("the synthesis worker failed: {}", what)
                );
                return Err(gst::FlowError::Error);
            }
            let n = inner.n;
            // Decide what the next buffer is: audio, silence, EOS, or wait.
            let mut silence: Option<u64> = None;
            let front = match inner.items.front() {
                None => Front::Empty,
                Some(Item::Started { start_pos, .. }) => Front::Started(*start_pos),
                Some(Item::Audio { .. }) => Front::Audio,
                Some(_) => Front::Event,
            };
            match front {
                Front::Started(start_pos) if live && start_pos > n && inner.current.is_none() => {
                    // Live: the text arrived at a later running time; silence until then.
                    silence = Some((start_pos - n).min(spb));
                }
                Front::Started(_) | Front::Event => {
                    if let Some(item) = inner.items.pop_front() {
                        self.handle_event_item(item, &mut inner, &src, &mut msgs);
                    }
                    continue;
                }
                Front::Audio => {
                    let first = inner.buffers == 0;
                    let Some(Item::Audio { samples, pos }) = inner.items.front_mut() else {
                        continue;
                    };
                    let len = (samples.len() - *pos).min(spb as usize);
                    let buffer =
                        make_buffer(Some(&samples[*pos..*pos + len]), len, format, n, first)?;
                    *pos += len;
                    if *pos >= samples.len() {
                        inner.items.pop_front();
                    }
                    inner.queued_samples = inner.queued_samples.saturating_sub(len);
                    inner.n += len as u64;
                    inner.buffers += 1;
                    if let Some(cur) = inner.current.as_mut() {
                        cur.samples_out += len as u64;
                    }
                    shared.cond.notify_all();
                    drop(inner);
                    self.post_all(&mut msgs);
                    return Ok(CreateSuccess::NewBuffer(buffer));
                }
                Front::Empty => {
                    if !live {
                        if inner.pending.is_empty() && !inner.worker_busy {
                            inner.eos = true;
                            drop(inner);
                            self.post_all(&mut msgs);
                            gst::debug!(CAT, imp = self, "all text spoken: EOS");
                            return Err(gst::FlowError::Eos);
                        }
                    } else {
                        let next_start = inner
                            .pending
                            .front()
                            .map(|u| u.start_pos)
                            .or(inner.busy_start);
                        let due = inner.current.is_some()
                            || inner.busy_start.is_some()
                            || next_start.is_some_and(|s| s <= n);
                        if !due {
                            silence = Some(match next_start {
                                Some(s) => (s - n).min(spb),
                                None => spb,
                            });
                        } else {
                            let r0 = inner.r0.unwrap_or(gst::ClockTime::ZERO);
                            let d = *deadline
                                .get_or_insert_with(|| self.live_deadline(r0, n, info.latency));
                            if Instant::now() >= d {
                                // Audio is late: keep the clock going with silence.
                                if let Some(cur) = inner.current.as_mut() {
                                    if cur.samples_out > 0 {
                                        cur.underruns += 1;
                                        gst::warning!(
                                            CAT,
                                            imp = self,
                                            "utterance {}: audio late at sample {n} (underrun {}), \
                                             inserting silence; synthesis is slower than real \
                                             time or the chunks are too large for the latency",
                                            cur.id,
                                            cur.underruns
                                        );
                                    } else if n == cur.start {
                                        gst::warning!(
                                            CAT,
                                            imp = self,
                                            "utterance {}: first audio later than the latency \
                                             ({}), speech starts late",
                                            cur.id,
                                            info.latency
                                        );
                                    }
                                }
                                silence = Some(spb);
                            }
                        }
                    }
                }
            }
            if let Some(len) = silence {
                let first = inner.buffers == 0;
                let buffer = make_buffer(None, len as usize, format, n, first)?;
                inner.n += len;
                inner.buffers += 1;
                drop(inner);
                self.post_all(&mut msgs);
                return Ok(CreateSuccess::NewBuffer(buffer));
            }
            // Wait for the worker (messages first: never post under the lock).
            if !msgs.is_empty() {
                drop(inner);
                self.post_all(&mut msgs);
                inner = shared.lock();
                continue;
            }
            inner = match deadline {
                Some(d) => {
                    let timeout = d.saturating_duration_since(Instant::now());
                    shared
                        .cond
                        .wait_timeout(inner, timeout)
                        .map(|(g, _)| g)
                        .unwrap_or_else(|p| p.into_inner().0)
                }
                None => shared.cond.wait(inner).unwrap_or_else(|p| p.into_inner()),
            };
        }
    }
}
