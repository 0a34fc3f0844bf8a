//! The model families omnitts runs, keyed by config.json's `model_type` (as vLLM-Omni registers
//! its models by architecture): for each, the names of its two stages in a stage config
//! (`model_stage`, `model_arch`), its built-in stage configs, its request rules, and the one
//! `match` that picks the stage implementations the engine is monomorphised over.

use std::path::Path;
use std::sync::Arc;

use super::fish_speech::{FishAr, FishDecoder, FishRules};
use super::qwen3_tts::code2wav::Code2Wav;
use super::qwen3_tts::{ArModel, Qwen3Rules};
use super::tts::{ModelError, Stage0Model, Stage1Model, VoiceRules};

/// A stage's names in a stage config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageNames {
    /// `engine_args.model_stage` (required in a stage config).
    pub model_stage: &'static str,
    /// `engine_args.model_arch` (optional; checked when given).
    pub model_arch: &'static str,
}

/// Which implementation a family has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `qwen3_tts`.
    Qwen3Tts,
    /// `fish_qwen3_omni`.
    FishSpeech,
}

/// One model family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Family {
    /// Its implementation.
    pub kind: Kind,
    /// config.json's `model_type`.
    pub model_type: &'static str,
    /// The family in words.
    pub name: &'static str,
    /// The output rate of the family's codec decoder, Hz (the elements' pad templates list these;
    /// a loaded checkpoint's own description gives the rate its caps carry).
    pub sample_rate: u32,
    /// Stage 0 and stage 1.
    pub stages: [StageNames; 2],
    /// The built-in async-chunk stage config (YAML) and its file name.
    pub default_config: (&'static str, &'static str),
    /// The built-in batch stage config (stage 1 decodes once stage 0 is done).
    pub batch_config: (&'static str, &'static str),
    /// The files a checkpoint cannot load without: one of each group (a hub snapshot without
    /// them is incomplete).
    pub required_files: &'static [&'static [&'static str]],
    /// Whether stage 0 loads quantized weight forms (`engine_args.quantization` int8 or 4-bit);
    /// a family without them loads dense weights only.
    pub quantized_weights: bool,
}

/// Qwen3-TTS (12 Hz): talker + code predictor, Code2Wav at 24 kHz.
pub const QWEN3_TTS: Family = Family {
    kind: Kind::Qwen3Tts,
    model_type: "qwen3_tts",
    name: "Qwen3-TTS",
    sample_rate: 24_000,
    stages: [
        StageNames {
            model_stage: "qwen3_tts",
            model_arch: "Qwen3TTSTalkerForConditionalGeneration",
        },
        StageNames {
            model_stage: "code2wav",
            model_arch: "Qwen3TTSCode2Wav",
        },
    ],
    default_config: (
        include_str!("../../configs/qwen3_tts.yaml"),
        "configs/qwen3_tts.yaml",
    ),
    batch_config: (
        include_str!("../../configs/qwen3_tts_batch.yaml"),
        "configs/qwen3_tts_batch.yaml",
    ),
    required_files: &[
        &["config.json"],
        &["generation_config.json"],
        &["vocab.json"],
        &["merges.txt"],
        &["model.safetensors", "model.safetensors.index.json"],
        &["speech_tokenizer/config.json"],
        &["speech_tokenizer/model.safetensors"],
    ],
    quantized_weights: true,
};

/// Fish Audio S2 Pro: slow AR + fast AR, the DAC codec at 44.1 kHz.
pub const FISH_SPEECH: Family = Family {
    kind: Kind::FishSpeech,
    model_type: "fish_qwen3_omni",
    name: "Fish Audio S2 Pro",
    sample_rate: 44_100,
    stages: [
        StageNames {
            model_stage: "fish_speech",
            model_arch: "FishSpeechSlowARForConditionalGeneration",
        },
        StageNames {
            model_stage: "fish_codec",
            model_arch: "FishSpeechDACDecoder",
        },
    ],
    default_config: (
        include_str!("../../configs/fish_speech.yaml"),
        "configs/fish_speech.yaml",
    ),
    batch_config: (
        include_str!("../../configs/fish_speech_batch.yaml"),
        "configs/fish_speech_batch.yaml",
    ),
    required_files: &[
        &["config.json"],
        &["tokenizer.json"],
        &["model.safetensors", "model.safetensors.index.json"],
        &["codec.pth"],
    ],
    quantized_weights: false,
};

/// Every family, in the order messages list them; the first is the default family, whose stage
/// configs are the engine's defaults ([`StageConfig::default_async`](crate::engine::StageConfig::default_async)).
pub const FAMILIES: [Family; 2] = [QWEN3_TTS, FISH_SPEECH];

/// The known `model_type`s, for messages: `qwen3_tts, fish_qwen3_omni`.
pub fn known_model_types() -> String {
    FAMILIES
        .iter()
        .map(|f| f.model_type)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `model_stage` names a stage config may give stage `stage_id` (0 or 1).
pub fn stage_names(stage_id: usize) -> Vec<&'static str> {
    FAMILIES
        .iter()
        .filter_map(|f| f.stages.get(stage_id).map(|s| s.model_stage))
        .collect()
}

/// The family of config.json's `model_type`. Errors: [`ModelError::Config`] naming the key
/// and listing the known ones.
pub fn family(model_type: &str, file: &Path) -> Result<&'static Family, ModelError> {
    FAMILIES
        .iter()
        .find(|f| f.model_type == model_type)
        .ok_or_else(|| ModelError::Config {
            file: file.to_path_buf(),
            field: "model_type".into(),
            msg: format!(
                "unknown model type {model_type:?}; omnitts runs: {}",
                known_model_types()
            ),
        })
}

/// The family of the checkpoint in `dir` (its config.json's `model_type`). Errors: an
/// unreadable or invalid config.json, a missing or unknown `model_type` (naming the key and
/// listing the known ones).
pub fn detect(dir: &Path) -> Result<&'static Family, ModelError> {
    let file = dir.join("config.json");
    let text = std::fs::read_to_string(&file).map_err(|source| ModelError::Io {
        path: file.clone(),
        source,
    })?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| ModelError::Json {
        path: file.clone(),
        msg: e.to_string(),
    })?;
    let model_type = v
        .get("model_type")
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| ModelError::Config {
            file: file.clone(),
            field: "model_type".into(),
            msg: format!("missing; omnitts runs: {}", known_model_types()),
        })?;
    family(model_type, &file)
}

/// What the engine does with a family's stage types: `visit::<A, C>` runs with stage 0's and
/// stage 1's implementations (the engine's loops are monomorphised over them).
pub trait StageVisitor {
    /// The visit's result.
    type Out;
    /// Runs with the family's stage-0 model `A` and stage-1 model `C`.
    fn visit<A: Stage0Model, C: Stage1Model>(self) -> Self::Out;
}

impl Family {
    /// The request rules and description of the checkpoint in `dir` (configs only, no weights).
    pub fn rules(&self, dir: &Path) -> Result<Arc<dyn VoiceRules>, ModelError> {
        Ok(match self.kind {
            Kind::FishSpeech => Arc::new(FishRules::open(dir)?),
            Kind::Qwen3Tts => Arc::new(Qwen3Rules::open(dir)?),
        })
    }

    /// Calls `v` with this family's stage implementations: the one place the engine's stage
    /// types are chosen.
    pub fn visit<V: StageVisitor>(&self, v: V) -> V::Out {
        match self.kind {
            Kind::FishSpeech => v.visit::<FishAr, FishDecoder>(),
            Kind::Qwen3Tts => v.visit::<ArModel, Code2Wav>(),
        }
    }
}
