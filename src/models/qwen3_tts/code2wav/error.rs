//! TEMPORARY: the model error type of the contract, defined here until the `ar` branch's
//! `ModelError` in `src/models/qwen3_tts/mod.rs` is merged; the lead replaces this file by
//! `pub use super::super::ModelError` at merge (same variants and fields).

use std::path::PathBuf;

/// Errors of the Qwen3-TTS model stages.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A JSON file did not parse (the message names the field, line and column).
    #[error("invalid JSON in {}: {msg}", path.display())]
    Json { path: PathBuf, msg: String },
    /// A weight tensor is absent from a safetensors file.
    #[error("tensor {name} missing from {}", file.display())]
    MissingTensor { file: PathBuf, name: String },
    /// A weight tensor has an unexpected shape.
    #[error("tensor {name} in {} has shape {got:?}, expected {expected:?}", file.display())]
    Shape {
        file: PathBuf,
        name: String,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    /// A configuration value is invalid or inconsistent.
    #[error("invalid config {}: field {field}: {msg}", file.display())]
    Config {
        file: PathBuf,
        field: String,
        msg: String,
    },
    /// A request (here: codes) is invalid.
    #[error("invalid request: {field} = {value}: {msg}")]
    InvalidRequest {
        field: String,
        value: String,
        msg: String,
    },
    /// A tensor operation failed.
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    /// The text tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}
