//! Launcher of `rope_attention.cu`: the q/k head norms, RoPE, KV-cache writes and attention of a
//! decode step in one launch, bit-identical to [`super::qk_norm_rope::qk_norm_rope_kv`] followed
//! by [`super::decode_attention::decode_attention`] (reference: `Attention::forward` in
//! `src/nn/attention.rs`), one launch a layer fewer on the one-row matmul path.

use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{Result, Tensor};

use super::qk_norm_rope::{HeadNorms, Heads};
use super::{Args, Pos, cuda_device, dev_ptr, empty, kernel_name, row_stride};
use super::{decode_attention, qk_norm_rope};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/rope_attention.ptx"));
const MODULE: &str = "omnitts_rope_attention";
/// Most threads of a block (`ROPE_ATTN_THREADS` = `ATTN_THREADS` in the kernels); a launch takes
/// [`decode_attention::block_threads`].
const THREADS: usize = 256;

/// Whether the kernel takes heads of width `hd`: both kernels it chains do, and a block holds a
/// thread per NeoX pair (`hd / 2` ≤ its threads).
pub fn supports_head_dim(hd: usize) -> bool {
    qk_norm_rope::supports_head_dim(hd)
        && decode_attention::supports_head_dim(hd)
        && hd / 2 <= THREADS
}

/// [`qk_norm_rope::qk_norm_rope_kv`] (its arguments and checks: `q` `[batch, t, nh·hd]`, `k`/`v`
/// `[batch, t, nkv·hd]`, the head norms, f32 tables, `pos`, the caches `[batch, nkv, cap, hd]`
/// whose slots `pos..pos+t` are written) then [`decode_attention::decode_attention`] (at most
/// `max_keys` keys, `scale`) in one launch. Returns `[batch, t, nh·hd]`, ready for `o_proj`.
#[allow(clippy::too_many_arguments)]
pub fn rope_attention(
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
    max_keys: usize,
    scale: f64,
) -> Result<Tensor> {
    let Heads { nh, nkv, hd } = heads;
    if !supports_head_dim(hd) {
        candle_core::bail!("rope_attention: head width {hd} unsupported");
    }
    let dtype = q.dtype();
    let (b, t, cap) = qk_norm_rope::check(q, k, v, norms, cos, sin, pos, k_cache, v_cache, heads)?;
    let dev = cuda_device(q)?;
    let q_rot = empty(&dev, dtype, (b, nh, t, hd))?;
    decode_attention::check(&q_rot, k_cache, v_cache, pos, max_keys)?;
    let out = empty(&dev, dtype, (b, t, nh * hd))?;
    let (qs, ks, vs) = (row_stride(q)?, row_stride(k)?, row_stride(v)?);
    let (pq, pk, pv) = (dev_ptr(q, &dev)?, dev_ptr(k, &dev)?, dev_ptr(v, &dev)?);
    let (pqw, pkw, eps, norm_guards) = qk_norm_rope::norm_args(norms, &dev)?;
    let (pcos, psin) = (dev_ptr(cos, &dev)?, dev_ptr(sin, &dev)?);
    let (prot, pkc, pvc, pout) = (
        dev_ptr(&q_rot, &dev)?,
        dev_ptr(k_cache, &dev)?,
        dev_ptr(v_cache, &dev)?,
        dev_ptr(&out, &dev)?,
    );
    let (pos_ptr, pos_host, _pos_guard) = pos.launch_args(&dev, "rope_attention")?;
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
        .ptr(prot.addr)
        .ptr(pkc.addr)
        .ptr(pvc.addr)
        .ptr(pout.addr)
        .i32(t)?
        .i32(nh)?
        .i32(nkv)?
        .i32(hd)?
        .i32(cap)?
        .i32(max_keys)?
        .f32(eps)
        .f32(scale as f32);
    let name = kernel_name("rope_attention", dtype)?;
    let shared = decode_attention::shared_bytes(max_keys, hd);
    let threads = decode_attention::block_threads(
        &dev,
        (MODULE, PTX, &name),
        nh * t * b,
        shared,
        max_keys,
        hd,
    )?;
    let cfg = LaunchConfig {
        grid_dim: (nh as u32, t as u32, b as u32),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: shared as u32,
    };
    args.launch(&dev, MODULE, PTX, &name, cfg)?;
    drop((pq, pk, pv, norm_guards, pcos, psin, prot, pkc, pvc, pout));
    Ok(out)
}
