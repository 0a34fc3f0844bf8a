//! Launcher of `decode_stack.cu`: a whole decoder stack's decode step (a few rows, every layer) in
//! one persistent kernel whose phases are separated by grid-wide barriers instead of launches.
//! Same device functions and work split as the per-layer path
//! (`DecoderLayer::forward_gemv` in `src/nn/fused_decode.rs`: 5 launches a layer), so the output is
//! bit-identical to it; a 5-layer code-predictor step goes from ~25 launches to 1. Opt-in
//! (`OMNITTS_DECODE_STACK=1`): on an H200 a grid barrier costs about what a launch in a CUDA graph
//! does (1.9 µs), and the phases lose the per-layer kernels' occupancy, so it is slower
//! (docs/cuda.md, "q/k norm + attention in one launch, and one launch per stack").
//!
//! Every function errors (nothing is launched) on shapes, dtypes or addresses the kernel does not
//! take; callers check [`takes`] first and keep the per-layer kernels otherwise.

use std::sync::OnceLock;

use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute;
use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::{CudaDevice, WrapErr};
use candle_core::{DType, Result, Tensor};

use super::decode_attention::{self, MAX_KEYS};
use super::gemv::{self, MAX_ROWS};
use super::qk_norm_rope::Heads;
use super::{DecodeAt, DevPtr, cuda_device, dev_ptr, empty, kernel_name, rope_attention};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/decode_stack.ptx"));
const MODULE: &str = "omnitts_decode_stack";
/// Threads per block (`STACK_THREADS` in the kernel).
const THREADS: usize = 256;
/// Most layers one launch takes (`STACK_MAX_LAYERS`: the address table is a kernel parameter,
/// 80 bytes a layer, within the 4 KiB parameter limit).
pub const MAX_LAYERS: usize = 40;

/// One layer's attention for the stack kernel, in the layouts the per-layer kernels take (all
/// contiguous, in the activation dtype): `qkv` `[(nh + 2·nkv)·hd, hidden]` (the fused q/k/v
/// weight), `qk_norm` the q and k head norms' weights `[hd]` (epsilon `qk_eps`; `None`: a
/// stack without them), `o` `[hidden, nh·hd]`,
/// `k_cache`/`v_cache` `[batch, nkv, cap, hd]`; `scale` multiplies the scores.
#[derive(Debug, Clone)]
pub struct StackAttention {
    pub heads: Heads,
    pub qk_eps: f64,
    pub scale: f64,
    pub qkv: Tensor,
    pub qk_norm: Option<(Tensor, Tensor)>,
    pub o: Tensor,
    pub k_cache: Tensor,
    pub v_cache: Tensor,
}

/// One decoder layer for the stack kernel: `input_norm`/`post_norm` `[hidden]` (epsilon `eps`),
/// the attention, `gate_up` `[2·inter, hidden]` (gate rows first) and `down` `[hidden, inter]`.
/// Every layer of a stack must share the heads, epsilons and scale.
#[derive(Debug, Clone)]
pub struct StackLayer {
    pub eps: f64,
    pub input_norm: Tensor,
    pub post_norm: Tensor,
    pub attn: StackAttention,
    pub gate_up: Tensor,
    pub down: Tensor,
}

/// The two u32 the kernel's grid barrier counts with, zeroed once on first use (they return to a
/// valid state after every launch). One per stack of caches: launches sharing one must not run at
/// the same time, so a clone starts with its own.
#[derive(Debug, Default)]
pub struct Barrier(OnceLock<Tensor>);

impl Clone for Barrier {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl Barrier {
    fn get(&self, like: &Tensor) -> Result<&Tensor> {
        if let Some(t) = self.0.get() {
            return Ok(t);
        }
        let t = Tensor::zeros(2, DType::U32, like.device())?;
        Ok(self.0.get_or_init(|| t))
    }
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct LayerPtrs {
    input_norm: u64,
    qkv: u64,
    q_norm: u64,
    k_norm: u64,
    o: u64,
    post_norm: u64,
    gate_up: u64,
    down: u64,
    k_cache: u64,
    v_cache: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct StackLayers([LayerPtrs; MAX_LAYERS]);

#[repr(C)]
#[derive(Clone, Copy)]
struct StackDims {
    layers: i32,
    batch: i32,
    t: i32,
    hidden: i32,
    nh: i32,
    nkv: i32,
    hd: i32,
    inter: i32,
    cap: i32,
    max_keys: i32,
    wpr_qkv: i32,
    wpr_o: i32,
    wpr_gate_up: i32,
    wpr_down: i32,
    pos_host: u32,
    eps: f32,
    qk_eps: f32,
    scale: f32,
}

// SAFETY: plain `repr(C)` data of the same layout as the kernel's parameter structs.
unsafe impl DeviceRepr for StackLayers {}
// SAFETY: as above.
unsafe impl DeviceRepr for StackDims {}

/// The stack's sizes once every layer is checked: `(hidden, inter, cap)`.
fn check(x: &Tensor, layers: &[StackLayer], max_keys: usize) -> Result<Sizes> {
    let Some(first) = layers.first() else {
        candle_core::bail!("decode_stack: no layers");
    };
    let heads = first.attn.heads;
    let Heads { nh, nkv, hd } = heads;
    let dtype = x.dtype();
    let (b, t, hidden) = x.dims3()?;
    let rows = b * t;
    let inter = first.down.dim(1)?;
    let cap = first.attn.k_cache.dim(2)?;
    let ok = layers.len() <= MAX_LAYERS
        && matches!(dtype, DType::BF16 | DType::F32)
        && x.is_contiguous()
        && x.layout().start_offset().is_multiple_of(8)
        && (1..=MAX_ROWS).contains(&rows)
        && nkv > 0
        && nh.is_multiple_of(nkv)
        && rope_attention::supports_head_dim(hd)
        && (1..=MAX_KEYS).contains(&max_keys)
        && layers.iter().all(|l| {
            let a = &l.attn;
            let vec = |v: &Tensor, len| gemv::vector_ok(v, len, dtype);
            let mat = |w: &Tensor, n, k| {
                w.dims2().is_ok_and(|d| d == (n, k)) && gemv::supports(rows, k, dtype, w)
            };
            let cache = |c: &Tensor| {
                c.dims4().is_ok_and(|d| d == (b, nkv, cap, hd))
                    && c.dtype() == dtype
                    && c.is_contiguous()
                    && c.layout().start_offset().is_multiple_of(8)
            };
            (a.heads, a.qk_eps, a.scale, l.eps)
                == (heads, first.attn.qk_eps, first.attn.scale, first.eps)
                && vec(&l.input_norm, hidden)
                && vec(&l.post_norm, hidden)
                && a.qk_norm
                    .as_ref()
                    .is_none_or(|(q, k)| vec(q, hd) && vec(k, hd))
                && mat(&a.qkv, (nh + 2 * nkv) * hd, hidden)
                && mat(&a.o, hidden, nh * hd)
                && mat(&l.gate_up, 2 * inter, hidden)
                && mat(&l.down, hidden, inter)
                && cache(&a.k_cache)
                && cache(&a.v_cache)
        });
    if !ok {
        candle_core::bail!(
            "decode_stack: {} layers, input {:?} {dtype:?}, heads {:?} or {max_keys} keys unsupported",
            layers.len(),
            x.dims(),
            heads
        );
    }
    Ok(Sizes {
        heads,
        hidden,
        inter,
        cap,
    })
}

/// A checked stack's sizes.
struct Sizes {
    heads: Heads,
    hidden: usize,
    inter: usize,
    cap: usize,
}

/// Whether [`decode_stack`] takes `x` `[batch, t, hidden]` through `layers` (shapes, dtypes,
/// layouts, at most [`MAX_LAYERS`] layers and [`gemv::MAX_ROWS`] rows, `max_keys` ≤
/// [`MAX_KEYS`]).
pub fn takes(x: &Tensor, layers: &[StackLayer], max_keys: usize) -> bool {
    check(x, layers, max_keys).is_ok()
}

/// Runs every layer of the stack over `x` `[batch, t, hidden]` at positions `at.pos..+t`
/// (writing their keys and values into the caches' slots, attending causally to at most
/// `at.max_keys` keys) in one launch. Returns the last layer's output `[batch, t, hidden]`, before
/// any final norm, bit-identical to the per-layer path. `at`: f32 RoPE tables `[positions,
/// hd/2]` and the position (a device position makes the launch replayable in a CUDA graph).
/// `barrier`: the owner's ([`Barrier`]).
pub fn decode_stack(
    x: &Tensor,
    layers: &[StackLayer],
    at: DecodeAt<'_>,
    barrier: &Barrier,
) -> Result<Tensor> {
    let Sizes {
        heads,
        hidden,
        inter,
        cap,
    } = check(x, layers, at.max_keys)?;
    let Heads { nh, nkv, hd } = heads;
    let dtype = x.dtype();
    let (b, t, _) = x.dims3()?;
    let rows = b * t;
    let (positions, half) = at.cos.dims2()?;
    if at.cos.dtype() != DType::F32
        || at.sin.dtype() != DType::F32
        || half != hd / 2
        || at.sin.dims2()? != (positions, half)
        || !at.cos.is_contiguous()
        || !at.sin.is_contiguous()
    {
        candle_core::bail!(
            "decode_stack: RoPE tables {:?} do not match hd {hd}",
            at.cos.dims()
        );
    }
    if let super::Pos::Host(p) = at.pos
        && (p + t > positions || p + t > cap || p + t > at.max_keys)
    {
        candle_core::bail!(
            "decode_stack: positions {p}..{} past the tables ({positions}), cache ({cap}) or key limit ({})",
            p + t,
            at.max_keys
        );
    }
    let dev = cuda_device(x)?;
    let align8 = |n: usize| n.div_ceil(8) * 8;
    let scratch_len = align8(rows * (nh + 2 * nkv) * hd)
        + 2 * align8(rows * nh * hd)
        + align8(rows * hidden)
        + align8(rows * inter);
    let scratch = empty(&dev, dtype, scratch_len)?;
    let out = empty(&dev, dtype, (b, t, hidden))?;
    let bar = barrier.get(x)?;

    let mut guards = Vec::with_capacity(layers.len() * 10 + 6);
    let mut addr = |t| keep(&mut guards, t, &dev);
    let mut table = StackLayers([LayerPtrs::default(); MAX_LAYERS]);
    for (slot, l) in table.0.iter_mut().zip(layers) {
        let a = &l.attn;
        *slot = LayerPtrs {
            input_norm: addr(&l.input_norm)?,
            qkv: addr(&a.qkv)?,
            q_norm: a
                .qk_norm
                .as_ref()
                .map(|(q, _)| addr(q))
                .transpose()?
                .unwrap_or(0),
            k_norm: a
                .qk_norm
                .as_ref()
                .map(|(_, k)| addr(k))
                .transpose()?
                .unwrap_or(0),
            o: addr(&a.o)?,
            post_norm: addr(&l.post_norm)?,
            gate_up: addr(&l.gate_up)?,
            down: addr(&l.down)?,
            k_cache: addr(&a.k_cache)?,
            v_cache: addr(&a.v_cache)?,
        };
    }
    let (px, pout, pscratch) = (addr(x)?, addr(&out)?, addr(&scratch)?);
    let (pcos, psin, pbar) = (addr(at.cos)?, addr(at.sin)?, addr(bar)?);
    let (pos_ptr, pos_host, _pos_guard) = at.pos.launch_args(&dev, "decode_stack")?;
    let qkv_n = (nh + 2 * nkv) * hd;
    let int = |v: usize| {
        i32::try_from(v)
            .map_err(|_| candle_core::Error::Msg(format!("decode_stack: {v} exceeds i32")))
    };
    let dims = StackDims {
        layers: int(layers.len())?,
        batch: int(b)?,
        t: int(t)?,
        hidden: int(hidden)?,
        nh: int(nh)?,
        nkv: int(nkv)?,
        hd: int(hd)?,
        inter: int(inter)?,
        cap: int(cap)?,
        max_keys: int(at.max_keys)?,
        wpr_qkv: int(gemv::warps_per_row(qkv_n, hidden))?,
        wpr_o: int(gemv::warps_per_row(hidden, nh * hd))?,
        wpr_gate_up: int(gemv::warps_per_row(inter, hidden))?,
        wpr_down: int(gemv::warps_per_row(hidden, inter))?,
        pos_host: u32::try_from(pos_host)
            .map_err(|_| candle_core::Error::Msg(format!("decode_stack: position {pos_host}")))?,
        eps: layers[0].eps as f32,
        qk_eps: layers[0].attn.qk_eps as f32,
        scale: layers[0].attn.scale as f32,
    };

    let shared = decode_attention::shared_bytes(at.max_keys, hd);
    let func = dev.get_or_load_custom_func(&kernel_name("decode_stack", dtype)?, MODULE, PTX)?;
    let blocks = resident_grid(&dev, &func, shared, blocks_per_sm())?;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (THREADS as u32, 1, 1),
        shared_mem_bytes: shared as u32,
    };
    let mut builder = func.builder();
    builder
        .arg(&table)
        .arg(&dims)
        .arg(&px)
        .arg(&pout)
        .arg(&pscratch)
        .arg(&pcos)
        .arg(&psin)
        .arg(&pos_ptr)
        .arg(&pbar);
    // SAFETY: the arguments match the kernel's parameters in order and layout; every address
    // comes from a live tensor whose guard is held until the launch is queued; the grid fits on
    // the device at once (SMs × resident blocks), which the barrier needs.
    unsafe { builder.launch(cfg) }.w()?;
    drop(guards);
    Ok(out)
}

/// Diagnostic: the time of one grid barrier of the stack kernel (µs), with `blocks_per_sm` blocks
/// per SM (capped at what fits), timed on the host over `count` barriers in one launch after a
/// warm-up launch. Returns `(blocks, µs per barrier)`. `device` must be a CUDA device.
pub fn time_grid_barrier(
    device: &candle_core::Device,
    blocks_per_sm: u32,
    count: usize,
) -> Result<(u32, f64)> {
    let candle_core::Device::Cuda(dev) = device else {
        candle_core::bail!("time_grid_barrier: {device:?} is not a CUDA device");
    };
    let bar = Tensor::zeros(2, DType::U32, device)?;
    let func = dev.get_or_load_custom_func("grid_barrier_bench", MODULE, PTX)?;
    let blocks = resident_grid(dev, &func, 0, blocks_per_sm)?;
    let run = |n: usize| -> Result<f64> {
        let guard = dev_ptr(&bar, dev)?;
        let n = i32::try_from(n).map_err(|_| candle_core::Error::Msg(format!("{n} barriers")))?;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let start = std::time::Instant::now();
        let mut builder = func.builder();
        builder.arg(&guard.addr).arg(&n);
        // SAFETY: the kernel takes (u32*, i32); the barrier tensor is alive; the grid fits on
        // the device at once.
        unsafe { builder.launch(cfg) }.w()?;
        device.synchronize()?;
        Ok(start.elapsed().as_secs_f64())
    };
    run(16)?;
    let empty = run(0)?;
    let full = run(count)?;
    Ok((blocks, (full - empty).max(0.0) * 1e6 / count.max(1) as f64))
}

/// The grid of a kernel whose blocks must all run at once (its grid barrier waits for every
/// block): the SMs × the blocks of `func` that fit on one with `shared` bytes of dynamic shared
/// memory, at most `per_sm`. Errors when none fits.
fn resident_grid(dev: &CudaDevice, func: &CudaFunction, shared: usize, per_sm: u32) -> Result<u32> {
    let sms = dev
        .cuda_stream()
        .context()
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .w()?;
    let resident = func
        .occupancy_max_active_blocks_per_multiprocessor(THREADS as u32, shared, None)
        .w()?;
    let per_sm = resident.min(per_sm);
    if per_sm == 0 || sms <= 0 {
        candle_core::bail!(
            "decode_stack: no block fits on an SM ({shared} bytes of shared memory)"
        );
    }
    Ok(sms as u32 * per_sm)
}

/// `t`'s device address, its guard kept in `guards` (alive until the launch is queued).
fn keep<'t>(guards: &mut Vec<DevPtr<'t>>, t: &'t Tensor, dev: &CudaDevice) -> Result<u64> {
    let p = dev_ptr(t, dev)?;
    let addr = p.addr;
    guards.push(p);
    Ok(addr)
}

/// Blocks per SM of the stack kernel (at most what fits): `OMNITTS_STACK_BLOCKS_PER_SM`
/// ([`crate::nn::switches`]), else 2. More blocks keep more loads in flight; fewer make each
/// barrier cheaper.
fn blocks_per_sm() -> u32 {
    crate::nn::switches::Switches::get().stack_blocks_per_sm
}
