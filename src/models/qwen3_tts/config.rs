//! `config.json` and `generation_config.json` of a Qwen3-TTS checkpoint.
//!
//! Every size and id is read from the JSON; the reference config classes' defaults
//! (`configuration_qwen3_tts.py`) are *not* the checkpoint values (e.g. codec ids 4196+,
//! 32 code groups, rope theta 1e4) and are never used for required fields. A missing or
//! malformed field is a [`ModelError::Config`] naming the file and the dotted field path.
//! Optional fields default exactly like Hugging Face's `PretrainedConfig` does
//! (`attention_bias` false, `use_sliding_window` false, `rope_scaling` none, `hidden_act` silu),
//! and `null` means absent.
//!
//! The JSON is read with serde derive into structs that mirror it (private here), then checked
//! and turned into the public types: the variant from `tts_model_type`, lower-cased speaker and
//! language maps, ids inside their vocabularies, the decoder stacks as [`TransformerConfig`].

use std::collections::BTreeMap;
use std::path::Path;

use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::ModelError;
use crate::config_path;
use crate::nn::TransformerConfig;

/// The checkpoint kind (`tts_model_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ModelVariant {
    /// `custom_voice`: preset speakers (+ instruct for the larger sizes).
    CustomVoice,
    /// `voice_design`: the voice is described by the instruct text.
    VoiceDesign,
    /// `base`: voice cloning from reference audio (x-vector / ICL).
    Base,
}

impl ModelVariant {
    /// The `tts_model_type` string.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelVariant::CustomVoice => "custom_voice",
            ModelVariant::VoiceDesign => "voice_design",
            ModelVariant::Base => "base",
        }
    }
}

impl std::fmt::Display for ModelVariant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `talker_config.code_predictor_config` (reference `Qwen3TTSTalkerCodePredictorConfig`).
#[derive(Debug, Clone, PartialEq)]
pub struct CodePredictorConfig {
    pub transformer: TransformerConfig,
    /// Codebook size of codebooks 1.. (2048).
    pub vocab_size: usize,
    pub num_code_groups: usize,
    pub max_position_embeddings: Option<usize>,
}

/// `talker_config` (reference `Qwen3TTSTalkerConfig`).
#[derive(Debug, Clone, PartialEq)]
pub struct TalkerConfig {
    pub transformer: TransformerConfig,
    /// Codec vocabulary of the talker (3072): codebook-0 codes and control rows.
    pub vocab_size: usize,
    pub text_vocab_size: usize,
    pub text_hidden_size: usize,
    pub num_code_groups: usize,
    pub max_position_embeddings: Option<usize>,
    pub codec_pad_id: u32,
    pub codec_bos_id: u32,
    pub codec_eos_token_id: u32,
    pub codec_think_id: u32,
    pub codec_nothink_id: u32,
    pub codec_think_bos_id: u32,
    pub codec_think_eos_id: u32,
    /// Language name (lower case) → codec row; includes the dialects.
    pub codec_language_id: BTreeMap<String, u32>,
    /// Speaker name (lower case) → codec row. JSON values may be ints or one-element lists.
    pub spk_id: BTreeMap<String, u32>,
    /// Speaker name (lower case) → dialect language name, for speakers whose JSON value is a
    /// string (`false` entries are omitted).
    pub spk_is_dialect: BTreeMap<String, String>,
    pub code_predictor_config: CodePredictorConfig,
}

/// `speaker_encoder_config` (reference `Qwen3TTSSpeakerEncoderConfig`; used by Base only).
#[derive(Debug, Clone, PartialEq)]
pub struct SpeakerEncoderConfig {
    /// Output x-vector width (= talker hidden size).
    pub enc_dim: Option<usize>,
    pub sample_rate: Option<usize>,
    /// The raw object, for the (later) speaker encoder.
    pub raw: Value,
}

/// `config.json` (reference `Qwen3TTSConfig`).
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen3TtsConfig {
    pub variant: ModelVariant,
    /// `tts_model_type` as written.
    pub tts_model_type: String,
    /// `tts_model_size`, e.g. `0b6` / `1b7`.
    pub tts_model_size: String,
    pub tokenizer_type: Option<String>,
    pub tts_pad_token_id: u32,
    pub tts_bos_token_id: u32,
    pub tts_eos_token_id: u32,
    pub im_start_token_id: Option<u32>,
    pub im_end_token_id: Option<u32>,
    pub assistant_token_id: Option<u32>,
    pub talker_config: TalkerConfig,
    pub speaker_encoder_config: Option<SpeakerEncoderConfig>,
}

/// Deserializes `T` from the JSON object `v`, found at `path` of `file` (`""` for the root).
/// Keys that no field takes are ignored, as the reference's config classes ignore them. Pass a
/// value through [`without_nulls`] first.
///
/// Errors: [`ModelError::Config`] naming `file` and the field path (`talker_config.head_dim`,
/// `(root)` for the document itself).
pub(crate) fn from_json<T: DeserializeOwned>(
    file: &Path,
    v: &Value,
    path: &str,
) -> Result<T, ModelError> {
    let field = |p: &str| {
        if p.is_empty() {
            "(root)".to_string()
        } else {
            p.to_string()
        }
    };
    if !v.is_object() {
        return Err(ModelError::Config {
            file: file.to_path_buf(),
            field: field(path),
            msg: format!("expected a JSON object, got {v}"),
        });
    }
    config_path::deserialize(v, path, |_| {}).map_err(|e| ModelError::Config {
        file: file.to_path_buf(),
        field: field(&e.path),
        msg: e.msg,
    })
}

/// `v` without the `null` members of its objects: Hugging Face writes an unset value as `null`,
/// and omnitts reads it as absent (the field's default, or missing when it is required).
pub(crate) fn without_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(without_nulls).collect()),
        other => other.clone(),
    }
}

/// The validation pass over deserialized values: errors name `file` and `path.key`.
struct Fields<'a> {
    file: &'a Path,
    path: &'a str,
}

impl Fields<'_> {
    fn err(&self, key: &str, msg: impl Into<String>) -> ModelError {
        ModelError::Config {
            file: self.file.to_path_buf(),
            field: config_path::join(self.path, key),
            msg: msg.into(),
        }
    }

    fn positive(&self, key: &str, v: usize) -> Result<usize, ModelError> {
        if v == 0 {
            return Err(self.err(key, "must be > 0"));
        }
        Ok(v)
    }
}

/// The keys of a Qwen3 decoder stack, read from the talker's and from the code predictor's
/// config object (each object is read twice: as its own struct and as this one).
#[derive(Deserialize)]
struct StackJson {
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: usize,
    head_dim: usize,
    rms_norm_eps: f64,
    rope_theta: f64,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    use_sliding_window: bool,
    sliding_window: Option<usize>,
    #[serde(default = "silu")]
    hidden_act: String,
    rope_scaling: Option<RopeScalingJson>,
}

fn silu() -> String {
    "silu".to_string()
}

/// `rope_scaling`: only the `default` rope type exists in Qwen3-TTS (the talker's interleaved
/// MRoPE with identical position streams is plain 1-D RoPE, docs/qwen3-tts.md §3.2).
#[derive(Deserialize)]
struct RopeScalingJson {
    rope_type: Option<String>,
    /// The older spelling of `rope_type`.
    #[serde(rename = "type")]
    kind: Option<String>,
}

impl StackJson {
    /// Sizes of the decoder stack of the config object at `path`.
    fn read(file: &Path, v: &Value, path: &str) -> Result<TransformerConfig, ModelError> {
        let s: StackJson = from_json(file, v, path)?;
        let f = Fields { file, path };
        if s.hidden_act != "silu" {
            return Err(f.err(
                "hidden_act",
                format!("unsupported activation {:?} (only \"silu\")", s.hidden_act),
            ));
        }
        if let Some(rs) = &s.rope_scaling
            && let Some(t) = rs.rope_type.as_ref().or(rs.kind.as_ref())
            && t != "default"
        {
            return Err(f.err(
                "rope_scaling.rope_type",
                format!("unsupported rope type {t:?} (only \"default\")"),
            ));
        }
        let heads = f.positive("num_attention_heads", s.num_attention_heads)?;
        let kv = f.positive("num_key_value_heads", s.num_key_value_heads)?;
        if heads % kv != 0 {
            return Err(f.err(
                "num_key_value_heads",
                format!("{kv} does not divide num_attention_heads {heads}"),
            ));
        }
        let head_dim = f.positive("head_dim", s.head_dim)?;
        if head_dim % 2 != 0 {
            return Err(f.err("head_dim", format!("{head_dim} must be even for RoPE")));
        }
        let sliding_window = match (s.use_sliding_window, s.sliding_window) {
            (false, _) => None,
            (true, None) => return Err(f.err("sliding_window", "missing field")),
            (true, Some(w)) => Some(f.positive("sliding_window", w)?),
        };
        Ok(TransformerConfig {
            hidden_size: f.positive("hidden_size", s.hidden_size)?,
            intermediate_size: f.positive("intermediate_size", s.intermediate_size)?,
            num_hidden_layers: s.num_hidden_layers,
            num_attention_heads: heads,
            num_key_value_heads: kv,
            head_dim,
            rms_norm_eps: s.rms_norm_eps,
            rope_theta: s.rope_theta,
            attention_bias: s.attention_bias,
            sliding_window,
        })
    }
}

/// A codec row id: an integer, or a list of one integer (as `spk_id` writes some speakers).
struct CodecId(u64);

impl<'de> Deserialize<'de> for CodecId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        let scalar = match &v {
            Value::Array(a) if a.len() == 1 => &a[0],
            other => other,
        };
        scalar
            .as_u64()
            .map(CodecId)
            .ok_or_else(|| D::Error::custom(format!("expected an id (int or [int]), got {v}")))
    }
}

/// A `spk_is_dialect` value: `false` (no dialect) or the dialect's `codec_language_id` key.
struct Dialect(Option<String>);

impl<'de> Deserialize<'de> for Dialect {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::Bool(false) => Ok(Dialect(None)),
            Value::String(s) => Ok(Dialect(Some(s))),
            other => Err(D::Error::custom(format!(
                "expected false or a dialect name, got {other}"
            ))),
        }
    }
}

/// `config.json` as written; `talker_config` is read by [`TalkerJson`] and [`StackJson`].
#[derive(Deserialize)]
struct ConfigJson {
    tts_model_type: String,
    tts_model_size: String,
    tokenizer_type: Option<String>,
    tts_pad_token_id: u32,
    tts_bos_token_id: u32,
    tts_eos_token_id: u32,
    im_start_token_id: Option<u32>,
    im_end_token_id: Option<u32>,
    assistant_token_id: Option<u32>,
    talker_config: Value,
    speaker_encoder_config: Option<Value>,
}

/// `talker_config` less its decoder stack; `code_predictor_config` is read by
/// [`CodePredictorJson`] and [`StackJson`].
#[derive(Deserialize)]
struct TalkerJson {
    vocab_size: usize,
    text_vocab_size: usize,
    text_hidden_size: usize,
    num_code_groups: usize,
    max_position_embeddings: Option<usize>,
    codec_pad_id: u32,
    codec_bos_id: u32,
    codec_eos_token_id: u32,
    codec_think_id: u32,
    codec_nothink_id: u32,
    codec_think_bos_id: u32,
    codec_think_eos_id: u32,
    codec_language_id: BTreeMap<String, CodecId>,
    spk_id: BTreeMap<String, CodecId>,
    #[serde(default)]
    spk_is_dialect: BTreeMap<String, Dialect>,
    code_predictor_config: Value,
}

/// `talker_config.code_predictor_config` less its decoder stack.
#[derive(Deserialize)]
struct CodePredictorJson {
    vocab_size: usize,
    num_code_groups: usize,
    max_position_embeddings: Option<usize>,
}

/// `speaker_encoder_config`: the sizes the checkpoint check needs (the speaker encoder reads the
/// rest from [`SpeakerEncoderConfig::raw`]).
#[derive(Deserialize)]
struct SpeakerEncoderJson {
    enc_dim: Option<usize>,
    sample_rate: Option<usize>,
}

/// Lower-cased names → ids below `vocab` (the map at `f.path`).
fn id_map(
    f: &Fields<'_>,
    map: BTreeMap<String, CodecId>,
    vocab: usize,
) -> Result<BTreeMap<String, u32>, ModelError> {
    map.into_iter()
        .map(|(name, CodecId(id))| {
            if id >= vocab as u64 {
                return Err(f.err(
                    &name,
                    format!("id {id} is outside the codec vocabulary (vocab_size {vocab})"),
                ));
            }
            Ok((name.to_lowercase(), id as u32))
        })
        .collect()
}

impl Qwen3TtsConfig {
    /// Parses and validates `config.json` at `path`.
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        let v = read_json(path)?;
        Self::from_value(path, &v)
    }

    /// Parses and validates an already-read `config.json` (`file` is used in errors).
    pub fn from_value(file: &Path, v: &Value) -> Result<Self, ModelError> {
        let v = without_nulls(v);
        let root: ConfigJson = from_json(file, &v, "")?;
        let r = Fields { file, path: "" };
        let variant = match root.tts_model_type.as_str() {
            "custom_voice" => ModelVariant::CustomVoice,
            "voice_design" => ModelVariant::VoiceDesign,
            "base" => ModelVariant::Base,
            other => {
                return Err(r.err(
                    "tts_model_type",
                    format!("unknown model type {other:?} (custom_voice, voice_design or base)"),
                ));
            }
        };

        let t = Fields {
            file,
            path: "talker_config",
        };
        let transformer = StackJson::read(file, &root.talker_config, t.path)?;
        let talker: TalkerJson = from_json(file, &root.talker_config, t.path)?;
        let vocab_size = t.positive("vocab_size", talker.vocab_size)?;
        let text_vocab_size = t.positive("text_vocab_size", talker.text_vocab_size)?;
        let num_code_groups = t.positive("num_code_groups", talker.num_code_groups)?;
        if num_code_groups < 2 {
            return Err(t.err("num_code_groups", "must be at least 2"));
        }
        let codec_id = |key: &str, id: u32| -> Result<u32, ModelError> {
            if id as usize >= vocab_size {
                return Err(t.err(
                    key,
                    format!("id {id} is outside the codec vocabulary (vocab_size {vocab_size})"),
                ));
            }
            Ok(id)
        };
        let codec_pad_id = codec_id("codec_pad_id", talker.codec_pad_id)?;
        let codec_bos_id = codec_id("codec_bos_id", talker.codec_bos_id)?;
        let codec_eos_token_id = codec_id("codec_eos_token_id", talker.codec_eos_token_id)?;
        let codec_think_id = codec_id("codec_think_id", talker.codec_think_id)?;
        let codec_nothink_id = codec_id("codec_nothink_id", talker.codec_nothink_id)?;
        let codec_think_bos_id = codec_id("codec_think_bos_id", talker.codec_think_bos_id)?;
        let codec_think_eos_id = codec_id("codec_think_eos_id", talker.codec_think_eos_id)?;
        let codec_language_id = id_map(
            &Fields {
                file,
                path: "talker_config.codec_language_id",
            },
            talker.codec_language_id,
            vocab_size,
        )?;
        let spk_id = id_map(
            &Fields {
                file,
                path: "talker_config.spk_id",
            },
            talker.spk_id,
            vocab_size,
        )?;
        let d = Fields {
            file,
            path: "talker_config.spk_is_dialect",
        };
        let mut spk_is_dialect = BTreeMap::new();
        for (name, Dialect(dialect)) in talker.spk_is_dialect {
            let Some(dialect) = dialect else { continue };
            let dialect = dialect.to_lowercase();
            if !codec_language_id.contains_key(&dialect) {
                return Err(d.err(
                    &name,
                    format!("dialect {dialect:?} is not a key of codec_language_id"),
                ));
            }
            spk_is_dialect.insert(name.to_lowercase(), dialect);
        }

        let c = Fields {
            file,
            path: "talker_config.code_predictor_config",
        };
        let cp_transformer = StackJson::read(file, &talker.code_predictor_config, c.path)?;
        let cp: CodePredictorJson = from_json(file, &talker.code_predictor_config, c.path)?;
        let cp_groups = c.positive("num_code_groups", cp.num_code_groups)?;
        if cp_groups != num_code_groups {
            return Err(c.err(
                "num_code_groups",
                format!("{cp_groups} differs from talker_config.num_code_groups {num_code_groups}"),
            ));
        }
        let code_predictor_config = CodePredictorConfig {
            transformer: cp_transformer,
            vocab_size: c.positive("vocab_size", cp.vocab_size)?,
            num_code_groups: cp_groups,
            max_position_embeddings: cp.max_position_embeddings,
        };
        // Codebook-0 codes share the talker vocabulary with control rows; every code must be
        // below the first suppressed id so that it can also index the code predictor tables.
        if vocab_size < 1024 {
            return Err(t.err("vocab_size", "must be at least 1024 (control rows)"));
        }

        let talker_config = TalkerConfig {
            transformer,
            vocab_size,
            text_vocab_size,
            text_hidden_size: t.positive("text_hidden_size", talker.text_hidden_size)?,
            num_code_groups,
            max_position_embeddings: talker.max_position_embeddings,
            codec_pad_id,
            codec_bos_id,
            codec_eos_token_id,
            codec_think_id,
            codec_nothink_id,
            codec_think_bos_id,
            codec_think_eos_id,
            codec_language_id,
            spk_id,
            spk_is_dialect,
            code_predictor_config,
        };

        let speaker_encoder_config = match root.speaker_encoder_config {
            None => None,
            Some(raw) => {
                let s: SpeakerEncoderJson = from_json(file, &raw, "speaker_encoder_config")?;
                Some(SpeakerEncoderConfig {
                    enc_dim: s.enc_dim,
                    sample_rate: s.sample_rate,
                    raw,
                })
            }
        };

        let text_id = |key: &str, id: u32| -> Result<u32, ModelError> {
            if id as usize >= text_vocab_size {
                return Err(r.err(
                    key,
                    format!("id {id} is outside the text vocabulary ({text_vocab_size})"),
                ));
            }
            Ok(id)
        };
        Ok(Self {
            variant,
            tts_model_type: root.tts_model_type,
            tts_model_size: root.tts_model_size,
            tokenizer_type: root.tokenizer_type,
            tts_pad_token_id: text_id("tts_pad_token_id", root.tts_pad_token_id)?,
            tts_bos_token_id: text_id("tts_bos_token_id", root.tts_bos_token_id)?,
            tts_eos_token_id: text_id("tts_eos_token_id", root.tts_eos_token_id)?,
            im_start_token_id: root.im_start_token_id,
            im_end_token_id: root.im_end_token_id,
            assistant_token_id: root.assistant_token_id,
            talker_config,
            speaker_encoder_config,
        })
    }

    /// Languages a request may name: `auto` plus every `codec_language_id` key that is not a
    /// dialect (reference `Qwen3TTSForConditionalGeneration.supported_languages`).
    pub fn supported_languages(&self) -> Vec<String> {
        let mut v = vec!["auto".to_string()];
        v.extend(
            self.talker_config
                .codec_language_id
                .keys()
                .filter(|k| !k.contains("dialect"))
                .cloned(),
        );
        v
    }

    /// Preset speakers (lower case, sorted).
    pub fn supported_speakers(&self) -> Vec<String> {
        self.talker_config.spk_id.keys().cloned().collect()
    }

    /// Whether the wrapper drops the instruct for this size: the reference tests
    /// `tts_model_size in "0b6"` (a substring test) in `generate_custom_voice`.
    pub fn ignores_instruct(&self) -> bool {
        self.variant == ModelVariant::CustomVoice && "0b6".contains(self.tts_model_size.as_str())
    }
}

/// `generation_config.json` (the defaults of the reference wrapper's generate calls). Keys left
/// out keep [`GenerationConfig::default`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct GenerationConfig {
    pub do_sample: bool,
    pub repetition_penalty: f64,
    pub temperature: f64,
    pub top_p: f64,
    pub top_k: usize,
    pub subtalker_dosample: bool,
    pub subtalker_temperature: f64,
    pub subtalker_top_p: f64,
    pub subtalker_top_k: usize,
    pub max_new_tokens: usize,
}

impl Default for GenerationConfig {
    /// The reference wrapper's hard defaults (`_merge_generate_kwargs`), used for keys missing
    /// from `generation_config.json`.
    fn default() -> Self {
        Self {
            do_sample: true,
            repetition_penalty: 1.05,
            temperature: 0.9,
            top_p: 1.0,
            top_k: 50,
            subtalker_dosample: true,
            subtalker_temperature: 0.9,
            subtalker_top_p: 1.0,
            subtalker_top_k: 50,
            max_new_tokens: 2048,
        }
    }
}

impl GenerationConfig {
    /// Parses `generation_config.json`. As in the reference wrapper, a key that is absent falls
    /// back to the hard default; a key with a wrong type is an error.
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        let v = read_json(path)?;
        Self::from_value(path, &v)
    }

    /// Parses an already-read `generation_config.json` (`file` is used in errors).
    pub fn from_value(file: &Path, v: &Value) -> Result<Self, ModelError> {
        from_json(file, &without_nulls(v), "")
    }
}

/// Reads and parses a JSON file.
pub(crate) fn read_json(path: &Path) -> Result<Value, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| ModelError::Json {
        path: path.to_path_buf(),
        msg: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample() -> Value {
        json!({
            "tts_model_type": "custom_voice", "tts_model_size": "0b6",
            "tts_pad_token_id": 151671, "tts_bos_token_id": 151672, "tts_eos_token_id": 151673,
            "talker_config": {
                "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "hidden_act": "silu",
                "rope_scaling": {"interleaved": true, "mrope_section": [4,2,2], "rope_type": "default"},
                "vocab_size": 3072, "text_vocab_size": 151936, "text_hidden_size": 16,
                "num_code_groups": 16, "codec_pad_id": 2148, "codec_bos_id": 2149,
                "codec_eos_token_id": 2150, "codec_think_id": 2154, "codec_nothink_id": 2155,
                "codec_think_bos_id": 2156, "codec_think_eos_id": 2157,
                "codec_language_id": {"english": 2050, "chinese": 2055, "sichuan_dialect": 2062},
                "spk_id": {"Vivian": 3065, "eric": [2875]},
                "spk_is_dialect": {"vivian": false, "eric": "sichuan_dialect"},
                "code_predictor_config": {
                    "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
                    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "vocab_size": 2048,
                    "num_code_groups": 16
                }
            }
        })
    }

    #[test]
    fn parses_ids_lists_and_dialects() {
        let c = Qwen3TtsConfig::from_value(Path::new("config.json"), &sample()).unwrap();
        assert_eq!(c.variant, ModelVariant::CustomVoice);
        assert_eq!(c.talker_config.spk_id["vivian"], 3065);
        assert_eq!(c.talker_config.spk_id["eric"], 2875);
        assert_eq!(c.talker_config.spk_is_dialect["eric"], "sichuan_dialect");
        assert!(!c.talker_config.spk_is_dialect.contains_key("vivian"));
        assert_eq!(c.talker_config.transformer.head_dim, 16);
        assert_eq!(c.supported_languages(), vec!["auto", "chinese", "english"]);
        assert!(c.ignores_instruct());
    }

    #[test]
    fn missing_field_names_file_and_path() {
        let mut v = sample();
        v["talker_config"]["code_predictor_config"]
            .as_object_mut()
            .unwrap()
            .remove("head_dim");
        let e = Qwen3TtsConfig::from_value(Path::new("/x/config.json"), &v).unwrap_err();
        let s = e.to_string();
        assert!(s.contains("/x/config.json"), "{s}");
        assert!(
            s.contains("talker_config.code_predictor_config.head_dim"),
            "{s}"
        );
    }

    #[test]
    fn bad_values_are_rejected() {
        let mut v = sample();
        v["talker_config"]["codec_eos_token_id"] = json!(5000);
        let s = Qwen3TtsConfig::from_value(Path::new("c.json"), &v)
            .unwrap_err()
            .to_string();
        assert!(s.contains("talker_config.codec_eos_token_id"), "{s}");
        let mut v = sample();
        v["talker_config"]["spk_is_dialect"]["eric"] = json!("klingon_dialect");
        let s = Qwen3TtsConfig::from_value(Path::new("c.json"), &v)
            .unwrap_err()
            .to_string();
        assert!(s.contains("talker_config.spk_is_dialect.eric"), "{s}");
        let mut v = sample();
        v["tts_model_type"] = json!("karaoke");
        assert!(Qwen3TtsConfig::from_value(Path::new("c.json"), &v).is_err());
        let mut v = sample();
        v["talker_config"]["hidden_size"] = json!("big");
        let s = Qwen3TtsConfig::from_value(Path::new("c.json"), &v)
            .unwrap_err()
            .to_string();
        assert!(s.contains("talker_config.hidden_size"), "{s}");
    }

    /// The field and message of the config error for `v`.
    fn config_error(v: &Value) -> (String, String) {
        match Qwen3TtsConfig::from_value(Path::new("c.json"), v) {
            Err(ModelError::Config { field, msg, .. }) => (field, msg),
            Err(e) => panic!("expected a config error, got {e}"),
            Ok(_) => panic!("expected a config error for {v}"),
        }
    }

    #[test]
    fn errors_name_the_field_and_the_value() {
        // (how the fixture's config is broken, the field named, the message).
        type Case = (Box<dyn Fn(&mut Value)>, &'static str, &'static str);
        let cases: Vec<Case> = vec![
            (
                Box::new(|v| *v = json!([1, 2])),
                "(root)",
                "expected a JSON object, got [1,2]",
            ),
            (
                Box::new(|v| v["tts_model_type"] = json!("karaoke")),
                "tts_model_type",
                "unknown model type \"karaoke\"",
            ),
            (
                Box::new(|v| v["talker_config"]["hidden_size"] = json!("big")),
                "talker_config.hidden_size",
                "\"big\"",
            ),
            (
                Box::new(|v| v["talker_config"]["num_key_value_heads"] = json!(3)),
                "talker_config.num_key_value_heads",
                "3 does not divide num_attention_heads 4",
            ),
            (
                Box::new(|v| v["talker_config"]["hidden_act"] = json!("gelu")),
                "talker_config.hidden_act",
                "unsupported activation \"gelu\"",
            ),
            (
                Box::new(|v| v["talker_config"]["rope_scaling"]["rope_type"] = json!("yarn")),
                "talker_config.rope_scaling.rope_type",
                "unsupported rope type \"yarn\"",
            ),
            (
                Box::new(|v| {
                    v["talker_config"]["use_sliding_window"] = json!(true);
                    v["talker_config"]["sliding_window"] = Value::Null;
                }),
                "talker_config.sliding_window",
                "missing field",
            ),
            (
                Box::new(|v| v["talker_config"]["spk_id"]["eric"] = json!("x")),
                "talker_config.spk_id.eric",
                "expected an id (int or [int]), got \"x\"",
            ),
            (
                Box::new(|v| v["talker_config"]["spk_id"]["eric"] = json!([3100])),
                "talker_config.spk_id.eric",
                "id 3100 is outside the codec vocabulary (vocab_size 3072)",
            ),
            (
                Box::new(|v| v["talker_config"]["spk_is_dialect"]["eric"] = json!(3)),
                "talker_config.spk_is_dialect.eric",
                "expected false or a dialect name, got 3",
            ),
            (
                Box::new(|v| {
                    v["talker_config"]["code_predictor_config"]["num_code_groups"] = json!(8)
                }),
                "talker_config.code_predictor_config.num_code_groups",
                "8 differs from talker_config.num_code_groups 16",
            ),
            (
                Box::new(|v| v["tts_pad_token_id"] = json!(200000)),
                "tts_pad_token_id",
                "id 200000 is outside the text vocabulary (151936)",
            ),
            (
                Box::new(|v| v["talker_config"] = json!(5)),
                "talker_config",
                "expected a JSON object, got 5",
            ),
            (
                Box::new(|v| {
                    v.as_object_mut().unwrap().remove("talker_config");
                }),
                "talker_config",
                "missing field",
            ),
        ];
        for (change, field, msg) in cases {
            let mut v = sample();
            change(&mut v);
            let (f, m) = config_error(&v);
            assert_eq!(f, field, "{m}");
            assert!(m.contains(msg), "{field}: want {msg:?}, got {m:?}");
        }
    }

    #[test]
    fn null_is_absent() {
        let mut v = sample();
        v["talker_config"]["attention_bias"] = Value::Null;
        v["talker_config"]["sliding_window"] = Value::Null;
        v["talker_config"]["rope_scaling"] = Value::Null;
        v["talker_config"]["spk_is_dialect"]["vivian"] = Value::Null;
        v["tokenizer_type"] = Value::Null;
        let c = Qwen3TtsConfig::from_value(Path::new("c.json"), &v).unwrap();
        assert!(!c.talker_config.transformer.attention_bias);
        assert_eq!(c.talker_config.transformer.sliding_window, None);
        assert_eq!(c.tokenizer_type, None);
        assert!(!c.talker_config.spk_is_dialect.contains_key("vivian"));
        // A required field that is null is missing.
        let mut v = sample();
        v["talker_config"]["head_dim"] = Value::Null;
        assert_eq!(
            config_error(&v),
            (
                "talker_config.head_dim".to_string(),
                "missing field".to_string()
            )
        );
    }

    #[test]
    fn generation_config_falls_back_like_the_wrapper() {
        let g = GenerationConfig::from_value(
            Path::new("g.json"),
            &json!({"do_sample": false, "top_k": 7}),
        )
        .unwrap();
        assert!(!g.do_sample);
        assert_eq!(g.top_k, 7);
        assert_eq!(g.max_new_tokens, 2048);
        assert!(GenerationConfig::from_value(Path::new("g.json"), &json!({"top_k": "x"})).is_err());
        match GenerationConfig::from_value(Path::new("g.json"), &json!({"top_p": "x"})) {
            Err(ModelError::Config { field, msg, .. }) => {
                assert_eq!(field, "top_p");
                assert!(msg.contains("\"x\""), "{msg}");
            }
            other => panic!("expected a config error, got {other:?}"),
        }
        // null keeps the wrapper's default, as an absent key does.
        let g = GenerationConfig::from_value(Path::new("g.json"), &json!({"temperature": null}))
            .unwrap();
        assert_eq!(g, GenerationConfig::default());
    }
}
