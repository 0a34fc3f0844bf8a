//! SwiGLU MLP (`Qwen3TTSTalkerTextMLP` in the reference): `down(silu(gate(x)) * up(x))`, no bias.

use super::linear::Linear;
use candle_core::{Module, Result, Tensor};

use super::weights::{WeightError, Weights};

/// Weights `gate_proj`/`up_proj` `[intermediate, hidden]`, `down_proj` `[hidden, intermediate]`.
#[derive(Debug, Clone)]
pub struct Mlp {
    pub(super) gate_proj: Linear,
    pub(super) up_proj: Linear,
    pub(super) down_proj: Linear,
    /// gate and up as one matmul (weights concatenated; `gate_proj`/`up_proj` are then row views
    /// of it): set on CUDA when the fused decode kernels are on (`fused_decode.rs`).
    #[cfg(feature = "cuda")]
    pub(super) gate_up: Option<Linear>,
}

impl Mlp {
    pub fn new(
        hidden: usize,
        intermediate: usize,
        vb: &Weights,
    ) -> std::result::Result<Self, WeightError> {
        let gate_proj = vb.linear(hidden, intermediate, false, "gate_proj")?;
        let up_proj = vb.linear(hidden, intermediate, false, "up_proj")?;
        #[cfg(feature = "cuda")]
        let ([gate_proj, up_proj], gate_up) =
            super::fused_decode::fuse(vb.device(), [gate_proj, up_proj]);
        Ok(Self {
            gate_proj,
            up_proj,
            down_proj: vb.linear(intermediate, hidden, false, "down_proj")?,
            #[cfg(feature = "cuda")]
            gate_up,
        })
    }

    /// An MLP from weights already loaded under other names: `gate_proj`/`up_proj`
    /// `[intermediate, hidden]`, `down_proj` `[hidden, intermediate]`, on `device` (on CUDA, gate
    /// and up are fused into one matmul as [`Self::new`] does).
    pub fn from_parts(
        gate_proj: Linear,
        up_proj: Linear,
        down_proj: Linear,
        device: &candle_core::Device,
    ) -> Self {
        #[cfg(feature = "cuda")]
        let ([gate_proj, up_proj], gate_up) =
            super::fused_decode::fuse(device, [gate_proj, up_proj]);
        #[cfg(not(feature = "cuda"))]
        let _ = device;
        Self {
            gate_proj,
            up_proj,
            down_proj,
            #[cfg(feature = "cuda")]
            gate_up,
        }
    }

    /// `x`: `[batch, seq, hidden]` → `[batch, seq, hidden]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let gate = candle_nn::ops::silu(&self.gate_proj.forward(x)?)?;
        let up = self.up_proj.forward(x)?;
        self.down_proj.forward(&(gate * up)?)
    }
}
