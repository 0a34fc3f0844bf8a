//! Qwen3-TTS's sampling defaults: [`SamplingParams`] from `generation_config.json`.

use super::config::GenerationConfig;
use crate::models::tts::SamplingParams;

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
}
