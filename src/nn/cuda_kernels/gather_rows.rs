//! Launcher of `gather_rows.cu`: rows that lie anywhere on the device stacked into one tensor,
//! 32 rows a launch (reference: `Tensor::cat` along dimension 0, one copy kernel per row).

use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{DType, Result, Tensor};

use super::embed_sum::MAX_TABLES;
use super::{Args, cuda_device, dev_ptr, device_address, empty, expect};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/gather_rows.ptx"));
const MODULE: &str = "omnitts_gather_rows";
/// Threads per block (`GATHER_THREADS` in the kernel).
const THREADS: usize = 256;

/// `rows` (each `[1, …]`, contiguous, bf16 or f32, all of one shape and dtype, on one CUDA device)
/// as one new contiguous tensor `[rows.len(), …]`, in order.
///
/// The rows' storages must stay alive until the copy has run: the caller holds them across the call
/// (work is queued on the device's one stream, so a later free cannot overtake it).
///
/// Errors on an empty list, mismatched shapes or dtypes, or a non-contiguous row.
pub fn gather_rows(rows: &[&Tensor]) -> Result<Tensor> {
    let Some(first) = rows.first() else {
        candle_core::bail!("gather_rows: no rows");
    };
    let dtype = first.dtype();
    let name = match dtype {
        DType::BF16 => "gather_rows_u16",
        DType::F32 => "gather_rows_u32",
        other => candle_core::bail!("gather_rows: {other:?} rows"),
    };
    if first.dim(0)? != 1 {
        candle_core::bail!("gather_rows: rows of {:?}, expected [1, …]", first.dims());
    }
    for r in rows {
        expect(r, dtype, "gathered row")?;
        if r.dims() != first.dims() {
            candle_core::bail!(
                "gather_rows: a {:?} row with a {:?} one",
                r.dims(),
                first.dims()
            );
        }
    }
    let mut dims = first.dims().to_vec();
    dims[0] = rows.len();
    let dev = cuda_device(first)?;
    let out = empty(&dev, dtype, dims)?;
    let n = first.elem_count();
    if n == 0 {
        return Ok(out);
    }
    let po = dev_ptr(&out, &dev)?;
    let blocks = n.div_ceil(THREADS).min(64) as u32;
    for (group, chunk) in rows.chunks(MAX_TABLES).enumerate() {
        let mut ptrs = [0u64; MAX_TABLES];
        for (p, r) in ptrs.iter_mut().zip(chunk) {
            *p = device_address(r)?;
        }
        let args = Args::default()
            .ptrs(ptrs)
            .ptr(po.addr)
            .i64(n)?
            .i32(group * MAX_TABLES)?;
        let cfg = LaunchConfig {
            grid_dim: (blocks, chunk.len() as u32, 1),
            block_dim: (THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        args.launch(&dev, MODULE, PTX, name, cfg)?;
    }
    drop(po);
    Ok(out)
}
