//! Stage configuration: YAML with vLLM-Omni's field names (`configs/qwen3_tts.yaml`,
//! `configs/qwen3_tts_batch.yaml`, `configs/fish_speech.yaml`, `configs/fish_speech_batch.yaml`;
//! docs/qwen3-tts.md §9). `model_stage` names the model family's stage (the registry's names:
//! `qwen3_tts` / `code2wav`, `fish_speech` / `fish_codec`); `model_arch`, when given, must be that
//! stage's; [`StageConfig::check_family`] checks both against the checkpoint at load.
//!
//! Each stage is read with serde derive ([`ArStageConfig`] and [`DecoderStageConfig`] are the
//! structs of their `engine_args`) through [`crate::config_path`], so that every unknown key
//! becomes a warning naming its path (`stage_args[1].engine_args.foo: unknown key, ignored`) and
//! every wrong value an error naming the path and the value
//! (`stage_args[1].engine_args.codec_chunk_frames: expected a positive integer, got -3`). The
//! keys whose value the stage id fixes (`model_stage`, `final_output`, …) are checked first.
//!
//! Layout (defaults in parentheses; see `configs/qwen3_tts.yaml` for the commented reference):
//! ```yaml
//! async_chunk: true                  # false = batch: stage 1 decodes once stage 0 is done
//! stage_args:
//!   - stage_id: 0                    # talker + code predictor
//!     stage_type: llm
//!     runtime: {devices: auto}       # cpu | cuda:N | N | auto
//!     engine_args:
//!       model_stage: qwen3_tts       # required (qwen3_tts | fish_speech)
//!       model_arch: Qwen3TTSTalkerForConditionalGeneration
//!       engine_output_type: latent
//!       max_num_seqs: 1              # requests batched frame by frame on this stage
//!       max_waiting: 64              # requests that may wait for a place (FIFO); more are refused
//!       dtype: auto                  # auto (bf16 on CUDA, f32 on CPU) | float32 | bfloat16 | float16
//!       quantization: auto           # auto (int8 where it is faster, CPU) | none | q8_0 | q4_k
//!       first_frame_alone: true      # omnitts: a new request's first frame in a step of its own
//!                                    # (left out: on for a CUDA stage, off on the CPU; async only)
//!       priority_over_decoder: false # omnitts: CUDA, stage 0's stream above Code2Wav's passes
//!     default_sampling_params: {temperature, top_k, top_p, repetition_penalty, max_tokens, seed}
//!     subtalker_sampling_params: {do_sample, temperature, top_k, top_p}
//!     runaway_guard: {enabled: true, floor_frames: 75, frames_per_text_token: 6.0}
//!     final_output: false
//!   - stage_id: 1                    # Code2Wav
//!     runtime: {devices: auto}
//!     engine_args:
//!       model_stage: code2wav        # required (code2wav | fish_codec)
//!       model_arch: Qwen3TTSCode2Wav
//!       engine_output_type: audio
//!       max_num_seqs: 1
//!       dtype: float32               # float32 (exact) | bfloat16 (CUDA, tensor cores; docs/cuda.md)
//!       allow_tf32: false            # CUDA: f32 matrix products on TF32 tensor cores (process-wide)
//!       codec_chunk_frames: 25
//!       initial_codec_chunk_frames: 1
//!       codec_chunk_ramp: true          # omnitts: chunks 1, 1, 2, 4, … up to codec_chunk_frames
//!       codec_left_context_frames: 72   # windowed mode only
//!       decoder_streaming_mode: exact   # exact (stateful) | windowed (stateless, approximate)
//!       codec_buffer_frames: 50         # async-chunk buffer bound (raised to the largest chunk)
//!       max_num_batched_tokens: 0       # frames a Code2Wav pass takes at most (0: 512 on CUDA)
//!       first_chunk_lane: true          # omnitts: first chunks on a decoder of their own
//!                                       # (left out: on for a CUDA decoder, off on the CPU)
//!     engine_input_source: [0]
//!     final_output: true
//!     final_output_type: audio
//! ```
//! Values left out take the defaults above. Sampling values in `default_sampling_params` override
//! the checkpoint's `generation_config.json` (see [`SamplingOverrides::apply`]); `temperature: 0`
//! means greedy.

mod checks;

use std::path::Path;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_yaml_ng::{Mapping, Value};

use checks::{
    AnyValue, ArDType, ArQuantization, Bool, Check, Devices, MaxTokens, NonNegative, Positive,
    PositiveNumber, Seed, StreamingMode, Temperature, TopK, TopP, check_keys, checked, exact,
    expected, int, show, some, string,
};

use super::{DTypeSpec, DeviceSpec, EngineError};
use crate::config_path::{self, join};
use crate::models::registry::{self, Family};
use crate::models::tts::SamplingParams;
use crate::nn::QuantizationSpec;
use crate::nn::switches::{StreamPriority, Switches};

/// The default family's ([`registry::FAMILIES`]' first) shipped stage configuration (async
/// chunk, exact streaming).
pub const DEFAULT_ASYNC_YAML: &str = registry::FAMILIES[0].default_config.0;
/// The default family's shipped batch configuration (stage 1 decodes once stage 0 is done).
pub const DEFAULT_BATCH_YAML: &str = registry::FAMILIES[0].batch_config.0;

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
///
/// Deserializes from `default_sampling_params`; the `subtalker_*` fields are read from
/// `subtalker_sampling_params` by [`StageConfig::from_yaml_str`].
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(expecting = "a mapping")]
pub struct SamplingOverrides {
    /// `temperature` (≥ 0; 0 = greedy).
    #[serde(default, deserialize_with = "some::<Temperature, _>")]
    pub temperature: Option<f64>,
    /// `top_k` (0 or -1 = disabled).
    #[serde(default, deserialize_with = "some::<TopK, _>")]
    pub top_k: Option<usize>,
    /// `top_p` in (0, 1].
    #[serde(default, deserialize_with = "some::<TopP, _>")]
    pub top_p: Option<f64>,
    /// `repetition_penalty` (> 0).
    #[serde(default, deserialize_with = "some::<PositiveNumber, _>")]
    pub repetition_penalty: Option<f64>,
    /// `max_tokens`: the frame cap (`max_new_tokens`), within [`MAX_NEW_TOKENS_RANGE`](crate::models::tts::MAX_NEW_TOKENS_RANGE).
    #[serde(default, deserialize_with = "some::<MaxTokens, _>")]
    pub max_tokens: Option<usize>,
    /// `seed`.
    #[serde(default, deserialize_with = "some::<Seed, _>")]
    pub seed: Option<u64>,
    /// `subtalker_sampling_params.do_sample`.
    #[serde(skip)]
    pub subtalker_do_sample: Option<bool>,
    /// `subtalker_sampling_params.temperature`.
    #[serde(skip)]
    pub subtalker_temperature: Option<f64>,
    /// `subtalker_sampling_params.top_k`.
    #[serde(skip)]
    pub subtalker_top_k: Option<usize>,
    /// `subtalker_sampling_params.top_p`.
    #[serde(skip)]
    pub subtalker_top_p: Option<f64>,
}

/// `subtalker_sampling_params` of stage 0 (the code predictor), merged into
/// [`SamplingOverrides`].
#[derive(Default, Deserialize)]
#[serde(expecting = "a mapping")]
struct SubtalkerSampling {
    #[serde(default, deserialize_with = "some::<Bool, _>")]
    do_sample: Option<bool>,
    #[serde(default, deserialize_with = "some::<Temperature, _>")]
    temperature: Option<f64>,
    #[serde(default, deserialize_with = "some::<TopK, _>")]
    top_k: Option<usize>,
    #[serde(default, deserialize_with = "some::<TopP, _>")]
    top_p: Option<f64>,
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

    fn with_subtalker(self, s: SubtalkerSampling) -> Self {
        SamplingOverrides {
            subtalker_do_sample: s.do_sample,
            subtalker_temperature: s.temperature,
            subtalker_top_k: s.top_k,
            subtalker_top_p: s.top_p,
            ..self
        }
    }
}

/// The runaway guard (docs/field-lessons.md §3): generation ends with `FinishReason::Guard` once
/// the frame count reaches `max(floor_frames, ceil(frames_per_text_token × text tokens))`, unless
/// the caller's `max_new_tokens` ends it first. Deserializes from stage 0's `runaway_guard`; keys
/// left out keep [`GuardConfig::default`].
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(default, expecting = "a mapping")]
pub struct GuardConfig {
    /// Off = only `max_new_tokens` limits an utterance.
    #[serde(deserialize_with = "checked::<Bool, _>")]
    pub enabled: bool,
    /// The budget never goes below this many frames (75 = 6 s).
    #[serde(deserialize_with = "checked::<Positive, _>")]
    pub floor_frames: usize,
    /// Frames allowed per text token of the request.
    #[serde(deserialize_with = "checked::<PositiveNumber, _>")]
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

/// `max_waiting` when the stage config does not set it.
pub const DEFAULT_MAX_WAITING: usize = 64;

/// Stage 0 (talker + code predictor).
///
/// Deserializes from the stage's `engine_args`: a new engine setting is one field here, with its
/// doc and its `#[serde(default = …, deserialize_with = "checked::<…, _>")]`. `device`, `sampling`
/// and `guard` come from the stage's other sections and are filled in by
/// [`StageConfig::from_yaml_str`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(expecting = "a mapping")]
pub struct ArStageConfig {
    /// `runtime.devices`.
    #[serde(skip)]
    pub device: DeviceSpec,
    /// `engine_args.max_num_seqs`: requests the stage works on at once (batched: every running
    /// request advances one frame in each batched step).
    #[serde(
        default = "default_usize::<1>",
        deserialize_with = "checked::<Positive, _>"
    )]
    pub max_num_seqs: usize,
    /// `engine_args.max_waiting`: requests that may wait (FIFO) for one of the `max_num_seqs`
    /// places; a request beyond both is refused (`EngineError::Busy`).
    #[serde(
        default = "default_usize::<DEFAULT_MAX_WAITING>",
        deserialize_with = "checked::<NonNegative, _>"
    )]
    pub max_waiting: usize,
    /// `engine_args.dtype`.
    #[serde(default, deserialize_with = "checked::<ArDType, _>")]
    pub dtype: DTypeSpec,
    /// `engine_args.quantization`: the stored form of the talker's and code predictor's linear
    /// weights (`auto`, `none`, `q8_0`, `q4_k`; docs/cpu.md).
    #[serde(default, deserialize_with = "checked::<ArQuantization, _>")]
    pub quantization: QuantizationSpec,
    /// `default_sampling_params` + `subtalker_sampling_params`.
    #[serde(skip)]
    pub sampling: SamplingOverrides,
    /// `runaway_guard`.
    #[serde(skip)]
    pub guard: GuardConfig,
    /// `engine_args.model_stage` / `model_arch`.
    #[serde(skip)]
    pub model: StageModel,
    /// `engine_args.first_frame_alone` (an omnitts key; left out: on for a CUDA stage, off on
    /// the CPU; never without `async_chunk`, where no audio comes before the end): a request
    /// without a frame yet (its prefill has just ended) gets its first frame in a step of the new
    /// requests only, before the batched step of all, instead of waiting for that step; the
    /// running streams wait that small step. Taken only while fewer streams run than half of
    /// `max_num_seqs`, none waits for a place, and such steps have had at most a tenth of stage
    /// 0's recent stepping time (`engine/first_frame.rs`).
    #[serde(default, deserialize_with = "some::<Bool, _>")]
    pub first_frame_alone: Option<bool>,
    /// `engine_args.priority_over_decoder` (an omnitts key; left out: off): on CUDA, the CUDA
    /// streams ranked first-chunk lane > stage 0 > stage 1's own passes (the lane at the
    /// device's greatest priority, stage 0 one level below, the passes at the default; it
    /// matters where the stages share a GPU), so that stage 0's chain of small kernels takes the
    /// SMs a Code2Wav pass frees before the pass's next blocks do. More audio a second with many
    /// streams (64 streams started together on an H100: 1.08×), more underruns under load (at 40
    /// requests a second, two seeds: 14 against 6 of 4,797 requests; docs/cuda.md, "Stage 0
    /// above Code2Wav"). `OMNITTS_STREAM_PRIORITY`, when set, decides instead.
    #[serde(default, deserialize_with = "some::<Bool, _>")]
    pub priority_over_decoder: Option<bool>,
}

/// A stage's `engine_args.model_stage` and `model_arch`, as given (the engine checks them
/// against the checkpoint's model family when it loads).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StageModel {
    /// `model_stage` (one of the registry's names for the stage).
    pub stage: String,
    /// `model_arch`, when given.
    pub arch: Option<String>,
}

/// Stage 1 (Code2Wav).
///
/// Deserializes from the stage's `engine_args` (a new engine setting is one field here);
/// `device` comes from `runtime` and is filled in by [`StageConfig::from_yaml_str`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(expecting = "a mapping")]
pub struct DecoderStageConfig {
    /// `runtime.devices`.
    #[serde(skip)]
    pub device: DeviceSpec,
    /// `engine_args.model_stage` / `model_arch`.
    #[serde(skip)]
    pub model: StageModel,
    /// `engine_args.max_num_seqs`.
    #[serde(
        default = "default_usize::<1>",
        deserialize_with = "checked::<Positive, _>"
    )]
    pub max_num_seqs: usize,
    /// `engine_args.codec_chunk_frames` (≥ 1).
    #[serde(
        default = "default_usize::<25>",
        deserialize_with = "checked::<Positive, _>"
    )]
    pub codec_chunk_frames: usize,
    /// `engine_args.initial_codec_chunk_frames` (0 = no separate first chunk).
    #[serde(
        default = "default_usize::<1>",
        deserialize_with = "checked::<NonNegative, _>"
    )]
    pub initial_codec_chunk_frames: usize,
    /// `engine_args.codec_chunk_ramp` (an omnitts key; default true): the chunks after the first
    /// grow until they reach `codec_chunk_frames`, each as long as all the audio before it (1, 1,
    /// 2, 4, 8, 16, 25, …; [`super::ChunkRamp`]; `OMNITTS_CHUNK_RAMP=twice` doubles each chunk
    /// instead), so the first audio is small and a player that starts on it is not starved while
    /// the chunks grow.
    #[serde(default = "default_true", deserialize_with = "checked::<Bool, _>")]
    pub codec_chunk_ramp: bool,
    /// `engine_args.codec_left_context_frames` (windowed mode).
    #[serde(
        default = "default_usize::<72>",
        deserialize_with = "checked::<NonNegative, _>"
    )]
    pub codec_left_context_frames: usize,
    /// `engine_args.decoder_streaming_mode`.
    #[serde(
        rename = "decoder_streaming_mode",
        default,
        deserialize_with = "checked::<StreamingMode, _>"
    )]
    pub streaming_mode: DecoderStreamingMode,
    /// `engine_args.dtype`: `F32` (exact, the default) or `Bf16` (bf16 weights and activations on
    /// CUDA, within the bound docs/cuda.md measures). Checked by the reader, not serde.
    #[serde(skip, default = "default_decoder_dtype")]
    pub dtype: DTypeSpec,
    /// `engine_args.allow_tf32` (as PyTorch's `torch.backends.cuda.matmul.allow_tf32`; default
    /// false): on CUDA, f32 matrix products (Code2Wav's convolutions) run on TF32 tensor cores.
    /// candle's switch is process-wide, so it then holds for every f32 product on CUDA in the
    /// process (the Base speaker encoder's too).
    #[serde(default, deserialize_with = "checked::<Bool, _>")]
    pub allow_tf32: bool,
    /// `engine_args.max_num_batched_tokens`: most codec frames (rows × chunk frames) one Code2Wav
    /// pass decodes (a chunk larger than that still goes whole); 0, the default, keeps the
    /// decoder's own budget (512 frames on CUDA, `Code2Wav::max_batch_frames`). Smaller passes
    /// bound how long a first chunk waits for the pass before it, at some cost in throughput.
    #[serde(default, deserialize_with = "checked::<NonNegative, _>")]
    pub max_num_batched_tokens: usize,
    /// `engine_args.first_chunk_lane` (an omnitts key; left out: on for a CUDA decoder, off on the
    /// CPU): new requests' first chunks (their first half second of audio) are decoded on a second
    /// copy of the decoder on its own stream, beside the pass in flight
    /// (`engine/first_chunk_lane.rs`). Exact streaming only.
    #[serde(default, deserialize_with = "some::<Bool, _>")]
    pub first_chunk_lane: Option<bool>,
    /// `engine_args.codec_buffer_frames`: frames stage 0 may run ahead of stage 1 before it blocks.
    #[serde(
        default = "default_usize::<50>",
        deserialize_with = "checked::<Positive, _>"
    )]
    pub codec_buffer_frames: usize,
}

impl DecoderStageConfig {
    /// Whether stage 1 runs the first-chunk lane with its decoder on `device`: as
    /// `first_chunk_lane` says, else on CUDA only; never with windowed streaming (stateless
    /// windows have no first chunk to go ahead of).
    pub fn first_chunk_lane_on(&self, device: DeviceSpec) -> bool {
        self.streaming_mode == DecoderStreamingMode::Exact
            && self
                .first_chunk_lane
                .unwrap_or(matches!(device.resolve(), DeviceSpec::Cuda(_)))
    }
}

fn default_decoder_dtype() -> DTypeSpec {
    DTypeSpec::F32
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
    /// The default family's async-chunk stage config ([`DEFAULT_ASYNC_YAML`], embedded at build
    /// time; its validity is checked by the tests).
    pub fn default_async() -> StageConfig {
        Self::builtin(&registry::FAMILIES[0], false)
            .expect("the built-in stage configs are embedded at build time and valid (unit-tested)")
    }

    /// The default family's batch stage config ([`DEFAULT_BATCH_YAML`], embedded at build time).
    pub fn default_batch() -> StageConfig {
        Self::builtin(&registry::FAMILIES[0], true)
            .expect("the built-in stage configs are embedded at build time and valid (unit-tested)")
    }

    /// Whether stage 0 on `ar_device` gives new requests their first frame in a step of their own
    /// ([`ArStageConfig::first_frame_alone`]): with `async_chunk` only, then as the key says, else
    /// on CUDA (measured there, with Qwen3-TTS; docs/cuda.md).
    pub fn first_frame_alone_on(&self, ar_device: DeviceSpec) -> bool {
        self.async_chunk
            && self
                .ar
                .first_frame_alone
                .unwrap_or(matches!(ar_device.resolve(), DeviceSpec::Cuda(_)))
    }

    /// The CUDA stream priority of each stage thread: `OMNITTS_STREAM_PRIORITY` when set, else
    /// [`StreamPriority::OVER_DECODER`] with [`ArStageConfig::priority_over_decoder`], else
    /// none above the default.
    pub fn stream_priority(&self) -> StreamPriority {
        StreamPriority::resolve(
            Switches::get().stream_priority,
            self.ar.priority_over_decoder,
        )
    }

    /// The built-in stage config of a model family: its async-chunk one
    /// (`configs/qwen3_tts.yaml`, `configs/fish_speech.yaml`), or with `batch` its batch one.
    /// Errors: none for the shipped files (they are unit-tested); [`EngineError::Config`] if
    /// one were invalid.
    pub fn builtin(family: &Family, batch: bool) -> Result<StageConfig, EngineError> {
        let (text, name) = if batch {
            family.batch_config
        } else {
            family.default_config
        };
        Ok(Self::from_yaml_str_named(text, name)?.0)
    }

    /// The built-in async-chunk stage config of the checkpoint in `dir` (its family's, by
    /// config.json's `model_type`). Errors: [`EngineError::Load`] for an unreadable config.json
    /// or an unknown `model_type` (the message lists the known ones).
    pub fn default_for_model(dir: &Path) -> Result<StageConfig, EngineError> {
        let family = registry::detect(dir).map_err(|e| EngineError::Load {
            stage: 0,
            name: "model",
            source: e,
        })?;
        Self::builtin(family, false)
    }

    /// Checks that the stages are `family`'s: each `model_stage` one of its stage names and
    /// `model_arch`, when given, its architecture. Errors: [`EngineError::Config`] naming the
    /// key (`stage_args[N].engine_args.model_stage` / `model_arch`), the value and the expected
    /// one, and listing the families omnitts knows.
    pub fn check_family(&self, family: &Family) -> Result<(), EngineError> {
        let given = [&self.ar.model, &self.decoder.model];
        for (id, (m, want)) in given.iter().zip(family.stages.iter()).enumerate() {
            let key = |k: &str| format!("stage_args[{id}].engine_args.{k}");
            let known = registry::FAMILIES
                .iter()
                .map(|f| {
                    format!(
                        "{} (model_type {}): {} / {}",
                        f.name, f.model_type, f.stages[id].model_stage, f.stages[id].model_arch
                    )
                })
                .collect::<Vec<_>>()
                .join("; ");
            let bad = |k: &str, v: &str, w: &str| EngineError::Config {
                source_name: "for this checkpoint".to_string(),
                key: key(k),
                msg: format!(
                    "{v:?} is not stage {id} of this checkpoint ({}, model_type {}): expected \
                     {w:?}; known: {known}",
                    family.name, family.model_type
                ),
            };
            // An unset model_stage (a config built in code) takes the checkpoint's.
            if !m.stage.is_empty() && m.stage != want.model_stage {
                return Err(bad("model_stage", &m.stage, want.model_stage));
            }
            if let Some(arch) = &m.arch
                && arch != want.model_arch
            {
                return Err(bad("model_arch", arch, want.model_arch));
            }
        }
        Ok(())
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
            key: DOCUMENT.to_string(),
            msg: format!("not valid YAML: {e}"),
        })?;
        let mut r = Reader {
            source,
            warnings: Vec::new(),
        };
        let cfg = r.document(&doc)?;
        Ok((cfg, r.warnings))
    }

    /// The chunk policy for a request, with optional per-request overrides.
    pub fn chunk_policy(
        &self,
        initial: Option<usize>,
        chunk: Option<usize>,
    ) -> super::chunk_buffer::ChunkPolicy {
        use super::chunk_buffer::{ChunkPolicy, ChunkRamp};
        use crate::nn::switches::Switches;
        if !self.async_chunk {
            return ChunkPolicy::Whole;
        }
        ChunkPolicy::Streaming {
            initial: initial.unwrap_or(self.decoder.initial_codec_chunk_frames),
            chunk: chunk.unwrap_or(self.decoder.codec_chunk_frames),
            ramp: if !self.decoder.codec_chunk_ramp {
                ChunkRamp::Off
            } else if Switches::get().twice_ramp {
                ChunkRamp::Twice
            } else {
                ChunkRamp::Total
            },
        }
    }
}

/// The key of errors about the document as a whole.
const DOCUMENT: &str = "<document>";

/// The top level of the document.
#[derive(Deserialize)]
#[serde(expecting = "a mapping with stage_args")]
struct Document {
    #[serde(default = "default_true", deserialize_with = "checked::<Bool, _>")]
    async_chunk: bool,
    /// Each entry is read as the stage its `stage_id` names (see [`Reader::document`]).
    #[serde(default, deserialize_with = "some::<AnyValue, _>")]
    stage_args: Option<Value>,
}

/// `stage_args[stage_id = 0]` less the keys [`StageSpec`] checks.
#[derive(Deserialize)]
#[serde(expecting = "a mapping")]
struct ArStage {
    #[serde(default)]
    runtime: Runtime,
    engine_args: ArStageConfig,
    #[serde(default)]
    default_sampling_params: SamplingOverrides,
    #[serde(default)]
    subtalker_sampling_params: SubtalkerSampling,
    #[serde(default)]
    runaway_guard: GuardConfig,
}

/// `stage_args[stage_id = 1]` less the keys [`StageSpec`] checks.
#[derive(Deserialize)]
#[serde(expecting = "a mapping")]
struct DecoderStage {
    #[serde(default)]
    runtime: Runtime,
    engine_args: DecoderStageConfig,
}

/// `runtime` of a stage.
#[derive(Default, Deserialize)]
#[serde(expecting = "a mapping")]
struct Runtime {
    #[serde(default, deserialize_with = "checked::<Devices, _>")]
    devices: DeviceSpec,
}

fn default_usize<const N: usize>() -> usize {
    N
}

fn default_true() -> bool {
    true
}

/// The keys of a stage whose values are fixed by its stage id: vLLM-Omni's files carry them,
/// omnitts checks them and reads the rest of the stage with serde.
struct StageSpec {
    id: usize,
    /// `engine_args.engine_output_type` and `final_output_type`.
    output_type: &'static str,
    /// `final_output`, and why.
    final_output: (bool, &'static str),
    /// `engine_input_source` (required when not empty), and how it is written in messages.
    input_source: (&'static [u64], &'static str),
}

const AR_STAGE: StageSpec = StageSpec {
    id: 0,
    output_type: "latent",
    final_output: (false, "emits codec frames, not the final output"),
    input_source: (&[], "[] (stage 0 takes the request)"),
};

const DECODER_STAGE: StageSpec = StageSpec {
    id: 1,
    output_type: "audio",
    final_output: (true, "produces the final audio"),
    input_source: (&[0], "[0]"),
};

struct Reader<'s> {
    source: &'s str,
    warnings: Vec<String>,
}

type R<T> = Result<T, EngineError>;

impl Reader<'_> {
    fn err(&self, key: &str, msg: impl Into<String>) -> EngineError {
        EngineError::Config {
            source_name: self.source.to_string(),
            key: if key.is_empty() { DOCUMENT } else { key }.to_string(),
            msg: msg.into(),
        }
    }

    fn warn(&mut self, key: &str, what: &str) {
        self.warnings
            .push(format!("stage config {}: {key}: {what}", self.source));
    }

    /// Deserializes `T` from `v`, found at `path`; keys no field takes become warnings.
    fn read<T: DeserializeOwned>(&mut self, v: &Value, path: &str) -> R<T> {
        let mut unknown = Vec::new();
        let r = config_path::deserialize(v, path, |key| unknown.push(key));
        for key in unknown {
            self.warn(&key, "unknown key, ignored");
        }
        r.map_err(|e| self.err(&e.path, e.msg))
    }

    fn document(&mut self, doc: &Value) -> R<StageConfig> {
        if doc.is_null() {
            return Err(self.err(
                DOCUMENT,
                "empty document; expected a mapping with stage_args",
            ));
        }
        check_keys(doc, "").map_err(|(key, msg)| self.err(&key, msg))?;
        let top: Document = self.read(doc, "")?;
        let stages = top
            .stage_args
            .ok_or_else(|| self.err("stage_args", "missing (a list of 2 stages)"))?;
        let list = stages
            .as_sequence()
            .ok_or_else(|| self.err("stage_args", expected("a list of 2 stages", &stages)))?;
        if list.len() != 2 {
            return Err(self.err(
                "stage_args",
                format!(
                    "expected 2 stages (stage_id 0: the AR model, stage_id 1: the codec decoder), got {}",
                    list.len()
                ),
            ));
        }
        let mut ar = None;
        let mut decoder = None;
        for (i, st) in list.iter().enumerate() {
            let path = format!("stage_args[{i}]");
            let m = st
                .as_mapping()
                .ok_or_else(|| self.err(&path, expected("a mapping (one stage)", st)))?;
            let id_key = join(&path, "stage_id");
            let id_val = m
                .get("stage_id")
                .ok_or_else(|| self.err(&id_key, "missing (0 or 1)"))?;
            match int(id_val) {
                Some(0) if ar.is_none() => ar = Some(self.ar_stage(m.clone(), &path)?),
                Some(1) if decoder.is_none() => {
                    decoder = Some(self.decoder_stage(m.clone(), &path)?)
                }
                Some(id @ (0 | 1)) => {
                    return Err(self.err(&id_key, format!("stage_id {id} appears twice")));
                }
                _ => return Err(self.err(&id_key, expected("0 or 1", id_val))),
            }
        }
        // Two entries, each 0 or 1, no duplicates: both are present.
        let (Some(ar), Some(decoder)) = (ar, decoder) else {
            return Err(self.err("stage_args", "stage_id 0 and stage_id 1 are both required"));
        };
        Ok(StageConfig {
            async_chunk: top.async_chunk,
            ar,
            decoder,
        })
    }

    fn ar_stage(&mut self, mut m: Mapping, path: &str) -> R<ArStageConfig> {
        let model = self.fixed_keys(&AR_STAGE, &mut m, path)?;
        let st: ArStage = self.read(&Value::Mapping(m), path)?;
        Ok(ArStageConfig {
            model,
            device: st.runtime.devices,
            sampling: st
                .default_sampling_params
                .with_subtalker(st.subtalker_sampling_params),
            guard: st.runaway_guard,
            ..st.engine_args
        })
    }

    fn decoder_stage(&mut self, mut m: Mapping, path: &str) -> R<DecoderStageConfig> {
        let model = self.fixed_keys(&DECODER_STAGE, &mut m, path)?;
        if m.remove("default_sampling_params").is_some() {
            let key = join(path, "default_sampling_params");
            self.warn(&key, "ignored (the decoder is deterministic)");
        }
        let mut dtype = default_decoder_dtype();
        if let Some(args) = m.get_mut("engine_args").and_then(Value::as_mapping_mut)
            && let Some(v) = args.remove("dtype")
        {
            dtype = match string(&v).ok().and_then(DTypeSpec::parse) {
                Some(DTypeSpec::F32 | DTypeSpec::Auto) => DTypeSpec::F32,
                Some(DTypeSpec::Bf16) => DTypeSpec::Bf16,
                _ => {
                    return Err(self.err(
                        &join(path, "engine_args.dtype"),
                        expected(
                            "float32 (exact) or bfloat16 (CUDA; the codec decoder runs in no other)",
                            &v,
                        ),
                    ));
                }
            };
        }
        let st: DecoderStage = self.read(&Value::Mapping(m), path)?;
        Ok(DecoderStageConfig {
            model,
            device: st.runtime.devices,
            dtype,
            ..st.engine_args
        })
    }

    /// Checks and removes the keys of stage `m` (at `path`) that `spec` fixes; returns its
    /// `model_stage` (one of the registry's names for the stage) and `model_arch`.
    fn fixed_keys(&self, spec: &StageSpec, m: &mut Mapping, path: &str) -> R<StageModel> {
        let key = |k: &str| join(path, k);
        m.remove("stage_id");
        if let Some(v) = m.remove("stage_type") {
            exact(&v, "llm").map_err(|e| self.err(&key("stage_type"), e))?;
        }
        if let Some(v) = m.remove("final_output") {
            let (want, why) = spec.final_output;
            if Bool::check(&v).map_err(|e| self.err(&key("final_output"), e))? != want {
                return Err(self.err(
                    &key("final_output"),
                    format!(
                        "expected {want} (stage {} {why}), got {}",
                        spec.id,
                        show(&v)
                    ),
                ));
            }
        }
        if let Some(v) = m.remove("final_output_type") {
            exact(&v, spec.output_type).map_err(|e| self.err(&key("final_output_type"), e))?;
        }
        let (source, source_text) = spec.input_source;
        let source_given = match m.remove("engine_input_source") {
            Some(v) => {
                let ok = v.as_sequence().is_some_and(|s| {
                    s.len() == source.len()
                        && s.iter().zip(source).all(|(a, b)| a.as_u64() == Some(*b))
                });
                if !ok {
                    return Err(self.err(&key("engine_input_source"), expected(source_text, &v)));
                }
                true
            }
            None => false,
        };
        let args_key = key("engine_args");
        let known_stages = registry::stage_names(spec.id);
        let args = match m.get_mut("engine_args") {
            None => {
                return Err(self.err(
                    &args_key,
                    format!("missing (needs model_stage: {})", known_stages.join(" | ")),
                ));
            }
            Some(Value::Mapping(args)) => args,
            Some(other) => return Err(self.err(&args_key, expected("a mapping", other))),
        };
        let arg_key = |k: &str| join(&args_key, k);
        let listed = known_stages
            .iter()
            .map(|n| format!("{n:?}"))
            .collect::<Vec<_>>()
            .join(" or ");
        let stage = match args.remove("model_stage") {
            Some(v) => {
                let given = string(&v).map_err(|e| self.err(&arg_key("model_stage"), e))?;
                if !known_stages.contains(&given) {
                    return Err(self.err(&arg_key("model_stage"), expected(&listed, &v)));
                }
                given.to_string()
            }
            None => {
                return Err(self.err(
                    &arg_key("model_stage"),
                    format!("missing (expected {listed})"),
                ));
            }
        };
        // The stage name says the family; a model_arch given must be that family's.
        let arch = match args.remove("model_arch") {
            Some(v) => {
                let want = registry::FAMILIES
                    .iter()
                    .filter_map(|f| f.stages.get(spec.id))
                    .find(|n| n.model_stage == stage)
                    .map(|n| n.model_arch);
                if let Some(want) = want {
                    exact(&v, want).map_err(|e| self.err(&arg_key("model_arch"), e))?;
                }
                Some(
                    string(&v)
                        .map_err(|e| self.err(&arg_key("model_arch"), e))?
                        .to_string(),
                )
            }
            None => None,
        };
        if let Some(v) = args.remove("engine_output_type") {
            exact(&v, spec.output_type).map_err(|e| self.err(&arg_key("engine_output_type"), e))?;
        }
        if !source_given && !source.is_empty() {
            return Err(self.err(
                &key("engine_input_source"),
                format!("missing (expected {source_text})"),
            ));
        }
        Ok(StageModel { stage, arch })
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
        assert_eq!(a.decoder.max_num_batched_tokens, 0);
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
    fn the_code2wav_pass_budget_is_read() {
        let yaml =
            DEFAULT_ASYNC_YAML.replace("max_num_batched_tokens: 0", "max_num_batched_tokens: 128");
        let (c, w) = StageConfig::from_yaml_str(&yaml).unwrap();
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(c.decoder.max_num_batched_tokens, 128);
    }

    #[test]
    fn the_first_frame_alone_is_read_and_defaults_to_cuda() {
        let d = StageConfig::default_async();
        assert_eq!(d.ar.first_frame_alone, None);
        assert!(!d.first_frame_alone_on(DeviceSpec::Cpu));
        assert!(d.first_frame_alone_on(DeviceSpec::Cuda(0)));
        // Without async chunks no audio comes before the end: never.
        let batch = StageConfig::default_batch();
        assert!(!batch.first_frame_alone_on(DeviceSpec::Cuda(0)));
        let forced = StageConfig {
            ar: ArStageConfig {
                first_frame_alone: Some(true),
                ..batch.ar.clone()
            },
            ..batch
        };
        assert!(!forced.first_frame_alone_on(DeviceSpec::Cuda(0)));
        let yaml = with_ar_key("first_frame_alone: false");
        let (c, w) = StageConfig::from_yaml_str(&yaml).unwrap();
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(c.ar.first_frame_alone, Some(false));
        assert!(!c.first_frame_alone_on(DeviceSpec::Cuda(0)));
        let yaml = with_ar_key("first_frame_alone: true");
        let (c, _) = StageConfig::from_yaml_str(&yaml).unwrap();
        assert!(c.first_frame_alone_on(DeviceSpec::Cpu));
        let bad = with_ar_key("first_frame_alone: often");
        let e = StageConfig::from_yaml_str(&bad).unwrap_err().to_string();
        assert!(e.contains("engine_args.first_frame_alone"), "{e}");
    }

    /// The built-in async config with `line` (`key: value`) added to stage 0's `engine_args`.
    fn with_ar_key(line: &str) -> String {
        DEFAULT_ASYNC_YAML.replace(
            "max_waiting: 64\n",
            &format!("max_waiting: 64\n      {line}\n"),
        )
    }

    #[test]
    fn priority_over_decoder_is_read_and_ranks_the_streams() {
        let d = StageConfig::default_async();
        assert_eq!(d.ar.priority_over_decoder, None);
        let yaml = with_ar_key("priority_over_decoder: true");
        let (on, w) = StageConfig::from_yaml_str(&yaml).unwrap();
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(on.ar.priority_over_decoder, Some(true));
        // Without OMNITTS_STREAM_PRIORITY (which decides when set: switches' tests).
        let ranks = |c: &StageConfig| StreamPriority::resolve(None, c.ar.priority_over_decoder);
        assert_eq!(ranks(&d), StreamPriority::default());
        assert_eq!(
            ranks(&on),
            StreamPriority {
                ar: Some(1),
                lane: Some(0),
                decoder: None
            }
        );
        let bad = with_ar_key("priority_over_decoder: 2");
        let e = StageConfig::from_yaml_str(&bad).unwrap_err().to_string();
        assert!(e.contains("engine_args.priority_over_decoder"), "{e}");
    }

    #[test]
    fn the_first_chunk_lane_is_read_and_defaults_to_cuda() {
        let (c, _) = StageConfig::from_yaml_str(DEFAULT_ASYNC_YAML).unwrap();
        let d = c.decoder;
        assert_eq!(d.first_chunk_lane, None);
        assert!(!d.first_chunk_lane_on(DeviceSpec::Cpu));
        assert!(d.first_chunk_lane_on(DeviceSpec::Cuda(0)));
        let windowed = DecoderStageConfig {
            streaming_mode: DecoderStreamingMode::Windowed,
            ..d.clone()
        };
        assert!(!windowed.first_chunk_lane_on(DeviceSpec::Cuda(0)));
        let yaml = DEFAULT_ASYNC_YAML.replace(
            "max_num_batched_tokens: 0",
            "max_num_batched_tokens: 0\n      first_chunk_lane: true",
        );
        let (c, w) = StageConfig::from_yaml_str(&yaml).unwrap();
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(c.decoder.first_chunk_lane, Some(true));
        assert!(c.decoder.first_chunk_lane_on(DeviceSpec::Cpu));
        let bad = DEFAULT_ASYNC_YAML.replace(
            "max_num_batched_tokens: 0",
            "max_num_batched_tokens: 0\n      first_chunk_lane: 2",
        );
        let e = StageConfig::from_yaml_str(&bad).unwrap_err().to_string();
        assert!(e.contains("engine_args.first_chunk_lane"), "{e}");
        assert!(e.contains("true or false"), "{e}");
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
