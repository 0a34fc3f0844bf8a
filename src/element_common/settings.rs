//! The values of the synthesis properties every omnitts element has (model, stage config,
//! devices, voice, sampling, chunk sizes) and their defaults. The param specs, set and get are in
//! [`super::properties`]; how the values become a request, in [`super::request`].

use std::sync::LazyLock;

use gst::glib;

use super::bundled_voice;
use crate::engine::StageConfig;
use crate::models::qwen3_tts::GenerationConfig;
use crate::models::tts::{PromptMode, SamplingParams};
use crate::nn::{Quantization, QuantizationSpec};

pub(crate) const DEFAULT_LANGUAGE: &str = "auto";
pub(crate) const DEFAULT_INITIAL_CHUNK_FRAMES: u32 = 0;
pub(crate) const DEFAULT_CHUNK_FRAMES: u32 = 0;

/// What gst-inspect shows as the sampling defaults: the built-in stage config's
/// `default_sampling_params` (configs/qwen3_tts.yaml: max-new-tokens and seed), else the released
/// checkpoints' `generation_config.json` values (docs/qwen3-tts.md §1.4). An unset property takes
/// the loaded stage config's value, else the loaded checkpoint's (the bundled voice's: greedy).
pub(crate) struct SamplingDefaults {
    pub do_sample: bool,
    pub temperature: f64,
    pub top_k: u32,
    pub top_p: f64,
    pub repetition_penalty: f64,
    pub max_new_tokens: u32,
    pub seed: u64,
}

pub(crate) static SAMPLING_DEFAULTS: LazyLock<SamplingDefaults> = LazyLock::new(|| {
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
    SamplingDefaults::of(&s)
});

impl SamplingDefaults {
    /// The property values of `s` (a loaded checkpoint's defaults, [`super::request::ModelInfo`]'s
    /// `base_sampling`).
    pub fn of(s: &SamplingParams) -> SamplingDefaults {
        SamplingDefaults {
            do_sample: s.do_sample,
            temperature: s.temperature,
            top_k: s.top_k.min(u32::MAX as usize) as u32,
            top_p: s.top_p,
            repetition_penalty: s.repetition_penalty,
            max_new_tokens: s.max_new_tokens.min(u32::MAX as usize) as u32,
            seed: s.seed,
        }
    }
}

/// The `quantization` property: the stored form of stage 0's linear weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, glib::Enum)]
#[repr(u32)]
#[enum_type(name = "GstOmniTtsQuantization")]
pub(crate) enum QuantizationSetting {
    /// The stage config's `engine_args.quantization`.
    #[default]
    #[enum_value(
        name = "The stage config's engine_args.quantization (built in: int8 on the CPU, else dense)",
        nick = "auto"
    )]
    Auto = 0,
    /// Dense weights.
    #[enum_value(
        name = "Dense weights in the model dtype: the checkpoint's values, reference parity",
        nick = "none"
    )]
    None = 1,
    /// int8 blocks.
    #[enum_value(
        name = "int8 blocks of 32 weights with a scale (GGML Q8_0), CPU only",
        nick = "q8-0"
    )]
    Q8_0 = 2,
    /// 4-bit blocks.
    #[enum_value(
        name = "4-bit k-quant blocks of 256 weights (GGML Q4_K), CPU only",
        nick = "q4-k"
    )]
    Q4K = 3,
}

impl QuantizationSetting {
    /// Its nick, as gst-launch spells it.
    pub fn nick(self) -> &'static str {
        match self {
            QuantizationSetting::Auto => "auto",
            QuantizationSetting::None => "none",
            QuantizationSetting::Q8_0 => "q8-0",
            QuantizationSetting::Q4K => "q4-k",
        }
    }

    /// The form asked for; `None`: the stage config decides.
    pub fn quantization(self) -> Option<QuantizationSpec> {
        match self {
            QuantizationSetting::Auto => None,
            QuantizationSetting::None => Some(QuantizationSpec::DENSE),
            QuantizationSetting::Q8_0 => Some(QuantizationSpec::Form(Quantization::Q8_0)),
            QuantizationSetting::Q4K => Some(QuantizationSpec::Form(Quantization::Q4K)),
        }
    }
}

/// The `prompt-mode` property: where the text goes in the prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, glib::Enum)]
#[repr(u32)]
#[enum_type(name = "GstOmniTtsPromptMode")]
pub(crate) enum PromptModeSetting {
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
    /// The engine's prompt mode; `None`: the variant's default.
    pub fn prompt_mode(self) -> Option<PromptMode> {
        match self {
            PromptModeSetting::Auto => None,
            PromptModeSetting::Streaming => Some(PromptMode::Streaming),
            PromptModeSetting::NonStreaming => Some(PromptMode::NonStreaming),
        }
    }
}

/// Values of the synthesis properties. Sampling fields and devices are `None` until set: then
/// the stage config (and, for sampling, the checkpoint's `generation_config.json`) decides.
#[derive(Debug, Clone)]
pub(crate) struct SynthesisSettings {
    pub model: String,
    pub stage_config: Option<String>,
    pub ar_device: Option<String>,
    pub decoder_device: Option<String>,
    /// Join the process-wide engine of the same key (`shared-engine`, default true).
    pub shared_engine: bool,
    /// `quantization` (auto: the stage config's).
    pub quantization: QuantizationSetting,
    pub speaker: Option<String>,
    pub language: String,
    pub instruct: Option<String>,
    pub prompt_mode: PromptModeSetting,
    pub ref_audio: Option<String>,
    pub ref_text: Option<String>,
    pub x_vector_only: bool,
    pub do_sample: Option<bool>,
    pub temperature: Option<f64>,
    pub top_k: Option<u32>,
    pub top_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub max_new_tokens: Option<u32>,
    pub seed: Option<u64>,
    /// Codec frames in an utterance's first chunk (0: the stage config's).
    pub initial_chunk_frames: u32,
    /// Codec frames in later chunks (0: the stage config's, or the live default).
    pub chunk_frames: u32,
}

impl Default for SynthesisSettings {
    fn default() -> Self {
        SynthesisSettings {
            model: bundled_voice::default_model(),
            stage_config: None,
            ar_device: None,
            decoder_device: None,
            shared_engine: true,
            quantization: QuantizationSetting::Auto,
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
        }
    }
}

impl SynthesisSettings {
    /// `initial-chunk-frames`, `None` when 0 (the stage config's).
    pub fn initial_chunk(&self) -> Option<usize> {
        (self.initial_chunk_frames > 0).then_some(self.initial_chunk_frames as usize)
    }

    /// `chunk-frames`, `None` when 0.
    pub fn chunk(&self) -> Option<usize> {
        (self.chunk_frames > 0).then_some(self.chunk_frames as usize)
    }

    /// The `stage-config` property as given, "" when unset (for messages).
    pub fn stage_config_name(&self) -> &str {
        self.stage_config.as_deref().unwrap_or("")
    }
}
