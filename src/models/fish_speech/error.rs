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

impl From<FishError> for crate::models::tts::ModelError {
    /// The seam's error: a refused request keeps its field (the value is not quoted: the message
    /// says what was wrong), configuration and file errors name their file.
    fn from(e: FishError) -> Self {
        use crate::models::tts::ModelError;
        match e {
            FishError::Io { path, source } => ModelError::Io { path, source },
            FishError::Config { path, msg } => ModelError::Config {
                file: path,
                field: String::new(),
                msg,
            },
            FishError::Weights(w) => w.into(),
            FishError::Checkpoint { file, msg } => ModelError::Config {
                file,
                field: String::new(),
                msg,
            },
            FishError::Tokenizer(m) => ModelError::Tokenizer(m),
            FishError::InvalidRequest { field, msg } => ModelError::InvalidRequest {
                field: field.to_string(),
                value: String::new(),
                msg,
            },
            FishError::Candle(c) => ModelError::Candle(c),
        }
    }
}
