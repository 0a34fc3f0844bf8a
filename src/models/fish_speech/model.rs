//! The whole text-to-codes half of S2 Pro: tokenizer and prompt builder, slow AR, fast AR.

use std::path::Path;

use candle_core::{DType, Device};

use super::checkpoint::open_weights;
use super::config::FishConfig;
use super::error::Result;
use super::fast_ar::FastAr;
use super::generate::{FirstFrame, GenerateOptions, Generated, PROMPT_HEADROOM, generate};
use super::prompt::{Codes, Prompt, PromptBuilder, VoiceReference};
use super::slow_ar::SlowAr;
use super::tokenizer::FishTokenizer;

/// A loaded S2 checkpoint (without the codec).
#[derive(Debug, Clone)]
pub struct FishModel {
    pub config: FishConfig,
    pub prompts: PromptBuilder,
    pub slow: SlowAr,
    pub fast: FastAr,
}

impl FishModel {
    /// Loads `dir` (config.json, tokenizer.json, the safetensors) on `device` in `dtype`.
    pub fn load(dir: &Path, device: &Device, dtype: DType) -> Result<Self> {
        let config = FishConfig::load(dir)?;
        let tokenizer = FishTokenizer::load(dir)?;
        let vb = open_weights(dir, device, dtype)?;
        let slow = SlowAr::new(&config, &tokenizer, &vb)?;
        let fast = FastAr::new(&config, &vb)?;
        Ok(Self {
            prompts: PromptBuilder {
                tokenizer,
                num_codebooks: config.num_codebooks(),
            },
            config,
            slow,
            fast,
        })
    }

    /// The prompt of `text` alone or with a reference voice (one batch; see
    /// [`PromptBuilder::batches`] for speaker-tagged text).
    pub fn prompt(&self, text: &str, voice: Option<&VoiceReference>) -> Result<Prompt> {
        self.prompts.build(text, voice, &[])
    }

    /// Generates the codes of `prompt`.
    pub fn generate(
        &self,
        prompt: &Prompt,
        opts: &GenerateOptions,
        debug: Option<&mut FirstFrame>,
    ) -> Result<Generated> {
        generate(&self.slow, &self.fast, prompt, opts, debug)
    }

    /// The codes of a whole text as the reference's `generate_long` produces them: one
    /// generation per batch of speaker turns, earlier batches kept in the prompt (the oldest left
    /// out when they no longer fit, where the reference stops with an error, as the engine's
    /// session does); the batches' codes concatenated.
    pub fn synthesize_codes(
        &self,
        text: &str,
        voice: Option<&VoiceReference>,
        opts: &GenerateOptions,
    ) -> Result<Codes> {
        let batches = self.prompts.batches(text, super::prompt::CHUNK_LENGTH)?;
        let mut history: Vec<(String, Codes)> = Vec::new();
        let mut all: Codes = vec![Vec::new(); self.config.num_codebooks()];
        let limit = self.slow.max_seq_len().saturating_sub(PROMPT_HEADROOM);
        for batch in batches {
            let (prompt, dropped) = self.prompts.build_within(&batch, voice, &history, limit)?;
            history.drain(..dropped);
            let g = self.generate(&prompt, opts, None)?;
            for (a, c) in all.iter_mut().zip(&g.codes) {
                a.extend_from_slice(c);
            }
            history.push((batch, g.codes));
        }
        Ok(all)
    }
}
