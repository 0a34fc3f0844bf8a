//! Sampling parameters shared by every model, and their one validation.

use super::error::ModelError;

/// The frame caps (`max_new_tokens`) the elements' `max-new-tokens` and the stage config's
/// `max_tokens` take: a cap of N allows at most N - 1 codec frames.
pub const MAX_NEW_TOKENS_RANGE: std::ops::RangeInclusive<u32> = 2..=65536;

/// Decoding parameters (Qwen3-TTS's `generate` kwargs; a model maps them onto its sampler:
/// Fish S2 Pro uses `temperature`, `top_k`, `top_p` for both its ARs, greedy when `do_sample` is
/// false, and ignores the `subtalker_*` and `repetition_penalty` values).
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
    /// Greedy with neutral values everywhere (temperature 1, top-k 1, top-p 1, no repetition
    /// penalty), at most `max_new_tokens` tokens, `seed`: for checks that want the argmax alone,
    /// whatever a checkpoint's generation config says.
    pub fn plain_greedy(max_new_tokens: usize, seed: u64) -> Self {
        SamplingParams {
            do_sample: false,
            temperature: 1.0,
            top_k: 1,
            top_p: 1.0,
            repetition_penalty: 1.0,
            subtalker_do_sample: false,
            subtalker_temperature: 1.0,
            subtalker_top_k: 1,
            subtalker_top_p: 1.0,
            max_new_tokens,
            seed,
        }
    }

    /// Greedy for both the talker and the code predictor (the exact-parity setting).
    pub fn greedy(mut self) -> Self {
        self.do_sample = false;
        self.subtalker_do_sample = false;
        self
    }

    /// The one check of every sampling value. Errors: [`ModelError::InvalidRequest`] naming the
    /// field (`temperature`, `top_p`, `subtalker_temperature`, `subtalker_top_p`,
    /// `repetition_penalty`, `max_new_tokens`) with its value: a temperature ≤ 0 or non-finite
    /// when sampling, a top_p outside (0, 1] when sampling, a repetition penalty ≤ 0 or
    /// non-finite, `max_new_tokens` 0.
    pub fn validate(&self) -> Result<(), ModelError> {
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
                    "must be > 0 when sampling (use do_sample = false for greedy)",
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
