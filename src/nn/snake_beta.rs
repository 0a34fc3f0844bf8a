//! SnakeBeta activation (BigVGAN style), elementwise and stateless.
//!
//! `y = x + 1 / (exp(beta) + 1e-9) * sin(x * exp(alpha))^2`, with per-channel `alpha` and `beta`
//! stored in log space. Reference: `SnakeBeta` in
//! `qwen_tts/core/tokenizer_12hz/modeling_qwen3_tts_tokenizer_v2.py`.

use candle_core::{Result, Tensor};

/// The reference's guard against division by zero.
const NO_DIV_BY_ZERO: f64 = 1e-9;

/// SnakeBeta over `[batch, channels, time]`, with `exp(alpha)` and `1 / (exp(beta) + 1e-9)`
/// precomputed as `[1, channels, 1]`.
#[derive(Debug, Clone)]
pub struct SnakeBeta {
    frequency: Tensor,
    inv_magnitude: Tensor,
}

impl SnakeBeta {
    /// Builds the activation from the checkpoint's log-space `alpha` and `beta`, each `[channels]`.
    pub fn from_log_params(alpha: &Tensor, beta: &Tensor) -> Result<Self> {
        let c = alpha.dims1()?;
        let cb = beta.dims1()?;
        if c != cb {
            candle_core::bail!("SnakeBeta: alpha has {c} channels, beta has {cb}")
        }
        let frequency = alpha.exp()?.reshape((1, c, 1))?;
        let inv_magnitude = (beta.exp()? + NO_DIV_BY_ZERO)?
            .recip()?
            .reshape((1, c, 1))?;
        Ok(Self {
            frequency,
            inv_magnitude,
        })
    }

    /// Number of channels.
    pub fn channels(&self) -> usize {
        self.frequency.dims()[1]
    }

    /// Applies the activation to `x` `[b, channels, t]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let periodic = x.broadcast_mul(&self.frequency)?.sin()?.sqr()?;
        x + periodic.broadcast_mul(&self.inv_magnitude)?
    }
}
