//! Launcher of `decode_attention.cu`: softmax(q·kᵀ·scale)·v of a few query rows over a KV cache,
//! scores and softmax in f32, causal limit from the position (reference: `Attention::attend` with
//! the causal / bucket mask, `src/nn/attention.rs`).

use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute;
use candle_core::cuda_backend::{CudaDevice, WrapErr};
use candle_core::{Result, Tensor};

use super::{Args, Pos, cuda_device, dev_ptr, empty, expect, kernel_name};
use crate::nn::switches::Switches;

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/decode_attention.ptx"));
const MODULE: &str = "omnitts_decode_attention";
/// The threads whose layout the kernels' sums follow (`ATTN_THREADS`): a block of fewer threads
/// does their work in turn and gives the same bits ([`block_threads`]).
const THREADS: usize = 256;
/// The block sizes the attention kernels take: multiples of a warp that divide [`THREADS`].
const BLOCK_SIZES: [usize; 4] = [32, 64, 128, 256];
/// Most keys one query may attend to (the scores live in shared memory: 32 KiB at this bound).
pub const MAX_KEYS: usize = 8192;

/// Whether the kernel handles heads of width `hd` (a multiple of 8 whose 8-element lanes tile the
/// block), and whose shared memory at [`MAX_KEYS`] keys fits in 48 KiB.
pub fn supports_head_dim(hd: usize) -> bool {
    hd >= 8
        && hd.is_multiple_of(8)
        && hd <= 8 * THREADS
        && THREADS.is_multiple_of(hd / 8)
        && shared_bytes(MAX_KEYS, hd) <= 48 * 1024
}

/// Threads of one block of an attention kernel (this one, [`super::rope_attention`],
/// [`super::rows_attention`]): kernel `name` of PTX module `module`, launched as `blocks` blocks
/// with `shared` bytes of dynamic shared memory, attending to at most `max_keys` keys of heads of
/// width `hd` (a head wider than 512 gets 256 threads). 256 while the grid fits the GPU in one wave of 256-thread blocks (a block's
/// latency is then the step's: one stream's 16 heads); past that, the fewest of 32, 64, 128, 256
/// that give every key of a full context and every NeoX pair of a head (`hd / 2`: the q/k norms
/// and RoPE) a thread of their own, so a 64-row batch of the code predictor (≤ 17 keys, 1,024
/// blocks) runs 64-thread blocks in one wave, and the talker's long contexts keep 256.
/// `OMNITTS_ATTN_THREADS` (64, 128 or 256) sets the size instead, where `hd / 2` allows. The
/// output is the same at every size: the kernel's sums follow the layout of 256 threads. Errors
/// when the kernel cannot be loaded or the device not queried.
pub(super) fn block_threads(
    dev: &CudaDevice,
    (module, ptx, name): (&str, &'static str, &str),
    blocks: usize,
    shared: usize,
    max_keys: usize,
    hd: usize,
) -> Result<usize> {
    let pairs = hd.div_ceil(2);
    let fewest = |want: usize| {
        BLOCK_SIZES
            .into_iter()
            .find(|&n| n >= want.max(pairs))
            .unwrap_or(THREADS)
    };
    if let Some(forced) = Switches::get().attn_threads {
        return Ok(fewest(forced));
    }
    let smaller = fewest(max_keys);
    if smaller == THREADS {
        return Ok(THREADS); // a long context (the talker's): no device query
    }
    let func = dev.get_or_load_custom_func(name, module, ptx)?;
    let per_sm = func
        .occupancy_max_active_blocks_per_multiprocessor(THREADS as u32, shared, None)
        .w()?;
    let sms = dev
        .cuda_stream()
        .context()
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .w()?;
    let one_wave = per_sm as usize * sms.max(0) as usize;
    Ok(if blocks <= one_wave { THREADS } else { smaller })
}

/// Dynamic shared memory of one block: the scores, the query, the partial sums, the scratch.
pub(super) fn shared_bytes(max_keys: usize, hd: usize) -> usize {
    (max_keys + hd + THREADS * 8 + 32) * 4
}

/// The checks of [`decode_attention`] (shapes, dtypes, alignment, the key limit, a host
/// position's range), shared with [`super::rope_attention`]. Returns `(batch, nh, t, hd, nkv, cap)`.
pub(super) fn check(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    pos: Pos<'_>,
    max_keys: usize,
) -> Result<(usize, usize, usize, usize, usize, usize)> {
    let dtype = q.dtype();
    expect(q, dtype, "queries")?;
    expect(k_cache, dtype, "k cache")?;
    expect(v_cache, dtype, "v cache")?;
    let (b, nh, t, hd) = q.dims4()?;
    let (cb, nkv, cap, cd) = k_cache.dims4()?;
    if (cb, cd) != (b, hd) || v_cache.dims4()? != (b, nkv, cap, hd) || nkv == 0 || nh % nkv != 0 {
        candle_core::bail!(
            "decode_attention: q {:?} and caches {:?} / {:?} do not match",
            q.dims(),
            k_cache.dims(),
            v_cache.dims()
        );
    }
    if !supports_head_dim(hd) || max_keys == 0 || max_keys > MAX_KEYS {
        candle_core::bail!("decode_attention: head width {hd} or {max_keys} keys unsupported");
    }
    // 16-byte loads: every row must start 16-byte aligned (buffers are, offsets must be too).
    let align = 16 / dtype.size_in_bytes();
    for (x, what) in [(q, "q"), (k_cache, "k cache"), (v_cache, "v cache")] {
        if x.layout().start_offset() % align != 0 {
            candle_core::bail!("decode_attention: {what} starts at an unaligned offset");
        }
    }
    if let Pos::Host(p) = pos
        && (p + t > cap || p + t > max_keys)
    {
        candle_core::bail!(
            "decode_attention: positions up to {} past the cache ({cap}) or the key limit ({max_keys})",
            p + t
        );
    }
    Ok((b, nh, t, hd, nkv, cap))
}

/// Attention of `q` `[batch, nh, t, hd]` (query i at position `pos + i`) over keys/values
/// `0..=pos + i` of `k_cache`/`v_cache` `[batch, nkv, cap, hd]` (contiguous, query head h reads
/// kv head `h / (nh / nkv)`), at most `max_keys` keys (≤ [`MAX_KEYS`]; the dynamic shared memory
/// is sized by it, so a device position must stay below it). `scale` multiplies the scores
/// (1/√hd). Returns `[batch, t, nh·hd]` in `q`'s dtype, ready for `o_proj`.
pub fn decode_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    pos: Pos<'_>,
    max_keys: usize,
    scale: f64,
) -> Result<Tensor> {
    let (b, nh, t, hd) = q.dims4()?;
    let name = kernel_name("decode_attention", q.dtype())?;
    let threads = block_threads(
        &cuda_device(q)?,
        (MODULE, PTX, &name),
        b * nh * t,
        shared_bytes(max_keys, hd),
        max_keys,
        hd,
    )?;
    decode_attention_in_blocks(q, k_cache, v_cache, pos, max_keys, scale, threads)
}

/// [`decode_attention`] in blocks of `threads` (32, 64, 128 or 256) instead of the size
/// [`block_threads`] picks: the same output, bit for bit, at every size (`gpu_parity
/// --check-kernels` checks it). Errors as [`decode_attention`], and on another block size.
pub fn decode_attention_in_blocks(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    pos: Pos<'_>,
    max_keys: usize,
    scale: f64,
    threads: usize,
) -> Result<Tensor> {
    if !BLOCK_SIZES.contains(&threads) {
        candle_core::bail!("decode_attention: blocks of {threads} threads unsupported");
    }
    let dtype = q.dtype();
    let (b, nh, t, hd, nkv, cap) = check(q, k_cache, v_cache, pos, max_keys)?;
    let dev = cuda_device(q)?;
    let out = empty(&dev, dtype, (b, t, nh * hd))?;
    let (pq, pk, pv, pout) = (
        dev_ptr(q, &dev)?,
        dev_ptr(k_cache, &dev)?,
        dev_ptr(v_cache, &dev)?,
        dev_ptr(&out, &dev)?,
    );
    let (pos_ptr, pos_host, _pos_guard) = pos.launch_args(&dev, "decode_attention")?;
    let args = Args::default()
        .ptr(pq.addr)
        .ptr(pk.addr)
        .ptr(pv.addr)
        .ptr(pout.addr)
        .ptr(pos_ptr)
        .u32(pos_host)?
        .i32(t)?
        .i32(nh)?
        .i32(nkv)?
        .i32(hd)?
        .i32(cap)?
        .i32(max_keys)?
        .f32(scale as f32);
    let shared = shared_bytes(max_keys, hd);
    if shared > 48 * 1024 {
        candle_core::bail!("decode_attention: {shared} bytes of shared memory for {max_keys} keys");
    }
    let cfg = LaunchConfig {
        grid_dim: (nh as u32, t as u32, b as u32),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: shared as u32,
    };
    args.launch(
        &dev,
        MODULE,
        PTX,
        &kernel_name("decode_attention", dtype)?,
        cfg,
    )?;
    drop((pq, pk, pv, pout));
    Ok(out)
}
