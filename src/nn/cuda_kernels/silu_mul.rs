//! Launcher of `silu_mul.cu`: `silu(gate) · up` in one kernel, f32 inside, one rounding
//! (reference: `Mlp::forward` in `src/nn/mlp.rs`).

use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{Result, Tensor};

use super::{Args, cuda_device, dev_ptr, empty, kernel_name, row_stride};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/silu_mul.ptx"));
const MODULE: &str = "omnitts_silu_mul";
/// Threads per block (`SILU_THREADS` in the kernel).
const THREADS: usize = 256;

/// `gate`, `up` `[batch, t, cols]` (contiguous, or last-dim narrows of one fused gate/up output),
/// bf16 or f32 → `silu(gate) · up`, contiguous `[batch, t, cols]`.
pub fn silu_mul(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    let dtype = gate.dtype();
    let (b, t, cols) = gate.dims3()?;
    if up.dims3()? != (b, t, cols) || up.dtype() != dtype || cols == 0 {
        candle_core::bail!(
            "silu_mul: gate {:?} {dtype:?}, up {:?} {:?}",
            gate.dims(),
            up.dims(),
            up.dtype()
        );
    }
    let (gs, us) = (row_stride(gate)?, row_stride(up)?);
    let dev = cuda_device(gate)?;
    let out = empty(&dev, dtype, (b, t, cols))?;
    let (pg, pu, po) = (
        dev_ptr(gate, &dev)?,
        dev_ptr(up, &dev)?,
        dev_ptr(&out, &dev)?,
    );
    let args = Args::default()
        .ptr(pg.addr)
        .ptr(pu.addr)
        .ptr(po.addr)
        .i32(gs)?
        .i32(us)?
        .i32(cols)?;
    let cfg = LaunchConfig {
        grid_dim: (cols.div_ceil(THREADS) as u32, (b * t) as u32, 1),
        block_dim: (THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    args.launch(&dev, MODULE, PTX, &kernel_name("silu_mul", dtype)?, cfg)?;
    drop((pg, pu, po));
    Ok(out)
}
