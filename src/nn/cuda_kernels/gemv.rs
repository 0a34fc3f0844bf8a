//! Launcher of `gemv.cu`: the decode path's one-row matmuls with the RMSNorm before them and the
//! residual add, SwiGLU, a bias or an f32 cast after them fused in (reference:
//! `DecoderLayer::forward` in `src/nn/transformer.rs`, i.e. `Linear::forward` on
//! `RmsNorm::forward`, then `x + h` or `silu(gate) · up`; candle's CUDA `rms_norm` and cuBLAS
//! numerics, f32 accumulation, summation order aside).
//!
//! Every function errors (nothing is launched) on shapes, dtypes or addresses the kernels do not
//! take; callers check [`takes`] / [`supports`] / [`vector_ok`] first and keep the candle ops
//! otherwise.

use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{DType, Result, Tensor};

use super::{Args, cuda_device, dev_ptr, empty, expect, kernel_name};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/gemv.ptx"));
const MODULE: &str = "omnitts_gemv";
/// Threads per block (`GEMV_THREADS` in the kernel): 8 warps.
const THREADS: usize = 256;
/// Query rows one launch takes (`GEMV_MAX_ROWS`).
pub const MAX_ROWS: usize = 4;
/// Blocks a launch aims for (two per SM of an H100/H200), so that enough weight reads are in
/// flight to stream at memory bandwidth.
const TARGET_BLOCKS: usize = 264;

/// Whether the kernels take `rows` input rows of width `k` in `dtype` against weight `w` `[n, k]`:
/// bf16 or f32, at most [`MAX_ROWS`] rows, `k` a multiple of 8 (16-byte loads), a contiguous,
/// aligned weight of the same dtype.
pub fn supports(rows: usize, k: usize, dtype: DType, w: &Tensor) -> bool {
    (1..=MAX_ROWS).contains(&rows)
        && matches!(dtype, DType::BF16 | DType::F32)
        && w.dims2().is_ok_and(|(_, wk)| wk == k)
        && k.is_multiple_of(8)
        && w.dtype() == dtype
        && w.is_contiguous()
        && w.layout().start_offset().is_multiple_of(8)
}

/// [`supports`] for the input tensor itself: `x` `[batch, t, k]` contiguous and starting on a
/// 16-byte boundary (its storage's allocation is), against weight `w` `[n, k]`.
pub fn takes(x: &Tensor, w: &Tensor) -> bool {
    let Ok((b, t, k)) = x.dims3() else {
        return false;
    };
    x.is_contiguous()
        && x.layout().start_offset().is_multiple_of(8)
        && supports(b * t, k, x.dtype(), w)
}

/// Whether `v` (an RMSNorm weight or a bias) can ride along a launch whose vectors have `len`
/// elements in `dtype`: that length, that dtype, contiguous and 16-byte aligned.
pub fn vector_ok(v: &Tensor, len: usize, dtype: DType) -> bool {
    v.dims1().is_ok_and(|l| l == len)
        && v.dtype() == dtype
        && v.is_contiguous()
        && v.layout().start_offset().is_multiple_of(8)
}

/// `rms_norm(x) · wᵀ`: `x` `[batch, t, k]`, `norm` `[k]` (the RMSNorm weight, with `eps`),
/// `w` `[n, k]` → `[batch, t, n]`. The input layernorm and the q/k/v projections of a layer.
pub fn norm_gemv(x: &Tensor, norm: &Tensor, eps: f64, w: &Tensor) -> Result<Tensor> {
    let n = w.dim(0)?;
    launch(Variant::Norm, x, Some((norm, eps)), w, None, n)
}

/// `rms_norm(x) · wᵀ` rounded to `x`'s dtype and returned as f32 `[batch, t, n]`: a final norm
/// and an output head (`head(norm(h)).to_dtype(F32)` in one launch). `x` `[batch, t, k]`, `norm`
/// `[k]`, `w` `[n, k]`.
pub fn norm_gemv_logits(x: &Tensor, norm: &Tensor, eps: f64, w: &Tensor) -> Result<Tensor> {
    let n = w.dim(0)?;
    launch(Variant::NormLogits, x, Some((norm, eps)), w, None, n)
}

/// `res + x · wᵀ` (the product rounded to the dtype before the add, as the unfused ops):
/// `x` `[batch, t, k]`, `w` `[n, k]`, `res` `[batch, t, n]` → `[batch, t, n]`. `o_proj` or
/// `down_proj` with the residual add after it.
pub fn gemv_residual(x: &Tensor, w: &Tensor, res: &Tensor) -> Result<Tensor> {
    let n = w.dim(0)?;
    launch(Variant::Residual, x, None, w, Some(res), n)
}

/// `x · wᵀ + bias` (the product rounded to the dtype before the add, as `Linear::forward`):
/// `x` `[batch, t, k]`, `w` `[n, k]`, `bias` `[n]` → `[batch, t, n]`.
pub fn gemv_bias(x: &Tensor, w: &Tensor, bias: &Tensor) -> Result<Tensor> {
    let n = w.dim(0)?;
    launch(Variant::Bias, x, None, w, Some(bias), n)
}

/// `silu(rms_norm(x) · gateᵀ) · (rms_norm(x) · upᵀ)` with `w` = `[gate; up]` `[2n, k]` (the
/// fused gate/up weight): `x` `[batch, t, k]`, `norm` `[k]` → `[batch, t, n]`. The
/// post-attention layernorm and the MLP up to `down_proj`.
pub fn norm_gemv_silu(x: &Tensor, norm: &Tensor, eps: f64, w: &Tensor) -> Result<Tensor> {
    let rows = w.dim(0)?;
    if !rows.is_multiple_of(2) {
        candle_core::bail!("norm_gemv_silu: fused gate/up weight of {rows} rows");
    }
    launch(Variant::NormSilu, x, Some((norm, eps)), w, None, rows / 2)
}

/// Warps that share one output element (split k): the fewest that give [`TARGET_BLOCKS`]
/// blocks, while each warp still reads at least one 256-element stretch of its row.
pub(super) fn warps_per_row(n: usize, k: usize) -> usize {
    let mut wpr = 1;
    while wpr < 8 && n * wpr / 8 < TARGET_BLOCKS && wpr * 2 * 256 <= k {
        wpr *= 2;
    }
    wpr
}

/// The kernel variants of `gemv.cu`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Variant {
    Norm,
    NormLogits,
    Residual,
    Bias,
    NormSilu,
}

impl Variant {
    fn base_name(self) -> &'static str {
        match self {
            Variant::Norm => "gemv_norm",
            Variant::NormLogits => "gemv_norm_logits",
            Variant::Residual => "gemv_residual",
            Variant::Bias => "gemv_bias",
            Variant::NormSilu => "gemv_norm_silu",
        }
    }
}

fn launch(
    variant: Variant,
    x: &Tensor,
    norm: Option<(&Tensor, f64)>,
    w: &Tensor,
    res: Option<&Tensor>,
    n: usize,
) -> Result<Tensor> {
    let base = variant.base_name();
    let dtype = x.dtype();
    let (b, t, k) = x.dims3()?;
    if !supports(b * t, k, dtype, w) || n == 0 {
        candle_core::bail!(
            "{base}: input {:?} {dtype:?} against weight {:?} {:?} unsupported",
            x.dims(),
            w.dims(),
            w.dtype()
        );
    }
    expect(x, dtype, "input")?;
    if let Some((nw, _)) = norm {
        expect(nw, dtype, "norm weight")?;
        if nw.dims1()? != k {
            candle_core::bail!("{base}: norm weight {:?} for rows of {k}", nw.dims());
        }
    }
    if let Some(r) = res {
        expect(r, dtype, "residual or bias")?;
        let fits = if variant == Variant::Bias {
            r.dims1().is_ok_and(|len| len == n)
        } else {
            r.dims3().is_ok_and(|d| d == (b, t, n))
        };
        if !fits {
            candle_core::bail!(
                "{base}: {:?} added to an output of ({b}, {t}, {n})",
                r.dims()
            );
        }
    }
    let dev = cuda_device(x)?;
    let out_dtype = if variant == Variant::NormLogits {
        DType::F32
    } else {
        dtype
    };
    let out = empty(&dev, out_dtype, (b, t, n))?;
    let (px, pw, po) = (dev_ptr(x, &dev)?, dev_ptr(w, &dev)?, dev_ptr(&out, &dev)?);
    // Absent operands get the input's address: the kernel variant never reads them.
    let pn = norm.map(|(nw, _)| dev_ptr(nw, &dev)).transpose()?;
    let pr = res.map(|r| dev_ptr(r, &dev)).transpose()?;
    let (norm_addr, res_addr) = (
        pn.as_ref().map_or(px.addr, |p| p.addr),
        pr.as_ref().map_or(px.addr, |p| p.addr),
    );
    for (what, addr) in [("input", px.addr), ("weight", pw.addr), ("norm", norm_addr)] {
        if addr % 16 != 0 {
            candle_core::bail!("{base}: {what} at {addr:#x} is not 16-byte aligned");
        }
    }
    let wpr = warps_per_row(n, k);
    let per_block = THREADS / 32 / wpr;
    let args = Args::default()
        .ptr(px.addr)
        .ptr(norm_addr)
        .f32(norm.map_or(0.0, |(_, eps)| eps as f32))
        .ptr(pw.addr)
        .ptr(res_addr)
        .ptr(po.addr)
        .i32(b * t)?
        .i32(k)?
        .i32(n)?
        .i32(wpr)?;
    let cfg = LaunchConfig {
        grid_dim: (
            u32::try_from(n.div_ceil(per_block))
                .map_err(|_| candle_core::Error::Msg(format!("{base}: {n} outputs")))?,
            1,
            1,
        ),
        block_dim: (THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    args.launch(&dev, MODULE, PTX, &kernel_name(base, dtype)?, cfg)?;
    drop((px, pw, po, pn, pr));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::warps_per_row;

    #[test]
    fn warps_per_row_fills_the_gpu_without_idle_warps() {
        // Code predictor / 0.6B talker: q/k/v (4096 × 1024) and gate/up pairs (3072 × 1024)
        // already give enough blocks; o_proj (1024 × 2048) and down (1024 × 3072) split k.
        assert_eq!(warps_per_row(4096, 1024), 1);
        assert_eq!(warps_per_row(3072, 1024), 1);
        assert_eq!(warps_per_row(1024, 2048), 4);
        assert_eq!(warps_per_row(1024, 3072), 4);
        // A short row never gets more warps than 256-element stretches.
        assert_eq!(warps_per_row(16, 256), 1);
        assert_eq!(warps_per_row(16, 512), 2);
        assert_eq!(warps_per_row(16, 1 << 16), 8);
    }
}
