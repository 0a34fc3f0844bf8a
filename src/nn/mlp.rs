//! SwiGLU MLP (`Qwen3TTSTalkerTextMLP` in the reference): `down(silu(gate(x)) * up(x))`, no bias.

use candle_core::{Module, Result, Tensor};
use candle_nn::Linear;

use super::weights::{WeightError, Weights};

/// Weights `gate_proj`/`up_proj` `[intermediate, hidden]`, `down_proj` `[hidden, intermediate]`.
#[derive(Debug, Clone)]
pub struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Mlp {
    pub fn new(
        hidden: usize,
        intermediate: usize,
        vb: &Weights,
    ) -> std::result::Result<Self, WeightError> {
        Ok(Self {
            gate_proj: vb.linear(hidden, intermediate, false, "gate_proj")?,
            up_proj: vb.linear(hidden, intermediate, false, "up_proj")?,
            down_proj: vb.linear(intermediate, hidden, false, "down_proj")?,
        })
    }

    /// `x`: `[batch, seq, hidden]` → `[batch, seq, hidden]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let gate = candle_nn::ops::silu(&self.gate_proj.forward(x)?)?;
        let up = self.up_proj.forward(x)?;
        self.down_proj.forward(&(gate * up)?)
    }
}
