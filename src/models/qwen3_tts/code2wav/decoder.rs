//! The convolutional parts of the Code2Wav decoder: `decoder.pre_conv`, `decoder.upsample.*`
//! (causal transposed conv + ConvNeXt) and `decoder.decoder.*` (the SnakeBeta vocoder), each with
//! an explicit streaming state.
//!
//! Reference: `Qwen3TTSTokenizerV2Decoder`, `Qwen3TTSTokenizerV2ConvNeXtBlock`,
//! `Qwen3TTSTokenizerV2DecoderDecoderBlock`, `Qwen3TTSTokenizerV2DecoderDecoderResidualUnit` in
//! `modeling_qwen3_tts_tokenizer_v2.py`.

use candle_core::Tensor;
use candle_nn::Module;

use super::ModelError;
use super::batch::{BatchState, RowLinear, stack_field};
use super::config::DecoderConfig;
use crate::nn::Weights;
use crate::nn::conv::{
    CausalConvState, ConvTransposeState, StreamingCausalConv1d, StreamingCausalConvTranspose1d,
    Then,
};
use crate::nn::snake_beta::SnakeBeta;

/// LayerNorm epsilon of the ConvNeXt blocks (hard-coded in the reference).
const CONVNEXT_LN_EPS: f32 = 1e-6;
/// Dilations of the three residual units in every decoder block (hard-coded in the reference).
const RESIDUAL_DILATIONS: [usize; 3] = [1, 3, 9];
/// Kernel of the residual units' first conv, `decoder.0` and `decoder.6` (hard-coded).
const DECODER_KERNEL: usize = 7;

/// `Qwen3TTSTokenizerV2CausalConvNet` at `w` (tensors `conv.weight`, `conv.bias`).
pub(crate) fn causal_conv(
    w: &Weights,
    c_in: usize,
    c_out: usize,
    kernel: usize,
    dilation: usize,
    groups: usize,
) -> Result<StreamingCausalConv1d, ModelError> {
    let weight = w.get(&[c_out, c_in / groups, kernel], "conv.weight")?;
    let bias = w.get(&[c_out], "conv.bias")?;
    Ok(StreamingCausalConv1d::new(
        weight,
        Some(bias),
        dilation,
        groups,
    )?)
}

/// `Qwen3TTSTokenizerV2CausalTransConvNet` at `w` (kernel `k`, stride `s`).
fn causal_conv_transpose(
    w: &Weights,
    c_in: usize,
    c_out: usize,
    kernel: usize,
    stride: usize,
) -> Result<StreamingCausalConvTranspose1d, ModelError> {
    let weight = w.get(&[c_in, c_out, kernel], "conv.weight")?;
    let bias = w.get(&[c_out], "conv.bias")?;
    Ok(StreamingCausalConvTranspose1d::new(
        weight,
        Some(bias),
        stride,
    )?)
}

/// `SnakeBeta` at `w`; its parameters are read in f32 when the decoder runs in bf16 (a bf16
/// `alpha` would put a ~0.4 % error on each frequency, a phase error that grows with the input).
fn snake(w: &Weights, channels: usize) -> Result<SnakeBeta, ModelError> {
    let w = &if w.dtype() == candle_core::DType::BF16 {
        w.with_dtype(candle_core::DType::F32)
    } else {
        w.clone()
    };
    let alpha = w.get(&[channels], "alpha")?;
    let beta = w.get(&[channels], "beta")?;
    Ok(SnakeBeta::from_log_params(&alpha, &beta)?)
}

/// `upsample.{i}.1`: causal depthwise conv k7 → LayerNorm → Linear ×4 → GELU (erf) → Linear → ×gamma → +x.
struct ConvNeXtBlock {
    dwconv: StreamingCausalConv1d,
    norm_weight: Tensor,
    norm_bias: Tensor,
    pwconv1: RowLinear,
    pwconv2: RowLinear,
    gamma: Tensor,
}

impl ConvNeXtBlock {
    fn new(dim: usize, w: &Weights) -> Result<Self, ModelError> {
        Ok(Self {
            dwconv: causal_conv(&w.pp("dwconv"), dim, dim, 7, 1, dim)?,
            norm_weight: w.pp("norm").get(&[dim], "weight")?,
            norm_bias: w.pp("norm").get(&[dim], "bias")?,
            pwconv1: RowLinear(w.linear(dim, 4 * dim, true, "pwconv1")?),
            pwconv2: RowLinear(w.linear(4 * dim, dim, true, "pwconv2")?),
            gamma: w.get(&[dim], "gamma")?,
        })
    }

    /// `[b, dim, t]` → `[b, dim, t]`.
    fn forward(&self, x: &Tensor, state: &mut CausalConvState) -> candle_core::Result<Tensor> {
        let h = self
            .dwconv
            .forward(x, state)?
            .transpose(1, 2)?
            .contiguous()?;
        let h = if h.dtype() == candle_core::DType::F64 {
            // The fused kernel has no f64 version (f64 is the verification mode).
            candle_nn::ops::layer_norm_slow(
                &h,
                &self.norm_weight,
                &self.norm_bias,
                CONVNEXT_LN_EPS,
            )?
        } else {
            candle_nn::ops::layer_norm(&h, &self.norm_weight, &self.norm_bias, CONVNEXT_LN_EPS)?
        };
        let h = self.pwconv1.forward(&h)?.gelu_erf()?;
        let h = self.pwconv2.forward(&h)?.broadcast_mul(&self.gamma)?;
        x + h.transpose(1, 2)?
    }
}

/// `upsample.{i}`: `.0` causal transposed conv (k = s = ratio), `.1` ConvNeXt.
pub(crate) struct UpsampleStage {
    conv: StreamingCausalConvTranspose1d,
    convnext: ConvNeXtBlock,
}

/// Streaming state of an [`UpsampleStage`].
#[derive(Debug, Clone, Default)]
pub(crate) struct UpsampleState {
    conv: ConvTransposeState,
    convnext: CausalConvState,
}

impl BatchState for UpsampleState {
    fn stack(states: &[&Self]) -> candle_core::Result<Self> {
        Ok(Self {
            conv: stack_field(states, |s| &s.conv)?,
            convnext: stack_field(states, |s| &s.convnext)?,
        })
    }

    fn split(self, rows: usize) -> candle_core::Result<Vec<Self>> {
        let (conv, convnext) = (self.conv.split(rows)?, self.convnext.split(rows)?);
        Ok(conv
            .into_iter()
            .zip(convnext)
            .map(|(conv, convnext)| Self { conv, convnext })
            .collect())
    }
}

impl UpsampleStage {
    pub(crate) fn new(dim: usize, ratio: usize, w: &Weights) -> Result<Self, ModelError> {
        Ok(Self {
            conv: causal_conv_transpose(&w.pp("0"), dim, dim, ratio, ratio)?,
            convnext: ConvNeXtBlock::new(dim, &w.pp("1"))?,
        })
    }

    pub(crate) fn forward(
        &self,
        x: &Tensor,
        state: &mut UpsampleState,
    ) -> candle_core::Result<Tensor> {
        let h = self.conv.forward(x, &mut state.conv)?;
        self.convnext.forward(&h, &mut state.convnext)
    }
}

/// `block.{2,3,4}`: SnakeBeta → causal conv k7 (dilation d) → SnakeBeta → causal conv k1 → +x.
struct ResidualUnit {
    act1: SnakeBeta,
    conv1: StreamingCausalConv1d,
    act2: SnakeBeta,
    conv2: StreamingCausalConv1d,
}

impl ResidualUnit {
    fn new(dim: usize, dilation: usize, w: &Weights) -> Result<Self, ModelError> {
        Ok(Self {
            act1: snake(&w.pp("act1"), dim)?,
            conv1: causal_conv(&w.pp("conv1"), dim, dim, DECODER_KERNEL, dilation, 1)?,
            act2: snake(&w.pp("act2"), dim)?,
            conv2: causal_conv(&w.pp("conv2"), dim, dim, 1, 1, 1)?,
        })
    }

    fn forward(&self, x: &Tensor, state: &mut CausalConvState) -> candle_core::Result<Tensor> {
        // act2 follows conv1's bias add, and the residual add conv2's (fused on CUDA).
        let h = self
            .conv1
            .forward_then(&self.act1.forward(x)?, state, Then::Snake(&self.act2))?;
        // conv2 has kernel 1: no past context, so no state.
        self.conv2
            .forward_then(&h, &mut CausalConvState::default(), Then::Residual(x))
    }
}

/// `decoder.{1..}`: SnakeBeta(in) → causal transposed conv in → in/2 (k = 2r, s = r) → 3 residual units.
pub(crate) struct DecoderBlock {
    snake: SnakeBeta,
    upsample: StreamingCausalConvTranspose1d,
    units: Vec<ResidualUnit>,
}

/// Streaming state of a [`DecoderBlock`].
#[derive(Debug, Clone, Default)]
pub(crate) struct DecoderBlockState {
    upsample: ConvTransposeState,
    units: [CausalConvState; 3],
}

impl BatchState for DecoderBlockState {
    fn stack(states: &[&Self]) -> candle_core::Result<Self> {
        Ok(Self {
            upsample: stack_field(states, |s| &s.upsample)?,
            units: stack_field(states, |s| &s.units)?,
        })
    }

    fn split(self, rows: usize) -> candle_core::Result<Vec<Self>> {
        let (upsample, units) = (
            BatchState::split(self.upsample, rows)?,
            BatchState::split(self.units, rows)?,
        );
        Ok(upsample
            .into_iter()
            .zip(units)
            .map(|(upsample, units)| Self { upsample, units })
            .collect())
    }
}

impl DecoderBlock {
    /// Block `index` (0-based; weights at `decoder.decoder.{index + 1}`).
    pub(crate) fn new(cfg: &DecoderConfig, index: usize, w: &Weights) -> Result<Self, ModelError> {
        let in_dim = cfg.decoder_dim >> index;
        let out_dim = cfg.decoder_dim >> (index + 1);
        let rate = cfg.upsample_rates[index];
        let units = RESIDUAL_DILATIONS
            .iter()
            .enumerate()
            .map(|(i, &d)| ResidualUnit::new(out_dim, d, &w.pp(format!("block.{}", i + 2))))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            snake: snake(&w.pp("block.0"), in_dim)?,
            upsample: causal_conv_transpose(&w.pp("block.1"), in_dim, out_dim, 2 * rate, rate)?,
            units,
        })
    }

    pub(crate) fn forward(
        &self,
        x: &Tensor,
        state: &mut DecoderBlockState,
    ) -> candle_core::Result<Tensor> {
        let mut h = self
            .upsample
            .forward(&self.snake.forward(x)?, &mut state.upsample)?;
        for (unit, s) in self.units.iter().zip(state.units.iter_mut()) {
            h = unit.forward(&h, s)?;
        }
        Ok(h)
    }
}

/// `decoder.decoder`: `.0` causal conv latent → decoder_dim (k7), blocks, `.{n+1}` SnakeBeta,
/// `.{n+2}` causal conv → 1 channel (k7). Output before the final clamp.
pub(crate) struct Vocoder {
    conv_in: StreamingCausalConv1d,
    blocks: Vec<DecoderBlock>,
    snake_out: SnakeBeta,
    conv_out: StreamingCausalConv1d,
}

/// Streaming state of the [`Vocoder`].
#[derive(Debug, Clone, Default)]
pub(crate) struct VocoderState {
    conv_in: CausalConvState,
    blocks: Vec<DecoderBlockState>,
    conv_out: CausalConvState,
}

impl BatchState for VocoderState {
    fn stack(states: &[&Self]) -> candle_core::Result<Self> {
        Ok(Self {
            conv_in: stack_field(states, |s| &s.conv_in)?,
            blocks: stack_field(states, |s| &s.blocks)?,
            conv_out: stack_field(states, |s| &s.conv_out)?,
        })
    }

    fn split(self, rows: usize) -> candle_core::Result<Vec<Self>> {
        let conv_in = self.conv_in.split(rows)?;
        let blocks = BatchState::split(self.blocks, rows)?;
        let conv_out = self.conv_out.split(rows)?;
        Ok(conv_in
            .into_iter()
            .zip(blocks)
            .zip(conv_out)
            .map(|((conv_in, blocks), conv_out)| Self {
                conv_in,
                blocks,
                conv_out,
            })
            .collect())
    }
}

impl Vocoder {
    /// Loads `decoder.decoder.*` at `w`.
    pub(crate) fn new(cfg: &DecoderConfig, w: &Weights) -> Result<Self, ModelError> {
        let n = cfg.upsample_rates.len();
        let out_dim = cfg.decoder_dim >> n;
        let blocks = (0..n)
            .map(|i| DecoderBlock::new(cfg, i, &w.pp(i + 1)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            conv_in: causal_conv(
                &w.pp(0),
                cfg.latent_dim,
                cfg.decoder_dim,
                DECODER_KERNEL,
                1,
                1,
            )?,
            blocks,
            snake_out: snake(&w.pp(n + 1), out_dim)?,
            conv_out: causal_conv(&w.pp(n + 2), out_dim, 1, DECODER_KERNEL, 1, 1)?,
        })
    }

    pub(crate) fn init_state(&self) -> VocoderState {
        VocoderState {
            blocks: vec![DecoderBlockState::default(); self.blocks.len()],
            ..Default::default()
        }
    }

    /// `[b, latent, t]` → `[b, 1, t * prod(upsample_rates)]` (unclamped).
    pub(crate) fn forward(
        &self,
        x: &Tensor,
        state: &mut VocoderState,
    ) -> candle_core::Result<Tensor> {
        let mut h = self.conv_in.forward(x, &mut state.conv_in)?;
        for (block, s) in self.blocks.iter().zip(state.blocks.iter_mut()) {
            h = block.forward(&h, s)?;
        }
        let h = self.snake_out.forward(&h)?;
        self.conv_out.forward(&h, &mut state.conv_out)
    }
}
