//! Model implementations. Each model mirrors its Hugging Face checkpoint layout.

pub mod fish_speech;
pub mod qwen3_tts;
pub mod tts;
