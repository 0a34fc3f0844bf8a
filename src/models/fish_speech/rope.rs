//! Rotary position embedding as Fish Speech applies it: interleaved (GPT-J) pairs — dims 2i and
//! 2i+1 rotate together — with a cos/sin table **rounded to bf16** whatever the activation dtype
//! (the reference keeps `freqs_cis` in bf16 and multiplies the f32 activations by it; an f32 table
//! is reported to end generation early in the real model). Used by the slow AR, the fast AR and
//! the codec's transformers, each with its own base and head width.

use candle_core::{Device, Result, Tensor};

/// Tables `cos`, `sin`: `[positions, head_dim/2]` f32 holding bf16-representable values.
#[derive(Debug, Clone)]
pub struct RopeTable {
    cos: Tensor,
    sin: Tensor,
    positions: usize,
}

/// `(cos, sin)` of pair `i` at position `p` as the reference computes them: `inv_freq[i] =
/// 1 / base^(2i/head_dim)` and the angle `p · inv_freq[i]` in f32, rounded to bf16.
pub fn rope_values(positions: usize, head_dim: usize, base: f64) -> (Vec<f32>, Vec<f32>) {
    rope_values_from(0, positions, head_dim, base)
}

/// [`rope_values`] for positions `start..start + len`.
pub fn rope_values_from(
    start: usize,
    len: usize,
    head_dim: usize,
    base: f64,
) -> (Vec<f32>, Vec<f32>) {
    let half = head_dim / 2;
    let base = base as f32;
    let inv_freq: Vec<f32> = (0..half)
        .map(|i| 1.0f32 / base.powf((2 * i) as f32 / head_dim as f32))
        .collect();
    let round = |x: f32| half::bf16::from_f32(x).to_f32();
    let mut cos = Vec::with_capacity(len * half);
    let mut sin = Vec::with_capacity(len * half);
    for p in start..start + len {
        for &f in &inv_freq {
            let a = p as f32 * f;
            cos.push(round(a.cos()));
            sin.push(round(a.sin()));
        }
    }
    (cos, sin)
}

impl RopeTable {
    /// The table for positions `0..positions`.
    pub fn new(positions: usize, head_dim: usize, base: f64, device: &Device) -> Result<Self> {
        let (cos, sin) = rope_values(positions, head_dim, base);
        let half = head_dim / 2;
        Ok(Self {
            cos: Tensor::from_vec(cos, (positions, half), device)?,
            sin: Tensor::from_vec(sin, (positions, half), device)?,
            positions,
        })
    }

    /// Positions covered.
    pub fn positions(&self) -> usize {
        self.positions
    }

    /// `(cos, sin)` `[len, head_dim/2]` for positions `start..start+len`.
    pub fn slice(&self, start: usize, len: usize) -> Result<(Tensor, Tensor)> {
        if start + len > self.positions {
            candle_core::bail!(
                "RoPE: positions {start}..{} past the table's {}",
                start + len,
                self.positions
            )
        }
        Ok((
            self.cos.narrow(0, start, len)?,
            self.sin.narrow(0, start, len)?,
        ))
    }

    /// Rotates `x` `[batch, heads, t, head_dim]` at positions `start..start+t` with tables
    /// computed for those positions only (for unbounded positions: the codec's streams).
    pub fn apply_at(x: &Tensor, start: usize, base: f64) -> Result<Tensor> {
        let (_, _, t, hd) = x.dims4()?;
        let (cos, sin) = Self::values_at(start, t, hd, base, x.device(), x.dtype())?;
        candle_nn::rotary_emb::rope_i(&x.contiguous()?, &cos, &sin)
    }

    /// `(cos, sin)` `[t, head_dim/2]` in `dtype` on `device` for positions `start..start+t`,
    /// computed for those positions only: what [`Self::apply_at`] rotates with.
    pub fn values_at(
        start: usize,
        t: usize,
        head_dim: usize,
        base: f64,
        device: &candle_core::Device,
        dtype: candle_core::DType,
    ) -> Result<(Tensor, Tensor)> {
        let (cos, sin) = rope_values_from(start, t, head_dim, base);
        Ok((
            Tensor::from_vec(cos, (t, head_dim / 2), device)?.to_dtype(dtype)?,
            Tensor::from_vec(sin, (t, head_dim / 2), device)?.to_dtype(dtype)?,
        ))
    }

    /// Rotates `x` `[batch, heads, t, head_dim]` (f32) at positions `start..start+t`.
    pub fn apply(&self, x: &Tensor, start: usize) -> Result<Tensor> {
        let t = x.dim(2)?;
        let (cos, sin) = self.slice(start, t)?;
        let dtype = x.dtype();
        let (cos, sin) = (cos.to_dtype(dtype)?, sin.to_dtype(dtype)?);
        candle_nn::rotary_emb::rope_i(&x.contiguous()?, &cos, &sin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_bf16_and_pairs_interleave() {
        let dev = Device::Cpu;
        let rope = RopeTable::new(16, 4, 10_000.0, &dev).unwrap();
        let (cos, sin) = rope.slice(0, 16).unwrap();
        for v in cos.flatten_all().unwrap().to_vec1::<f32>().unwrap() {
            assert_eq!(half::bf16::from_f32(v).to_f32(), v);
        }
        let s: Vec<Vec<f32>> = sin.to_vec2().unwrap();
        assert_eq!(s[0], [0.0, 0.0]);
        // position 3: pair 0 turns by 3 rad
        let x = Tensor::new(&[[[[1f32, 0.0, 0.0, 0.0]]]], &dev).unwrap();
        let y: Vec<f32> = rope
            .apply(&x, 3)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let (c, sn) = (
            half::bf16::from_f32(3f32.cos()).to_f32(),
            half::bf16::from_f32(3f32.sin()).to_f32(),
        );
        assert_eq!(y, [c, sn, 0.0, 0.0], "dims 0 and 1 rotate together");
    }
}
