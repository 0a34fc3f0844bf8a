//! The waveform decoder (the reference's `Decoder`, causal): a 7-tap conv from the latent to
//! `decoder_dim` channels, one block per rate (Snake, a stride-r transposed conv of kernel 2r
//! halving the channels, three residual units with dilations 1, 3, 9), Snake, a 7-tap conv to one
//! channel, tanh. The transformer layers the config lists for the decoder are built by the
//! reference but never run; their weights are ignored here.

use candle_core::Tensor;

use super::config::CodecConfig;
use super::layers::{ResidualState, ResidualUnit, causal_conv, snake};
use super::weights::CodecWeights;
use crate::models::fish_speech::error::Result;
use crate::nn::conv::{
    CausalConvState, ConvTransposeState, StreamingCausalConv1d, StreamingCausalConvTranspose1d,
    Then,
};
use crate::nn::snake_beta::SnakeBeta;

#[derive(Debug, Clone)]
struct Block {
    snake: SnakeBeta,
    up: StreamingCausalConvTranspose1d,
    units: [ResidualUnit; 3],
}

/// Streaming state of [`Decoder::forward`].
#[derive(Debug, Clone, Default)]
pub struct DecoderState {
    conv_in: CausalConvState,
    blocks: Vec<(ConvTransposeState, [ResidualState; 3])>,
    conv_out: CausalConvState,
}

impl DecoderState {
    /// The states of several streams stacked along the batch dimension, in order, for one pass
    /// of a decoder with `blocks` blocks over all of them (a stream that has decoded nothing
    /// starts from zeros, as it does alone). Errors for states of different decoders.
    pub fn stack(states: &[&DecoderState], blocks: usize) -> Result<DecoderState> {
        let filled: Vec<DecoderState> = states
            .iter()
            .map(|s| {
                let mut s = (*s).clone();
                s.blocks.resize(blocks, Default::default());
                s
            })
            .collect();
        let rows = |pick: &dyn Fn(&DecoderState) -> &CausalConvState| {
            CausalConvState::stack(&filled.iter().map(pick).collect::<Vec<_>>())
        };
        let mut stacked = Vec::with_capacity(blocks);
        for i in 0..blocks {
            let ups: Vec<&ConvTransposeState> = filled.iter().map(|s| &s.blocks[i].0).collect();
            let unit = |u: usize, c: usize| rows(&|s| &s.blocks[i].1[u][c]);
            stacked.push((
                ConvTransposeState::stack(&ups)?,
                [
                    [unit(0, 0)?, unit(0, 1)?],
                    [unit(1, 0)?, unit(1, 1)?],
                    [unit(2, 0)?, unit(2, 1)?],
                ],
            ));
        }
        Ok(DecoderState {
            conv_in: rows(&|s| &s.conv_in)?,
            blocks: stacked,
            conv_out: rows(&|s| &s.conv_out)?,
        })
    }

    /// A state of `rows` rows (after a pass) as the per-stream states, in order: the inverse of
    /// [`Self::stack`].
    pub fn split(self, rows: usize) -> Result<Vec<DecoderState>> {
        let mut blocks: Vec<Vec<(ConvTransposeState, [ResidualState; 3])>> = vec![Vec::new(); rows];
        for (up, [[a0, a1], [b0, b1], [c0, c1]]) in self.blocks {
            let mut convs = Vec::with_capacity(6);
            for c in [a0, a1, b0, b1, c0, c1] {
                convs.push(c.split(rows)?.into_iter());
            }
            for (row, up) in blocks.iter_mut().zip(up.split(rows)?) {
                let mut next = |i: usize| convs[i].next().unwrap_or_default();
                row.push((
                    up,
                    [[next(0), next(1)], [next(2), next(3)], [next(4), next(5)]],
                ));
            }
        }
        Ok(self
            .conv_in
            .split(rows)?
            .into_iter()
            .zip(self.conv_out.split(rows)?)
            .zip(blocks)
            .map(|((conv_in, conv_out), blocks)| DecoderState {
                conv_in,
                blocks,
                conv_out,
            })
            .collect())
    }
}

/// The decoder's weights.
#[derive(Debug, Clone)]
pub struct Decoder {
    conv_in: StreamingCausalConv1d,
    blocks: Vec<Block>,
    snake: SnakeBeta,
    conv_out: StreamingCausalConv1d,
}

impl Decoder {
    pub fn new(w: &CodecWeights, cfg: &CodecConfig) -> Result<Self> {
        let ch = cfg.decoder_dim;
        let conv_in = causal_conv(w, "decoder.model.0", cfg.latent_dim(), ch, 7, 1, 1)?;
        let mut blocks = Vec::new();
        let mut out = ch;
        for (i, &r) in cfg.decoder_rates.iter().enumerate() {
            let (cin, cout) = (ch >> i, ch >> (i + 1));
            let p = format!("decoder.model.{}.block", i + 1);
            let conv = format!("{p}.1.conv");
            let unit = |k: usize, d: usize| ResidualUnit::new(w, &format!("{p}.{k}"), cout, d);
            blocks.push(Block {
                snake: snake(w, &format!("{p}.0"), cin)?,
                up: StreamingCausalConvTranspose1d::new(
                    w.weight(&conv, &[cin, cout, 2 * r])?,
                    Some(w.bias(&conv, cout)?),
                    r,
                )?,
                units: [unit(2, 1)?, unit(3, 3)?, unit(4, 9)?],
            });
            out = cout;
        }
        let n = cfg.decoder_rates.len();
        Ok(Self {
            conv_in,
            blocks,
            snake: snake(w, &format!("decoder.model.{}", n + 1), out)?,
            conv_out: causal_conv(w, &format!("decoder.model.{}", n + 2), out, 1, 7, 1, 1)?,
        })
    }

    /// Its blocks (one per upsampling rate).
    pub fn blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Latent `[b, latent, t]` → audio `[b, 1, t · Π rates]`, continuing `state`'s stream.
    pub fn forward(&self, z: &Tensor, state: &mut DecoderState) -> Result<Tensor> {
        if state.blocks.len() != self.blocks.len() {
            state.blocks = vec![Default::default(); self.blocks.len()];
        }
        let mut x = self.conv_in.forward(z, &mut state.conv_in)?;
        for (b, (us, rs)) in self.blocks.iter().zip(state.blocks.iter_mut()) {
            x = b.up.forward(&b.snake.forward(&x)?, us)?;
            for (u, s) in b.units.iter().zip(rs.iter_mut()) {
                x = u.forward(&x, s)?;
            }
        }
        let y = self.conv_out.forward_then(
            &self.snake.forward(&x)?,
            &mut state.conv_out,
            Then::Nothing,
        )?;
        Ok(y.tanh()?)
    }
}
