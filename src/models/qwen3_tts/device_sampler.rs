//! The code predictor's token choice as tensor ops that stay on the device, so a whole frame
//! (15 steps of logits → code → next input embedding) can be one CUDA graph (issue 5).
//!
//! Only candle tensor ops are used, so the same code runs on the CPU device (unit tests) and on
//! CUDA (inside a graph capture: no host reads, no shapes or values that depend on device data,
//! constants allocated up front). It mirrors the host code-predictor path of
//! [`super::sampling::TokenChooser::choose`]:
//!
//! - greedy: the first index of the maximum, as the host's `argmax` and torch's (the smallest
//!   index among the logits equal to the maximum: bf16 logits tie often, and a device argmax
//!   reduction does not promise which of the tied indices it returns);
//! - sampling: temperature → top-k (keep logits ≥ the k-th largest) → top-p (drop the ascending
//!   prefix whose cumulative probability is ≤ `1 - top_p`, never the most probable token) →
//!   inverse-CDF multinomial over the vocabulary in index order with a uniform `u ∈ [0, 1)`:
//!   the first index whose inclusive cumulative probability exceeds `u × total`.
//!
//! The uniforms are drawn on the host from the session's ChaCha20 stream (one per step, in step
//! order, exactly as the host sampler consumes them) and uploaded with the warper parameters as one
//! f64 vector per frame ([`frame_params`]). For the same uniform the device picks the host's code
//! except where float rounding moves a cumulative sum across `u × total` or the top-p cut, and
//! except among exactly equal logits at the top-p threshold (the host's cut walks ties one by one,
//! the device keeps or drops them together): cumulative sums are blocked matrix products in f64
//! here, sequential sums on the host.

use candle_core::{D, DType, Device, Result, Tensor};
use rand::Rng;
use rand_chacha::ChaCha20Rng;

use super::sampling::TokenChooser;

/// f64 values at the head of a frame's parameter vector, before one uniform per step:
/// `[temperature, top-k index into the ascending sort, top-p cut]`.
pub const PARAM_HEADER: usize = 3;

/// Block length of the blocked prefix sum (a `[rows, BLOCK] × [BLOCK, BLOCK]` product plus a
/// `[1, rows] × [rows, rows]` one for the row offsets).
const BLOCK: usize = 64;

/// The parameter vector of one frame for the sampling path, `PARAM_HEADER + steps` f64 values:
/// temperature (f32 value, 1.0 = none), the index into the ascending sort of the k-th largest
/// logit (0 = top-k off: `k == 0` or `k >= vocab`), the top-p cut `1 - top_p` computed in f32
/// as the host does (-1 = top-p off: `top_p >= 1`), then `steps` uniforms in [0, 1) drawn from
/// `rng` in step order (as many draws as the host sampler makes for the same frame).
pub fn frame_params(
    chooser: &TokenChooser,
    vocab: usize,
    steps: usize,
    rng: &mut ChaCha20Rng,
) -> Vec<f64> {
    let k = chooser.top_k;
    let kidx = if k == 0 || k >= vocab { 0 } else { vocab - k };
    let cut = if chooser.top_p >= 1.0 {
        -1.0
    } else {
        f64::from(1.0f32 - chooser.top_p)
    };
    let mut p = Vec::with_capacity(PARAM_HEADER + steps);
    p.extend_from_slice(&[f64::from(chooser.temperature), kidx as f64, cut]);
    p.extend((0..steps).map(|_| rng.random::<f64>()));
    p
}

/// The parameter vector of a greedy row in a batched frame (`PARAM_HEADER + steps` values):
/// temperature 0 marks it, and the row's pick is then the first index of the maximum, as the
/// greedy one-row kernel picks (`cuda_kernels::pick_rows`). No uniforms are drawn: a greedy solo
/// frame draws none either.
pub fn greedy_row_params(steps: usize) -> Vec<f64> {
    let mut p = vec![0.0, 0.0, -1.0];
    p.resize(PARAM_HEADER + steps, 0.0);
    p
}

/// Constants of the device-side sampler for one vocabulary size, allocated once on the device
/// (they must outlive any CUDA graph that uses them).
#[derive(Debug, Clone)]
pub struct DeviceSampler {
    vocab: usize,
    rows: usize,
    /// `[BLOCK, BLOCK]` f64, 1 where row ≤ column: `x [r, BLOCK] × tri` = inclusive prefix sums.
    tri_block: Tensor,
    /// `[rows, rows]` f64, 1 where row < column: exclusive prefix sums of the row totals.
    tri_rows: Tensor,
    /// `[1, vocab]` f64: 0, 1, … vocab-1.
    arange: Tensor,
    /// `[1, vocab]` f64: `vocab` (above every index).
    past_end: Tensor,
    /// `[1, vocab]` f32: -inf.
    neg_inf: Tensor,
    /// `[1, 1]` f64: 0 and `vocab - 1`.
    zero: Tensor,
    last: Tensor,
}

impl DeviceSampler {
    /// Constants for `vocab` logits on `device`. Errors for an empty vocabulary.
    pub fn new(vocab: usize, device: &Device) -> Result<Self> {
        if vocab == 0 {
            candle_core::bail!("device sampler: empty vocabulary");
        }
        let rows = vocab.div_ceil(BLOCK);
        let upper = |n: usize, strict: bool| -> Result<Tensor> {
            let v: Vec<f64> = (0..n * n)
                .map(|i| {
                    let (r, c) = (i / n, i % n);
                    if r < c || (!strict && r == c) {
                        1.0
                    } else {
                        0.0
                    }
                })
                .collect();
            Tensor::from_vec(v, (n, n), device)
        };
        let arange: Vec<f64> = (0..vocab).map(|i| i as f64).collect();
        Ok(Self {
            vocab,
            rows,
            tri_block: upper(BLOCK, false)?,
            tri_rows: upper(rows, true)?,
            arange: Tensor::from_vec(arange, (1, vocab), device)?,
            past_end: Tensor::full(vocab as f64, (1, vocab), device)?,
            neg_inf: Tensor::full(f32::NEG_INFINITY, (1, vocab), device)?,
            zero: Tensor::zeros((1, 1), DType::F64, device)?,
            last: Tensor::full((vocab - 1) as f64, (1, 1), device)?,
        })
    }

    /// Vocabulary size the constants were made for.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Logits of any shape with `vocab` elements → `[1, vocab]` f32.
    fn row(&self, logits: &Tensor) -> Result<Tensor> {
        logits.reshape((1, self.vocab))?.to_dtype(DType::F32)
    }

    /// Inclusive prefix sums along the last dimension of `x` `[1, vocab]` f64.
    fn cumsum(&self, x: &Tensor) -> Result<Tensor> {
        let padded_len = self.rows * BLOCK;
        let x = if padded_len > self.vocab {
            x.pad_with_zeros(1, 0, padded_len - self.vocab)?
        } else {
            x.clone()
        };
        let within = x.reshape((self.rows, BLOCK))?.matmul(&self.tri_block)?; // [rows, BLOCK]
        let totals = within
            .narrow(1, BLOCK - 1, 1)?
            .contiguous()?
            .reshape((1, self.rows))?;
        let offsets = totals.matmul(&self.tri_rows)?.reshape((self.rows, 1))?;
        within
            .broadcast_add(&offsets)?
            .reshape((1, padded_len))?
            .narrow(1, 0, self.vocab)
    }

    /// Greedy choice: `logits` (`vocab` values, any shape, f32 or lower) → the first index of the
    /// maximum as u32 `[1]`, on the logits' device.
    pub fn greedy(&self, logits: &Tensor) -> Result<Tensor> {
        let row = self.row(logits)?;
        let max = row.max_keepdim(D::Minus1)?;
        row.broadcast_eq(&max)?
            .where_cond(&self.arange, &self.past_end)?
            .min_keepdim(D::Minus1)?
            .minimum(&self.last)? // no logit equals the maximum only with NaNs: stay in range
            .to_dtype(DType::U32)?
            .reshape(1)
    }

    /// Sampled choice for step `step`: `logits` (`vocab` values, any shape) and `params` (f64
    /// `[PARAM_HEADER + steps]` on the same device, see [`frame_params`]; the step's uniform is
    /// element `PARAM_HEADER + step`) → the chosen index as u32 `[1]` on the device.
    pub fn sample(&self, logits: &Tensor, params: &Tensor, step: usize) -> Result<Tensor> {
        let v = self.vocab;
        let temperature = params.narrow(0, 0, 1)?.to_dtype(DType::F32)?;
        let l = self.row(logits)?.broadcast_div(&temperature)?;
        // top-k: the k-th largest is element `kidx` of the ascending sort.
        let order = l.arg_sort_last_dim(true)?;
        let sorted = l.gather(&order, 1)?;
        let kidx = params.narrow(0, 1, 1)?.to_dtype(DType::U32)?;
        let thr_k = sorted.index_select(&kidx, 1)?; // [1, 1]
        let sorted = sorted
            .broadcast_ge(&thr_k)?
            .where_cond(&sorted, &self.neg_inf)?;
        // top-p on the (still ascending) masked values: drop the prefix with cum ≤ cut, never the
        // last (most probable) one; the first kept value is the threshold.
        let cum = self.cumsum(&candle_nn::ops::softmax_last_dim(&sorted)?.to_dtype(DType::F64)?)?;
        let cut = params.narrow(0, 2, 1)?.reshape((1, 1))?;
        let dropped = cum
            .broadcast_le(&cut)?
            .to_dtype(DType::F64)?
            .sum_keepdim(1)?
            .minimum(&self.last)?
            .to_dtype(DType::U32)?
            .reshape(1)?;
        let thr_p = sorted.index_select(&dropped, 1)?; // [1, 1], -inf when only masked ones drop
        let thr = thr_k.maximum(&thr_p)?;
        let l = l.broadcast_ge(&thr)?.where_cond(&l, &self.neg_inf)?;
        // Inverse CDF in index order: first i with u·total < cum_i = #{i: cum_i ≤ u·total},
        // capped at the last index of non-zero probability (the host's fallback).
        let p = candle_nn::ops::softmax_last_dim(&l)?.to_dtype(DType::F64)?;
        let cum = self.cumsum(&p)?;
        let total = cum.narrow(1, v - 1, 1)?;
        let u = params.narrow(0, PARAM_HEADER + step, 1)?.reshape((1, 1))?;
        let target = (u * total)?;
        let below = cum
            .broadcast_le(&target)?
            .to_dtype(DType::F64)?
            .sum_keepdim(1)?;
        let last_nonzero = p
            .broadcast_gt(&self.zero)?
            .to_dtype(DType::F64)?
            .mul(&self.arange)?
            .max_keepdim(1)?;
        below
            .minimum(&last_nonzero)?
            .to_dtype(DType::U32)?
            .reshape(1)
    }
}

#[cfg(test)]
mod tests {
    use super::super::sampling;
    use super::*;
    use rand::SeedableRng;

    fn random_logits(rng: &mut ChaCha20Rng, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| (rng.random::<f32>() - 0.5) * 2.0 * scale)
            .collect()
    }

    fn pick(t: &Tensor) -> u32 {
        t.to_vec1::<u32>().expect("u32 [1]")[0]
    }

    #[test]
    fn greedy_rows_are_marked_by_temperature_zero() {
        let p = greedy_row_params(15);
        assert_eq!(p.len(), PARAM_HEADER + 15);
        assert_eq!(p[0], 0.0);
        assert!(p[PARAM_HEADER..].iter().all(|&u| u == 0.0));
        // A sampled row's temperature is positive (validated > 0), so the marker never collides.
        let chooser = TokenChooser {
            do_sample: true,
            temperature: 0.9,
            top_k: 50,
            top_p: 1.0,
        };
        let mut rng = ChaCha20Rng::seed_from_u64(1);
        assert!(frame_params(&chooser, 2048, 15, &mut rng)[0] > 0.0);
    }

    #[test]
    fn greedy_equals_host_argmax() {
        let mut rng = ChaCha20Rng::seed_from_u64(11);
        for vocab in [2048usize, 100, 64, 1] {
            let s = DeviceSampler::new(vocab, &Device::Cpu).expect("sampler");
            for _ in 0..100 {
                let l = random_logits(&mut rng, vocab, 8.0);
                let t = Tensor::from_slice(&l, (1, 1, vocab), &Device::Cpu).expect("t");
                assert_eq!(pick(&s.greedy(&t).expect("greedy")), sampling::argmax(&l));
            }
        }
        // Ties: the first maximum, as the host.
        let s = DeviceSampler::new(4, &Device::Cpu).expect("sampler");
        let l = [1.0f32, 3.0, 3.0, f32::NEG_INFINITY];
        let t = Tensor::from_slice(&l, 4, &Device::Cpu).expect("t");
        assert_eq!(pick(&s.greedy(&t).expect("greedy")), 1);
        // bf16-rounded logits tie often: still the first of the tied maxima.
        let s = DeviceSampler::new(2048, &Device::Cpu).expect("sampler");
        for _ in 0..100 {
            let l: Vec<f32> = random_logits(&mut rng, 2048, 2.0)
                .iter()
                .map(|v| (v * 4.0).round() / 4.0)
                .collect();
            let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert!(
                l.iter().filter(|&&v| v == max).count() >= 2,
                "no tie at the maximum"
            );
            let t = Tensor::from_slice(&l, 2048, &Device::Cpu).expect("t");
            assert_eq!(pick(&s.greedy(&t).expect("greedy")), sampling::argmax(&l));
        }
    }

    /// Whether `u` lies within `eps` (relative to the total) of a boundary of the host's CDF
    /// (inverse-CDF walk or top-p cut) for these logits.
    fn near_boundary(chooser: &TokenChooser, logits: &[f32], u: f64, eps: f64) -> bool {
        let mut l = logits.to_vec();
        sampling::apply_temperature(&mut l, chooser.temperature);
        sampling::apply_top_k(&mut l, chooser.top_k);
        // top-p cut: some ascending cumulative probability within eps of the cut.
        let mut sorted = l.clone();
        sorted.sort_by(|a, b| a.total_cmp(b));
        let cut = f64::from(1.0f32 - chooser.top_p);
        let mut cum = 0f64;
        for p in sampling::softmax(&sorted) {
            cum += f64::from(p);
            if chooser.top_p < 1.0 && p > 0.0 && (cum - cut).abs() < eps {
                return true;
            }
        }
        sampling::apply_top_p(&mut l, chooser.top_p);
        let probs = sampling::softmax(&l);
        let total: f64 = probs.iter().map(|&p| f64::from(p)).sum();
        let mut cum = 0f64;
        probs.iter().any(|&p| {
            cum += f64::from(p);
            p > 0.0 && (cum - u * total).abs() < eps * total
        })
    }

    #[test]
    fn sampling_equals_host_sampler_for_the_same_uniforms() {
        let mut data = ChaCha20Rng::seed_from_u64(5);
        let choosers = [
            (0.9, 50, 1.0),
            (0.9, 50, 0.8),
            (1.0, 0, 0.95),
            (0.7, 0, 1.0),
            (1.3, 3, 0.5),
            (0.9, 1, 1.0),
            (0.9, 4096, 0.3),
        ];
        let (mut total, mut differ, mut differ_away) = (0usize, 0usize, 0usize);
        for vocab in [2048usize, 100] {
            let s = DeviceSampler::new(vocab, &Device::Cpu).expect("sampler");
            for &(temperature, top_k, top_p) in &choosers {
                let chooser = TokenChooser {
                    do_sample: true,
                    temperature,
                    top_k,
                    top_p,
                };
                let mut rng = ChaCha20Rng::seed_from_u64(vocab as u64 + top_k as u64);
                for _ in 0..40 {
                    let logits = random_logits(&mut data, vocab, 6.0);
                    // The same stream position for both: the host draws one uniform per pick.
                    let mut host_rng = rng.clone();
                    let host = chooser.choose(&mut logits.clone(), &mut host_rng);
                    let params = frame_params(&chooser, vocab, 1, &mut rng);
                    assert_eq!(
                        rng.random::<u64>(),
                        host_rng.random::<u64>(),
                        "streams diverged"
                    );
                    let pt = Tensor::new(params.as_slice(), &Device::Cpu).expect("params");
                    let lt = Tensor::from_slice(&logits, (1, 1, vocab), &Device::Cpu).expect("l");
                    let dev = pick(&s.sample(&lt, &pt, 0).expect("sample"));
                    total += 1;
                    if dev != host {
                        differ += 1;
                        if !near_boundary(&chooser, &logits, params[PARAM_HEADER], 1e-5) {
                            differ_away += 1;
                            eprintln!(
                                "vocab {vocab} {chooser:?}: device {dev} host {host} away from a boundary"
                            );
                        }
                    }
                }
            }
        }
        eprintln!(
            "device vs host sampler: {differ} / {total} differ ({differ_away} away from a boundary)"
        );
        assert_eq!(total, 560);
        assert_eq!(differ_away, 0, "{differ} / {total} differ");
        assert!(differ <= 2, "{differ} / {total} differ at CDF boundaries");
    }

    #[test]
    fn top_k_one_and_tiny_top_p_pick_the_maximum() {
        let mut data = ChaCha20Rng::seed_from_u64(9);
        let s = DeviceSampler::new(300, &Device::Cpu).expect("sampler");
        for (top_k, top_p) in [(1usize, 1.0f32), (0, 1e-6)] {
            let chooser = TokenChooser {
                do_sample: true,
                temperature: 0.9,
                top_k,
                top_p,
            };
            let mut rng = ChaCha20Rng::seed_from_u64(1);
            for _ in 0..30 {
                let logits = random_logits(&mut data, 300, 4.0);
                let params = frame_params(&chooser, 300, 2, &mut rng);
                let pt = Tensor::new(params.as_slice(), &Device::Cpu).expect("params");
                let lt = Tensor::from_slice(&logits, 300, &Device::Cpu).expect("l");
                for step in 0..2 {
                    let dev = pick(&s.sample(&lt, &pt, step).expect("sample"));
                    assert_eq!(dev, sampling::argmax(&logits));
                }
            }
        }
    }
}
