//! Launcher of `snake_beta.cu`: the Code2Wav decoder's SnakeBeta activation in one kernel, f32
//! inside, one rounding (reference: [`crate::nn::snake_beta::SnakeBeta`]'s tensor operations).

use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{DType, Result, Tensor};

use super::{Args, cuda_device, dev_ptr, empty, expect, kernel_name};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/snake_beta.ptx"));
const MODULE: &str = "omnitts_snake_beta";
/// Threads per block (`SNAKE_THREADS` in the kernel).
const THREADS: usize = 256;

/// `x` `[batch, channels, time]` (bf16 or f32; made contiguous) →
/// `x + inv_magnitude[c] · sin(x · frequency[c])²`, contiguous, same shape and dtype.
/// `frequency` and `inv_magnitude` are f32 `[channels]` on the same device.
///
/// Errors if the shapes or dtypes disagree or `x` is not on a CUDA device.
pub fn snake_beta(x: &Tensor, frequency: &Tensor, inv_magnitude: &Tensor) -> Result<Tensor> {
    let (b, c, t) = x.dims3()?;
    expect(frequency, DType::F32, "SnakeBeta frequency")?;
    expect(inv_magnitude, DType::F32, "SnakeBeta inverse magnitude")?;
    if frequency.dims1()? != c || inv_magnitude.dims1()? != c {
        candle_core::bail!(
            "snake_beta: {c} channels, parameters {:?} and {:?}",
            frequency.dims(),
            inv_magnitude.dims()
        );
    }
    let x = x.contiguous()?;
    let dev = cuda_device(&x)?;
    let out = empty(&dev, x.dtype(), (b, c, t))?;
    if out.elem_count() == 0 {
        return Ok(out);
    }
    let (px, pf, pm, po) = (
        dev_ptr(&x, &dev)?,
        dev_ptr(frequency, &dev)?,
        dev_ptr(inv_magnitude, &dev)?,
        dev_ptr(&out, &dev)?,
    );
    let args = Args::default()
        .ptr(px.addr)
        .ptr(pf.addr)
        .ptr(pm.addr)
        .ptr(po.addr)
        .i32(c)?
        .i32(t)?;
    let rows = u32::try_from(b * c)
        .map_err(|_| candle_core::Error::Msg(format!("snake_beta: {} rows", b * c)))?;
    let cfg = LaunchConfig {
        grid_dim: (rows, t.div_ceil(THREADS) as u32, 1),
        block_dim: (THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    args.launch(
        &dev,
        MODULE,
        PTX,
        &kernel_name("snake_beta", x.dtype())?,
        cfg,
    )?;
    drop((px, pf, pm, po));
    Ok(out)
}
