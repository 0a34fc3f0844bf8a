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
            device: device.clone(),
            tables: Arc::new(Mutex::new(None)),
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
        for p in start..start + len {
            let p = p as f32;
            for &f in &self.inv_freq {
                let a = f * p;
                cos.push(a.cos());
                sin.push(a.sin());
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
