//! Model implementations. Each model mirrors its Hugging Face checkpoint layout.

pub mod qwen3_tts;
