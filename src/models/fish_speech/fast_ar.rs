//! The fast AR: a small transformer over the 10 positions of one frame (`audio_decoder.*` in the
//! checkpoint: `embeddings` (one table shared by every codebook), `layers.N`, `norm`, `output`,
//! and `project_in` when its width differs from the slow model's).
//!
//! Position 0 takes the slow AR's final-normed hidden state (its output is not used); position
//! k ≥ 1 takes the embedding of code k−1 and predicts code k over all `codebook_size` (4096)
//! entries — residual logits are not restricted to the codec's 1024 (the codec clamps). Nine
//! sequential steps give codes 1..=9. Each row of a batch is independent (same positions).

use candle_core::{DType, Module, Tensor};

use super::config::FishConfig;
use super::error::{FishError, Result};
use super::layers::{load_stack, rope};
use crate::nn::{DecoderLayer, LayerCaches, Linear, RmsNorm, RotaryEmbedding, Weights};

/// The fast AR's weights.
#[derive(Debug, Clone)]
pub struct FastAr {
    project_in: Option<Linear>,
    /// `[codebook_size, fast_dim]`.
    embeddings: Tensor,
    /// `audio_decoder.layers.N` ([`super::layers`]).
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    /// `[codebook_size, fast_dim]`.
    output: Linear,
    rope: RotaryEmbedding,
    num_codebooks: usize,
    dim: usize,
    /// Width of the slow AR's hidden state (`project_in`'s input).
    input_dim: usize,
    codebook_size: usize,
}

impl FastAr {
    pub fn new(cfg: &FishConfig, vb: &Weights) -> Result<Self> {
        let d = cfg.fast();
        let slow_dim = cfg.slow().dim;
        let a = vb.pp("audio_decoder");
        let cbs = cfg.codebook_size();
        let project_in = if d.dim != slow_dim {
            Some(a.linear(slow_dim, d.dim, true, "project_in")?)
        } else {
            None
        };
        Ok(Self {
            project_in,
            embeddings: a.get(&[cbs, d.dim], "embeddings.weight")?,
            layers: load_stack(&d, &a)?,
            norm: RmsNorm::new(d.dim, d.norm_eps, &a.pp("norm"))?,
            output: a.linear(d.dim, cbs, false, "output")?,
            rope: rope(&d, vb.device()),
            num_codebooks: cfg.num_codebooks(),
            dim: d.dim,
            input_dim: slow_dim,
            codebook_size: cbs,
        })
    }

    /// Codes 1..num_codebooks of one frame for each row: `hidden` `[b, slow_dim]` (the slow
    /// AR's final-normed state), `code0` the rows' codebook-0 codes; `choose(step, logits)`
    /// picks the code of step k (1-based) from each row's f32 logits `[b, codebook_size]`.
    /// `logits_out`, when given, receives each step's logits.
    pub fn frame(
        &self,
        hidden: &Tensor,
        code0: &[u32],
        mut choose: impl FnMut(usize, &Tensor) -> Result<Vec<u32>>,
        mut logits_out: Option<&mut Vec<Tensor>>,
    ) -> Result<Vec<Vec<u32>>> {
        let b = hidden.dim(0)?;
        if code0.len() != b {
            return Err(FishError::InvalidRequest {
                field: "code0",
                msg: format!("{} codes for {b} rows", code0.len()),
            });
        }
        let mut cache = self.new_cache();
        self.first_position(hidden, &mut cache)?;
        let mut prev = code0.to_vec();
        let mut out: Vec<Vec<u32>> = vec![Vec::with_capacity(self.num_codebooks - 1); b];
        for step in 1..self.num_codebooks {
            let ids = Tensor::new(prev.as_slice(), hidden.device())?;
            let logits = self.code_logits(&ids, &mut cache)?;
            if let Some(l) = logits_out.as_deref_mut() {
                l.push(logits.clone());
            }
            prev = choose(step, &logits)?;
            for (row, &c) in out.iter_mut().zip(&prev) {
                row.push(c);
            }
        }
        Ok(out)
    }

    /// Codes a frame has (1 + the nine the fast AR makes).
    pub fn num_codebooks(&self) -> usize {
        self.num_codebooks
    }

    /// Width of the slow AR's hidden state the frame starts from.
    pub fn input_dim(&self) -> usize {
        self.input_dim
    }

    /// Entries of a codebook, the width of each step's logits.
    pub fn codebook_size(&self) -> usize {
        self.codebook_size
    }

    /// The dtype of the weights (the rows' activations).
    pub fn dtype(&self) -> DType {
        self.embeddings.dtype()
    }

    /// The RoPE tables `(cos, sin)` of a frame's positions (views of the model's table: holding
    /// them keeps that table's memory alive, which captured graphs read).
    pub fn frame_rope(&self) -> candle_core::Result<(Tensor, Tensor)> {
        self.rope.cos_sin(0, self.num_codebooks)
    }

    /// An empty KV cache for one frame's positions.
    pub fn new_cache(&self) -> LayerCaches {
        LayerCaches::new(self.layers.len(), self.num_codebooks)
    }

    /// The slow AR's hidden states `hidden` `[b, input_dim]` as the fast AR takes them
    /// `[b, dim]`: through `project_in` when the widths differ, else unchanged.
    pub fn project(&self, hidden: &Tensor) -> Result<Tensor> {
        Ok(match &self.project_in {
            Some(p) => p.forward(hidden)?,
            None => hidden.clone(),
        })
    }

    /// Position 0 of a frame: the rows' slow-AR hidden states `hidden` `[b, input_dim]` into
    /// `cache` (empty); the output is not used.
    pub fn first_position(&self, hidden: &Tensor, cache: &mut LayerCaches) -> Result<()> {
        let b = hidden.dim(0)?;
        let h = self.project(hidden)?;
        cache.run(&self.layers, &self.rope, &h.reshape((b, 1, self.dim))?)?;
        Ok(())
    }

    /// The next position of a frame: the rows' previous codes `ids` `[b]` (u32) → the next
    /// code's f32 logits `[b, codebook_size]`, `cache` advanced by one position.
    pub fn code_logits(&self, ids: &Tensor, cache: &mut LayerCaches) -> Result<Tensor> {
        let b = ids.dim(0)?;
        let x = self
            .embeddings
            .index_select(ids, 0)?
            .reshape((b, 1, self.dim))?;
        let y = cache.run(&self.layers, &self.rope, &x)?;
        Ok(self
            .output
            .forward(&self.norm.forward(&y)?)?
            .squeeze(1)?
            .to_dtype(DType::F32)?)
    }
}
