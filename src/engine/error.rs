//! Engine errors.

use crate::models::tts::ModelError;

/// Everything that can go wrong in [`crate::engine`] before a request is running. Errors that happen
/// while a request runs arrive as `EngineEvent::Finished { reason: FinishReason::Error(msg), .. }`.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A stage-configuration YAML value is missing, mistyped or out of range. `key` is the path of the
    /// offending value, e.g. `stage_args[1].engine_args.codec_chunk_frames`.
    #[error("stage config {source_name}: {key}: {msg}")]
    Config {
        /// The YAML file, or `<string>` for [`crate::engine::StageConfig::from_yaml_str`].
        source_name: String,
        /// Path of the key inside the document (`stage_args[0].runtime.devices`).
        key: String,
        /// What was expected and what was found.
        msg: String,
    },
    /// Reading a stage-configuration file failed.
    #[error("stage config {path}: {source}")]
    ConfigIo {
        /// The file that could not be read.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A device string could not be parsed or the device cannot be opened.
    #[error("device {spec:?}: {msg}")]
    Device {
        /// The device as written ("cuda:1", "gpu", …).
        spec: String,
        /// Why it was refused.
        msg: String,
    },
    /// Loading a stage's model failed.
    #[error("loading stage {stage} ({name}): {source}")]
    Load {
        /// 0 (AR) or 1 (codec decoder).
        stage: usize,
        /// The stage's model (`qwen3_tts`, `code2wav`, `fish_speech`, `fish_codec`), or `model`
        /// when the checkpoint's family could not be told.
        name: &'static str,
        /// The model error.
        source: ModelError,
    },
    /// The two stages disagree about the model (e.g. code groups versus codec quantizers).
    #[error("model mismatch: {0}")]
    Mismatch(String),
    /// A request field is invalid; returned synchronously by `Engine::submit`.
    #[error("invalid request: {field} = {value}: {msg}")]
    InvalidRequest {
        /// The request field (`voice.text`, `sampling.top_p`, `chunk_frames`, …).
        field: String,
        /// The offending value as text.
        value: String,
        /// What is allowed.
        msg: String,
    },
    /// Admission refused a request: stage 0 already holds `max_num_seqs` running requests and
    /// `max_waiting` waiting ones. The running ones are unharmed; try again later or raise the
    /// limits in the stage config.
    #[error(
        "engine full: {held} requests running or waiting (max_num_seqs = {max_num_seqs} running + \
         max_waiting = {max_waiting} waiting); raise stage_args[0].engine_args.max_waiting or \
         max_num_seqs in the stage config, or use an engine of its own"
    )]
    Busy {
        /// Requests stage 0 held when this one was refused.
        held: usize,
        /// `stage_args[0].engine_args.max_num_seqs`.
        max_num_seqs: usize,
        /// `stage_args[0].engine_args.max_waiting`.
        max_waiting: usize,
    },
    /// A stage thread could not be spawned or died.
    #[error("stage {stage}: {msg}")]
    Stage {
        /// 0 (AR) or 1 (Code2Wav).
        stage: usize,
        /// What happened.
        msg: String,
    },
}
