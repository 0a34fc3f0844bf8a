//! The Fish Speech model's error type.

use std::path::PathBuf;

use crate::nn::WeightError;

/// Errors of loading and running Fish Speech (S2 Pro).
#[derive(Debug, thiserror::Error)]
pub enum FishError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {msg}")]
    Config { path: PathBuf, msg: String },
    #[error(transparent)]
    Weights(#[from] WeightError),
    #[error("{file}: {msg}")]
    Checkpoint { file: PathBuf, msg: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("invalid request: {field}: {msg}")]
    InvalidRequest { field: &'static str, msg: String },
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// Results of this module.
pub type Result<T> = std::result::Result<T, FishError>;
