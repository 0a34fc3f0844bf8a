//! Launcher of `bias_epilogue.cu`: a Code2Wav convolution's bias add, alone or with the SnakeBeta
//! or residual add that follows it, in one pass (reference: the tensor operations in
//! [`crate::nn::conv`] and [`crate::nn::snake_beta`]).

use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{DType, Result, Tensor};

use super::{Args, cuda_device, dev_ptr, empty, expect, kernel_name};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/bias_epilogue.ptx"));
const MODULE: &str = "omnitts_bias_epilogue";
/// Threads per block (`EPILOGUE_THREADS` in the kernel).
const THREADS: usize = 256;

/// What follows the bias add.
#[derive(Debug, Clone, Copy)]
pub enum Then<'a> {
    /// Nothing: `y + bias`.
    Nothing,
    /// SnakeBeta with f32 `frequency` and `inv_magnitude`, each `[channels]`.
    Snake {
        frequency: &'a Tensor,
        inv_magnitude: &'a Tensor,
    },
    /// The residual add: `residual + (y + bias)`, `residual` `[batch, channels, time]`.
    Residual(&'a Tensor),
}

/// `y` `[batch, channels, time]` (bf16 or f32; rows of `time` unit-stride samples at a fixed row
/// stride: contiguous, or a time narrow of a contiguous tensor) plus `bias` `[channels]` (same
/// dtype), then `then`: a new contiguous `[batch, channels, time]` tensor of `y`'s dtype.
///
/// Errors if shapes, dtypes or layouts disagree, or `y` is not on a CUDA device.
pub fn bias_epilogue(y: &Tensor, bias: &Tensor, then: Then<'_>) -> Result<Tensor> {
    launch(y, 1, bias, then)
}

/// [`bias_epilogue`] of a transposed convolution's product by phases: `z` `[batch, channels ·
/// phases, n]` (contiguous; row `c · phases + r` holds output samples `m · phases + r`) gives
/// `[batch, channels, n · phases]` with `out[b, c, m · phases + r] = then(z[b, c · phases + r, m] +
/// bias[c])`.
///
/// Errors as [`bias_epilogue`], or if `z` is not contiguous or its rows are not a multiple of
/// `phases`.
pub fn bias_epilogue_phased(
    z: &Tensor,
    phases: usize,
    bias: &Tensor,
    then: Then<'_>,
) -> Result<Tensor> {
    launch(z, phases, bias, then)
}

/// [`bias_epilogue`] (`phases` 1) and [`bias_epilogue_phased`].
fn launch(y: &Tensor, phases: usize, bias: &Tensor, then: Then<'_>) -> Result<Tensor> {
    let dtype = y.dtype();
    let (b, rows, n) = y.dims3()?;
    if phases == 0 || rows % phases != 0 || (phases > 1 && !y.is_contiguous()) {
        candle_core::bail!(
            "bias_epilogue: {:?} (strides {:?}) is not a product of {phases} phases",
            y.dims(),
            y.layout().stride()
        );
    }
    let (c, t) = (rows / phases, n * phases);
    expect(bias, dtype, "conv bias")?;
    if bias.dims1()? != c {
        candle_core::bail!("bias_epilogue: {c} channels, bias {:?}", bias.dims());
    }
    // Row r = batch index · channels + channel sits at r · y_stride.
    let stride = y.layout().stride();
    let y_stride = if phases > 1 {
        Some(n)
    } else if stride[2] != 1 {
        None
    } else if c == 1 {
        Some(stride[0])
    } else if b == 1 || stride[0] == c * stride[1] {
        Some(stride[1])
    } else {
        None
    };
    let Some(y_stride) = y_stride else {
        candle_core::bail!(
            "bias_epilogue: rows of {:?} (strides {stride:?}) are not evenly spaced",
            y.dims()
        )
    };
    let dev = cuda_device(y)?;
    let out = empty(&dev, dtype, (b, c, t))?;
    if out.elem_count() == 0 {
        return Ok(out);
    }
    let (name, f, m, r) = match then {
        Then::Nothing => ("bias_add", None, None, None),
        Then::Snake {
            frequency,
            inv_magnitude,
        } => {
            expect(frequency, DType::F32, "SnakeBeta frequency")?;
            expect(inv_magnitude, DType::F32, "SnakeBeta inverse magnitude")?;
            if frequency.dims1()? != c || inv_magnitude.dims1()? != c {
                candle_core::bail!("bias_epilogue: SnakeBeta parameters for another width");
            }
            ("bias_snake", Some(frequency), Some(inv_magnitude), None)
        }
        Then::Residual(res) => {
            expect(res, dtype, "residual")?;
            if res.dims3()? != (b, c, t) {
                candle_core::bail!(
                    "bias_epilogue: residual {:?} for {:?}",
                    res.dims(),
                    y.dims()
                );
            }
            ("bias_residual", None, None, Some(res))
        }
    };
    let (py, pb, po) = (
        dev_ptr(y, &dev)?,
        dev_ptr(bias, &dev)?,
        dev_ptr(&out, &dev)?,
    );
    let pf = f.map(|t| dev_ptr(t, &dev)).transpose()?;
    let pm = m.map(|t| dev_ptr(t, &dev)).transpose()?;
    let pr = r.map(|t| dev_ptr(t, &dev)).transpose()?;
    // Unused pointers stand in as the output's address (never read in that mode).
    let or_out = |p: &Option<super::DevPtr<'_>>| p.as_ref().map_or(po.addr, |p| p.addr);
    let args = Args::default()
        .ptr(py.addr)
        .i64(y_stride)?
        .ptr(pb.addr)
        .ptr(or_out(&pf))
        .ptr(or_out(&pm))
        .ptr(or_out(&pr))
        .ptr(po.addr)
        .i32(c)?
        .i32(t)?
        .i32(phases)?;
    let rows = u32::try_from(b * c)
        .map_err(|_| candle_core::Error::Msg(format!("bias_epilogue: {} rows", b * c)))?;
    let cfg = LaunchConfig {
        grid_dim: (rows, t.div_ceil(THREADS) as u32, 1),
        block_dim: (THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    args.launch(&dev, MODULE, PTX, &kernel_name(name, dtype)?, cfg)?;
    drop((py, pb, po, pf, pm, pr));
    Ok(out)
}
