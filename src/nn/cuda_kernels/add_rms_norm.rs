//! Launcher of `add_rms_norm.cu`: the residual add and the following RMSNorm in one kernel
//! (reference: `h = x + attn` then `RmsNorm::forward(h)` in `src/nn/transformer.rs`; candle's
//! CUDA `rms_norm` numerics).

use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{Result, Tensor};

use super::{Args, cuda_device, dev_ptr, empty, expect, kernel_name};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/add_rms_norm.ptx"));
const MODULE: &str = "omnitts_add_rms_norm";
/// Threads per block (`ADD_RMS_THREADS` in the kernel).
const THREADS: u32 = 256;

/// `sum = a + b` (rounded to the dtype: the residual stream) and
/// `normed = sum · rsqrt(mean(sum²) + eps) · w` (f32 statistics, one rounding), over the last
/// dimension. `a`, `b`: same shape `[..., cols]`, contiguous; `w` `[cols]`; all bf16 or all f32.
/// Returns `(sum, normed)`, both of `a`'s shape.
pub fn add_rms_norm(a: &Tensor, b: &Tensor, w: &Tensor, eps: f64) -> Result<(Tensor, Tensor)> {
    let dtype = a.dtype();
    expect(a, dtype, "residual")?;
    expect(b, dtype, "update")?;
    expect(w, dtype, "norm weight")?;
    if a.dims() != b.dims() {
        candle_core::bail!("add_rms_norm: {:?} + {:?}", a.dims(), b.dims());
    }
    let cols = a.dims().last().copied().unwrap_or(0);
    if cols == 0 || w.dims1()? != cols {
        candle_core::bail!("add_rms_norm: weight {:?} for rows of {cols}", w.dims());
    }
    let rows = a.elem_count() / cols;
    let dev = cuda_device(a)?;
    let sum = empty(&dev, dtype, a.shape().clone())?;
    let normed = empty(&dev, dtype, a.shape().clone())?;
    let (pa, pb, pw) = (dev_ptr(a, &dev)?, dev_ptr(b, &dev)?, dev_ptr(w, &dev)?);
    let (ps, pn) = (dev_ptr(&sum, &dev)?, dev_ptr(&normed, &dev)?);
    let args = Args::default()
        .ptr(pa.addr)
        .ptr(pb.addr)
        .ptr(pw.addr)
        .ptr(ps.addr)
        .ptr(pn.addr)
        .i32(cols)?
        .f32(eps as f32);
    let cfg = LaunchConfig {
        grid_dim: (
            u32::try_from(rows)
                .map_err(|_| candle_core::Error::Msg("add_rms_norm: too many rows".into()))?,
            1,
            1,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    args.launch(&dev, MODULE, PTX, &kernel_name("add_rms_norm", dtype)?, cfg)?;
    drop((pa, pb, pw, ps, pn));
    Ok((sum, normed))
}
