//! The checkpoint's `config.json` (`model_type` `fish_qwen3_omni`): a nested `text_config` (the
//! slow AR) and `audio_decoder_config` (the fast AR and the codebook embeddings), resolved into
//! the dimensions each transformer uses, with the reference loader's defaults and fallbacks (the
//! fast AR takes every unset value from the slow one; both use the slow model's RoPE base and
//! norm epsilon).

use std::path::Path;

use serde::Deserialize;

use super::error::{FishError, Result};

/// `config.json` as written in the checkpoint.
#[derive(Debug, Clone, Deserialize)]
pub struct FishConfig {
    pub model_type: String,
    /// The first `<|semantic:i|>` token id (151678 in S2 Pro). The tokenizer is authoritative:
    /// [`super::FishTokenizer`] checks that the two agree.
    #[serde(default)]
    pub semantic_start_token_id: Option<u32>,
    #[serde(default)]
    pub semantic_end_token_id: Option<u32>,
    pub text_config: TextConfig,
    pub audio_decoder_config: AudioDecoderConfig,
}

/// `text_config`: the slow AR (a Qwen3 backbone).
#[derive(Debug, Clone, Deserialize)]
pub struct TextConfig {
    pub vocab_size: usize,
    pub n_layer: usize,
    pub n_head: usize,
    #[serde(default = "minus_one")]
    pub n_local_heads: i64,
    #[serde(default)]
    pub head_dim: Option<usize>,
    pub dim: usize,
    #[serde(default)]
    pub intermediate_size: Option<usize>,
    #[serde(default = "rope_base")]
    pub rope_base: f64,
    #[serde(default = "norm_eps")]
    pub norm_eps: f64,
    #[serde(default = "max_seq_len")]
    pub max_seq_len: usize,
    #[serde(default = "yes")]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub attention_qkv_bias: bool,
    #[serde(default)]
    pub attention_o_bias: bool,
    #[serde(default)]
    pub attention_qk_norm: bool,
}

/// `audio_decoder_config`: the fast AR over the codebooks of one frame.
#[derive(Debug, Clone, Deserialize)]
pub struct AudioDecoderConfig {
    /// Entries of each codebook slice of the embeddings and of the fast head (4096).
    pub vocab_size: usize,
    /// Codebooks per frame (10: one semantic, nine residual).
    pub num_codebooks: usize,
    pub n_layer: usize,
    #[serde(default)]
    pub dim: Option<usize>,
    #[serde(default)]
    pub n_head: Option<usize>,
    #[serde(default)]
    pub n_local_heads: Option<usize>,
    #[serde(default)]
    pub head_dim: Option<usize>,
    #[serde(default)]
    pub intermediate_size: Option<usize>,
    #[serde(default)]
    pub attention_qkv_bias: Option<bool>,
    #[serde(default)]
    pub attention_qk_norm: Option<bool>,
    #[serde(default)]
    pub attention_o_bias: Option<bool>,
}

fn minus_one() -> i64 {
    -1
}
fn rope_base() -> f64 {
    10_000.0
}
fn norm_eps() -> f64 {
    1e-5
}
fn max_seq_len() -> usize {
    2048
}
fn yes() -> bool {
    true
}

/// The dimensions of one transformer stack (slow or fast), every default resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct StackDims {
    /// Residual width.
    pub dim: usize,
    pub n_layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (GQA: `n_head` is a multiple).
    pub n_kv_head: usize,
    pub head_dim: usize,
    /// SwiGLU hidden width.
    pub intermediate: usize,
    pub qk_norm: bool,
    pub qkv_bias: bool,
    pub o_bias: bool,
    pub norm_eps: f64,
    pub rope_base: f64,
}

/// The reference's default SwiGLU width: `2/3 · 4 · dim` rounded up to a multiple of 256.
fn default_intermediate(dim: usize) -> usize {
    let n = 2 * (4 * dim) / 3;
    n.div_ceil(256) * 256
}

impl FishConfig {
    /// Reads and checks `dir/config.json`.
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| FishError::Io {
            path: path.clone(),
            source,
        })?;
        let cfg: FishConfig = serde_json::from_str(&text).map_err(|e| FishError::Config {
            path: path.clone(),
            msg: e.to_string(),
        })?;
        cfg.check().map_err(|msg| FishError::Config { path, msg })?;
        Ok(cfg)
    }

    fn check(&self) -> std::result::Result<(), String> {
        if self.model_type != "fish_qwen3_omni" {
            return Err(format!(
                "model_type {:?}: this loader reads `fish_qwen3_omni` (Fish Audio S2)",
                self.model_type
            ));
        }
        for (name, d) in [
            ("text_config", self.slow()),
            ("audio_decoder_config", self.fast()),
        ] {
            if d.n_head == 0 || d.n_kv_head == 0 || d.n_head % d.n_kv_head != 0 {
                return Err(format!(
                    "{name}: {} query heads are not a multiple of {} key/value heads",
                    d.n_head, d.n_kv_head
                ));
            }
            if d.head_dim % 2 != 0 || d.head_dim == 0 {
                return Err(format!("{name}: head_dim {} must be even", d.head_dim));
            }
        }
        if self.audio_decoder_config.num_codebooks == 0 {
            return Err("audio_decoder_config.num_codebooks must be > 0".into());
        }
        Ok(())
    }

    /// The slow AR's dimensions.
    pub fn slow(&self) -> StackDims {
        let t = &self.text_config;
        let head_dim = t.head_dim.unwrap_or(t.dim / t.n_head.max(1));
        StackDims {
            dim: t.dim,
            n_layer: t.n_layer,
            n_head: t.n_head,
            n_kv_head: if t.n_local_heads < 0 {
                t.n_head
            } else {
                t.n_local_heads as usize
            },
            head_dim,
            intermediate: t.intermediate_size.unwrap_or(default_intermediate(t.dim)),
            qk_norm: t.attention_qk_norm,
            qkv_bias: t.attention_qkv_bias,
            o_bias: t.attention_o_bias,
            norm_eps: t.norm_eps,
            rope_base: t.rope_base,
        }
    }

    /// The fast AR's dimensions: each unset value falls back to the slow model's.
    pub fn fast(&self) -> StackDims {
        let s = self.slow();
        let a = &self.audio_decoder_config;
        StackDims {
            dim: a.dim.unwrap_or(s.dim),
            n_layer: a.n_layer,
            n_head: a.n_head.unwrap_or(s.n_head),
            n_kv_head: a.n_local_heads.unwrap_or(s.n_kv_head),
            head_dim: a.head_dim.unwrap_or(s.head_dim),
            intermediate: a.intermediate_size.unwrap_or(s.intermediate),
            qk_norm: a.attention_qk_norm.unwrap_or(s.qk_norm),
            qkv_bias: a.attention_qkv_bias.unwrap_or(s.qkv_bias),
            o_bias: a.attention_o_bias.unwrap_or(s.o_bias),
            norm_eps: s.norm_eps,
            rope_base: s.rope_base,
        }
    }

    /// Codebooks per frame (10).
    pub fn num_codebooks(&self) -> usize {
        self.audio_decoder_config.num_codebooks
    }

    /// Entries of each codebook slice (4096).
    pub fn codebook_size(&self) -> usize {
        self.audio_decoder_config.vocab_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_falls_back_to_slow_and_defaults_resolve() {
        let cfg: FishConfig = serde_json::from_str(
            r#"{"model_type":"fish_qwen3_omni",
                "text_config":{"vocab_size":100,"n_layer":2,"n_head":4,"dim":64,"attention_qk_norm":true},
                "audio_decoder_config":{"vocab_size":16,"num_codebooks":10,"n_layer":1,"attention_qk_norm":false}}"#,
        )
        .unwrap();
        cfg.check().unwrap();
        let s = cfg.slow();
        assert_eq!((s.n_kv_head, s.head_dim, s.intermediate), (4, 16, 256));
        assert_eq!(s.rope_base, 10_000.0);
        let f = cfg.fast();
        assert_eq!((f.dim, f.n_head, f.n_layer, f.qk_norm), (64, 4, 1, false));
    }

    #[test]
    fn other_model_types_are_refused() {
        let cfg: FishConfig = serde_json::from_str(
            r#"{"model_type":"qwen3_tts",
                "text_config":{"vocab_size":100,"n_layer":2,"n_head":4,"dim":64},
                "audio_decoder_config":{"vocab_size":16,"num_codebooks":10,"n_layer":1}}"#,
        )
        .unwrap();
        assert!(cfg.check().unwrap_err().contains("fish_qwen3_omni"));
    }
}
