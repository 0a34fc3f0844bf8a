//! Stage configuration: YAML with vLLM-Omni's field names (`configs/qwen3_tts.yaml`,
//! `configs/qwen3_tts_batch.yaml`; docs/qwen3-tts.md §9).
//!
//! The document is parsed into a `serde_yaml_ng::Value` and walked by hand, so that every unknown
//! key becomes a warning naming its path (`stage_args[1].engine_args.foo: unknown key, ignored`)
//! and every wrong value an error naming the path and the value
//! (`stage_args[1].engine_args.codec_chunk_frames: expected a positive integer, got -3`).
//!
//! Layout (defaults in parentheses; see `configs/qwen3_tts.yaml` for the commented reference):
//! ```yaml
//! async_chunk: true                  # false = batch: stage 1 decodes once stage 0 is done
//! stage_args:
//!   - stage_id: 0                    # talker + code predictor
//!     stage_type: llm
//!     runtime: {devices: auto}       # cpu | cuda:N | N | auto
//!     engine_args:
//!       model_stage: qwen3_tts       # required
//!       model_arch: Qwen3TTSTalkerForConditionalGeneration
//!       engine_output_type: latent
//!       max_num_seqs: 1              # requests interleaved frame by frame on this stage
//!       dtype: auto                  # auto (bf16 on CUDA, f32 on CPU) | float32 | bfloat16 | float16
//!     default_sampling_params: {temperature, top_k, top_p, repetition_penalty, max_tokens, seed}
//!     subtalker_sampling_params: {do_sample, temperature, top_k, top_p}
//!     runaway_guard: {enabled: true, floor_frames: 75, frames_per_text_token: 6.0}
//!     final_output: false
//!   - stage_id: 1                    # Code2Wav
//!     runtime: {devices: auto}
//!     engine_args:
//!       model_stage: code2wav        # required
//!       model_arch: Qwen3TTSCode2Wav
//!       engine_output_type: audio
//!       max_num_seqs: 1
//!       dtype: float32               # the decoder runs in f32 only
//!       codec_chunk_frames: 25
//!       initial_codec_chunk_frames: 1
//!       codec_left_context_frames: 72   # windowed mode only
//!       decoder_streaming_mode: exact   # exact (stateful) | windowed (stateless, approximate)
//!       codec_buffer_frames: 50         # async-chunk buffer bound (raised to the largest chunk)
//!     engine_input_source: [0]
//!     final_output: true
//!     final_output_type: audio
//! ```
//! Values left out take the defaults above. Sampling values in `default_sampling_params` override
//! the checkpoint's `generation_config.json` (see [`SamplingOverrides::apply`]); `temperature: 0`
//! means greedy.

use std::fmt::Write as _;
use std::path::Path;

use serde_yaml_ng::{Mapping, Value};

use super::{DTypeSpec, DeviceSpec, EngineError};
use crate::models::qwen3_tts::SamplingParams;

/// The shipped default stage configuration (async chunk, exact streaming).
pub const DEFAULT_ASYNC_YAML: &str = include_str!("../../configs/qwen3_tts.yaml");
/// The shipped batch configuration (stage 1 decodes once stage 0 is done).
pub const DEFAULT_BATCH_YAML: &str = include_str!("../../configs/qwen3_tts_batch.yaml");

/// How stage 1 turns chunks of frames into audio.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DecoderStreamingMode {
    /// Stateful streaming decode (`Code2Wav::stream`): equal to the whole-utterance decode.
    #[default]
    Exact,
    /// Stateless windows (`Code2Wav::decode_window`) with `codec_left_context_frames` of left
    /// context, as vLLM-Omni does: approximate at chunk boundaries.
    Windowed,
}

impl DecoderStreamingMode {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "exact" => Some(DecoderStreamingMode::Exact),
            "windowed" => Some(DecoderStreamingMode::Windowed),
            _ => None,
        }
    }
}

/// Values from `default_sampling_params` / `subtalker_sampling_params` of stage 0; `None` keeps
/// the checkpoint's `generation_config.json` value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SamplingOverrides {
    /// `temperature` (≥ 0; 0 = greedy).
    pub temperature: Option<f64>,
    /// `top_k` (0 or -1 = disabled).
    pub top_k: Option<usize>,
    /// `top_p` in (0, 1].
    pub top_p: Option<f64>,
    /// `repetition_penalty` (> 0).
    pub repetition_penalty: Option<f64>,
    /// `max_tokens`: the frame cap (`max_new_tokens`).
    pub max_tokens: Option<usize>,
    /// `seed`.
    pub seed: Option<u64>,
    /// `subtalker_sampling_params.do_sample`.
    pub subtalker_do_sample: Option<bool>,
    /// `subtalker_sampling_params.temperature`.
    pub subtalker_temperature: Option<f64>,
    /// `subtalker_sampling_params.top_k`.
    pub subtalker_top_k: Option<usize>,
    /// `subtalker_sampling_params.top_p`.
    pub subtalker_top_p: Option<f64>,
}

impl SamplingOverrides {
    /// `base` (normally `SamplingParams::from_generation_config`) with every set value replaced.
    /// `temperature: 0` switches the talker to greedy (`do_sample = false`), a positive temperature
    /// switches sampling on.
    pub fn apply(&self, mut base: SamplingParams) -> SamplingParams {
        if let Some(t) = self.temperature {
            if t == 0.0 {
                base.do_sample = false;
            } else {
                base.do_sample = true;
                base.temperature = t;
            }
        }
        if let Some(v) = self.top_k {
            base.top_k = v;
        }
        if let Some(v) = self.top_p {
            base.top_p = v;
        }
        if let Some(v) = self.repetition_penalty {
            base.repetition_penalty = v;
        }
        if let Some(v) = self.max_tokens {
            base.max_new_tokens = v;
        }
        if let Some(v) = self.seed {
            base.seed = v;
        }
        if let Some(v) = self.subtalker_do_sample {
            base.subtalker_do_sample = v;
        }
        if let Some(t) = self.subtalker_temperature {
            if t == 0.0 {
                base.subtalker_do_sample = false;
            } else {
                base.subtalker_temperature = t;
            }
        }
        if let Some(v) = self.subtalker_top_k {
            base.subtalker_top_k = v;
        }
        if let Some(v) = self.subtalker_top_p {
            base.subtalker_top_p = v;
        }
        base
    }
}

/// The runaway guard (docs/field-lessons.md §3): generation ends with `FinishReason::Guard` once
/// the frame
/// count reaches `max(floor_frames, ceil(frames_per_text_token × text tokens))`, unless the
/// caller's `max_new_tokens` ends it first.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GuardConfig {
    /// Off = only `max_new_tokens` limits an utterance.
    pub enabled: bool,
    /// The budget never goes below this many frames (75 = 6 s).
    pub floor_frames: usize,
    /// Frames allowed per text token of the request.
    pub frames_per_text_token: f64,
}

impl Default for GuardConfig {
    fn default() -> Self {
        GuardConfig {
            enabled: true,
            floor_frames: 75,
            frames_per_text_token: 6.0,
        }
    }
}

impl GuardConfig {
    /// The frame budget for a text of `text_tokens` tokens, or `None` when disabled.
    pub fn budget(&self, text_tokens: usize) -> Option<usize> {
        if !self.enabled {
            return None;
        }
        let scaled = (self.frames_per_text_token * text_tokens as f64).ceil();
        let scaled = if scaled.is_finite() && scaled < usize::MAX as f64 {
            scaled as usize
        } else {
            usize::MAX
        };
        Some(self.floor_frames.max(scaled))
    }
}

/// Stage 0 (talker + code predictor).
/// `max_waiting` when the stage config does not set it.
pub const DEFAULT_MAX_WAITING: usize = 64;

#[derive(Debug, Clone, PartialEq)]
pub struct ArStageConfig {
    /// `runtime.devices`.
    pub device: DeviceSpec,
    /// `engine_args.max_num_seqs`: requests the stage works on at once (batched: every running
    /// request advances one frame in each batched step).
    pub max_num_seqs: usize,
    /// `engine_args.max_waiting`: requests that may wait (FIFO) for one of the `max_num_seqs`
    /// places; a request beyond both is refused (`EngineError::Busy`).
    pub max_waiting: usize,
    /// `engine_args.dtype`.
    pub dtype: DTypeSpec,
    /// `default_sampling_params` + `subtalker_sampling_params`.
    pub sampling: SamplingOverrides,
    /// `runaway_guard`.
    pub guard: GuardConfig,
}

/// Stage 1 (Code2Wav).
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderStageConfig {
    /// `runtime.devices`.
    pub device: DeviceSpec,
    /// `engine_args.max_num_seqs`.
    pub max_num_seqs: usize,
    /// `engine_args.codec_chunk_frames` (≥ 1).
    pub codec_chunk_frames: usize,
    /// `engine_args.initial_codec_chunk_frames` (0 = no separate first chunk).
    pub initial_codec_chunk_frames: usize,
    /// `engine_args.codec_left_context_frames` (windowed mode).
    pub codec_left_context_frames: usize,
    /// `engine_args.decoder_streaming_mode`.
    pub streaming_mode: DecoderStreamingMode,
    /// `engine_args.codec_buffer_frames`: frames stage 0 may run ahead of stage 1 before it blocks.
    pub codec_buffer_frames: usize,
}

/// The parsed stage configuration; see the module docs for the YAML layout.
#[derive(Debug, Clone, PartialEq)]
pub struct StageConfig {
    /// `async_chunk`: stream chunks to stage 1 while stage 0 runs (true) or decode once at the end.
    pub async_chunk: bool,
    /// `stage_args[stage_id = 0]`.
    pub ar: ArStageConfig,
    /// `stage_args[stage_id = 1]`.
    pub decoder: DecoderStageConfig,
}

impl Default for StageConfig {
    /// Same as [`StageConfig::default_async`].
    fn default() -> Self {
        Self::default_async()
    }
}

impl StageConfig {
    /// `configs/qwen3_tts.yaml` (embedded at build time; its validity is checked by the tests).
    pub fn default_async() -> StageConfig {
        Self::from_yaml_str(DEFAULT_ASYNC_YAML)
            .expect("configs/qwen3_tts.yaml is embedded at build time and valid (unit-tested)")
            .0
    }

    /// `configs/qwen3_tts_batch.yaml` (embedded at build time).
    pub fn default_batch() -> StageConfig {
        Self::from_yaml_str_named(DEFAULT_BATCH_YAML, "configs/qwen3_tts_batch.yaml")
            .expect(
                "configs/qwen3_tts_batch.yaml is embedded at build time and valid (unit-tested)",
            )
            .0
    }

    /// Reads and validates a YAML file. Returns the config and the warnings (unknown keys).
    pub fn from_yaml_file(
        path: impl AsRef<Path>,
    ) -> Result<(StageConfig, Vec<String>), EngineError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| EngineError::ConfigIo {
            path: path.display().to_string(),
            source: e,
        })?;
        Self::from_yaml_str_named(&text, &path.display().to_string())
    }

    /// Parses and validates YAML text. Returns the config and the warnings (unknown keys).
    pub fn from_yaml_str(text: &str) -> Result<(StageConfig, Vec<String>), EngineError> {
        Self::from_yaml_str_named(text, "<string>")
    }

    fn from_yaml_str_named(
        text: &str,
        source: &str,
    ) -> Result<(StageConfig, Vec<String>), EngineError> {
        let doc: Value = serde_yaml_ng::from_str(text).map_err(|e| EngineError::Config {
            source_name: source.to_string(),
            key: "<document>".to_string(),
            msg: format!("not valid YAML: {e}"),
        })?;
        let mut w = Walker {
            source,
            warnings: Vec::new(),
        };
        let cfg = w.document(&doc)?;
        Ok((cfg, w.warnings))
    }

    /// The chunk policy for a request, with optional per-request overrides.
    pub fn chunk_policy(
        &self,
        initial: Option<usize>,
        chunk: Option<usize>,
    ) -> super::chunk_buffer::ChunkPolicy {
        use super::chunk_buffer::ChunkPolicy;
        if !self.async_chunk {
            return ChunkPolicy::Whole;
        }
        ChunkPolicy::Streaming {
            initial: initial.unwrap_or(self.decoder.initial_codec_chunk_frames),
            chunk: chunk.unwrap_or(self.decoder.codec_chunk_frames),
        }
    }
}

/// Compact rendering of a YAML value for messages.
fn show(v: &Value) -> String {
    match v {
        Value::Null => "null".to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("{s:?}"),
        Value::Sequence(_) | Value::Mapping(_) | Value::Tagged(_) => {
            let s = serde_yaml_ng::to_string(v).unwrap_or_else(|_| "<value>".to_string());
            let one_line = s.trim().replace('\n', " ");
            let kind = match v {
                Value::Sequence(_) => "a list",
                Value::Mapping(_) => "a mapping",
                _ => "a tagged value",
            };
            let mut out = String::new();
            let _ = write!(out, "{kind} ({one_line})");
            out
        }
    }
}

struct Walker<'s> {
    source: &'s str,
    warnings: Vec<String>,
}

type R<T> = Result<T, EngineError>;

impl Walker<'_> {
    fn err(&self, key: &str, msg: impl Into<String>) -> EngineError {
        EngineError::Config {
            source_name: self.source.to_string(),
            key: key.to_string(),
            msg: msg.into(),
        }
    }

    fn expected(&self, key: &str, what: &str, got: &Value) -> EngineError {
        self.err(key, format!("expected {what}, got {}", show(got)))
    }

    fn warn_unknown(&mut self, key: &str) {
        self.warnings.push(format!(
            "stage config {}: {key}: unknown key, ignored",
            self.source
        ));
    }

    /// The entries of a mapping as (string key, value).
    fn entries<'v>(&self, v: &'v Value, path: &str) -> R<Vec<(String, &'v Value)>> {
        let m: &Mapping = v
            .as_mapping()
            .ok_or_else(|| self.expected(path, "a mapping", v))?;
        m.iter()
            .map(|(k, val)| match k {
                Value::String(s) => Ok((s.clone(), val)),
                other => Err(self.err(path, format!("keys must be strings, got {}", show(other)))),
            })
            .collect()
    }

    fn boolean(&self, v: &Value, key: &str) -> R<bool> {
        v.as_bool()
            .ok_or_else(|| self.expected(key, "true or false", v))
    }

    fn string<'v>(&self, v: &'v Value, key: &str) -> R<&'v str> {
        v.as_str().ok_or_else(|| self.expected(key, "a string", v))
    }

    fn int(&self, v: &Value, key: &str, what: &str) -> R<i64> {
        match v {
            Value::Number(n) if n.is_i64() || n.is_u64() => {
                n.as_i64().ok_or_else(|| self.expected(key, what, v))
            }
            _ => Err(self.expected(key, what, v)),
        }
    }

    fn positive(&self, v: &Value, key: &str) -> R<usize> {
        let what = "a positive integer";
        let n = self.int(v, key, what)?;
        if n < 1 {
            return Err(self.expected(key, what, v));
        }
        usize::try_from(n).map_err(|_| self.expected(key, what, v))
    }

    fn non_negative(&self, v: &Value, key: &str) -> R<usize> {
        let what = "a non-negative integer";
        let n = self.int(v, key, what)?;
        usize::try_from(n).map_err(|_| self.expected(key, what, v))
    }

    fn float(&self, v: &Value, key: &str, what: &str, ok: impl Fn(f64) -> bool) -> R<f64> {
        let x = match v {
            Value::Number(n) => n.as_f64(),
            _ => None,
        };
        match x {
            Some(x) if x.is_finite() && ok(x) => Ok(x),
            _ => Err(self.expected(key, what, v)),
        }
    }

    /// `top_k`: a non-negative integer, or -1 (vLLM's "disabled") which maps to 0.
    fn top_k(&self, v: &Value, key: &str) -> R<usize> {
        let what = "a non-negative integer or -1 (disabled)";
        let n = self.int(v, key, what)?;
        match n {
            -1 => Ok(0),
            n => usize::try_from(n).map_err(|_| self.expected(key, what, v)),
        }
    }

    fn top_p(&self, v: &Value, key: &str) -> R<f64> {
        self.float(v, key, "a number in (0, 1]", |x| x > 0.0 && x <= 1.0)
    }

    fn temperature(&self, v: &Value, key: &str) -> R<f64> {
        self.float(v, key, "a number ≥ 0 (0 = greedy)", |x| x >= 0.0)
    }

    fn device(&self, v: &Value, key: &str) -> R<DeviceSpec> {
        let what = "\"cpu\", \"cuda:N\", a GPU index or \"auto\"";
        let s = match v {
            Value::String(s) => s.clone(),
            Value::Number(n) if n.is_u64() => n.to_string(),
            _ => return Err(self.expected(key, what, v)),
        };
        let spec: DeviceSpec = s.parse().map_err(|_| self.expected(key, what, v))?;
        spec.check_supported().map_err(|e| {
            self.err(
                key,
                match e {
                    EngineError::Device { msg, .. } => format!("{}: {msg}", show(v)),
                    other => other.to_string(),
                },
            )
        })?;
        Ok(spec)
    }

    fn exact_str(&self, v: &Value, key: &str, want: &str) -> R<()> {
        let s = self.string(v, key)?;
        if s == want {
            Ok(())
        } else {
            Err(self.expected(key, &format!("{want:?}"), v))
        }
    }

    fn document(&mut self, doc: &Value) -> R<StageConfig> {
        if doc.is_null() {
            return Err(self.err(
                "<document>",
                "empty document; expected a mapping with stage_args",
            ));
        }
        let mut async_chunk = true;
        let mut stages: Option<&Value> = None;
        for (k, v) in self.entries(doc, "<document>")? {
            match k.as_str() {
                "async_chunk" => async_chunk = self.boolean(v, "async_chunk")?,
                "stage_args" => stages = Some(v),
                _ => self.warn_unknown(&k),
            }
        }
        let stages =
            stages.ok_or_else(|| self.err("stage_args", "missing (a list of 2 stages)"))?;
        let list = stages
            .as_sequence()
            .ok_or_else(|| self.expected("stage_args", "a list of 2 stages", stages))?;
        if list.len() != 2 {
            return Err(self.err(
                "stage_args",
                format!(
                    "expected 2 stages (stage_id 0: qwen3_tts, stage_id 1: code2wav), got {}",
                    list.len()
                ),
            ));
        }
        let mut ar = None;
        let mut dec = None;
        for (i, st) in list.iter().enumerate() {
            let path = format!("stage_args[{i}]");
            let m = st
                .as_mapping()
                .ok_or_else(|| self.expected(&path, "a mapping (one stage)", st))?;
            let id_val = m
                .get("stage_id")
                .ok_or_else(|| self.err(&format!("{path}.stage_id"), "missing (0 or 1)"))?;
            let id = self.int(id_val, &format!("{path}.stage_id"), "0 or 1")?;
            match id {
                0 if ar.is_none() => ar = Some(self.ar_stage(st, &path)?),
                1 if dec.is_none() => dec = Some(self.decoder_stage(st, &path)?),
                0 | 1 => {
                    return Err(self.err(
                        &format!("{path}.stage_id"),
                        format!("stage_id {id} appears twice"),
                    ));
                }
                _ => return Err(self.expected(&format!("{path}.stage_id"), "0 or 1", id_val)),
            }
        }
        // Both present: two entries, no duplicates.
        let (Some(ar), Some(decoder)) = (ar, dec) else {
            return Err(self.err("stage_args", "stage_id 0 and stage_id 1 are both required"));
        };
        Ok(StageConfig {
            async_chunk,
            ar,
            decoder,
        })
    }

    /// Keys common to both stages; returns true when handled.
    fn common_key(&mut self, k: &str, v: &Value, path: &str, stage: usize) -> R<bool> {
        let key = format!("{path}.{k}");
        match k {
            "stage_id" => {}
            "stage_type" => self.exact_str(v, &key, "llm")?,
            "final_output" => {
                let want = stage == 1;
                if self.boolean(v, &key)? != want {
                    return Err(self.err(
                        &key,
                        format!(
                            "expected {want} (stage {stage} {}), got {}",
                            if want {
                                "produces the final audio"
                            } else {
                                "emits codec frames, not the final output"
                            },
                            show(v)
                        ),
                    ));
                }
            }
            "final_output_type" => {
                let want = if stage == 1 { "audio" } else { "latent" };
                self.exact_str(v, &key, want)?;
            }
            "engine_input_source" => {
                let what = if stage == 1 {
                    "[0]"
                } else {
                    "[] (stage 0 takes the request)"
                };
                let ok = match v.as_sequence() {
                    Some(s) if stage == 0 => s.is_empty(),
                    Some(s) => s.len() == 1 && s[0].as_u64() == Some(0),
                    None => false,
                };
                if !ok {
                    return Err(self.expected(&key, what, v));
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn runtime(&mut self, v: &Value, path: &str) -> R<DeviceSpec> {
        let mut device = DeviceSpec::Auto;
        for (k, val) in self.entries(v, path)? {
            let key = format!("{path}.{k}");
            match k.as_str() {
                "devices" => device = self.device(val, &key)?,
                _ => self.warn_unknown(&key),
            }
        }
        Ok(device)
    }

    fn ar_stage(&mut self, st: &Value, path: &str) -> R<ArStageConfig> {
        let mut cfg = ArStageConfig {
            device: DeviceSpec::Auto,
            max_num_seqs: 1,
            max_waiting: DEFAULT_MAX_WAITING,
            dtype: DTypeSpec::Auto,
            sampling: SamplingOverrides::default(),
            guard: GuardConfig::default(),
        };
        let mut have_engine_args = false;
        for (k, v) in self.entries(st, path)? {
            if self.common_key(&k, v, path, 0)? {
                continue;
            }
            let key = format!("{path}.{k}");
            match k.as_str() {
                "runtime" => cfg.device = self.runtime(v, &key)?,
                "engine_args" => {
                    have_engine_args = true;
                    self.ar_engine_args(v, &key, &mut cfg)?
                }
                "default_sampling_params" => self.sampling(v, &key, &mut cfg.sampling)?,
                "subtalker_sampling_params" => self.subtalker(v, &key, &mut cfg.sampling)?,
                "runaway_guard" => cfg.guard = self.guard(v, &key)?,
                _ => self.warn_unknown(&key),
            }
        }
        if !have_engine_args {
            return Err(self.err(
                &format!("{path}.engine_args"),
                "missing (needs model_stage: qwen3_tts)",
            ));
        }
        Ok(cfg)
    }

    fn ar_engine_args(&mut self, v: &Value, path: &str, cfg: &mut ArStageConfig) -> R<()> {
        let mut model_stage = false;
        for (k, val) in self.entries(v, path)? {
            let key = format!("{path}.{k}");
            match k.as_str() {
                "model_stage" => {
                    self.exact_str(val, &key, "qwen3_tts")?;
                    model_stage = true;
                }
                "model_arch" => {
                    self.exact_str(val, &key, "Qwen3TTSTalkerForConditionalGeneration")?
                }
                "engine_output_type" => self.exact_str(val, &key, "latent")?,
                "max_num_seqs" => cfg.max_num_seqs = self.positive(val, &key)?,
                "max_waiting" => cfg.max_waiting = self.non_negative(val, &key)?,
                "dtype" => {
                    let s = self.string(val, &key)?;
                    cfg.dtype = DTypeSpec::parse(s).ok_or_else(|| {
                        self.expected(&key, "auto, float32, bfloat16 or float16", val)
                    })?;
                }
                _ => self.warn_unknown(&key),
            }
        }
        if !model_stage {
            return Err(self.err(
                &format!("{path}.model_stage"),
                "missing (expected \"qwen3_tts\")",
            ));
        }
        Ok(())
    }

    fn sampling(&mut self, v: &Value, path: &str, s: &mut SamplingOverrides) -> R<()> {
        for (k, val) in self.entries(v, path)? {
            let key = format!("{path}.{k}");
            match k.as_str() {
                "temperature" => s.temperature = Some(self.temperature(val, &key)?),
                "top_k" => s.top_k = Some(self.top_k(val, &key)?),
                "top_p" => s.top_p = Some(self.top_p(val, &key)?),
                "repetition_penalty" => {
                    s.repetition_penalty = Some(self.float(val, &key, "a number > 0", |x| x > 0.0)?)
                }
                "max_tokens" => s.max_tokens = Some(self.positive(val, &key)?),
                "seed" => s.seed = Some(self.non_negative(val, &key)? as u64),
                _ => self.warn_unknown(&key),
            }
        }
        Ok(())
    }

    fn subtalker(&mut self, v: &Value, path: &str, s: &mut SamplingOverrides) -> R<()> {
        for (k, val) in self.entries(v, path)? {
            let key = format!("{path}.{k}");
            match k.as_str() {
                "do_sample" => s.subtalker_do_sample = Some(self.boolean(val, &key)?),
                "temperature" => s.subtalker_temperature = Some(self.temperature(val, &key)?),
                "top_k" => s.subtalker_top_k = Some(self.top_k(val, &key)?),
                "top_p" => s.subtalker_top_p = Some(self.top_p(val, &key)?),
                _ => self.warn_unknown(&key),
            }
        }
        Ok(())
    }

    fn guard(&mut self, v: &Value, path: &str) -> R<GuardConfig> {
        let mut g = GuardConfig::default();
        for (k, val) in self.entries(v, path)? {
            let key = format!("{path}.{k}");
            match k.as_str() {
                "enabled" => g.enabled = self.boolean(val, &key)?,
                "floor_frames" => g.floor_frames = self.positive(val, &key)?,
                "frames_per_text_token" => {
                    g.frames_per_text_token = self.float(val, &key, "a number > 0", |x| x > 0.0)?
                }
                _ => self.warn_unknown(&key),
            }
        }
        Ok(g)
    }

    fn decoder_stage(&mut self, st: &Value, path: &str) -> R<DecoderStageConfig> {
        let mut cfg = DecoderStageConfig {
            device: DeviceSpec::Auto,
            max_num_seqs: 1,
            codec_chunk_frames: 25,
            initial_codec_chunk_frames: 1,
            codec_left_context_frames: 72,
            streaming_mode: DecoderStreamingMode::Exact,
            codec_buffer_frames: 50,
        };
        let mut have_engine_args = false;
        let mut have_input_source = false;
        for (k, v) in self.entries(st, path)? {
            if k == "engine_input_source" {
                have_input_source = true;
            }
            if self.common_key(&k, v, path, 1)? {
                continue;
            }
            let key = format!("{path}.{k}");
            match k.as_str() {
                "runtime" => cfg.device = self.runtime(v, &key)?,
                "engine_args" => {
                    have_engine_args = true;
                    self.decoder_engine_args(v, &key, &mut cfg)?
                }
                "default_sampling_params" => self.warnings.push(format!(
                    "stage config {}: {key}: ignored (the decoder is deterministic)",
                    self.source
                )),
                _ => self.warn_unknown(&key),
            }
        }
        if !have_engine_args {
            return Err(self.err(
                &format!("{path}.engine_args"),
                "missing (needs model_stage: code2wav)",
            ));
        }
        if !have_input_source {
            return Err(self.err(
                &format!("{path}.engine_input_source"),
                "missing (expected [0])",
            ));
        }
        Ok(cfg)
    }

    fn decoder_engine_args(
        &mut self,
        v: &Value,
        path: &str,
        cfg: &mut DecoderStageConfig,
    ) -> R<()> {
        let mut model_stage = false;
        for (k, val) in self.entries(v, path)? {
            let key = format!("{path}.{k}");
            match k.as_str() {
                "model_stage" => {
                    self.exact_str(val, &key, "code2wav")?;
                    model_stage = true;
                }
                "model_arch" => self.exact_str(val, &key, "Qwen3TTSCode2Wav")?,
                "engine_output_type" => self.exact_str(val, &key, "audio")?,
                "max_num_seqs" => cfg.max_num_seqs = self.positive(val, &key)?,
                "dtype" => {
                    let s = self.string(val, &key)?;
                    if DTypeSpec::parse(s) != Some(DTypeSpec::F32) {
                        return Err(self.expected(
                            &key,
                            "float32 (the codec decoder runs in f32 only)",
                            val,
                        ));
                    }
                }
                "codec_chunk_frames" => cfg.codec_chunk_frames = self.positive(val, &key)?,
                "initial_codec_chunk_frames" => {
                    cfg.initial_codec_chunk_frames = self.non_negative(val, &key)?
                }
                "codec_left_context_frames" => {
                    cfg.codec_left_context_frames = self.non_negative(val, &key)?
                }
                "codec_buffer_frames" => cfg.codec_buffer_frames = self.positive(val, &key)?,
                "decoder_streaming_mode" => {
                    let s = self.string(val, &key)?;
                    cfg.streaming_mode = DecoderStreamingMode::parse(s)
                        .ok_or_else(|| self.expected(&key, "\"exact\" or \"windowed\"", val))?;
                }
                _ => self.warn_unknown(&key),
            }
        }
        if !model_stage {
            return Err(self.err(
                &format!("{path}.model_stage"),
                "missing (expected \"code2wav\")",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_configs_parse_without_warnings() {
        let (a, wa) = StageConfig::from_yaml_str(DEFAULT_ASYNC_YAML).unwrap();
        assert!(wa.is_empty(), "{wa:?}");
        assert!(a.async_chunk);
        assert_eq!(a.decoder.codec_chunk_frames, 25);
        assert_eq!(a.decoder.initial_codec_chunk_frames, 1);
        assert_eq!(a.decoder.codec_left_context_frames, 72);
        assert_eq!(a.decoder.streaming_mode, DecoderStreamingMode::Exact);
        let (b, wb) = StageConfig::from_yaml_str(DEFAULT_BATCH_YAML).unwrap();
        assert!(wb.is_empty(), "{wb:?}");
        assert!(!b.async_chunk);
        // The two files differ only in the async_chunk switch.
        assert_eq!(
            StageConfig {
                async_chunk: true,
                ..b
            },
            a
        );
        assert_eq!(StageConfig::default_async(), a);
    }

    #[test]
    fn guard_budget() {
        let g = GuardConfig::default();
        assert_eq!(g.budget(3), Some(75));
        assert_eq!(g.budget(20), Some(120));
        let g = GuardConfig {
            frames_per_text_token: 2.5,
            ..g
        };
        assert_eq!(g.budget(31), Some(78)); // ceil(77.5)
        assert_eq!(
            GuardConfig {
                enabled: false,
                ..g
            }
            .budget(1000),
            None
        );
    }

    #[test]
    fn overrides_apply() {
        let base = SamplingParams {
            do_sample: true,
            temperature: 0.9,
            top_k: 50,
            top_p: 1.0,
            repetition_penalty: 1.05,
            subtalker_do_sample: true,
            subtalker_temperature: 0.9,
            subtalker_top_k: 50,
            subtalker_top_p: 1.0,
            max_new_tokens: 8192,
            seed: 0,
        };
        let o = SamplingOverrides {
            temperature: Some(0.0),
            max_tokens: Some(100),
            seed: Some(42),
            subtalker_top_k: Some(10),
            ..Default::default()
        };
        let s = o.apply(base.clone());
        assert!(!s.do_sample);
        assert_eq!(s.temperature, 0.9);
        assert_eq!(s.max_new_tokens, 100);
        assert_eq!(s.seed, 42);
        assert_eq!(s.subtalker_top_k, 10);
        assert!(s.subtalker_do_sample);
        assert_eq!(SamplingOverrides::default().apply(base.clone()), base);
    }
}
