//! `config.json` and `generation_config.json` of a Qwen3-TTS checkpoint.
//!
//! Every size and id is read from the JSON; the reference config classes' defaults
//! (`configuration_qwen3_tts.py`) are *not* the checkpoint values (e.g. codec ids 4196+,
//! 32 code groups, rope theta 1e4) and are never used for required fields. A missing or
//! malformed field is a [`ModelError::Config`] naming the file and the dotted field path.
//! Optional fields default exactly like Hugging Face's `PretrainedConfig` does
//! (`attention_bias` false, `use_sliding_window` false, `rope_scaling` none, `hidden_act` silu).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Map, Value};

use super::ModelError;
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

/// Reads typed fields of one JSON object, producing errors that name the file and field path.
struct Obj<'a> {
    file: &'a Path,
    path: String,
    map: &'a Map<String, Value>,
}

impl<'a> Obj<'a> {
    fn root(file: &'a Path, v: &'a Value) -> Result<Self, ModelError> {
        let map = v.as_object().ok_or_else(|| ModelError::Config {
            file: file.to_path_buf(),
            field: "(root)".into(),
            msg: "expected a JSON object".into(),
        })?;
        Ok(Self {
            file,
            path: String::new(),
            map,
        })
    }

    fn field_path(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{}", self.path, key)
        }
    }

    fn err(&self, key: &str, msg: impl Into<String>) -> ModelError {
        ModelError::Config {
            file: self.file.to_path_buf(),
            field: self.field_path(key),
            msg: msg.into(),
        }
    }

    fn raw(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn req(&self, key: &str) -> Result<&'a Value, ModelError> {
        self.raw(key).ok_or_else(|| self.err(key, "missing field"))
    }

    fn obj(&self, key: &str) -> Result<Obj<'a>, ModelError> {
        let v = self.req(key)?;
        let map = v
            .as_object()
            .ok_or_else(|| self.err(key, format!("expected an object, got {v}")))?;
        Ok(Obj {
            file: self.file,
            path: self.field_path(key),
            map,
        })
    }

    fn opt_obj(&self, key: &str) -> Result<Option<Obj<'a>>, ModelError> {
        match self.raw(key) {
            None => Ok(None),
            Some(_) => self.obj(key).map(Some),
        }
    }

    fn usize_of(&self, key: &str, v: &Value) -> Result<usize, ModelError> {
        v.as_u64()
            .and_then(|x| usize::try_from(x).ok())
            .ok_or_else(|| self.err(key, format!("expected a non-negative integer, got {v}")))
    }

    fn usize(&self, key: &str) -> Result<usize, ModelError> {
        self.usize_of(key, self.req(key)?)
    }

    fn positive(&self, key: &str) -> Result<usize, ModelError> {
        let x = self.usize(key)?;
        if x == 0 {
            return Err(self.err(key, "must be > 0"));
        }
        Ok(x)
    }

    fn u32(&self, key: &str) -> Result<u32, ModelError> {
        let x = self.usize(key)?;
        u32::try_from(x).map_err(|_| self.err(key, format!("{x} does not fit in u32")))
    }

    fn f64_of(&self, key: &str, v: &Value) -> Result<f64, ModelError> {
        v.as_f64()
            .ok_or_else(|| self.err(key, format!("expected a number, got {v}")))
    }

    fn f64(&self, key: &str) -> Result<f64, ModelError> {
        self.f64_of(key, self.req(key)?)
    }

    fn opt_f64(&self, key: &str) -> Result<Option<f64>, ModelError> {
        self.raw(key).map(|v| self.f64_of(key, v)).transpose()
    }

    fn opt_usize(&self, key: &str) -> Result<Option<usize>, ModelError> {
        self.raw(key).map(|v| self.usize_of(key, v)).transpose()
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>, ModelError> {
        self.raw(key)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| self.err(key, format!("expected true/false, got {v}")))
            })
            .transpose()
    }

    fn string(&self, key: &str) -> Result<String, ModelError> {
        let v = self.req(key)?;
        v.as_str()
            .map(str::to_string)
            .ok_or_else(|| self.err(key, format!("expected a string, got {v}")))
    }

    fn opt_string(&self, key: &str) -> Result<Option<String>, ModelError> {
        match self.raw(key) {
            None => Ok(None),
            Some(_) => self.string(key).map(Some),
        }
    }
}

/// `rope_scaling`: only the `default` rope type exists in Qwen3-TTS (the talker's interleaved
/// MRoPE with identical position streams is plain 1-D RoPE, docs/qwen3-tts.md §3.2).
fn check_rope_scaling(o: &Obj<'_>) -> Result<(), ModelError> {
    if let Some(rs) = o.opt_obj("rope_scaling")? {
        let ty = match rs.opt_string("rope_type")? {
            Some(t) => Some(t),
            None => rs.opt_string("type")?,
        };
        if let Some(t) = ty
            && t != "default"
        {
            return Err(rs.err(
                "rope_type",
                format!("unsupported rope type {t:?} (only \"default\")"),
            ));
        }
    }
    Ok(())
}

fn check_act(o: &Obj<'_>) -> Result<(), ModelError> {
    let act = o.opt_string("hidden_act")?.unwrap_or_else(|| "silu".into());
    if act != "silu" {
        return Err(o.err(
            "hidden_act",
            format!("unsupported activation {act:?} (only \"silu\")"),
        ));
    }
    Ok(())
}

/// Sizes of a Qwen3 decoder stack read from a config object (talker or code predictor).
fn transformer_config(o: &Obj<'_>) -> Result<TransformerConfig, ModelError> {
    check_act(o)?;
    check_rope_scaling(o)?;
    let heads = o.positive("num_attention_heads")?;
    let kv = o.positive("num_key_value_heads")?;
    if heads % kv != 0 {
        return Err(o.err(
            "num_key_value_heads",
            format!("{kv} does not divide num_attention_heads {heads}"),
        ));
    }
    let head_dim = o.positive("head_dim")?;
    if head_dim % 2 != 0 {
        return Err(o.err("head_dim", format!("{head_dim} must be even for RoPE")));
    }
    let use_sw = o.opt_bool("use_sliding_window")?.unwrap_or(false);
    let sliding_window = if use_sw {
        Some(o.positive("sliding_window")?)
    } else {
        None
    };
    Ok(TransformerConfig {
        hidden_size: o.positive("hidden_size")?,
        intermediate_size: o.positive("intermediate_size")?,
        num_hidden_layers: o.usize("num_hidden_layers")?,
        num_attention_heads: heads,
        num_key_value_heads: kv,
        head_dim,
        rms_norm_eps: o.f64("rms_norm_eps")?,
        rope_theta: o.f64("rope_theta")?,
        attention_bias: o.opt_bool("attention_bias")?.unwrap_or(false),
        sliding_window,
    })
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

fn id_map(o: &Obj<'_>, key: &str, vocab: usize) -> Result<BTreeMap<String, u32>, ModelError> {
    let m = o.obj(key)?;
    let mut out = BTreeMap::new();
    for (name, v) in m.map {
        // A bare integer or a one-element list of one integer.
        let scalar = match v {
            Value::Array(a) if a.len() == 1 => &a[0],
            other => other,
        };
        let id = scalar
            .as_u64()
            .ok_or_else(|| m.err(name, format!("expected an id (int or [int]), got {v}")))?;
        if id as usize >= vocab {
            return Err(m.err(
                name,
                format!("id {id} is outside the codec vocabulary (vocab_size {vocab})"),
            ));
        }
        out.insert(name.to_lowercase(), id as u32);
    }
    Ok(out)
}

impl Qwen3TtsConfig {
    /// Parses and validates `config.json` at `path`.
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        let v = read_json(path)?;
        Self::from_value(path, &v)
    }

    /// Parses and validates an already-read `config.json` (`file` is used in errors).
    pub fn from_value(file: &Path, v: &Value) -> Result<Self, ModelError> {
        let root = Obj::root(file, v)?;
        let tts_model_type = root.string("tts_model_type")?;
        let variant = match tts_model_type.as_str() {
            "custom_voice" => ModelVariant::CustomVoice,
            "voice_design" => ModelVariant::VoiceDesign,
            "base" => ModelVariant::Base,
            other => {
                return Err(root.err(
                    "tts_model_type",
                    format!("unknown model type {other:?} (custom_voice, voice_design or base)"),
                ));
            }
        };
        let tts_model_size = root.string("tts_model_size")?;
        let opt_u32 = |key: &str| -> Result<Option<u32>, ModelError> {
            root.opt_usize(key)?
                .map(|x| u32::try_from(x).map_err(|_| root.err(key, "does not fit in u32")))
                .transpose()
        };

        let t = root.obj("talker_config")?;
        let transformer = transformer_config(&t)?;
        let vocab_size = t.positive("vocab_size")?;
        let text_vocab_size = t.positive("text_vocab_size")?;
        let num_code_groups = t.positive("num_code_groups")?;
        if num_code_groups < 2 {
            return Err(t.err("num_code_groups", "must be at least 2"));
        }
        let codec_id = |key: &str| -> Result<u32, ModelError> {
            let id = t.u32(key)?;
            if id as usize >= vocab_size {
                return Err(t.err(
                    key,
                    format!("id {id} is outside the codec vocabulary (vocab_size {vocab_size})"),
                ));
            }
            Ok(id)
        };
        let codec_pad_id = codec_id("codec_pad_id")?;
        let codec_bos_id = codec_id("codec_bos_id")?;
        let codec_eos_token_id = codec_id("codec_eos_token_id")?;
        let codec_think_id = codec_id("codec_think_id")?;
        let codec_nothink_id = codec_id("codec_nothink_id")?;
        let codec_think_bos_id = codec_id("codec_think_bos_id")?;
        let codec_think_eos_id = codec_id("codec_think_eos_id")?;
        let codec_language_id = id_map(&t, "codec_language_id", vocab_size)?;
        let spk_id = id_map(&t, "spk_id", vocab_size)?;
        let mut spk_is_dialect = BTreeMap::new();
        if let Some(d) = t.opt_obj("spk_is_dialect")? {
            for (name, v) in d.map {
                match v {
                    Value::Bool(false) | Value::Null => {}
                    Value::String(dialect) => {
                        let dialect = dialect.to_lowercase();
                        if !codec_language_id.contains_key(&dialect) {
                            return Err(d.err(
                                name,
                                format!("dialect {dialect:?} is not a key of codec_language_id"),
                            ));
                        }
                        spk_is_dialect.insert(name.to_lowercase(), dialect);
                    }
                    other => {
                        return Err(d.err(
                            name,
                            format!("expected false or a dialect name, got {other}"),
                        ));
                    }
                }
            }
        }

        let c = t.obj("code_predictor_config")?;
        let cp_transformer = transformer_config(&c)?;
        let cp_groups = c.positive("num_code_groups")?;
        if cp_groups != num_code_groups {
            return Err(c.err(
                "num_code_groups",
                format!("{cp_groups} differs from talker_config.num_code_groups {num_code_groups}"),
            ));
        }
        let code_predictor_config = CodePredictorConfig {
            transformer: cp_transformer,
            vocab_size: c.positive("vocab_size")?,
            num_code_groups: cp_groups,
            max_position_embeddings: c.opt_usize("max_position_embeddings")?,
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
            text_hidden_size: t.positive("text_hidden_size")?,
            num_code_groups,
            max_position_embeddings: t.opt_usize("max_position_embeddings")?,
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

        let speaker_encoder_config = match root.opt_obj("speaker_encoder_config")? {
            None => None,
            Some(s) => Some(SpeakerEncoderConfig {
                enc_dim: s.opt_usize("enc_dim")?,
                sample_rate: s.opt_usize("sample_rate")?,
                raw: Value::Object(s.map.clone()),
            }),
        };

        let text_id = |key: &str| -> Result<u32, ModelError> {
            let id = root.u32(key)?;
            if id as usize >= text_vocab_size {
                return Err(root.err(
                    key,
                    format!("id {id} is outside the text vocabulary ({text_vocab_size})"),
                ));
            }
            Ok(id)
        };
        Ok(Self {
            variant,
            tts_model_type,
            tts_model_size,
            tokenizer_type: root.opt_string("tokenizer_type")?,
            tts_pad_token_id: text_id("tts_pad_token_id")?,
            tts_bos_token_id: text_id("tts_bos_token_id")?,
            tts_eos_token_id: text_id("tts_eos_token_id")?,
            im_start_token_id: opt_u32("im_start_token_id")?,
            im_end_token_id: opt_u32("im_end_token_id")?,
            assistant_token_id: opt_u32("assistant_token_id")?,
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

/// `generation_config.json` (the defaults of the reference wrapper's generate calls).
#[derive(Debug, Clone, PartialEq)]
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

    pub fn from_value(file: &Path, v: &Value) -> Result<Self, ModelError> {
        let o = Obj::root(file, v)?;
        let d = Self::default();
        Ok(Self {
            do_sample: o.opt_bool("do_sample")?.unwrap_or(d.do_sample),
            repetition_penalty: o
                .opt_f64("repetition_penalty")?
                .unwrap_or(d.repetition_penalty),
            temperature: o.opt_f64("temperature")?.unwrap_or(d.temperature),
            top_p: o.opt_f64("top_p")?.unwrap_or(d.top_p),
            top_k: o.opt_usize("top_k")?.unwrap_or(d.top_k),
            subtalker_dosample: o
                .opt_bool("subtalker_dosample")?
                .unwrap_or(d.subtalker_dosample),
            subtalker_temperature: o
                .opt_f64("subtalker_temperature")?
                .unwrap_or(d.subtalker_temperature),
            subtalker_top_p: o.opt_f64("subtalker_top_p")?.unwrap_or(d.subtalker_top_p),
            subtalker_top_k: o.opt_usize("subtalker_top_k")?.unwrap_or(d.subtalker_top_k),
            max_new_tokens: o.opt_usize("max_new_tokens")?.unwrap_or(d.max_new_tokens),
        })
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
    }
}
