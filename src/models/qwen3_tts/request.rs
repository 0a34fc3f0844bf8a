//! What a request asks for: the voice and text ([`VoiceRequest`]) and the decoding settings
//! ([`SamplingParams`]).

use super::config::GenerationConfig;
use super::error::ModelError;
use super::prompt::VoiceClonePrompt;

/// Where the text goes: all in the prefill (`NonStreaming`) or one token per frame (`Streaming`,
/// the reference's `non_streaming_mode=False`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PromptMode {
    Streaming,
    NonStreaming,
}

impl std::str::FromStr for PromptMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().replace('_', "-").as_str() {
            "streaming" => Ok(PromptMode::Streaming),
            "non-streaming" | "nonstreaming" => Ok(PromptMode::NonStreaming),
            other => Err(format!(
                "unknown prompt mode {other:?} (streaming | non-streaming)"
            )),
        }
    }
}

/// What to say and how. `None` fields take the reference default for the variant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VoiceRequest {
    pub text: String,
    /// CustomVoice preset speaker (case-insensitive). `None`/empty: no speaker row.
    pub speaker: Option<String>,
    /// Language (case-insensitive name, or its ISO 639-1 code: `en`, `zh`, …); `None` = `auto`.
    pub language: Option<String>,
    /// Instruct / voice description (CustomVoice 1.7B, VoiceDesign); ignored for 0.6B
    /// CustomVoice like the reference wrapper.
    pub instruct: Option<String>,
    /// `None` = the variant's reference default (non-streaming for CustomVoice/VoiceDesign,
    /// streaming for Base).
    pub prompt_mode: Option<PromptMode>,
    /// Base checkpoints: the voice to clone (required for Base, refused otherwise); see
    /// [`ArModel::create_voice_clone_prompt`].
    pub voice_clone: Option<VoiceClonePrompt>,
}

/// Decoding parameters (reference `generate` kwargs).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    pub do_sample: bool,
    pub temperature: f64,
    pub top_k: usize,
    pub top_p: f64,
    pub repetition_penalty: f64,
    pub subtalker_do_sample: bool,
    pub subtalker_temperature: f64,
    pub subtalker_top_k: usize,
    pub subtalker_top_p: f64,
    /// Maximum codebook-0 tokens sampled (frames = tokens − 1 when the limit is hit).
    pub max_new_tokens: usize,
    /// Seed of the ChaCha20 stream used for all sampling of one utterance.
    pub seed: u64,
}

impl SamplingParams {
    /// The checkpoint's `generation_config.json` values (seed 0).
    pub fn from_generation_config(g: &GenerationConfig) -> Self {
        Self {
            do_sample: g.do_sample,
            temperature: g.temperature,
            top_k: g.top_k,
            top_p: g.top_p,
            repetition_penalty: g.repetition_penalty,
            subtalker_do_sample: g.subtalker_dosample,
            subtalker_temperature: g.subtalker_temperature,
            subtalker_top_k: g.subtalker_top_k,
            subtalker_top_p: g.subtalker_top_p,
            max_new_tokens: g.max_new_tokens,
            seed: 0,
        }
    }

    /// Greedy for both the talker and the code predictor (the exact-parity setting).
    pub fn greedy(mut self) -> Self {
        self.do_sample = false;
        self.subtalker_do_sample = false;
        self
    }

    pub(super) fn validate(&self) -> Result<(), ModelError> {
        let bad = |field: &str, value: String, msg: &str| ModelError::InvalidRequest {
            field: field.into(),
            value,
            msg: msg.into(),
        };
        if self.max_new_tokens == 0 {
            return Err(bad("max_new_tokens", "0".into(), "must be at least 1"));
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return Err(bad(
                "repetition_penalty",
                self.repetition_penalty.to_string(),
                "must be > 0",
            ));
        }
        for (on, name, t, p) in [
            (self.do_sample, "", self.temperature, self.top_p),
            (
                self.subtalker_do_sample,
                "subtalker_",
                self.subtalker_temperature,
                self.subtalker_top_p,
            ),
        ] {
            if on && !(t > 0.0 && t.is_finite()) {
                return Err(bad(
                    &format!("{name}temperature"),
                    t.to_string(),
                    "must be > 0 when sampling",
                ));
            }
            if on && !(p > 0.0 && p <= 1.0) {
                return Err(bad(
                    &format!("{name}top_p"),
                    p.to_string(),
                    "must be in (0, 1]",
                ));
            }
        }
        Ok(())
    }
}
