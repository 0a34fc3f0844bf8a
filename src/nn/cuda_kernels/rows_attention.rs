//! Launcher of `rows_attention.cu`: a batched talker step's attention, each row (stream) at its
//! own position over its own KV cache, read from device tables. Per row it is exactly
//! [`super::rope_attention::rope_attention`] of that row alone (the same device function), so a
//! batched step attends as the one-stream step does.

use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{DType, Result, Tensor};

use super::qk_norm_rope::{self, HeadNorms, Heads};
use super::{Args, cuda_device, dev_ptr, empty, expect, kernel_name, row_stride};
use super::{decode_attention, rope_attention};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/rows_attention.ptx"));
const MODULE: &str = "omnitts_rows_attention";

/// The device tables of one layer's KV caches for a batch of `rows` streams: `caches` i64
/// `[2, rows]` (row r's key buffer address, then its value buffer address; each buffer one
/// stream's `[1, kv_heads, cap_r, head_dim]` cache of the layer), `caps` u32 `[rows]` (cap_r).
/// The buffers must stay alive and unmoved while a launch that reads the tables runs.
#[derive(Debug, Clone, Copy)]
pub struct RowCaches<'a> {
    pub caches: &'a Tensor,
    pub caps: &'a Tensor,
}

/// Whether the kernel takes heads of width `hd` (those [`rope_attention`] takes).
pub fn supports_head_dim(hd: usize) -> bool {
    rope_attention::supports_head_dim(hd)
}

/// q/k head norms, RoPE at `positions[r]` (u32 `[rows]`, on the device), the key/value written
/// into slot `positions[r]` of row r's caches (`kv`), and attention over its keys
/// `0..=positions[r]`, for every row of `q` `[rows, 1, nh·hd]` and `k`/`v` `[rows, 1, nkv·hd]`
/// (rows evenly spaced: views of one q/k/v output are fine) in one launch. `q_w`/`k_w`: the head
/// norms' weights `[hd]`; `cos`/`sin`: f32 RoPE tables `[positions, hd/2]` from position 0;
/// `max_keys` (≤ [`decode_attention::MAX_KEYS`]) sizes the shared memory, so every position must
/// be below it, below its row's cap and below the tables' length: the caller checks that (a row
/// past it attends to fewer keys, it does not fault). Returns `[rows, 1, nh·hd]`, ready for
/// `o_proj`. Errors on mismatched shapes or dtypes.
#[allow(clippy::too_many_arguments)]
pub fn rows_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    norms: Option<HeadNorms<'_>>,
    cos: &Tensor,
    sin: &Tensor,
    positions: &Tensor,
    kv: RowCaches<'_>,
    heads: Heads,
    max_keys: usize,
    scale: f64,
) -> Result<Tensor> {
    let Heads { nh, nkv, hd } = heads;
    let dtype = q.dtype();
    let (rows, t, qw) = q.dims3()?;
    if t != 1
        || qw != nh * hd
        || k.dims3()? != (rows, 1, nkv * hd)
        || v.dims3()? != (rows, 1, nkv * hd)
        || k.dtype() != dtype
        || v.dtype() != dtype
    {
        candle_core::bail!(
            "rows_attention: q {:?} k {:?} v {:?} are not one position of {nh}/{nkv} heads of {hd}",
            q.dims(),
            k.dims(),
            v.dims()
        );
    }
    if !supports_head_dim(hd) || nkv == 0 || nh % nkv != 0 {
        candle_core::bail!("rows_attention: unsupported heads {heads:?}");
    }
    if max_keys == 0 || max_keys > decode_attention::MAX_KEYS {
        candle_core::bail!("rows_attention: {max_keys} keys unsupported");
    }
    qk_norm_rope::check_norms(norms, dtype, hd, "rows_attention")?;
    expect(cos, DType::F32, "cos table")?;
    expect(sin, DType::F32, "sin table")?;
    expect(positions, DType::U32, "positions")?;
    expect(kv.caches, DType::I64, "cache table")?;
    expect(kv.caps, DType::U32, "cache capacities")?;
    let (table_len, half) = cos.dims2()?;
    if half != hd / 2
        || sin.dims2()? != (table_len, half)
        || positions.dims1()? != rows
        || kv.caches.dims2()? != (2, rows)
        || kv.caps.dims1()? != rows
    {
        candle_core::bail!(
            "rows_attention: tables {:?}, positions {:?} or cache tables {:?} / {:?} do not match \
             {rows} rows of head width {hd}",
            cos.dims(),
            positions.dims(),
            kv.caches.dims(),
            kv.caps.dims()
        );
    }
    let align = 16 / dtype.size_in_bytes();
    if !q.layout().start_offset().is_multiple_of(align) {
        candle_core::bail!("rows_attention: q starts at an unaligned offset");
    }
    let dev = cuda_device(q)?;
    let q_rot = empty(&dev, dtype, (rows, nh, hd))?;
    let out = empty(&dev, dtype, (rows, 1, nh * hd))?;
    let (qs, ks, vs) = (row_stride(q)?, row_stride(k)?, row_stride(v)?);
    let (pq, pk, pv) = (dev_ptr(q, &dev)?, dev_ptr(k, &dev)?, dev_ptr(v, &dev)?);
    let (pqw, pkw, eps, norm_guards) = qk_norm_rope::norm_args(norms, &dev)?;
    let (pcos, psin) = (dev_ptr(cos, &dev)?, dev_ptr(sin, &dev)?);
    let (ppos, pkv, pcaps) = (
        dev_ptr(positions, &dev)?,
        dev_ptr(kv.caches, &dev)?,
        dev_ptr(kv.caps, &dev)?,
    );
    let (prot, pout) = (dev_ptr(&q_rot, &dev)?, dev_ptr(&out, &dev)?);
    let args = Args::default()
        .ptr(pq.addr)
        .ptr(pk.addr)
        .ptr(pv.addr)
        .i32(qs)?
        .i32(ks)?
        .i32(vs)?
        .ptr(pqw)
        .ptr(pkw)
        .ptr(pcos.addr)
        .ptr(psin.addr)
        .ptr(ppos.addr)
        .ptr(pkv.addr)
        .ptr(pcaps.addr)
        .ptr(prot.addr)
        .ptr(pout.addr)
        .i32(nh)?
        .i32(nkv)?
        .i32(hd)?
        .i32(max_keys)?
        .f32(eps)
        .f32(scale as f32);
    let name = kernel_name("rows_attention", dtype)?;
    let shared = decode_attention::shared_bytes(max_keys, hd);
    let threads = decode_attention::block_threads(
        &dev,
        (MODULE, PTX, &name),
        nh * rows,
        shared,
        max_keys,
        hd,
    )?;
    let cfg = LaunchConfig {
        grid_dim: (nh as u32, 1, rows as u32),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: shared as u32,
    };
    args.launch(&dev, MODULE, PTX, &name, cfg)?;
    drop((
        pq,
        pk,
        pv,
        norm_guards,
        pcos,
        psin,
        ppos,
        pkv,
        pcaps,
        prot,
        pout,
    ));
    Ok(out)
}
