//! RMSNorm exactly as Hugging Face computes it (`Qwen3TTSRMSNorm` in the reference
//! `modeling_qwen3_tts.py`): statistics in f32 (in f64 for f64 inputs), normalised value cast back
//! to the input dtype, then multiplied by the weight.
//!
//! On CUDA the same function runs as candle's fused `rms_norm` kernel (one launch instead of
//! nine; it accumulates in f32 and rounds once, after the weight multiply, where the reference
//! rounds the normalised value before the multiply: a difference of at most one rounding of the
//! activation dtype, none in f32 beyond `rsqrt` vs `1/sqrt`). The CPU keeps the literal reference
//! sequence, which the fixture parity tests pin.

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

    /// From a weight `[dim]` already loaded (e.g. from a PyTorch state dict).
    pub fn from_weight(weight: Tensor, eps: f64) -> Self {
        Self { weight, eps }
    }

    /// Epsilon added to the mean square.
    pub fn eps(&self) -> f64 {
        self.eps
    }

    /// The weight `[dim]` in `dtype` (no copy when it already is).
    pub fn weight_as(&self, dtype: DType) -> Result<Tensor> {
        self.weight.to_dtype(dtype)
    }

    /// `x`: `[..., dim]` in any float dtype → same shape and dtype.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let in_dtype = x.dtype();
        if x.device().is_cuda() && in_dtype != DType::F64 {
            let w = self.weight.to_dtype(in_dtype)?;
            return candle_nn::ops::rms_norm(&x.contiguous()?, &w, self.eps as f32);
        }
        // f64 inputs (verification runs) keep their precision.
        let xf = x.to_dtype(if in_dtype == DType::F64 {
            DType::F64
        } else {
            DType::F32
        })?;
        let variance = xf.sqr()?.mean_keepdim(D::Minus1)?;
        let inv = (variance + self.eps)?.sqrt()?.recip()?;
        let normed = xf.broadcast_mul(&inv)?.to_dtype(in_dtype)?;
        normed.broadcast_mul(&self.weight.to_dtype(in_dtype)?)
    }
}
