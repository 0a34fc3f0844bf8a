//! RMSNorm exactly as Hugging Face computes it (`Qwen3TTSRMSNorm` in the reference
//! `modeling_qwen3_tts.py`): statistics in f32, normalised value cast back to the input dtype,
//! then multiplied by the weight.

use candle_core::{D, DType, Result, Tensor};

use super::weights::{WeightError, Weights};

/// RMSNorm over the last dimension. Weight `[dim]`.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    /// Loads `prefix.weight` of shape `[dim]`.
    pub fn new(dim: usize, eps: f64, vb: &Weights) -> std::result::Result<Self, WeightError> {
        Ok(Self {
            weight: vb.get(&[dim], "weight")?,
            eps,
        })
    }

    /// `x`: `[..., dim]` in any float dtype → same shape and dtype.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let in_dtype = x.dtype();
        let xf = x.to_dtype(DType::F32)?;
        let variance = xf.sqr()?.mean_keepdim(D::Minus1)?;
        let inv = (variance + self.eps)?.sqrt()?.recip()?;
        let normed = xf.broadcast_mul(&inv)?.to_dtype(in_dtype)?;
        normed.broadcast_mul(&self.weight.to_dtype(in_dtype)?)
    }
}
