//! `speech_tokenizer/config.json` of the Qwen3-TTS-Tokenizer-12Hz, decoder part.
//!
//! Every size is read from the JSON: the Python class defaults (hidden 1024, MLP 3072) do not
//! match the published checkpoints (docs/qwen3-tts.md §1.5). Reference:
//! `qwen_tts/core/tokenizer_12hz/configuration_qwen3_tts_tokenizer_v2.py`.

use std::path::Path;

use serde::Deserialize;

use super::ModelError;
use crate::models::qwen3_tts::config::{from_json, without_nulls};

/// Top level of `speech_tokenizer/config.json` (encoder part ignored).
#[derive(Debug, Clone, Deserialize)]
pub struct SpeechTokenizerConfig {
    /// Output samples per codec frame (1920 = 80 ms at 24 kHz).
    pub decode_upsample_rate: usize,
    /// Output sample rate in Hz (24000).
    pub output_sample_rate: u32,
    /// The Code2Wav decoder.
    pub decoder_config: DecoderConfig,
}

/// `decoder_config` of `speech_tokenizer/config.json` (`Qwen3TTSTokenizerV2DecoderConfig`).
#[derive(Debug, Clone, Deserialize)]
pub struct DecoderConfig {
    /// Entries per codebook (2048).
    pub codebook_size: usize,
    /// RVQ output width (512); each codebook vector is `codebook_dim / 2` wide.
    pub codebook_dim: usize,
    /// Width around the transformer and in the upsampler (1024).
    pub latent_dim: usize,
    /// Transformer width (512).
    pub hidden_size: usize,
    /// Transformer MLP width (1024).
    pub intermediate_size: usize,
    /// Transformer layers (8).
    pub num_hidden_layers: usize,
    /// Query heads (16).
    pub num_attention_heads: usize,
    /// Key/value heads (16).
    pub num_key_value_heads: usize,
    /// Head width (64). As in the reference, `hidden_size / num_attention_heads` when absent.
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// MLP activation (`silu`).
    #[serde(default = "default_hidden_act")]
    pub hidden_act: String,
    /// RMSNorm epsilon (1e-5).
    pub rms_norm_eps: f64,
    /// RoPE base (10000).
    pub rope_theta: f64,
    /// Causal sliding-window length in frames, the query included (72).
    pub sliding_window: usize,
    /// Codebooks per frame (16): 1 semantic (`rvq_first`) + the rest (`rvq_rest`).
    pub num_quantizers: usize,
    /// Upsampling factors of the four decoder blocks ([8, 5, 4, 3]).
    pub upsample_rates: Vec<usize>,
    /// Factors of the transposed-conv + ConvNeXt stages after the transformer ([2, 2]).
    pub upsampling_ratios: Vec<usize>,
    /// Channels of the first decoder block (1536), halved by every block.
    pub decoder_dim: usize,
    /// Bias on q/k/v/o projections (false).
    #[serde(default)]
    pub attention_bias: bool,
}

fn default_hidden_act() -> String {
    "silu".to_string()
}

impl DecoderConfig {
    /// Head width: `head_dim`, or `hidden_size / num_attention_heads` when the JSON has none.
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Product of `upsampling_ratios` and `upsample_rates`: output samples per frame.
    pub fn total_upsample(&self) -> usize {
        self.upsampling_ratios
            .iter()
            .chain(&self.upsample_rates)
            .product()
    }
}

impl SpeechTokenizerConfig {
    /// Reads and validates `path` (a `speech_tokenizer/config.json`).
    ///
    /// Errors: [`ModelError::Io`], [`ModelError::Json`] (not JSON), [`ModelError::Config`] naming
    /// the missing, mistyped or inconsistent field (`decoder_config.sliding_window`).
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json_str(&text, path)
    }

    /// Parses and validates JSON text; `path` is only used in error messages.
    pub fn from_json_str(text: &str, path: &Path) -> Result<Self, ModelError> {
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| ModelError::Json {
            path: path.to_path_buf(),
            msg: e.to_string(),
        })?;
        let cfg: Self = from_json(path, &without_nulls(&v), "")?;
        cfg.validate(path)?;
        Ok(cfg)
    }

    fn validate(&self, path: &Path) -> Result<(), ModelError> {
        let err = |field: &str, msg: String| ModelError::Config {
            file: path.to_path_buf(),
            field: field.to_string(),
            msg,
        };
        let d = &self.decoder_config;
        let positive = [
            ("decoder_config.codebook_size", d.codebook_size),
            ("decoder_config.codebook_dim", d.codebook_dim),
            ("decoder_config.latent_dim", d.latent_dim),
            ("decoder_config.hidden_size", d.hidden_size),
            ("decoder_config.intermediate_size", d.intermediate_size),
            ("decoder_config.num_attention_heads", d.num_attention_heads),
            ("decoder_config.num_key_value_heads", d.num_key_value_heads),
            ("decoder_config.sliding_window", d.sliding_window),
            ("decoder_config.decoder_dim", d.decoder_dim),
            ("decode_upsample_rate", self.decode_upsample_rate),
        ];
        for (field, v) in positive {
            if v == 0 {
                return Err(err(field, "must be > 0".into()));
            }
        }
        if self.output_sample_rate == 0 {
            return Err(err("output_sample_rate", "must be > 0".into()));
        }
        if d.head_dim() == 0 || !d.head_dim().is_multiple_of(2) {
            return Err(err(
                "decoder_config.head_dim",
                format!("{} must be even and > 0 (RoPE half split)", d.head_dim()),
            ));
        }
        if !d.codebook_dim.is_multiple_of(2) {
            return Err(err(
                "decoder_config.codebook_dim",
                format!(
                    "{} must be even (codebook vectors are codebook_dim / 2 wide)",
                    d.codebook_dim
                ),
            ));
        }
        if d.num_quantizers < 2 {
            return Err(err(
                "decoder_config.num_quantizers",
                format!("{} must be ≥ 2 (1 semantic + acoustic)", d.num_quantizers),
            ));
        }
        if !d.num_attention_heads.is_multiple_of(d.num_key_value_heads) {
            return Err(err(
                "decoder_config.num_key_value_heads",
                format!(
                    "{} does not divide num_attention_heads {}",
                    d.num_key_value_heads, d.num_attention_heads
                ),
            ));
        }
        if d.upsample_rates
            .iter()
            .chain(&d.upsampling_ratios)
            .any(|&r| r == 0)
        {
            return Err(err(
                "decoder_config.upsample_rates",
                "factors must be > 0".into(),
            ));
        }
        let halvings = 1usize
            .checked_shl(d.upsample_rates.len() as u32)
            .unwrap_or(usize::MAX);
        if !d.decoder_dim.is_multiple_of(halvings) {
            return Err(err(
                "decoder_config.decoder_dim",
                format!(
                    "{} must be divisible by 2^{} (one halving per upsample rate)",
                    d.decoder_dim,
                    d.upsample_rates.len()
                ),
            ));
        }
        if d.total_upsample() != self.decode_upsample_rate {
            return Err(err(
                "decode_upsample_rate",
                format!(
                    "{} differs from the decoder's upsampling product {} (upsampling_ratios {:?} × upsample_rates {:?})",
                    self.decode_upsample_rate,
                    d.total_upsample(),
                    d.upsampling_ratios,
                    d.upsample_rates
                ),
            ));
        }
        if !matches!(d.hidden_act.as_str(), "silu" | "swish" | "gelu" | "relu") {
            return Err(err(
                "decoder_config.hidden_act",
                format!("unsupported activation {:?}", d.hidden_act),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY: &str =
        include_str!("../../../../tests/fixtures/tiny-base/speech_tokenizer/config.json");

    fn edited(f: impl FnOnce(&mut serde_json::Value)) -> Result<SpeechTokenizerConfig, ModelError> {
        let mut v: serde_json::Value = serde_json::from_str(TINY).unwrap();
        f(&mut v);
        SpeechTokenizerConfig::from_json_str(&v.to_string(), Path::new("st/config.json"))
    }

    #[test]
    fn reads_the_fixture() {
        let c = edited(|_| {}).unwrap();
        assert_eq!(c.decoder_config.total_upsample(), c.decode_upsample_rate);
        // head_dim null = absent: hidden_size / num_attention_heads.
        let c = edited(|v| v["decoder_config"]["head_dim"] = serde_json::Value::Null).unwrap();
        let d = &c.decoder_config;
        assert_eq!(d.head_dim(), d.hidden_size / d.num_attention_heads);
    }

    #[test]
    fn errors_name_the_field() {
        let field_of = |r: Result<SpeechTokenizerConfig, ModelError>| match r {
            Err(ModelError::Config { file, field, msg }) => {
                assert_eq!(file, Path::new("st/config.json"));
                (field, msg)
            }
            Err(e) => panic!("expected a config error, got {e}"),
            Ok(_) => panic!("expected a config error"),
        };
        let (f, m) = field_of(edited(|v| {
            v["decoder_config"]
                .as_object_mut()
                .unwrap()
                .remove("sliding_window");
        }));
        assert_eq!(
            (f.as_str(), m.as_str()),
            ("decoder_config.sliding_window", "missing field")
        );
        let (f, m) = field_of(edited(|v| {
            v["decoder_config"]["upsample_rates"] = "x".into()
        }));
        assert_eq!(f, "decoder_config.upsample_rates");
        assert!(m.contains("\"x\""), "{m}");
        let (f, _) = field_of(edited(|v| {
            v["decoder_config"]["num_key_value_heads"] = 0.into()
        }));
        assert_eq!(f, "decoder_config.num_key_value_heads");
        match SpeechTokenizerConfig::from_json_str("{", Path::new("st/config.json")) {
            Err(ModelError::Json { path, .. }) => assert_eq!(path, Path::new("st/config.json")),
            other => panic!("expected a JSON error, got {other:?}"),
        }
    }
}
