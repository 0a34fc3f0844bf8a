//! Qwen3-TTS (12 Hz family) in candle, loading the published checkpoints unchanged.
//!
//! Reference: QwenLM/Qwen3-TTS `qwen_tts/core/models/modeling_qwen3_tts.py` and
//! `qwen_tts/core/tokenizer_12hz/modeling_qwen3_tts_tokenizer_v2.py`.

pub mod code2wav;
pub mod code_predictor;
pub mod config;
pub mod prompt;
pub mod sampling;
pub mod talker;
pub mod tokenizer;
