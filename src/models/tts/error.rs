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
    /// A configuration file's value, or the file as a whole (`field` empty), is unusable.
    #[error("{file}: {}{msg}", field_prefix(.field))]
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
            load @ WeightError::Load { .. } => {
                ModelError::Candle(candle_core::Error::Msg(load.to_string()))
            }
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

/// "field `NAME`: " before a [`ModelError::Config`]'s message, nothing for the whole file.
fn field_prefix(field: &str) -> String {
    if field.is_empty() {
        String::new()
    } else {
        format!("field `{field}`: ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_file_error_names_no_empty_field_or_tensor() {
        let config = |field: &str| ModelError::Config {
            file: "codec.pth".into(),
            field: field.into(),
            msg: "not a checkpoint".into(),
        };
        assert_eq!(config("").to_string(), "codec.pth: not a checkpoint");
        assert_eq!(
            config("hop").to_string(),
            "codec.pth: field `hop`: not a checkpoint"
        );
        let load = |name: &str| -> ModelError {
            WeightError::Load {
                file: "model.safetensors".into(),
                name: name.into(),
                source: Box::new(candle_core::Error::Msg("invalid header length".into())),
            }
            .into()
        };
        assert_eq!(
            load("").to_string(),
            "model.safetensors: invalid header length"
        );
        assert_eq!(
            load("w").to_string(),
            "model.safetensors: tensor `w`: invalid header length"
        );
    }
}
