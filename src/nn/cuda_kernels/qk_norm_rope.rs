//! Launcher of `qk_norm_rope.cu`: per-head RMSNorm of q and k, NeoX RoPE, and the write of the new
//! key and value into their KV-cache slot, in one kernel (reference: `Attention::qkv` + the cache
//! write of `Attention::forward` / `forward_at_slot`, `src/nn/attention.rs`).

use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{Result, Tensor};

use super::{Args, Pos, cuda_device, dev_ptr, empty, expect, kernel_name, row_stride};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/qk_norm_rope.ptx"));
const MODULE: &str = "omnitts_qk_norm_rope";

/// Head counts and width of the attention layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Heads {
    /// Query heads.
    pub nh: usize,
    /// Key/value heads (`nh % nkv == 0`).
    pub nkv: usize,
    /// Per-head width ([`supports_head_dim`]).
    pub hd: usize,
}

/// The per-head RMSNorms of q and k that the kernels apply before RoPE: weights `[hd]` in the
/// activation dtype and their epsilon. A stack without them passes `None`: RoPE only.
#[derive(Debug, Clone, Copy)]
pub struct HeadNorms<'a> {
    pub q: &'a Tensor,
    pub k: &'a Tensor,
    pub eps: f64,
}

/// The launch arguments of `norms`: the weights' addresses (0 for none: the kernels then skip
/// the norm), the epsilon, and the guards that keep the weights' storage borrowed.
pub(super) fn norm_args<'a>(
    norms: Option<HeadNorms<'a>>,
    dev: &candle_core::cuda_backend::CudaDevice,
) -> Result<(
    u64,
    u64,
    f32,
    Option<(super::DevPtr<'a>, super::DevPtr<'a>)>,
)> {
    Ok(match norms {
        Some(n) => {
            let (q, k) = (super::dev_ptr(n.q, dev)?, super::dev_ptr(n.k, dev)?);
            (q.addr, k.addr, n.eps as f32, Some((q, k)))
        }
        None => (0, 0, 0.0, None),
    })
}

/// Checks `norms` against `dtype` and the head width `hd`.
pub(super) fn check_norms(
    norms: Option<HeadNorms<'_>>,
    dtype: candle_core::DType,
    hd: usize,
    what: &str,
) -> Result<()> {
    let Some(n) = norms else { return Ok(()) };
    expect(n.q, dtype, "q_norm weight")?;
    expect(n.k, dtype, "k_norm weight")?;
    if n.q.dims1()? != hd || n.k.dims1()? != hd {
        candle_core::bail!(
            "{what}: norm weights {:?} / {:?} do not match hd {hd}",
            n.q.dims(),
            n.k.dims()
        );
    }
    Ok(())
}

/// Whether the kernel handles heads of width `hd`: one thread per NeoX pair, `hd / 2` threads a
/// block, which must be whole warps (its block reductions shuffle across all 32 lanes), so `hd` is
/// a multiple of 64, at most 2048. Narrower heads (the tiny test checkpoints: 16) take the unfused ops.
pub fn supports_head_dim(hd: usize) -> bool {
    hd >= 64 && hd.is_multiple_of(64) && hd <= 2048
}

/// Normalises and rotates the new queries and keys, and writes keys and values into the cache.
///
/// - `q` `[batch, t, nh·hd]`, `k`/`v` `[batch, t, nkv·hd]`: projections, contiguous or last-dim
///   narrows of one fused QKV output (evenly spaced unit-stride rows).
/// - `q_w`/`k_w` `[hd]`: the head norms' weights; `eps` their epsilon (both norms share it).
/// - `cos`/`sin` f32 `[positions, hd/2]`, row p = position p (tables from position 0).
/// - `pos`: position of query 0; query i is at `pos + i` (must be `< positions`).
/// - `k_cache`/`v_cache` `[batch, nkv, cap, hd]` contiguous: slot `pos + i` is overwritten
///   (slots `>= cap` are skipped: the caller ensures room).
///
/// Returns the queries `[batch, nh, t, hd]` (what [`super::decode_attention::decode_attention`]
/// takes). All tensors share `q`'s dtype (bf16 or f32) except the f32 tables.
/// The checks of [`qk_norm_rope_kv`] (shapes, dtypes, tables, a host position's range), shared
/// with [`super::rope_attention`]. Returns `(batch, t, cap)`.
#[allow(clippy::too_many_arguments)]
pub(super) fn check(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    norms: Option<HeadNorms<'_>>,
    cos: &Tensor,
    sin: &Tensor,
    pos: Pos<'_>,
    k_cache: &Tensor,
    v_cache: &Tensor,
    heads: Heads,
) -> Result<(usize, usize, usize)> {
    let Heads { nh, nkv, hd } = heads;
    let dtype = q.dtype();
    let (b, t, qw) = q.dims3()?;
    if qw != nh * hd || k.dims3()? != (b, t, nkv * hd) || v.dims3()? != (b, t, nkv * hd) {
        candle_core::bail!(
            "qk_norm_rope_kv: q {:?} k {:?} v {:?} do not match {nh}/{nkv} heads of {hd}",
            q.dims(),
            k.dims(),
            v.dims()
        );
    }
    if !supports_head_dim(hd) || nkv == 0 || nh % nkv != 0 {
        candle_core::bail!("qk_norm_rope_kv: unsupported heads {heads:?}");
    }
    for (x, what) in [(k, "k"), (v, "v")] {
        if x.dtype() != dtype {
            candle_core::bail!("qk_norm_rope_kv: {what} is {:?}, q {dtype:?}", x.dtype());
        }
    }
    check_norms(norms, dtype, hd, "qk_norm_rope_kv")?;
    expect(k_cache, dtype, "k cache")?;
    expect(v_cache, dtype, "v cache")?;
    expect(cos, candle_core::DType::F32, "cos table")?;
    expect(sin, candle_core::DType::F32, "sin table")?;
    let (cb, ch, cap, cd) = k_cache.dims4()?;
    if (cb, ch, cd) != (b, nkv, hd) || v_cache.dims4()? != (b, nkv, cap, hd) {
        candle_core::bail!(
            "qk_norm_rope_kv: caches {:?} / {:?} do not hold [{b}, {nkv}, _, {hd}]",
            k_cache.dims(),
            v_cache.dims()
        );
    }
    let (positions, half) = cos.dims2()?;
    if half != hd / 2 || sin.dims2()? != (positions, half) {
        candle_core::bail!(
            "qk_norm_rope_kv: tables {:?} do not match hd {hd}",
            cos.dims()
        );
    }
    if let Pos::Host(p) = pos
        && (p + t > positions || p + t > cap)
    {
        candle_core::bail!(
            "qk_norm_rope_kv: positions {p}..{} past the tables ({positions}) or cache ({cap})",
            p + t
        );
    }
    Ok((b, t, cap))
}

#[allow(clippy::too_many_arguments)]
pub fn qk_norm_rope_kv(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    norms: Option<HeadNorms<'_>>,
    cos: &Tensor,
    sin: &Tensor,
    pos: Pos<'_>,
    k_cache: &Tensor,
    v_cache: &Tensor,
    heads: Heads,
) -> Result<Tensor> {
    let Heads { nh, nkv, hd } = heads;
    let dtype = q.dtype();
    let (b, t, cap) = check(q, k, v, norms, cos, sin, pos, k_cache, v_cache, heads)?;
    let dev = cuda_device(q)?;
    let out = empty(&dev, dtype, (b, nh, t, hd))?;
    let (qs, ks, vs) = (row_stride(q)?, row_stride(k)?, row_stride(v)?);
    let (pq, pk, pv) = (dev_ptr(q, &dev)?, dev_ptr(k, &dev)?, dev_ptr(v, &dev)?);
    let (pqw, pkw, eps, norm_guards) = norm_args(norms, &dev)?;
    let (pcos, psin) = (dev_ptr(cos, &dev)?, dev_ptr(sin, &dev)?);
    let (pkc, pvc, pout) = (
        dev_ptr(k_cache, &dev)?,
        dev_ptr(v_cache, &dev)?,
        dev_ptr(&out, &dev)?,
    );
    let (pos_ptr, pos_host, _pos_guard) = pos.launch_args(&dev, "qk_norm_rope_kv")?;
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
        .ptr(pos_ptr)
        .u32(pos_host)?
        .ptr(pout.addr)
        .ptr(pkc.addr)
        .ptr(pvc.addr)
        .i32(t)?
        .i32(nh)?
        .i32(nkv)?
        .i32(hd)?
        .i32(cap)?
        .f32(eps);
    let cfg = LaunchConfig {
        grid_dim: ((nh + 2 * nkv) as u32, t as u32, b as u32),
        block_dim: ((hd / 2) as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    args.launch(
        &dev,
        MODULE,
        PTX,
        &kernel_name("qk_norm_rope_kv", dtype)?,
        cfg,
    )?;
    drop((pq, pk, pv, norm_guards, pcos, psin, pkc, pvc, pout));
    Ok(out)
}
