//! Model implementations. Each model mirrors its Hugging Face checkpoint layout; [`tts`] is the
//! seam they share with the engine, [`registry`] the families keyed by config.json's `model_type`.

pub mod fish_speech;
pub mod qwen3_tts;
pub mod registry;
pub mod tts;
