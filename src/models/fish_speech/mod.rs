//! Fish Audio S2 Pro (`fishaudio/s2-pro`, config.json `model_type` `fish_qwen3_omni`): a dual-AR
//! text-to-speech model and its codec, in candle. docs/fish-speech.md describes the architecture
//! and where each fact comes from.
//!
//! - [`config`]: the nested `config.json`; [`tokenizer`] and [`prompt`]: the conversation prompt
//!   (text, or text with a reference voice's codes and transcript);
//! - [`slow_ar`]: the Qwen3 backbone over text and semantic tokens (one main token a frame,
//!   restricted to the 4096 semantic tokens and `<|im_end|>`); [`fast_ar`]: the nested AR that
//!   fills codebooks 1..=9 of each frame; [`layers`] and [`rope`]: their shared block;
//! - [`sampler`] and [`generate`]: the reference's sampling order and stop rule;
//! - [`codec`]: the modified DAC (44.1 kHz, 2048 samples a frame, 10 codebooks): decoder and
//!   encoder, read from `codec.pth` with candle's pickle reader;
//! - the model seam: [`rules`] (the description and request checks), [`stage0`] (both ARs as
//!   the engine's stage 0: the slow AR per row, the fast AR batched over the rows), [`stage1`]
//!   (the codec decoder as its stage 1).

pub mod checkpoint;
pub mod codec;
pub mod config;
pub mod error;
pub mod fast_ar;
pub mod generate;
pub mod graphs;
pub mod layers;
pub mod model;
pub mod prompt;
pub mod rope;
pub mod rules;
pub mod sampler;
pub mod slow_ar;
pub mod stage0;
pub mod stage1;
pub mod tokenizer;

pub use config::FishConfig;
pub use error::{FishError, Result};
pub use generate::{GenerateOptions, Generated};
pub use model::FishModel;
pub use prompt::{Codes, Prompt, PromptBuilder, VoiceReference};
pub use rules::FishRules;
pub use sampler::SamplingParams;
pub use stage0::{FishAr, FishPrefill, FishSession};
pub use stage1::{FishDecoder, FishStream};
pub use tokenizer::FishTokenizer;
