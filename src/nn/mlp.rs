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
    /// gate and up as one matmul (weights concatenated; `gate_proj`/`up_proj` are then row views
    /// of it): set on CUDA when the fused decode kernels are on. Used by [`Self::forward_fused`].
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    gate_up: Option<Linear>,
}

impl Mlp {
    pub fn new(
        hidden: usize,
        intermediate: usize,
        vb: &Weights,
    ) -> std::result::Result<Self, WeightError> {
        let gate_proj = vb.linear(hidden, intermediate, false, "gate_proj")?;
        let up_proj = vb.linear(hidden, intermediate, false, "up_proj")?;
        #[allow(unused_mut)]
        let (mut gate_proj, mut up_proj, mut gate_up) = (gate_proj, up_proj, None);
        #[cfg(feature = "cuda")]
        if vb.device().is_cuda()
            && super::cuda_kernels::enabled()
            && let Ok((parts, fused)) =
                super::cuda_kernels::fused_linear::fuse_linears(&[&gate_proj, &up_proj])
        {
            let mut parts = parts.into_iter();
            if let (Some(g), Some(u)) = (parts.next(), parts.next()) {
                (gate_proj, up_proj, gate_up) = (g, u, Some(fused));
            }
        }
        Ok(Self {
            gate_proj,
            up_proj,
            down_proj: vb.linear(intermediate, hidden, false, "down_proj")?,
            gate_up,
        })
    }

    /// `x`: `[batch, seq, hidden]` → `[batch, seq, hidden]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let gate = candle_nn::ops::silu(&self.gate_proj.forward(x)?)?;
        let up = self.up_proj.forward(x)?;
        self.down_proj.forward(&(gate * up)?)
    }

    /// The fused gate/up weight `[2·intermediate, hidden]` (gate rows first) and `down_proj`'s
    /// weight `[hidden, intermediate]`, when the fused weight exists and `down_proj` has no bias
    /// (the one-row matmul path of [`super::transformer::LayerCaches::run_fused`]).
    #[cfg(feature = "cuda")]
    pub(crate) fn gemv_weights(&self) -> Option<(&Tensor, &Tensor)> {
        let gate_up = self.gate_up.as_ref()?;
        (gate_up.bias().is_none() && self.down_proj.bias().is_none())
            .then(|| (gate_up.weight(), self.down_proj.weight()))
    }

    /// [`Self::forward`] with the fused CUDA kernels (`src/nn/cuda_kernels`): one gate/up matmul
    /// (two without the fused weight), one SiLU·up kernel, the down matmul. `x` `[batch, t,
    /// hidden]`, bf16 or f32 on CUDA.
    #[cfg(feature = "cuda")]
    pub(crate) fn forward_fused(&self, x: &Tensor) -> Result<Tensor> {
        let (gate, up) = match &self.gate_up {
            Some(gu) => {
                let gu = gu.forward(x)?;
                let n = gu.dim(2)? / 2;
                (gu.narrow(2, 0, n)?, gu.narrow(2, n, n)?)
            }
            None => (self.gate_proj.forward(x)?, self.up_proj.forward(x)?),
        };
        self.down_proj
            .forward(&super::cuda_kernels::silu_mul::silu_mul(&gate, &up)?)
    }
}
