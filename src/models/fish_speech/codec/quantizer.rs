//! The downsampled residual VQ (the reference's `DownsampleResidualVectorQuantize`): one
//! semantic codebook (4096 entries) and nine residual codebooks (1024 each), all of dimension 8,
//! at a quarter of the encoder's frame rate (two stride-2 stages), with a windowed transformer
//! on each side.
//!
//! Decode: codes are clamped to each codebook's last entry (semantic ≤ 4095, residual ≤ 1023 —
//! the fast AR may emit residual codes up to 4095), looked up, projected by each codebook's
//! `out_proj` (1×1 conv, weight-normed) and summed (semantic + Σ residual), then `post_module`,
//! then the up stages (a stride-2 transposed conv and a ConvNeXt block each).
//!
//! Encode: the down stages (a stride-2 causal conv and a ConvNeXt block each), `pre_module`, then
//! each codebook in turn picks the entry nearest in cosine (L2-normalised `in_proj` output vs the
//! L2-normalised codebook) and its `out_proj` output is subtracted from the residual.

use candle_core::{D, DType, Module, Tensor};

use super::config::CodecConfig;
use super::layers::{ConvNeXt, StridedCausalConv};
use super::transformer::{WindowCache, WindowTransformer};
use super::weights::CodecWeights;
use crate::models::fish_speech::error::{FishError, Result};
use crate::nn::Linear;
use crate::nn::conv::{
    CausalConvState, ConvTransposeState, StreamingCausalConvTranspose1d, per_row_on_cpu,
};

/// One codebook with its projections.
#[derive(Debug, Clone)]
pub struct Codebook {
    /// `[entries, codebook_dim]`.
    codebook: Tensor,
    /// `[codebook_dim, latent]` as a linear layer (the 1×1 conv).
    in_proj: Linear,
    /// `[latent, codebook_dim]`.
    out_proj: Linear,
    entries: usize,
}

impl Codebook {
    fn new(
        w: &CodecWeights,
        prefix: &str,
        entries: usize,
        dim: usize,
        latent: usize,
    ) -> Result<Self> {
        let proj = |name: &str, i: usize, o: usize| -> Result<Linear> {
            let p = format!("{prefix}.{name}");
            let weight = w.weight(&p, &[o, i, 1])?.squeeze(2)?;
            Ok(Linear::new(weight, Some(w.bias(&p, o)?)))
        };
        Ok(Self {
            codebook: w.get(&format!("{prefix}.codebook.weight"), &[entries, dim])?,
            in_proj: proj("in_proj", latent, dim)?,
            out_proj: proj("out_proj", dim, latent)?,
            entries,
        })
    }

    /// `codes` `[b, t]` (u32, already clamped) → `[b, t, latent]` (the projection row by row
    /// on the CPU, so a row rounds as its stream alone).
    fn decode(&self, codes: &Tensor) -> Result<Tensor> {
        let (b, t) = codes.dims2()?;
        let e = self
            .codebook
            .index_select(&codes.flatten_all()?, 0)?
            .reshape((b, t, ()))?;
        Ok(per_row_on_cpu(&e, |r| self.out_proj.forward(r))?)
    }

    /// Nearest entries of `z` `[b, t, latent]`: `(codes [b, t], out_proj(entries) [b, t, latent])`.
    fn encode(&self, z: &Tensor) -> Result<(Tensor, Tensor)> {
        let (b, t, _) = z.dims3()?;
        let ze = self.in_proj.forward(z)?.reshape((b * t, ()))?;
        let normalize = |x: &Tensor| -> Result<Tensor> {
            let n = x.sqr()?.sum_keepdim(1)?.sqrt()?.maximum(1e-12)?;
            Ok(x.broadcast_div(&n)?)
        };
        let (e, c) = (normalize(&ze)?, normalize(&self.codebook)?);
        let dist = e
            .sqr()?
            .sum_keepdim(1)?
            .broadcast_sub(&(e.matmul(&c.t()?)? * 2.0)?)?
            .broadcast_add(&c.sqr()?.sum_keepdim(1)?.t()?)?;
        let codes = dist.neg()?.argmax(D::Minus1)?.reshape((b, t))?;
        let zq = self.decode(&codes)?;
        Ok((codes, zq))
    }
}

/// Streaming state of [`Quantizer::decode`].
#[derive(Debug, Clone, Default)]
pub struct QuantizerState {
    post: WindowCache,
    up: Vec<(ConvTransposeState, CausalConvState)>,
}

impl QuantizerState {
    /// Past frames the post transformer's next chunk attends to ([`WindowCache::fill`]):
    /// streams with equal fill and chunk length share a [`Quantizer::decode_rows`] pass.
    pub fn fill(&self, q: &Quantizer) -> usize {
        self.post.fill(q.post.window())
    }
}

/// The quantizer's weights.
#[derive(Debug, Clone)]
pub struct Quantizer {
    semantic: Codebook,
    residual: Vec<Codebook>,
    down: Vec<(StridedCausalConv, ConvNeXt)>,
    up: Vec<(StreamingCausalConvTranspose1d, ConvNeXt)>,
    pre: WindowTransformer,
    post: WindowTransformer,
}

impl Quantizer {
    pub fn new(w: &CodecWeights, cfg: &CodecConfig) -> Result<Self> {
        let q = &cfg.quantizer;
        let latent = q.input_dim;
        if latent != cfg.latent_dim() {
            return Err(FishError::Checkpoint {
                file: "codec_config.yaml".into(),
                msg: format!("quantizer input_dim {latent} ≠ latent {}", cfg.latent_dim()),
            });
        }
        let semantic = Codebook::new(
            w,
            "quantizer.semantic_quantizer.quantizers.0",
            q.semantic_codebook_size,
            q.codebook_dim,
            latent,
        )?;
        let residual = (0..q.n_codebooks)
            .map(|i| {
                Codebook::new(
                    w,
                    &format!("quantizer.quantizer.quantizers.{i}"),
                    q.codebook_size,
                    q.codebook_dim,
                    latent,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let mut down = Vec::new();
        for (i, &f) in q.downsample_factor.iter().enumerate() {
            let p = format!("quantizer.downsample.{i}");
            down.push((
                StridedCausalConv::new(w, &format!("{p}.0"), latent, latent, f, f)?,
                ConvNeXt::new(w, &format!("{p}.1"), latent)?,
            ));
        }
        // upsample.0 undoes the last downsample stage
        let mut up = Vec::new();
        for (i, &f) in q.downsample_factor.iter().rev().enumerate() {
            let p = format!("quantizer.upsample.{i}");
            let conv = format!("{p}.0.conv");
            up.push((
                StreamingCausalConvTranspose1d::new(
                    w.weight(&conv, &[latent, latent, f])?,
                    Some(w.bias(&conv, latent)?),
                    f,
                )?,
                ConvNeXt::new(w, &format!("{p}.1"), latent)?,
            ));
        }
        let module = |name: &str, m: &super::config::WindowModule| {
            WindowTransformer::new(
                w,
                &format!("quantizer.{name}"),
                &m.config,
                m.input_dim,
                m.window_size,
            )
        };
        Ok(Self {
            semantic,
            residual,
            down,
            up,
            pre: module("pre_module", &q.pre_module)?,
            post: module("post_module", &q.post_module)?,
        })
    }

    /// Codes `[b, 1 + residual, t]` (u32) → latent `[b, latent, t · downsampling]`, continuing
    /// `state`'s stream.
    pub fn decode(&self, codes: &Tensor, state: &mut QuantizerState) -> Result<Tensor> {
        self.decode_rows(codes, &mut [state])
    }

    /// Codes `[rows, 1 + residual, t]` (u32) → latent `[rows, latent, t · downsampling]`, row `r`
    /// continuing `states[r]`'s stream. The states must have the same [`QuantizerState::fill`];
    /// each row computes what its stream computes alone (on the CPU to the bit). Errors: a wrong
    /// codebook count or state count, different fills; after a failed pass the states are
    /// undefined.
    pub fn decode_rows(
        &self,
        codes: &Tensor,
        states: &mut [&mut QuantizerState],
    ) -> Result<Tensor> {
        let (b, n, _) = codes.dims3()?;
        if states.len() != b {
            return Err(FishError::Candle(candle_core::Error::Msg(format!(
                "codec quantizer: {b} rows of codes for {} states",
                states.len()
            ))));
        }
        if n != 1 + self.residual.len() {
            return Err(FishError::InvalidRequest {
                field: "codes",
                msg: format!("{n} codebooks, the codec has {}", 1 + self.residual.len()),
            });
        }
        let clamp =
            |c: Tensor, entries: usize| -> Result<Tensor> { Ok(c.minimum(entries as u32 - 1)?) };
        let codes = codes.to_dtype(DType::U32)?;
        let sem = self.semantic.decode(&clamp(
            codes.narrow(1, 0, 1)?.squeeze(1)?,
            self.semantic.entries,
        )?)?;
        let mut res: Option<Tensor> = None;
        for (i, cb) in self.residual.iter().enumerate() {
            let c = clamp(codes.narrow(1, i + 1, 1)?.squeeze(1)?, cb.entries)?;
            let z = cb.decode(&c)?;
            res = Some(match res {
                Some(r) => (r + z)?,
                None => z,
            });
        }
        let z = match res {
            Some(r) => (sem + r)?,
            None => sem,
        };
        let mut posts: Vec<&mut WindowCache> = states.iter_mut().map(|s| &mut s.post).collect();
        let mut z = self.post.forward_rows(&z.transpose(1, 2)?, &mut posts)?;
        for s in states.iter_mut() {
            if s.up.len() != self.up.len() {
                s.up = vec![Default::default(); self.up.len()];
            }
        }
        for (i, (conv, block)) in self.up.iter().enumerate() {
            let (mut cs, mut bs) = if b == 1 {
                std::mem::take(&mut states[0].up[i])
            } else {
                let convs: Vec<&ConvTransposeState> = states.iter().map(|s| &s.up[i].0).collect();
                let blocks: Vec<&CausalConvState> = states.iter().map(|s| &s.up[i].1).collect();
                (
                    ConvTransposeState::stack(&convs)?,
                    CausalConvState::stack(&blocks)?,
                )
            };
            z = block.forward(&conv.forward(&z, &mut cs)?, &mut bs)?;
            if b == 1 {
                states[0].up[i] = (cs, bs);
            } else {
                for ((s, c), k) in states.iter_mut().zip(cs.split(b)?).zip(bs.split(b)?) {
                    s.up[i] = (c, k);
                }
            }
        }
        Ok(z)
    }

    /// Latent `[b, latent, t]` of a whole signal → codes `[b, 1 + residual, t / downsampling]`.
    pub fn encode(&self, z: &Tensor) -> Result<Tensor> {
        let mut z = z.clone();
        for (conv, block) in &self.down {
            z = block.forward(&conv.forward(&z)?, &mut CausalConvState::default())?;
        }
        let z = self
            .pre
            .forward(&z, &mut WindowCache::default())?
            .transpose(1, 2)?; // [b, t, d]
        let (sem_codes, sem_z) = self.semantic.encode(&z)?;
        let mut residual = (z - sem_z)?;
        let mut codes = vec![sem_codes];
        for cb in &self.residual {
            let (c, zq) = cb.encode(&residual)?;
            residual = (residual - zq)?;
            codes.push(c);
        }
        Ok(Tensor::stack(&codes, 1)?)
    }
}
