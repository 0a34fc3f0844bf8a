//! The waveform encoder (the reference's `Encoder`, causal): a 7-tap conv from one channel to
//! `encoder_dim`, one block per rate (three residual units with dilations 1, 3, 9 at half width,
//! Snake, a stride-r conv of kernel 2r doubling the channels, and a windowed transformer where
//! the config asks for layers: `dim / 64` heads of `head_dim`, SwiGLU `3 · dim`, window 512),
//! Snake, a 3-tap conv to the latent width.

use candle_core::Tensor;

use super::config::CodecConfig;
use super::layers::{ResidualUnit, StridedCausalConv, causal_conv, snake};
use super::transformer::{WindowCache, WindowTransformer};
use super::weights::CodecWeights;
use crate::models::fish_speech::error::Result;
use crate::nn::conv::StreamingCausalConv1d;
use crate::nn::snake_beta::SnakeBeta;

/// The window of the encoder's transformers (the reference's default: its config does not set it).
pub const ENCODER_WINDOW: usize = 512;

#[derive(Debug, Clone)]
struct Block {
    units: [ResidualUnit; 3],
    snake: SnakeBeta,
    down: StridedCausalConv,
    transformer: Option<WindowTransformer>,
}

/// The encoder's weights.
#[derive(Debug, Clone)]
pub struct Encoder {
    conv_in: StreamingCausalConv1d,
    blocks: Vec<Block>,
    snake: SnakeBeta,
    conv_out: StreamingCausalConv1d,
}

impl Encoder {
    pub fn new(w: &CodecWeights, cfg: &CodecConfig) -> Result<Self> {
        let mut d = cfg.encoder_dim;
        let conv_in = causal_conv(w, "encoder.block.0", 1, d, 7, 1, 1)?;
        let mut blocks = Vec::new();
        for (i, &r) in cfg.encoder_rates.iter().enumerate() {
            let half = d;
            d *= 2;
            let p = format!("encoder.block.{}.block", i + 1);
            let unit = |k: usize, dil: usize| ResidualUnit::new(w, &format!("{p}.{k}"), half, dil);
            let layers = cfg.encoder_transformer_layers.get(i).copied().unwrap_or(0);
            let transformer = if layers > 0 {
                let g = &cfg.transformer_general_config;
                let tc = super::config::TransformerConfig {
                    n_layer: layers,
                    n_head: d / 64,
                    dim: d,
                    intermediate_size: 3 * d,
                    n_local_heads: -1,
                    head_dim: g.head_dim,
                    rope_base: g.rope_base,
                    norm_eps: g.norm_eps,
                };
                Some(WindowTransformer::new(
                    w,
                    &format!("{p}.5"),
                    &tc,
                    d,
                    Some(ENCODER_WINDOW),
                )?)
            } else {
                None
            };
            blocks.push(Block {
                units: [unit(0, 1)?, unit(1, 3)?, unit(2, 9)?],
                snake: snake(w, &format!("{p}.3"), half)?,
                down: StridedCausalConv::new(w, &format!("{p}.4"), half, d, 2 * r, r)?,
                transformer,
            });
        }
        let n = cfg.encoder_rates.len();
        Ok(Self {
            conv_in,
            blocks,
            snake: snake(w, &format!("encoder.block.{}", n + 1), d)?,
            conv_out: causal_conv(
                w,
                &format!("encoder.block.{}", n + 2),
                d,
                cfg.latent_dim(),
                3,
                1,
                1,
            )?,
        })
    }

    /// Audio `[b, 1, samples]` (a whole signal) → latent `[b, latent, samples / hop]`.
    pub fn forward(&self, audio: &Tensor) -> Result<Tensor> {
        let mut x = self.conv_in.forward(audio, &mut Default::default())?;
        for b in &self.blocks {
            for u in &b.units {
                x = u.forward(&x, &mut Default::default())?;
            }
            x = b.down.forward(&b.snake.forward(&x)?)?;
            if let Some(t) = &b.transformer {
                x = t.forward(&x, &mut WindowCache::default())?;
            }
        }
        let x = self.snake.forward(&x)?;
        Ok(self.conv_out.forward(&x, &mut Default::default())?)
    }
}
