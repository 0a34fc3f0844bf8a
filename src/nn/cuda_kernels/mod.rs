//! Fused CUDA kernels for the single-token decode path of the Qwen3 decoder stacks (talker decode
//! step, code-predictor steps), feature `cuda` only. Each kernel is one CUDA C file here, compiled
//! to PTX by `build.rs` and loaded through candle's `CudaDevice::get_or_load_custom_func`; each has
//! a Rust launcher module with its shapes. Per decoder layer they take a decode position from ~27
//! launches to 5 (docs/cuda.md, "Fused decode kernels", "One-row matmuls and frame kernels" and
//! "q/k norm + attention in one launch, and one launch per stack"):
//!
//! | kernel | replaces |
//! |---|---|
//! | [`qk_norm_rope::qk_norm_rope_kv`] | q/k RMSNorm, transposes, RoPE, KV-cache writes |
//! | [`decode_attention::decode_attention`] | QKᵀ, scale, f32 cast, mask, softmax, casts, PV, copies |
//! | [`rope_attention::rope_attention`] | the two above in one launch (on the one-row matmul path) |
//! | [`add_rms_norm::add_rms_norm`] | residual add + the next RMSNorm |
//! | [`silu_mul::silu_mul`] | SiLU(gate) · up |
//! | [`argmax_embed::argmax_embed`] | the device sampler's greedy pick + the next input's embedding lookup |
//! | [`sample_embed::sample_embed`] | the device sampler's top-k/top-p draw + the next input's embedding lookup (`OMNITTS_FUSED_SAMPLER=0` turns it off) |
//! | [`embed_sum::embed_sum`] | the talker input's 16 code uploads, embedding lookups, sum and text add ([`embed_sum::embed_sum_rows`]: for a batch, codes on the device) |
//! | [`pick_rows::pick_rows`] | a batched frame's code-predictor picks: every row greedy or sampled with its own parameters, plus its next embedding |
//! | [`rows_attention::rows_attention`] | a batched talker step's attention: `rope_attention` per row over the row's own KV cache at its own position, read from device tables |
//! | [`gemv`] | one-row matmuls with the RMSNorm before and the residual add or SiLU · up after (with `rope_attention`: 5 launches a layer) |
//! | [`bias_epilogue::bias_epilogue`] | a Code2Wav convolution's bias add, with the SnakeBeta or residual add after it |
//! | [`gather_rows::gather_rows`] | a batched Code2Wav pass's stacking of the streams' convolution states: one copy kernel per stream and layer |
//! | [`shift_cols::shift_cols`] | a Code2Wav convolution's product input: candle's concatenation with the history, `im2col1d` and the transposing copy after the GEMM (the GEMM on [`shift_cols`]'s tap-major rows writes `[batch, channels, time]` directly) |
//! | [`kv_prefix::kv_prefix_copy`] | a prefill's keys/values copied from the prefill graphs' scratch cache into a stream's, layer by layer (56 copies for the 1.7B talker) |
//! | [`snake_beta::snake_beta`] | the Code2Wav decoder's SnakeBeta (mul, sin, square, mul, add) |
//! | [`decode_stack::decode_stack`] | a whole stack's decode step (every layer's kernels) in one persistent launch (opt-in: `OMNITTS_DECODE_STACK=1`) |
//!
//! Numerics as docs/cuda.md states: norms and softmax accumulate in f32, RoPE tables are f32
//! (rounded to the activation dtype as the reference casts them), activations bf16 (or f32).
//! Only bf16 and f32 activations are supported; other dtypes take the unfused path.
//!
//! `OMNITTS_FUSED_KERNELS=0` in the environment turns the fused path off ([`crate::nn::switches`]),
//! for A/B runs against the unfused candle ops; `OMNITTS_FUSED_KERNELS=1` keeps only the first four
//! kernels (9 launches per layer), without [`gemv`], [`rope_attention`], [`argmax_embed`] and
//! [`embed_sum`];
//! [`decode_stack`] is opt-in (`OMNITTS_DECODE_STACK=1`): bit-identical, but slower on an H200
//! (docs/cuda.md, "q/k norm + attention in one launch, and one launch per stack").

pub mod add_rms_norm;
pub mod argmax_embed;
pub mod bias_epilogue;
pub mod decode_attention;
pub mod decode_stack;
pub mod embed_sum;
pub mod fused_linear;
pub mod gather_rows;
pub mod gemv;
pub mod kv_prefix;
pub mod pick_rows;
pub mod qk_norm_rope;
pub mod rope_attention;
pub mod rows_attention;
pub mod sample_embed;
pub mod shift_cols;
pub mod silu_mul;
pub mod snake_beta;

use candle_core::cuda_backend::cudarc::driver::{DevicePtr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, CudaDevice, WrapErr};
use candle_core::op::BackpropOp;
use candle_core::{DType, Device, Result, Shape, Storage, StorageRef, Tensor};

use super::switches::{FusedKernels, Switches};

/// Most query rows per call that take the fused decode path (decode steps: 1; the code
/// predictor's first step: 2); longer inputs (prefills) run the unfused ops.
pub const MAX_DECODE_ROWS: usize = 4;

/// Whether the fused decode kernels are on (`OMNITTS_FUSED_KERNELS` is not `0`:
/// [`crate::nn::switches`]).
pub fn enabled() -> bool {
    Switches::get().fused_kernels >= FusedKernels::PerLayer
}

/// Whether the one-row matmul kernels ([`gemv`]) and the frame kernels ([`argmax_embed`],
/// [`embed_sum`]) are on (`OMNITTS_FUSED_KERNELS` unset or above `1`).
pub fn all_enabled() -> bool {
    Switches::get().fused_kernels == FusedKernels::All
}

/// Whether the whole-stack decode kernel ([`decode_stack`]) is on: opt-in with
/// `OMNITTS_DECODE_STACK=1`, and only with every other kernel on ([`all_enabled`]).
pub fn stack_enabled() -> bool {
    all_enabled() && Switches::get().decode_stack
}

/// [`usable_for`] `x` with every kernel on ([`all_enabled`]): the condition of the one-row matmuls
/// and the frame kernels.
pub fn all_usable_for(x: &Tensor) -> bool {
    usable_for(x) && all_enabled()
}

/// Whether `x` is on a CUDA device in a dtype the kernels are built for, and they are enabled.
pub fn usable_for(x: &Tensor) -> bool {
    enabled() && x.device().is_cuda() && matches!(x.dtype(), DType::BF16 | DType::F32)
}

/// Where a decode call's first query sits: a device u32 `[1]` (read by the kernel, so a CUDA graph
/// replays for any position) or a host value baked into the launch.
#[derive(Debug, Clone, Copy)]
pub enum Pos<'a> {
    Device(&'a Tensor),
    Host(usize),
}

impl<'a> Pos<'a> {
    /// The two position arguments of a kernel launch: the device address of the u32 position
    /// (0 for a host position) and the host position (0 for a device one), plus the guard that
    /// keeps the device position alive until the launch is queued. `op` names the kernel in errors.
    fn launch_args(self, dev: &CudaDevice, op: &str) -> Result<(u64, usize, Option<DevPtr<'a>>)> {
        match self {
            Pos::Device(p) => {
                if p.dtype() != DType::U32 || p.elem_count() < 1 {
                    candle_core::bail!("{op}: device position must be u32, got {:?}", p.dtype());
                }
                let g = dev_ptr(p, dev)?;
                Ok((g.addr, 0, Some(g)))
            }
            Pos::Host(p) => Ok((0, p, None)),
        }
    }
}

/// Where a fused decode call of a stack runs, passed down through its layers: the f32 RoPE tables
/// from position 0 (`cos`/`sin` `[positions, head_dim/2]`), the position of the first query row,
/// and the most key slots a row attends to.
#[derive(Debug, Clone, Copy)]
pub struct DecodeAt<'a> {
    pub cos: &'a Tensor,
    pub sin: &'a Tensor,
    pub pos: Pos<'a>,
    pub max_keys: usize,
}

/// The kernel name for `dtype`: `{base}_bf16` or `{base}_f32`.
fn kernel_name(base: &str, dtype: DType) -> Result<String> {
    match dtype {
        DType::BF16 => Ok(format!("{base}_bf16")),
        DType::F32 => Ok(format!("{base}_f32")),
        other => candle_core::bail!("{base}: no fused kernel for {other:?}"),
    }
}

fn cuda_device(t: &Tensor) -> Result<CudaDevice> {
    match t.device() {
        Device::Cuda(d) => Ok(d.clone()),
        other => candle_core::bail!("fused CUDA kernel called on {other:?}"),
    }
}

/// A tensor's device address (start offset included) as a kernel argument, with the read guard
/// on its storage that keeps it alive and unaliased by other threads until the launch is queued.
struct DevPtr<'t> {
    _guard: StorageRef<'t>,
    addr: u64,
}

/// [`DevPtr`] of `t` (bf16, f32, f64, u32 or i64 elements). The kernel may write through it (the KV cache);
/// all work is queued on the device's one stream, so ordering is preserved.
fn dev_ptr<'t>(t: &'t Tensor, dev: &CudaDevice) -> Result<DevPtr<'t>> {
    match t.dtype() {
        DType::BF16 => typed_ptr::<half::bf16>(t, dev),
        DType::F32 => typed_ptr::<f32>(t, dev),
        DType::F64 => typed_ptr::<f64>(t, dev),
        DType::U32 => typed_ptr::<u32>(t, dev),
        DType::I64 => typed_ptr::<i64>(t, dev),
        other => candle_core::bail!("fused CUDA kernel: no pointer for {other:?}"),
    }
}

fn typed_ptr<'t, T: CudaDType>(t: &'t Tensor, dev: &CudaDevice) -> Result<DevPtr<'t>> {
    let (guard, layout) = t.storage_and_layout();
    let offset = layout.start_offset();
    let addr = {
        let Storage::Cuda(s) = &*guard else {
            candle_core::bail!("fused CUDA kernel: tensor is not on a CUDA device");
        };
        let slice = s.as_cuda_slice::<T>()?;
        let stream = dev.cuda_stream();
        let (base, _sync) = slice.device_ptr(&stream);
        base + (offset * std::mem::size_of::<T>()) as u64
    };
    Ok(DevPtr {
        _guard: guard,
        addr,
    })
}

/// The device address of `t`'s first element (start offset included), for a device table that
/// a kernel reads ([`rows_attention::RowCaches`]). The address stays valid while `t`'s storage
/// lives and is not reallocated; the caller keeps it so for as long as the table is used.
pub fn device_address(t: &Tensor) -> Result<u64> {
    let dev = cuda_device(t)?;
    Ok(dev_ptr(t, &dev)?.addr)
}

/// A new contiguous device tensor of `shape` whose elements are NOT initialised: only for kernel
/// outputs that the kernel writes in full before anything reads them. No fill kernel runs.
fn empty(dev: &CudaDevice, dtype: DType, shape: impl Into<Shape>) -> Result<Tensor> {
    let shape = shape.into();
    let n = shape.elem_count();
    // SAFETY (every arm): every element is written by the launching kernel before any read.
    let storage = match dtype {
        DType::BF16 => {
            let s = unsafe { dev.alloc::<half::bf16>(n) }?;
            candle_core::CudaStorage::wrap_cuda_slice(s, dev.clone())
        }
        DType::F32 => {
            let s = unsafe { dev.alloc::<f32>(n) }?;
            candle_core::CudaStorage::wrap_cuda_slice(s, dev.clone())
        }
        DType::U32 => {
            let s = unsafe { dev.alloc::<u32>(n) }?;
            candle_core::CudaStorage::wrap_cuda_slice(s, dev.clone())
        }
        other => candle_core::bail!("fused CUDA kernel: no output buffer for {other:?}"),
    };
    Ok(Tensor::from_storage(
        Storage::Cuda(storage),
        shape,
        BackpropOp::none(),
        false,
    ))
}

/// A launch of one block of `threads` threads (the code-pick kernels: one row of logits).
fn single_block(threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The row width and dtype of a code-pick kernel's embedding table `[vocab, hidden]` (checked:
/// contiguous, `vocab` rows), which is also the kernel variant; `(0, F32)` without a table (the
/// kernel then copies no row). `op` names the kernel in errors.
fn pick_table(table: Option<&Tensor>, vocab: usize, op: &str) -> Result<(usize, DType)> {
    match table {
        Some(t) => {
            expect(t, t.dtype(), "embedding table")?;
            let (rows, hidden) = t.dims2()?;
            if rows != vocab {
                candle_core::bail!("{op}: table of {rows} rows for {vocab} logits");
            }
            Ok((hidden, t.dtype()))
        }
        None => Ok((0, DType::F32)),
    }
}

/// The outputs of a code-pick kernel (`argmax_embed`, `sample_embed`), allocated but not
/// initialised (the kernel writes them): the chosen id, u32 `[1]`, and with an embedding table
/// `[vocab, hidden]` that row as `[1, 1, hidden]`.
struct PickOutputs {
    id: Tensor,
    x: Option<Tensor>,
    hidden: usize,
    /// The kernel variant: the table's dtype (f32 without a table).
    dtype: DType,
}

impl PickOutputs {
    /// Checks `table` (contiguous, `vocab` rows) and allocates the outputs. `op` names the kernel
    /// in errors.
    fn new(dev: &CudaDevice, table: Option<&Tensor>, vocab: usize, op: &str) -> Result<Self> {
        let (hidden, dtype) = pick_table(table, vocab, op)?;
        Ok(Self {
            id: empty(dev, DType::U32, 1)?,
            x: table
                .map(|_| empty(dev, dtype, (1, 1, hidden)))
                .transpose()?,
            hidden,
            dtype,
        })
    }

    /// Device addresses of `table` and of the row output, with the guards that keep them alive.
    /// Without a table the kernel copies nothing and `fallback` stands in for both.
    fn row_addrs<'t>(
        &'t self,
        dev: &CudaDevice,
        table: Option<&'t Tensor>,
        fallback: u64,
    ) -> Result<(u64, u64, [Option<DevPtr<'t>>; 2])> {
        let pt = table.map(|t| dev_ptr(t, dev)).transpose()?;
        let px = self.x.as_ref().map(|x| dev_ptr(x, dev)).transpose()?;
        let addrs = (
            pt.as_ref().map_or(fallback, |p| p.addr),
            px.as_ref().map_or(fallback, |p| p.addr),
        );
        Ok((addrs.0, addrs.1, [pt, px]))
    }
}

/// Kernel argument list: device addresses and scalars, pushed in the kernel's parameter order.
#[derive(Default)]
struct Args {
    values: Vec<ArgValue>,
}

enum ArgValue {
    Ptr(u64),
    Ptrs(Box<PtrArray>),
    I32(i32),
    I64(i64),
    U32(u32),
    F32(f32),
}

/// A fixed array of device addresses passed by value (a kernel's `struct { u64 ptr[32]; }`).
#[repr(C)]
#[derive(Clone, Copy)]
struct PtrArray([u64; embed_sum::MAX_TABLES]);

// SAFETY: plain `repr(C)` data of the same layout as the kernel's parameter struct.
unsafe impl candle_core::cuda_backend::cudarc::driver::DeviceRepr for PtrArray {}

impl Args {
    fn ptr(mut self, p: u64) -> Self {
        self.values.push(ArgValue::Ptr(p));
        self
    }
    fn ptrs(mut self, p: [u64; embed_sum::MAX_TABLES]) -> Self {
        self.values.push(ArgValue::Ptrs(Box::new(PtrArray(p))));
        self
    }
    fn i32(mut self, v: usize) -> Result<Self> {
        let v = i32::try_from(v)
            .map_err(|_| candle_core::Error::Msg(format!("kernel argument {v} exceeds i32")))?;
        self.values.push(ArgValue::I32(v));
        Ok(self)
    }
    fn i64(mut self, v: usize) -> Result<Self> {
        let v = i64::try_from(v)
            .map_err(|_| candle_core::Error::Msg(format!("kernel argument {v} exceeds i64")))?;
        self.values.push(ArgValue::I64(v));
        Ok(self)
    }
    fn u32(mut self, v: usize) -> Result<Self> {
        let v = u32::try_from(v)
            .map_err(|_| candle_core::Error::Msg(format!("kernel argument {v} exceeds u32")))?;
        self.values.push(ArgValue::U32(v));
        Ok(self)
    }
    fn f32(mut self, v: f32) -> Self {
        self.values.push(ArgValue::F32(v));
        self
    }

    /// Launches `name` of the PTX module `module` (loaded once per device) on the device stream.
    fn launch(
        self,
        dev: &CudaDevice,
        module: &str,
        ptx: &'static str,
        name: &str,
        cfg: LaunchConfig,
    ) -> Result<()> {
        let func = dev.get_or_load_custom_func(name, module, ptx)?;
        let mut builder = func.builder();
        for v in &self.values {
            match v {
                ArgValue::Ptr(p) => builder.arg(p),
                ArgValue::Ptrs(p) => builder.arg(p.as_ref()),
                ArgValue::I32(x) => builder.arg(x),
                ArgValue::I64(x) => builder.arg(x),
                ArgValue::U32(x) => builder.arg(x),
                ArgValue::F32(x) => builder.arg(x),
            };
        }
        // SAFETY: the argument list matches the kernel's parameters (each launcher documents them);
        // the addresses come from live tensors whose guards the caller holds across this call.
        unsafe { builder.launch(cfg) }.w()?;
        Ok(())
    }
}

/// Row stride (elements) of a `[batch, t, width]` tensor whose rows are unit-stride runs laid out
/// at a fixed stride (contiguous, or a last-dim `narrow` of a contiguous tensor).
fn row_stride(x: &Tensor) -> Result<usize> {
    let (b, t, _) = x.dims3()?;
    let stride = x.layout().stride();
    if stride[2] != 1 || (b > 1 && t > 1 && stride[0] != t * stride[1]) {
        candle_core::bail!(
            "fused kernel: rows of {:?} (strides {stride:?}) are not evenly spaced",
            x.dims()
        );
    }
    Ok(if t > 1 {
        stride[1]
    } else if b > 1 {
        stride[0]
    } else {
        x.dim(2)?
    })
}

/// Errors unless `t` is contiguous with element type `dtype`.
fn expect(t: &Tensor, dtype: DType, what: &str) -> Result<()> {
    if t.dtype() != dtype {
        candle_core::bail!(
            "fused kernel: {what} is {:?}, expected {dtype:?}",
            t.dtype()
        );
    }
    if !t.is_contiguous() {
        candle_core::bail!("fused kernel: {what} {:?} is not contiguous", t.dims());
    }
    Ok(())
}
