//! 1-D rotary position embedding, NeoX/half-split pairing (dims i and i + head_dim/2), as the
//! reference `Qwen3TTSRotaryEmbedding` / `Qwen3TTSTalkerRotaryEmbedding` compute it with identical
//! temporal/height/width position streams (the talker's interleaved "MRoPE" then reduces to this;
//! see docs/qwen3-tts.md §3.2). Tables are computed in f32 and cast to the activation dtype at use.
//!
//! The tables live on the device and are computed once for a range of positions that doubles when
//! a later position is asked for, so a decode step uploads nothing (no host-to-device copy per
//! step, as a CUDA graph needs).

use std::sync::{Arc, Mutex};

use candle_core::{DType, Device, Result, Tensor};

/// `(positions covered, cos, sin)`, each table `[positions, head_dim/2]` f32 on the device.
type Tables = (usize, Tensor, Tensor);

/// RoPE with `inv_freq[i] = 1 / theta^(2i/head_dim)`, i < head_dim/2.
#[derive(Debug, Clone)]
pub struct RotaryEmbedding {
    inv_freq: Vec<f32>,
    /// Each cos/sin value rounded to bf16 ([`Self::with_bf16_table`]).
    bf16_table: bool,
    device: Device,
    tables: Arc<Mutex<Option<Tables>>>,
}

/// Positions covered by the first table (grown by doubling).
const INITIAL_POSITIONS: usize = 256;

impl RotaryEmbedding {
    pub fn new(head_dim: usize, theta: f64, device: &Device) -> Self {
        let theta = theta as f32;
        let inv_freq = (0..head_dim / 2)
            .map(|i| {
                let exponent = (2 * i) as f32 / head_dim as f32;
                1.0f32 / theta.powf(exponent)
            })
            .collect();
        Self {
            inv_freq,
            bf16_table: false,
            device: device.clone(),
            tables: Arc::new(Mutex::new(None)),
        }
    }

    /// [`Self::new`] with every cos/sin value rounded to bf16 (still stored as f32), for
    /// models whose reference keeps its table in bf16 whatever the activation dtype (Fish
    /// Speech).
    pub fn with_bf16_table(head_dim: usize, theta: f64, device: &Device) -> Self {
        Self {
            bf16_table: true,
            ..Self::new(head_dim, theta, device)
        }
    }

    /// f32 tables `(cos, sin)`, each `[len, head_dim/2]`, for positions `start..start+len`
    /// (views of the cached device tables).
    pub fn cos_sin(&self, start: usize, len: usize) -> Result<(Tensor, Tensor)> {
        let end = start + len;
        let mut guard = self
            .tables
            .lock()
            .map_err(|_| candle_core::Error::Msg("RoPE table lock poisoned".into()))?;
        let covered = guard.as_ref().map_or(0, |t| t.0);
        if end > covered {
            let mut n = covered.max(INITIAL_POSITIONS);
            while n < end {
                n *= 2;
            }
            let (cos, sin) = self.compute(0, n)?;
            *guard = Some((n, cos, sin));
        }
        let (_, cos, sin) = guard
            .as_ref()
            .ok_or_else(|| candle_core::Error::Msg("RoPE tables missing".into()))?;
        Ok((cos.narrow(0, start, len)?, sin.narrow(0, start, len)?))
    }

    /// Computes the tables for positions `start..start+len` on the host (f32) and uploads them.
    fn compute(&self, start: usize, len: usize) -> Result<(Tensor, Tensor)> {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(len * half);
        let mut sin = Vec::with_capacity(len * half);
        let round = |x: f32| match self.bf16_table {
            true => half::bf16::from_f32(x).to_f32(),
            false => x,
        };
        for p in start..start + len {
            let p = p as f32;
            for &f in &self.inv_freq {
                let a = f * p;
                cos.push(round(a.cos()));
                sin.push(round(a.sin()));
            }
        }
        Ok((
            Tensor::from_vec(cos, (len, half), &self.device)?,
            Tensor::from_vec(sin, (len, half), &self.device)?,
        ))
    }

    /// Applies the rotation to `x`: `[batch, heads, seq, head_dim]` (any float dtype), with tables
    /// from [`Self::cos_sin`] for the same `seq` positions.
    pub fn apply(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let dtype = x.dtype();
        let (cos, sin) = if dtype == DType::F32 {
            (cos.clone(), sin.clone())
        } else {
            (cos.to_dtype(dtype)?, sin.to_dtype(dtype)?)
        };
        candle_nn::rotary_emb::rope(&x.contiguous()?, &cos, &sin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD_DIM: usize = 8;
    const THETA: f64 = 10_000.0;

    /// The angle of pair `i` at position `p`, as the reference computes it: `inv_freq` and the
    /// product in f32.
    fn angle(p: usize, i: usize) -> f64 {
        let inv_freq = 1.0f32 / (THETA as f32).powf((2 * i) as f32 / HEAD_DIM as f32);
        (inv_freq * p as f32) as f64
    }

    fn table(t: &Tensor) -> Vec<Vec<f32>> {
        t.to_vec2().unwrap()
    }

    #[test]
    fn tables_follow_the_formula_across_growth() {
        let rope = RotaryEmbedding::new(HEAD_DIM, THETA, &Device::Cpu);
        // 0..40 first, then 1000..1010 (past the first 256 positions: the tables grow), then
        // 30..40 again from the grown tables.
        for (start, len) in [(0, 40), (1000, 10), (30, 10)] {
            let (cos, sin) = rope.cos_sin(start, len).unwrap();
            assert_eq!(cos.dims(), &[len, HEAD_DIM / 2]);
            assert_eq!(cos.dtype(), DType::F32);
            let (cos, sin) = (table(&cos), table(&sin));
            for r in 0..len {
                for i in 0..HEAD_DIM / 2 {
                    let a = angle(start + r, i);
                    let (c, s) = (cos[r][i] as f64, sin[r][i] as f64);
                    assert!(
                        (c - a.cos()).abs() < 1e-6 && (s - a.sin()).abs() < 1e-6,
                        "position {}, pair {i}: ({c}, {s}) vs ({}, {})",
                        start + r,
                        a.cos(),
                        a.sin()
                    );
                }
            }
        }
        // Pair 0 turns by one radian per position; the last pair by theta^(-(d-2)/d).
        let (cos, _) = rope.cos_sin(1, 1).unwrap();
        let cos = table(&cos);
        assert!((cos[0][0] as f64 - 1f64.cos()).abs() < 1e-7);
        let slowest = THETA.powf(-((HEAD_DIM - 2) as f64) / HEAD_DIM as f64);
        assert!((cos[0][HEAD_DIM / 2 - 1] as f64 - slowest.cos()).abs() < 1e-7);
    }

    #[test]
    fn a_bf16_table_holds_the_rounded_values() {
        let exact = RotaryEmbedding::new(HEAD_DIM, THETA, &Device::Cpu);
        let rounded = RotaryEmbedding::with_bf16_table(HEAD_DIM, THETA, &Device::Cpu);
        let (c, s) = exact.cos_sin(0, 300).unwrap();
        let (rc, rs) = rounded.cos_sin(0, 300).unwrap();
        let mut differs = false;
        for (e, r) in [(c, rc), (s, rs)] {
            let (e, r) = (table(&e), table(&r));
            for (er, rr) in e.iter().zip(&r) {
                for (&x, &y) in er.iter().zip(rr) {
                    assert_eq!(y, half::bf16::from_f32(x).to_f32());
                    differs |= x != y;
                }
            }
        }
        assert!(differs, "rounding changes some values");
    }

    #[test]
    fn apply_rotates_half_split_pairs() {
        let dev = Device::Cpu;
        let rope = RotaryEmbedding::new(HEAD_DIM, THETA, &dev);
        let (b, h, t) = (2, 3, 5);
        let start = 7;
        let data: Vec<f32> = (0..b * h * t * HEAD_DIM)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
            .collect();
        let x = Tensor::from_vec(data.clone(), (b, h, t, HEAD_DIM), &dev).unwrap();
        let (cos, sin) = rope.cos_sin(start, t).unwrap();
        for dtype in [DType::F32, DType::F64] {
            let y = RotaryEmbedding::apply(&x.to_dtype(dtype).unwrap(), &cos, &sin).unwrap();
            assert_eq!(y.dtype(), dtype);
            let y: Vec<f64> = y
                .to_dtype(DType::F64)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let half = HEAD_DIM / 2;
            for row in 0..b * h * t {
                let p = start + row % t;
                let base = row * HEAD_DIM;
                for i in 0..half {
                    // NeoX pairing: dims i and i + head_dim/2 rotate together.
                    let (x1, x2) = (data[base + i] as f64, data[base + i + half] as f64);
                    let a = angle(p, i);
                    let want1 = x1 * a.cos() - x2 * a.sin();
                    let want2 = x1 * a.sin() + x2 * a.cos();
                    let (got1, got2) = (y[base + i], y[base + i + half]);
                    assert!(
                        (got1 - want1).abs() < 1e-5 && (got2 - want2).abs() < 1e-5,
                        "{dtype:?} row {row}, pair {i}: ({got1}, {got2}) vs ({want1}, {want2})"
                    );
                }
            }
        }
    }

    /// The property attention relies on: the dot product of a query rotated to position `p` and a
    /// key rotated to position `p - k` depends on `k` only.
    #[test]
    fn scores_depend_on_relative_position_only() {
        let dev = Device::Cpu;
        let rope = RotaryEmbedding::new(HEAD_DIM, THETA, &dev);
        let q = Tensor::new(&[[[[0.3f32, -1.2, 0.8, 0.1, 0.5, 0.9, -0.4, 1.1]]]], &dev).unwrap();
        let k = Tensor::new(&[[[[1.0f32, 0.2, -0.7, 0.4, -0.3, 0.6, 0.8, -1.0]]]], &dev).unwrap();
        let at = |x: &Tensor, p: usize| {
            let (cos, sin) = rope.cos_sin(p, 1).unwrap();
            RotaryEmbedding::apply(x, &cos, &sin).unwrap()
        };
        let score = |pq: usize, pk: usize| -> f32 {
            (at(&q, pq) * at(&k, pk))
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar()
                .unwrap()
        };
        for k_rel in [0, 1, 5, 30] {
            let base = score(k_rel, 0);
            for p in [10, 57, 200] {
                let s = score(p + k_rel, p);
                assert!(
                    (s - base).abs() < 1e-4,
                    "offset {k_rel} at {p}: {s} vs {base}"
                );
            }
        }
        assert!(
            (score(5, 0) - score(0, 0)).abs() > 1e-3,
            "rotation changes the score"
        );
    }
}
