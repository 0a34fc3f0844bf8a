//! Launcher of `conv_gemm.cu`: a bf16 causal convolution or causal transposed convolution of the
//! Code2Wav decoder as one implicit GEMM on the tensor cores, reading the stream's past input and
//! the chunk where they lie, writing `[batch, channels, time]` directly, with the bias add and what
//! follows it fused (reference: [`crate::nn::conv`]'s tensor path: candle's im2col, GEMM and
//! transposing copy, then [`super::bias_epilogue`]).

use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{DType, Result, Tensor};

use super::bias_epilogue::Then;
pub use super::shift_cols::ConvShape;
use super::{Args, cuda_device, dev_ptr, empty, expect};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/conv_gemm.ptx"));
const MODULE: &str = "omnitts_conv_gemm";
/// Threads per block and the output tile (`CONV_THREADS`, `CONV_BM` x `CONV_BN` in the kernel).
const THREADS: u32 = 128;
const TILE_ROWS: usize = 64;
const TILE_COLS: usize = 64;

/// The convolution of the input `[hist, x]` (concatenated along time, never materialised):
/// `out[b, m / phases, n · phases + m % phases] = then(bias + Σ_{j, ci} w[m, j · cin + ci] ·
/// xp[b, ci, n + j · dilation])`, with `xp` the concatenation.
///
/// - `w`: `[rows, taps · cin]` bf16, contiguous (`rows` = output channels × `phases`).
/// - `hist`: `[batch, cin, shape.context()]` bf16, contiguous; required when the context is > 0.
/// - `x`: `[batch, cin, len]` bf16, contiguous.
/// - `bias`: `[rows / phases]` bf16; `then` other than [`Then::Nothing`] needs a bias.
///
/// Returns a new contiguous `[batch, rows / phases, len · phases]` bf16 tensor. The products
/// accumulate in f32 and round once to bf16, then the epilogue rounds as
/// [`super::bias_epilogue::bias_epilogue`] does.
///
/// Errors if shapes, dtypes or layouts disagree, or the tensors are not on a CUDA device.
pub fn conv_gemm(
    w: &Tensor,
    hist: Option<&Tensor>,
    x: &Tensor,
    shape: ConvShape,
    bias: Option<&Tensor>,
    then: Then<'_>,
) -> Result<Tensor> {
    let ConvShape {
        taps,
        dilation,
        phases,
    } = shape;
    let (b, cin, len) = x.dims3()?;
    let (rows, k_total) = w.dims2()?;
    expect(w, DType::BF16, "conv weight")?;
    expect(x, DType::BF16, "conv input")?;
    if taps == 0 || dilation == 0 || phases == 0 || k_total != taps * cin || rows % phases != 0 {
        candle_core::bail!(
            "conv_gemm: weight {:?} for {cin} inputs, {taps} taps, {phases} phases",
            w.dims()
        );
    }
    let ctx = shape.context();
    let channels = rows / phases;
    let dev = cuda_device(x)?;
    let out = empty(&dev, DType::BF16, (b, channels, len * phases))?;
    if out.elem_count() == 0 {
        return Ok(out);
    }
    if let Some(h) = hist {
        expect(h, DType::BF16, "conv history")?;
        if h.dims3()? != (b, cin, ctx) {
            candle_core::bail!("conv_gemm: history {:?} for input {:?}", h.dims(), x.dims());
        }
    } else if ctx > 0 {
        candle_core::bail!("conv_gemm: {ctx} positions of history needed, none given");
    }
    if let Some(bias) = bias {
        expect(bias, DType::BF16, "conv bias")?;
        if bias.dims1()? != channels {
            candle_core::bail!("conv_gemm: {channels} channels, bias {:?}", bias.dims());
        }
    }
    let (name, f, m, r) = match (bias, then) {
        (None, Then::Nothing) => ("conv_gemm_plain_bf16", None, None, None),
        (Some(_), Then::Nothing) => ("conv_gemm_bias_bf16", None, None, None),
        (
            Some(_),
            Then::Snake {
                frequency,
                inv_magnitude,
            },
        ) => {
            expect(frequency, DType::F32, "SnakeBeta frequency")?;
            expect(inv_magnitude, DType::F32, "SnakeBeta inverse magnitude")?;
            if frequency.dims1()? != channels || inv_magnitude.dims1()? != channels {
                candle_core::bail!("conv_gemm: SnakeBeta parameters for another width");
            }
            ("conv_gemm_snake_bf16", Some(frequency), Some(inv_magnitude), None)
        }
        (Some(_), Then::Residual(res)) => {
            expect(res, DType::BF16, "residual")?;
            if res.dims3()? != (b, channels, len * phases) {
                candle_core::bail!("conv_gemm: residual {:?} for {:?}", res.dims(), out.dims());
            }
            ("conv_gemm_residual_bf16", None, None, Some(res))
        }
        (None, _) => candle_core::bail!("conv_gemm: a fused SnakeBeta or residual needs a bias"),
    };
    let (pw, px, po) = (dev_ptr(w, &dev)?, dev_ptr(x, &dev)?, dev_ptr(&out, &dev)?);
    let ph = hist.map(|t| dev_ptr(t, &dev)).transpose()?;
    let pb = bias.map(|t| dev_ptr(t, &dev)).transpose()?;
    let pf = f.map(|t| dev_ptr(t, &dev)).transpose()?;
    let pm = m.map(|t| dev_ptr(t, &dev)).transpose()?;
    let pr = r.map(|t| dev_ptr(t, &dev)).transpose()?;
    // Unused pointers stand in as the output's address (never read in that mode).
    let or_out = |p: &Option<super::DevPtr<'_>>| p.as_ref().map_or(po.addr, |p| p.addr);
    let args = Args::default()
        .ptr(pw.addr)
        .ptr(or_out(&ph))
        .ptr(px.addr)
        .ptr(or_out(&pb))
        .ptr(or_out(&pf))
        .ptr(or_out(&pm))
        .ptr(or_out(&pr))
        .ptr(po.addr)
        .i32(rows)?
        .i32(cin)?
        .i32(taps)?
        .i32(dilation)?
        .i32(len)?
        .i32(phases)?;
    let grid = |n: usize, what: &str| {
        u32::try_from(n).map_err(|_| candle_core::Error::Msg(format!("conv_gemm: {n} {what}")))
    };
    let cfg = LaunchConfig {
        grid_dim: (
            grid(len.div_ceil(TILE_COLS), "column tiles")?,
            grid(rows.div_ceil(TILE_ROWS), "row tiles")?,
            grid(b, "batch rows")?,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    args.launch(&dev, MODULE, PTX, name, cfg)?;
    drop((pw, px, po, ph, pb, pf, pm, pr));
    Ok(out)
}
