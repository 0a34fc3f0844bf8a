//! The codec's convolutional pieces: causal convolutions (stride 1 with streaming state from
//! `crate::nn::conv`; strided, for the encoder), the residual unit, the ConvNeXt block, LayerNorm.
//! Tensors are `[batch, channels, time]`.

use candle_core::{D, Module, Tensor};

use super::weights::CodecWeights;
use crate::models::fish_speech::error::Result;
use crate::nn::conv::{CausalConvState, StreamingCausalConv1d, Then};
use crate::nn::snake_beta::SnakeBeta;

/// DAC's Snake at `prefix` (`prefix.alpha` `[1, C, 1]`).
pub fn snake(w: &CodecWeights, prefix: &str, c: usize) -> Result<SnakeBeta> {
    let alpha = w
        .get(&format!("{prefix}.alpha"), &[1, c, 1])?
        .flatten_all()?;
    Ok(SnakeBeta::from_linear_alpha(&alpha)?)
}

/// A stride-1 causal conv at `prefix` (its `.conv` holds the weight, weight-normed or not):
/// left zero padding `(k − 1) · dilation`.
pub fn causal_conv(
    w: &CodecWeights,
    prefix: &str,
    c_in: usize,
    c_out: usize,
    k: usize,
    dilation: usize,
    groups: usize,
) -> Result<StreamingCausalConv1d> {
    let conv = format!("{prefix}.conv");
    let weight = w.weight(&conv, &[c_out, c_in / groups, k])?;
    let bias = w.bias(&conv, c_out)?;
    Ok(StreamingCausalConv1d::new(
        weight,
        Some(bias),
        dilation,
        groups,
    )?)
}

/// A causal conv with stride `s` and kernel `k` (whole signals only): left padding `k − s`,
/// right padding up to a whole last window, so `L` samples give `⌈L / s⌉` outputs.
#[derive(Debug, Clone)]
pub struct StridedCausalConv {
    weight: Tensor,
    bias: Tensor,
    kernel: usize,
    stride: usize,
}

impl StridedCausalConv {
    pub fn new(
        w: &CodecWeights,
        prefix: &str,
        c_in: usize,
        c_out: usize,
        k: usize,
        s: usize,
    ) -> Result<Self> {
        let conv = format!("{prefix}.conv");
        Ok(Self {
            weight: w.weight(&conv, &[c_out, c_in, k])?,
            bias: w.bias(&conv, c_out)?.reshape((1, c_out, 1))?,
            kernel: k,
            stride: s,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (k, s) = (self.kernel, self.stride);
        let len = x.dim(2)?;
        let pad = k - s;
        // (len − k + pad) / s + 1 frames, rounded up, then the length that makes them whole
        let frames = (len + pad).saturating_sub(k).div_ceil(s) + 1;
        let ideal = (frames - 1) * s + k - pad;
        let extra = ideal.saturating_sub(len);
        let x = x.pad_with_zeros(2, pad, extra)?;
        Ok(x.conv1d(&self.weight, 0, s, 1, 1)?
            .broadcast_add(&self.bias)?)
    }
}

/// `x + conv1x1(snake(conv7_dilated(snake(x))))`.
#[derive(Debug, Clone)]
pub struct ResidualUnit {
    snake1: SnakeBeta,
    conv1: StreamingCausalConv1d,
    snake2: SnakeBeta,
    conv2: StreamingCausalConv1d,
}

/// The states of a [`ResidualUnit`]'s two convs.
pub type ResidualState = [CausalConvState; 2];

impl ResidualUnit {
    /// `prefix.block.{0: snake, 1: conv k7, 2: snake, 3: conv k1}`.
    pub fn new(w: &CodecWeights, prefix: &str, dim: usize, dilation: usize) -> Result<Self> {
        Ok(Self {
            snake1: snake(w, &format!("{prefix}.block.0"), dim)?,
            conv1: causal_conv(w, &format!("{prefix}.block.1"), dim, dim, 7, dilation, 1)?,
            snake2: snake(w, &format!("{prefix}.block.2"), dim)?,
            conv2: causal_conv(w, &format!("{prefix}.block.3"), dim, dim, 1, 1, 1)?,
        })
    }

    pub fn forward(&self, x: &Tensor, state: &mut ResidualState) -> Result<Tensor> {
        let [s1, s2] = state;
        let y = self
            .conv1
            .forward_then(&self.snake1.forward(x)?, s1, Then::Snake(&self.snake2))?;
        Ok(self.conv2.forward_then(&y, s2, Then::Residual(x))?)
    }
}

/// LayerNorm over the last dim (f32 statistics, biased variance).
#[derive(Debug, Clone)]
pub struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
    eps: f64,
}

impl LayerNorm {
    pub fn new(w: &CodecWeights, prefix: &str, dim: usize, eps: f64) -> Result<Self> {
        Ok(Self {
            weight: w.get(&format!("{prefix}.weight"), &[dim])?,
            bias: w.get(&format!("{prefix}.bias"), &[dim])?,
            eps,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mean = x.mean_keepdim(D::Minus1)?;
        let xc = x.broadcast_sub(&mean)?;
        let var = xc.sqr()?.mean_keepdim(D::Minus1)?;
        let y = xc.broadcast_div(&(var + self.eps)?.sqrt()?)?;
        Ok(y.broadcast_mul(&self.weight)?.broadcast_add(&self.bias)?)
    }
}

/// ConvNeXt: `x + gamma · pwconv2(gelu(pwconv1(LayerNorm(dwconv7(x)))))`, the depthwise conv
/// causal.
#[derive(Debug, Clone)]
pub struct ConvNeXt {
    dwconv: StreamingCausalConv1d,
    norm: LayerNorm,
    pwconv1: crate::nn::Linear,
    pwconv2: crate::nn::Linear,
    gamma: Tensor,
}

impl ConvNeXt {
    pub fn new(w: &CodecWeights, prefix: &str, dim: usize) -> Result<Self> {
        let lin = |name: &str, i: usize, o: usize| -> Result<crate::nn::Linear> {
            let p = format!("{prefix}.{name}");
            Ok(crate::nn::Linear::new(
                w.get(&format!("{p}.weight"), &[o, i])?,
                Some(w.get(&format!("{p}.bias"), &[o])?),
            ))
        };
        Ok(Self {
            dwconv: causal_conv(w, &format!("{prefix}.dwconv"), dim, dim, 7, 1, dim)?,
            norm: LayerNorm::new(w, &format!("{prefix}.norm"), dim, 1e-6)?,
            pwconv1: lin("pwconv1", dim, 4 * dim)?,
            pwconv2: lin("pwconv2", 4 * dim, dim)?,
            gamma: w.get(&format!("{prefix}.gamma"), &[dim])?,
        })
    }

    pub fn forward(&self, x: &Tensor, state: &mut CausalConvState) -> Result<Tensor> {
        let y = self.dwconv.forward(x, state)?.transpose(1, 2)?; // [b, t, c]
        // Row by row on the CPU: a stream in a batched pass rounds as it does alone.
        let y =
            crate::nn::conv::per_row_on_cpu(&self.norm.forward(&y)?, |r| self.pwconv1.forward(r))?
                .gelu_erf()?;
        let y = crate::nn::conv::per_row_on_cpu(&y, |r| self.pwconv2.forward(r))?
            .broadcast_mul(&self.gamma)?;
        Ok((x + y.transpose(1, 2)?)?)
    }
}
