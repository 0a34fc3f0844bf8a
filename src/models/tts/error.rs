//! The error type of every model family (loading a checkpoint, checking and running a request).

use std::path::PathBuf;

use crate::nn::WeightError;

/// Errors of loading and running a model. `InvalidRequest` names the request field, its value and
/// why it was refused; the engine reports it to the caller, every other kind as a stage failure.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: invalid JSON: {msg}")]
    Json { path: PathBuf, msg: String },
    #[error("{file}: missing tensor `{name}`")]
    MissingTensor { file: PathBuf, name: String },
    #[error("{file}: tensor `{name}` has shape {got:?}, expected {expected:?}")]
    Shape {
        file: PathBuf,
        name: String,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    #[error("{file}: field `{field}`: {msg}")]
    Config {
        file: PathBuf,
        field: String,
        msg: String,
    },
    #[error("invalid request: {field} = {value:?}: {msg}")]
    InvalidRequest {
        field: String,
        value: String,
        msg: String,
    },
    /// A prefill's `stop` callback answered true (the request was cancelled).
    #[error("prefill stopped (request cancelled)")]
    Stopped,
    /// An open-text session's next frame needs a text id that has not arrived: wait for it.
    #[error("the next frame's text has not arrived yet")]
    TextPending,
    /// A session was asked for before its prefill was complete.
    #[error("prefill incomplete: {remaining} prompt positions still to run")]
    PrefillIncomplete { remaining: usize },
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}

impl From<WeightError> for ModelError {
    fn from(e: WeightError) -> Self {
        match e {
            WeightError::Missing { file, name } => ModelError::MissingTensor { file, name },
            WeightError::Shape {
                file,
                name,
                expected,
                got,
            } => ModelError::Shape {
                file,
                name,
                expected,
                got,
            },
            WeightError::Load { file, name, source } => ModelError::Candle(
                candle_core::Error::Msg(format!("{}: tensor `{name}`: {source}", file.display())),
            ),
        }
    }
}

/// Longest value, in characters, an [`ModelError::InvalidRequest`] made by
/// [`ModelError::invalid`] quotes (a longer one is cut with "…", so that a refused megabyte of
/// text does not become a megabyte of error message).
pub const QUOTED_VALUE_CHARS: usize = 80;

impl ModelError {
    /// [`ModelError::InvalidRequest`] for `field` = `value` (cut to [`QUOTED_VALUE_CHARS`]
    /// characters and "…") and why.
    pub fn invalid(field: &str, value: &str, msg: impl Into<String>) -> ModelError {
        let mut shown: String = value.chars().take(QUOTED_VALUE_CHARS).collect();
        if value.chars().nth(QUOTED_VALUE_CHARS).is_some() {
            shown.push('…');
        }
        ModelError::InvalidRequest {
            field: field.to_string(),
            value: shown,
            msg: msg.into(),
        }
    }
}
