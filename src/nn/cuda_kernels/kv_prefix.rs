//! Launcher of `kv_prefix.cu`: the first positions of one stack's KV cache copied into another's,
//! every layer's keys and values in one launch (the prefill graphs' scratch cache into a stream's
//! own: `models/qwen3_tts/graphs/prefill.rs`).

use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{DType, Result, Tensor};

use super::{Args, cuda_device, dev_ptr};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/kv_prefix.ptx"));
const MODULE: &str = "omnitts_kv_prefix";
/// Threads per block at most (`KV_PREFIX_THREADS` in the kernel).
const THREADS: usize = 128;

/// Copies positions `0..count` of each source buffer into the destination buffer at the same
/// index: `src`/`dst` are the buffers (each a layer's keys or values, `[1, kv_heads, capacity,
/// head_dim]`, contiguous, bf16 or f32, every buffer of one list the same shape and dtype).
/// Errors when the lists differ in length, the shapes, dtypes or devices disagree, `count`
/// exceeds either capacity, or the buffers are not on a CUDA device. `count` 0 copies nothing.
pub fn kv_prefix_copy(src: &[&Tensor], dst: &[&Tensor], count: usize) -> Result<()> {
    let (Some(s0), Some(d0)) = (src.first(), dst.first()) else {
        return Ok(());
    };
    if src.len() != dst.len() {
        candle_core::bail!(
            "kv_prefix_copy: {} sources, {} destinations",
            src.len(),
            dst.len()
        );
    }
    let (b, kv_heads, src_cap, head_dim) = s0.dims4()?;
    let (db, dkv, dst_cap, dhd) = d0.dims4()?;
    let dtype = s0.dtype();
    if b != 1 || (db, dkv, dhd) != (1, kv_heads, head_dim) || d0.dtype() != dtype {
        candle_core::bail!(
            "kv_prefix_copy: source {:?} {dtype:?}, destination {:?} {:?}",
            s0.dims(),
            d0.dims(),
            d0.dtype()
        );
    }
    let same = |t: &&Tensor, like: &Tensor| {
        t.dims() == like.dims() && t.dtype() == dtype && t.is_contiguous()
    };
    if !src.iter().all(|t| same(t, s0)) || !dst.iter().all(|t| same(t, d0)) {
        candle_core::bail!("kv_prefix_copy: buffers of one list differ in shape, dtype or layout");
    }
    if count > src_cap || count > dst_cap {
        candle_core::bail!(
            "kv_prefix_copy: {count} positions for buffers of {src_cap} and {dst_cap} slots"
        );
    }
    let elem = match dtype {
        DType::BF16 => 2,
        DType::F32 => 4,
        other => candle_core::bail!("kv_prefix_copy: no kernel for {other:?}"),
    };
    if count == 0 {
        return Ok(());
    }
    let row_words = head_dim * elem / 4;
    let dev = cuda_device(s0)?;
    let addrs = |list: &[&Tensor]| -> Result<Vec<i64>> {
        list.iter()
            .map(|t| Ok(dev_ptr(t, &dev)?.addr as i64))
            .collect()
    };
    let device = s0.device();
    let src_table = Tensor::new(addrs(src)?.as_slice(), device)?;
    let dst_table = Tensor::new(addrs(dst)?.as_slice(), device)?;
    let (ps, pd) = (dev_ptr(&src_table, &dev)?, dev_ptr(&dst_table, &dev)?);
    let args = Args::default()
        .ptr(ps.addr)
        .ptr(pd.addr)
        .i32(kv_heads)?
        .i32(src_cap)?
        .i32(dst_cap)?
        .i32(row_words)?;
    let grid = |n: usize, what: &str| {
        u32::try_from(n).map_err(|_| candle_core::Error::Msg(format!("kv_prefix_copy: {n} {what}")))
    };
    let cfg = LaunchConfig {
        grid_dim: (
            grid(src.len(), "buffers")?,
            grid(kv_heads, "heads")?,
            grid(count, "positions")?,
        ),
        block_dim: (row_words.clamp(1, THREADS) as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    args.launch(&dev, MODULE, PTX, "kv_prefix_copy", cfg)?;
    drop((ps, pd));
    Ok(())
}
