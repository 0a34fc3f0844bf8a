//! SnakeBeta activation (BigVGAN style), elementwise and stateless.
//!
//! `y = x + 1 / (exp(beta) + 1e-9) * sin(x * exp(alpha))^2`, with per-channel `alpha` and `beta`
//! stored in log space. Reference: `SnakeBeta` in
//! `qwen_tts/core/tokenizer_12hz/modeling_qwen3_tts_tokenizer_v2.py`.
//!
//! On the CPU in f32 the activation is one fused pass ([`FusedSnakeBeta`]) with an 8-lane
//! vectorised sine (the `wide` crate), instead of five tensor passes around the scalar libm
//! sine: it is the Code2Wav decoder's most frequent operation (about 460,000 evaluations per
//! 80 ms frame in the bundled voice's decoder, more in the released ones). Elsewhere (f64, the
//! verification mode) it runs as tensor operations, and on CUDA as one kernel
//! ([`crate::nn::cuda_kernels::snake_beta`]; `OMNITTS_DECODER_KERNELS=0` selects the tensor operations).

use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor, bail};
use wide::f32x8;

/// The reference's guard against division by zero.
const NO_DIV_BY_ZERO: f64 = 1e-9;

/// Tensors of at least this many elements are split over candle's barrier pool
/// (`CANDLE_NUM_THREADS`), the threshold of candle's own parallel elementwise ops.
const PARALLEL_MIN_ELEMENTS: usize = 64 * 1024;

/// SnakeBeta over `[batch, channels, time]`, with `exp(alpha)` and `1 / (exp(beta) + 1e-9)`
/// precomputed as `[1, channels, 1]`.
#[derive(Debug, Clone)]
pub struct SnakeBeta {
    /// `exp(alpha)`, `[1, channels, 1]`, in the parameters' dtype (f32, or f64 in verification).
    frequency: Tensor,
    /// `1 / (exp(beta) + 1e-9)`, `[1, channels, 1]`, same dtype.
    inv_magnitude: Tensor,
    /// The same parameters as host vectors, `[channels]` each, when they are f32 on the CPU.
    fused: Option<FusedSnakeBeta>,
}

impl SnakeBeta {
    /// Builds the activation from the checkpoint's log-space `alpha` and `beta`, each `[channels]`.
    /// The parameters are computed in f32 (f64 if they are f64), whatever the activations' dtype.
    pub fn from_log_params(alpha: &Tensor, beta: &Tensor) -> Result<Self> {
        let c = alpha.dims1()?;
        let cb = beta.dims1()?;
        if c != cb {
            bail!("SnakeBeta: alpha has {c} channels, beta has {cb}")
        }
        let dtype = if alpha.dtype() == DType::F64 {
            DType::F64
        } else {
            DType::F32
        };
        let frequency = alpha.to_dtype(dtype)?.exp()?;
        let inv_magnitude = (beta.to_dtype(dtype)?.exp()? + NO_DIV_BY_ZERO)?.recip()?;
        Self::from_params(frequency, inv_magnitude)
    }

    /// The plain Snake of DAC codecs, `x + 1 / (alpha + 1e-9) · sin(alpha · x)^2`, from its
    /// linear-space `alpha` `[channels]` (the same function with `exp(alpha') = alpha`, without
    /// the round trip through a logarithm, so a negative alpha works too).
    pub fn from_linear_alpha(alpha: &Tensor) -> Result<Self> {
        alpha.dims1()?;
        let dtype = if alpha.dtype() == DType::F64 {
            DType::F64
        } else {
            DType::F32
        };
        let frequency = alpha.to_dtype(dtype)?;
        let inv_magnitude = (&frequency + NO_DIV_BY_ZERO)?.recip()?;
        Self::from_params(frequency, inv_magnitude)
    }

    /// The activation from its parameters `frequency` and `inv_magnitude` (`[channels]` each, f32
    /// or f64): kept as `[1, channels, 1]`, and as host vectors for the fused CPU pass when f32 on
    /// the CPU.
    fn from_params(frequency: Tensor, inv_magnitude: Tensor) -> Result<Self> {
        let c = frequency.dims1()?;
        let fused = if frequency.device().is_cpu() && frequency.dtype() == DType::F32 {
            Some(FusedSnakeBeta {
                frequency: frequency.to_vec1()?,
                inv_magnitude: inv_magnitude.to_vec1()?,
            })
        } else {
            None
        };
        Ok(Self {
            frequency: frequency.reshape((1, c, 1))?,
            inv_magnitude: inv_magnitude.reshape((1, c, 1))?,
            fused,
        })
    }

    /// The f32 parameters as the CUDA kernels take them, `exp(alpha)` and
    /// `1 / (exp(beta) + 1e-9)`, each `[channels]`; `None` when they are f64 (verification).
    pub fn kernel_params(&self) -> Option<(Tensor, Tensor)> {
        if self.frequency.dtype() != DType::F32 {
            return None;
        }
        Some((
            self.frequency.flatten_all().ok()?,
            self.inv_magnitude.flatten_all().ok()?,
        ))
    }

    /// Number of channels.
    pub fn channels(&self) -> usize {
        self.frequency.dims()[1]
    }

    /// Applies the activation to `x` `[b, channels, t]` (f32, bf16 on CUDA, or f64); the result
    /// has `x`'s dtype.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match &self.fused {
            Some(op) if x.device().is_cpu() && x.dtype() == DType::F32 => {
                x.contiguous()?.apply_op1_no_bwd(op)
            }
            _ => {
                #[cfg(feature = "cuda")]
                if x.device().is_cuda()
                    && matches!(x.dtype(), DType::F32 | DType::BF16)
                    && crate::nn::switches::Switches::get().decoder_kernels
                    && let Some((f, m)) = self.kernel_params()
                {
                    return crate::nn::cuda_kernels::snake_beta::snake_beta(x, &f, &m);
                }
                self.forward_tensor_ops(x)
            }
        }
    }

    /// The activation as tensor operations (any device and dtype; the parameters are cast to
    /// `x`'s dtype).
    fn forward_tensor_ops(&self, x: &Tensor) -> Result<Tensor> {
        let (f, m) = (
            self.frequency.to_dtype(x.dtype())?,
            self.inv_magnitude.to_dtype(x.dtype())?,
        );
        let periodic = x.broadcast_mul(&f)?.sin()?.sqr()?;
        x + periodic.broadcast_mul(&m)?
    }
}

/// SnakeBeta as one CPU pass over a contiguous f32 `[b, channels, t]` tensor: per element
/// `x + (s * s) * inv_magnitude[c]` with `s = sin(x * frequency[c])`, the same operations in the
/// same order as the tensor form, with `wide`'s vectorised sine (within 1.2e-7 of libm's over the
/// arguments checked, |x · frequency| up to a few hundred; its range reduction loses accuracy far
/// beyond that, where the decoder's activations never go). Every
/// element goes through the 8-lane path (a row's last partial group is padded), so its value does
/// not depend on where it sits in a chunk: streamed, whole and batched passes agree to the bit.
#[derive(Debug, Clone)]
struct FusedSnakeBeta {
    /// `exp(alpha)`, `[channels]`.
    frequency: Vec<f32>,
    /// `1 / (exp(beta) + 1e-9)`, `[channels]`.
    inv_magnitude: Vec<f32>,
}

impl FusedSnakeBeta {
    /// `x` → `out` for one channel's row of samples.
    fn row(x: &[f32], out: &mut [f32], frequency: f32, inv_magnitude: f32) {
        let (f, m) = (f32x8::splat(frequency), f32x8::splat(inv_magnitude));
        let lanes = |v: [f32; 8]| {
            let v = f32x8::from(v);
            let s = (v * f).sin();
            (v + (s * s) * m).to_array()
        };
        let mut xs = x.chunks_exact(8);
        let mut outs = out.chunks_exact_mut(8);
        for (xc, oc) in (&mut xs).zip(&mut outs) {
            let mut v = [0f32; 8];
            v.copy_from_slice(xc);
            oc.copy_from_slice(&lanes(v));
        }
        let (xr, or) = (xs.remainder(), outs.into_remainder());
        if !xr.is_empty() {
            let mut v = [0f32; 8];
            v[..xr.len()].copy_from_slice(xr);
            or.copy_from_slice(&lanes(v)[..xr.len()]);
        }
    }
}

impl CustomOp1 for FusedSnakeBeta {
    fn name(&self) -> &'static str {
        "snake-beta"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(data) = storage else {
            bail!("SnakeBeta (fused): expected f32 storage")
        };
        let (_, c, t) = layout.shape().dims3()?;
        if c != self.frequency.len() {
            bail!(
                "SnakeBeta: input has {c} channels, the activation {}",
                self.frequency.len()
            )
        }
        let Some((start, end)) = layout.contiguous_offsets() else {
            bail!("SnakeBeta (fused): the input must be contiguous")
        };
        let x = &data[start..end];
        let mut out = vec![0f32; x.len()];
        if t == 0 {
            return Ok((CpuStorage::F32(out), layout.shape().clone()));
        }
        let rows = x.len() / t;
        // Row `r` of `[b * c, t]` is channel `r % c`.
        let run = |rows: std::ops::Range<usize>, out: &mut [f32]| {
            for (r, or) in rows.zip(out.chunks_exact_mut(t)) {
                let ch = r % c;
                let xr = &x[r * t..(r + 1) * t];
                Self::row(xr, or, self.frequency[ch], self.inv_magnitude[ch]);
            }
        };
        if x.len() < PARALLEL_MIN_ELEMENTS {
            run(0..rows, &mut out);
        } else {
            // On candle's barrier pool, as candle's own elementwise ops of this size run: whole
            // rows per job, so every element is computed exactly as in one thread.
            let out_ptr = out.as_mut_ptr() as usize;
            candle_core::utils::barrier_pool().execute_chunked(rows, |range| {
                // SAFETY: the ranges of `execute_chunked` are disjoint and within `0..rows`, so
                // each job writes its own rows of `out`, which outlives the call.
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(
                        (out_ptr as *mut f32).add(range.start * t),
                        range.len() * t,
                    )
                };
                run(range, dst);
            });
        }
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::test_util::max_diff;
    use candle_core::Device;

    /// The fused CPU pass against the tensor form, on rows whose lengths are and are not
    /// multiples of 8, and a row computed inside a long tensor equals itself computed alone.
    #[test]
    fn fused_pass_matches_tensor_ops() {
        let dev = Device::Cpu;
        let c = 3;
        let alpha = Tensor::new(&[0.3f32, -1.2, 1.9], &dev).unwrap();
        let beta = Tensor::new(&[-0.5f32, 0.7, 2.1], &dev).unwrap();
        let snake = SnakeBeta::from_log_params(&alpha, &beta).unwrap();
        assert!(snake.fused.is_some());
        assert_eq!(snake.channels(), c);
        for t in [1usize, 7, 8, 13, 64, 101] {
            let n = 2 * c * t;
            let xs: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.37)
                .collect();
            let x = Tensor::from_vec(xs, (2, c, t), &dev).unwrap();
            let fused = snake.forward(&x).unwrap();
            let plain = snake.forward_tensor_ops(&x).unwrap();
            let d = max_diff(&fused, &plain);
            // |y| reaches ~20 here; libm and the vector sine differ by a few ulp of sin.
            assert!(d < 1e-5, "t {t}: fused vs tensor ops differ by {d}");
            assert!(
                fused.to_vec3::<f32>().unwrap()[1][2]
                    .iter()
                    .any(|&v| v != 0.0)
            );
            // A prefix computed alone equals the same samples inside the longer row, to the bit.
            let head = x.narrow(2, 0, t.div_ceil(2)).unwrap();
            let alone = snake.forward(&head).unwrap();
            let inside = fused.narrow(2, 0, t.div_ceil(2)).unwrap();
            assert_eq!(
                alone.to_vec3::<f32>().unwrap(),
                inside.to_vec3::<f32>().unwrap(),
                "t {t}"
            );
        }
        // A row view with a start offset (contiguous, not copied) and a tensor above the parallel
        // threshold (rows split over the pool) give the same values as the tensor form.
        let t = PARALLEL_MIN_ELEMENTS / (2 * c) + 5;
        let xs: Vec<f32> = (0..2 * c * t)
            .map(|i| ((i * 53 % 211) as f32 - 105.0) * 0.11)
            .collect();
        let x = Tensor::from_vec(xs, (2, c, t), &dev).unwrap();
        for view in [x.clone(), x.narrow(0, 1, 1).unwrap()] {
            let fused = snake.forward(&view).unwrap();
            let plain = snake.forward_tensor_ops(&view).unwrap();
            let d = max_diff(&fused, &plain);
            assert!(
                d < 1e-5,
                "{:?}: fused vs tensor ops differ by {d}",
                view.shape()
            );
        }
        // f64 (the verification mode) keeps the tensor form.
        let snake64 = SnakeBeta::from_log_params(
            &alpha.to_dtype(DType::F64).unwrap(),
            &beta.to_dtype(DType::F64).unwrap(),
        )
        .unwrap();
        assert!(snake64.fused.is_none());
    }
}
