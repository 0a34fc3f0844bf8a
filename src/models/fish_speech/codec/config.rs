//! The codec's dimensions. S2 Pro ships no codec config (the reference builds its codec from its
//! own `modded_dac_vq.yaml`); [`CodecConfig::load`] reads `codec_config.yaml` (the same hydra
//! format: tiny fixtures ship one) when present, else [`CodecConfig::s2_pro`]'s values.

use std::path::Path;

use serde::Deserialize;

use crate::models::fish_speech::error::{FishError, Result};

/// The codec's hydra config (the keys it reads; `_target_` and the rest are ignored).
#[derive(Debug, Clone, Deserialize)]
pub struct CodecConfig {
    pub sample_rate: u32,
    /// Width of the encoder's first conv; doubles at each of the `encoder_rates` blocks.
    pub encoder_dim: usize,
    pub encoder_rates: Vec<usize>,
    /// Width of the decoder's first conv; halves at each of the `decoder_rates` blocks.
    pub decoder_dim: usize,
    pub decoder_rates: Vec<usize>,
    #[serde(default)]
    pub latent_dim: Option<usize>,
    /// Transformer layers after each encoder block (0: none).
    #[serde(default)]
    pub encoder_transformer_layers: Vec<usize>,
    pub transformer_general_config: GeneralTransformer,
    pub quantizer: QuantizerConfig,
}

/// The settings shared by the encoder's transformers.
#[derive(Debug, Clone, Deserialize)]
pub struct GeneralTransformer {
    pub head_dim: usize,
    pub rope_base: f64,
    pub norm_eps: f64,
}

/// `quantizer`: the downsampled residual VQ.
#[derive(Debug, Clone, Deserialize)]
pub struct QuantizerConfig {
    /// The latent width.
    pub input_dim: usize,
    /// Residual codebooks (9).
    pub n_codebooks: usize,
    /// Entries of each residual codebook (1024).
    pub codebook_size: usize,
    pub codebook_dim: usize,
    /// Entries of the semantic codebook (4096).
    pub semantic_codebook_size: usize,
    /// Each a stride-k conv down (encode) and a stride-k transposed conv up (decode).
    pub downsample_factor: Vec<usize>,
    pub post_module: WindowModule,
    pub pre_module: WindowModule,
}

/// A causal windowed transformer (`WindowLimitedTransformer`).
#[derive(Debug, Clone, Deserialize)]
pub struct WindowModule {
    /// Positions each query sees, itself included (None: all earlier ones).
    #[serde(default)]
    pub window_size: Option<usize>,
    pub input_dim: usize,
    pub config: TransformerConfig,
}

/// A codec transformer's dimensions.
#[derive(Debug, Clone, Deserialize)]
pub struct TransformerConfig {
    pub n_layer: usize,
    pub n_head: usize,
    pub dim: usize,
    pub intermediate_size: usize,
    #[serde(default = "minus_one")]
    pub n_local_heads: i64,
    pub head_dim: usize,
    pub rope_base: f64,
    pub norm_eps: f64,
}

fn minus_one() -> i64 {
    -1
}

/// S2 Pro's codec (44.1 kHz, hop 2048, 1 × 4096 + 9 × 1024 codebooks).
const S2_PRO: &str = "
sample_rate: 44100
encoder_dim: 64
encoder_rates: [2, 4, 8, 8]
decoder_dim: 1536
decoder_rates: [8, 8, 4, 2]
encoder_transformer_layers: [0, 0, 0, 4]
transformer_general_config: {head_dim: 64, rope_base: 10000, norm_eps: 1.0e-5}
quantizer:
  input_dim: 1024
  n_codebooks: 9
  codebook_size: 1024
  codebook_dim: 8
  semantic_codebook_size: 4096
  downsample_factor: [2, 2]
  post_module: &t
    window_size: 128
    input_dim: 1024
    config: {n_layer: 8, n_head: 16, dim: 1024, intermediate_size: 3072, head_dim: 64,
             rope_base: 10000, norm_eps: 1.0e-5}
  pre_module: *t
";

impl CodecConfig {
    /// The file beside `codec.pth` that gives the codec's dimensions.
    pub const FILE: &'static str = "codec_config.yaml";

    /// S2 Pro's values.
    pub fn s2_pro() -> Self {
        serde_yaml_ng::from_str(S2_PRO).expect("the built-in codec config parses")
    }

    /// `dir/codec_config.yaml` when present, else [`Self::s2_pro`].
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join(Self::FILE);
        if !path.exists() {
            return Ok(Self::s2_pro());
        }
        let text = std::fs::read_to_string(&path).map_err(|source| FishError::Io {
            path: path.clone(),
            source,
        })?;
        serde_yaml_ng::from_str(&text).map_err(|e| FishError::Config {
            path,
            msg: e.to_string(),
        })
    }

    /// Samples of the encoder's hop (the product of `encoder_rates`: 512).
    pub fn encoder_hop(&self) -> usize {
        self.encoder_rates.iter().product()
    }

    /// Samples a code frame covers: the hop times the quantizer's downsampling (2048).
    pub fn samples_per_frame(&self) -> usize {
        self.encoder_hop() * self.quantizer.downsample_factor.iter().product::<usize>()
    }

    /// The latent width (`encoder_dim · 2^blocks` unless set).
    pub fn latent_dim(&self) -> usize {
        self.latent_dim
            .unwrap_or(self.encoder_dim << self.encoder_rates.len())
    }

    /// Codebooks per frame (10).
    pub fn num_codebooks(&self) -> usize {
        1 + self.quantizer.n_codebooks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s2_pro_values() {
        let c = CodecConfig::s2_pro();
        assert_eq!(c.samples_per_frame(), 2048);
        assert_eq!(c.latent_dim(), 1024);
        assert_eq!(c.num_codebooks(), 10);
        assert_eq!(c.quantizer.pre_module.window_size, Some(128));
    }
}
