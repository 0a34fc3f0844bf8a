//! Launcher of `shift_cols.cu`: a causal convolution's product input, tap by tap, read in place
//! from the stream's past input and the chunk, so that the convolution is one batched GEMM whose
//! output is `[batch, channels, time]` (reference: candle's `conv1d` on CUDA: a concatenation,
//! `im2col1d`, the GEMM and a transposing copy).

use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{DType, Result, Tensor};

use super::{Args, cuda_device, dev_ptr, empty, expect};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/shift_cols.ptx"));
const MODULE: &str = "omnitts_shift_cols";
/// Threads per block (`SHIFT_THREADS` in the kernel).
const THREADS: usize = 256;

/// The shape of one convolution's product: `taps` taps `dilation` input positions apart, each
/// input position giving `phases` output samples (1 for a convolution; a transposed convolution of
/// stride `s` is `⌈k / s⌉` taps, dilation 1, `s` phases).
#[derive(Debug, Clone, Copy)]
pub struct ConvShape {
    /// Taps of the product (`k` for a convolution, `⌈k / s⌉` for a transposed one).
    pub taps: usize,
    /// Input positions between taps (1 for a transposed convolution).
    pub dilation: usize,
    /// Output samples per input position (1, or the transposed convolution's stride `s`).
    pub phases: usize,
}

impl ConvShape {
    /// Input positions of past context the product reads before a chunk: `(taps - 1) · dilation`.
    pub fn context(&self) -> usize {
        (self.taps - 1) * self.dilation
    }
}

/// `cols[b, j · cin + ci, n] = xp[b, ci, n + j · dilation]` for the concatenation
/// `xp = [hist, x]` along time: `[batch, taps · cin, len]`, contiguous, of `x`'s dtype.
///
/// - `hist`: `[batch, cin, shape.context()]`, contiguous; required when the context is > 0.
/// - `x`: `[batch, cin, len]`, contiguous, bf16 or f32.
///
/// Errors if shapes, dtypes or layouts disagree, or the tensors are not on a CUDA device.
pub fn shift_cols(hist: Option<&Tensor>, x: &Tensor, shape: ConvShape) -> Result<Tensor> {
    let (b, cin, len) = x.dims3()?;
    let dtype = x.dtype();
    let name = match dtype {
        DType::BF16 => "shift_cols_u16",
        DType::F32 => "shift_cols_u32",
        other => candle_core::bail!("shift_cols: {other:?} input"),
    };
    expect(x, dtype, "conv input")?;
    let ctx = shape.context();
    if shape.taps == 0 || shape.dilation == 0 {
        candle_core::bail!("shift_cols: {shape:?}");
    }
    match hist {
        Some(h) => {
            expect(h, dtype, "conv history")?;
            if h.dims3()? != (b, cin, ctx) {
                candle_core::bail!(
                    "shift_cols: history {:?} for input {:?}",
                    h.dims(),
                    x.dims()
                );
            }
        }
        None if ctx > 0 => {
            candle_core::bail!("shift_cols: {ctx} positions of history needed, none given")
        }
        None => {}
    }
    let rows = shape.taps * cin;
    let dev = cuda_device(x)?;
    let out = empty(&dev, dtype, (b, rows, len))?;
    if out.elem_count() == 0 {
        return Ok(out);
    }
    let (px, po) = (dev_ptr(x, &dev)?, dev_ptr(&out, &dev)?);
    let ph = hist.map(|h| dev_ptr(h, &dev)).transpose()?;
    let args = Args::default()
        .ptr(ph.as_ref().map_or(px.addr, |p| p.addr))
        .ptr(px.addr)
        .ptr(po.addr)
        .i32(cin)?
        .i32(shape.dilation)?
        .i32(ctx)?
        .i32(len)?;
    let grid = |n: usize, what: &str| {
        u32::try_from(n).map_err(|_| candle_core::Error::Msg(format!("shift_cols: {n} {what}")))
    };
    let cfg = LaunchConfig {
        grid_dim: (
            grid(
                len.div_ceil(THREADS * 16 / dtype.size_in_bytes()),
                "column blocks",
            )?,
            grid(rows, "rows")?,
            grid(b, "batch rows")?,
        ),
        block_dim: (THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    args.launch(&dev, MODULE, PTX, name, cfg)?;
    drop((px, po, ph));
    Ok(out)
}
