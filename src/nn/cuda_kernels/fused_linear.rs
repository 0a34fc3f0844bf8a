//! Projections that read the same input, run as one matmul: their weights concatenated along the
//! output dimension at load time (q/k/v of attention, gate/up of the MLP). The separate layers
//! become row views of the concatenated weight, so no weight is held twice and the unfused
//! (prefill) path multiplies by the very same values.

use crate::nn::Linear;
use candle_core::{Result, Tensor};

/// Concatenates the weights of `parts` (each `[out_i, in]`, no bias) into one `[Σ out_i, in]`
/// layer. Returns the parts rebuilt as views of it, and the fused layer. Errors (the caller keeps
/// the separate layers) on a bias, a quantized layer or mismatched input widths.
pub fn fuse_linears(parts: &[&Linear]) -> Result<(Vec<Linear>, Linear)> {
    if parts.iter().any(|l| l.bias().is_some()) {
        candle_core::bail!("fuse_linears: layers with a bias are not fused");
    }
    let Some(weights) = parts
        .iter()
        .map(|l| l.weight())
        .collect::<Option<Vec<&Tensor>>>()
    else {
        candle_core::bail!("fuse_linears: quantized layers are not fused");
    };
    let fused = Tensor::cat(&weights, 0)?;
    let mut views = Vec::with_capacity(parts.len());
    let mut row = 0;
    for w in &weights {
        let n = w.dim(0)?;
        views.push(Linear::new(fused.narrow(0, row, n)?, None));
        row += n;
    }
    Ok((views, Linear::new(fused, None)))
}
