//! The talker's decode step with its position on the device, replayed from CUDA graphs.
//!
//! An eager decode step bakes the KV length and the write offset into its kernels, so it cannot
//! be replayed. Here the position `p` lives in a device tensor: the new key/value are scattered
//! into slot `p` of preallocated KV buffers, RoPE rows are picked with `index_select`, and attention
//! runs over a fixed bucket of slots (64, 128, … up to the capacity) with an additive mask computed
//! on the device from `p`. So the work of a step is the same for every `p` below a bucket, and one
//! graph per bucket, captured at start-up (docs/field-lessons.md §5), serves every position. Masked
//! slots
//! get probability exactly 0, so the result equals the eager step up to the summation order of
//! the longer softmax and value product (tested: same greedy codes as eager on the fixtures).
//!
//! The graphs hold the device addresses of their KV buffers, so [`TalkerGraphs`] owns one KV cache
//! ([`LayerCaches`]) and serves one utterance at a time: a session takes it, prefills into it
//! eagerly, steps it, and gives it back (a lease: [`super::TalkerLease`]). Without the `cuda` feature, or
//! before capture, [`TalkerGraphs::step`] runs the same work directly (how the CPU tests check it).

use candle_core::{DType, Module, Result, Tensor};

use crate::models::qwen3_tts::talker::Talker;
use crate::nn::LayerCaches;
use crate::nn::readback;

/// Smallest attention bucket (slots); buckets double up to the capacity.
const MIN_BUCKET: usize = 64;

/// Static buffers, the owned KV cache and (with `cuda`) one graph per bucket for the talker's
/// decode step. Shapes: `input`/`hidden` `[1, 1, hidden]` (model dtype), `pos` u32 `[1]`,
/// `logits` f32 `[1, 1, vocab_size]`, RoPE tables f32 `[capacity, head_dim/2]`.
pub struct TalkerGraphs {
    cache: LayerCaches,
    capacity: usize,
    /// Attention lengths in slots, ascending; the last is `capacity`.
    buckets: Vec<usize>,
    input: Tensor,
    pos: Tensor,
    hidden: Tensor,
    logits: Tensor,
    cos: Tensor,
    sin: Tensor,
    /// f32 `0, 1, …, capacity-1`, and f32 zeros / −inf of the same length (mask operands).
    arange: Tensor,
    zeros: Tensor,
    neg_inf: Tensor,
    dtype: DType,
    #[cfg(feature = "cuda")]
    graphs: Vec<crate::nn::cuda_graph::Graph>,
}

impl std::fmt::Debug for TalkerGraphs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TalkerGraphs")
            .field("capacity", &self.capacity)
            .field("buckets", &self.buckets)
            .finish()
    }
}

/// `MIN_BUCKET, 2·MIN_BUCKET, …` below `capacity`, then `capacity`.
fn buckets_for(capacity: usize) -> Vec<usize> {
    let mut b = Vec::new();
    let mut n = MIN_BUCKET;
    while n < capacity {
        b.push(n);
        n *= 2;
    }
    b.push(capacity);
    b
}

impl TalkerGraphs {
    /// Allocates the static buffers and a KV cache of `capacity` positions (prompt + frames) in
    /// `dtype` on the talker's device, by running one eager step. Nothing is captured yet.
    pub fn new(talker: &Talker, dtype: DType, capacity: usize) -> Result<TalkerGraphs> {
        let cfg = talker.config();
        let t = &cfg.transformer;
        if t.sliding_window.is_some() {
            candle_core::bail!("the talker decode graph does not support a sliding window");
        }
        let capacity = capacity.max(MIN_BUCKET);
        let dev = talker.device().clone();
        let d = t.hidden_size;
        let mut cache = talker.new_cache(capacity);
        // One eager position allocates every layer's buffers with `capacity` slots.
        talker.forward(&Tensor::zeros((1, 1, d), dtype, &dev)?, &mut cache)?;
        cache.reset();
        if cache.capacity() != capacity {
            candle_core::bail!(
                "talker KV cache allocated {} slots, {capacity} wanted",
                cache.capacity()
            );
        }
        let (cos, sin) = talker.rope().cos_sin(0, capacity)?;
        let arange = Tensor::arange(0u32, capacity as u32, &dev)?.to_dtype(DType::F32)?;
        Ok(TalkerGraphs {
            cache,
            capacity,
            buckets: buckets_for(capacity),
            input: Tensor::zeros((1, 1, d), dtype, &dev)?,
            pos: Tensor::zeros(1, DType::U32, &dev)?,
            hidden: Tensor::zeros((1, 1, d), dtype, &dev)?,
            logits: Tensor::zeros((1, 1, cfg.vocab_size), DType::F32, &dev)?,
            cos: cos.contiguous()?,
            sin: sin.contiguous()?,
            zeros: Tensor::zeros(capacity, DType::F32, &dev)?,
            neg_inf: Tensor::full(f32::NEG_INFINITY, capacity, &dev)?,
            arange,
            dtype,
            #[cfg(feature = "cuda")]
            graphs: Vec::new(),
        })
    }

    /// Positions the owned KV cache holds (prompt + frames of one utterance).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Whether the graphs are captured (otherwise [`Self::step`] runs the work directly).
    pub fn is_captured(&self) -> bool {
        #[cfg(feature = "cuda")]
        {
            !self.graphs.is_empty()
        }
        #[cfg(not(feature = "cuda"))]
        {
            false
        }
    }

    /// Captures one CUDA graph per bucket, after one eager run of each under the parameter upload
    /// cache. Errors: not a CUDA device, a build without `cuda`, a failed capture.
    pub fn capture(&mut self, talker: &Talker) -> Result<()> {
        #[cfg(feature = "cuda")]
        {
            use crate::nn::cuda_graph::{Graph, htod_cache};
            let dev = talker.device().clone();
            if !dev.is_cuda() {
                candle_core::bail!("CUDA graphs need a CUDA device, the talker is on {dev:?}");
            }
            let _htod = htod_cache(&dev)?;
            for &b in &self.buckets {
                self.run(talker, b)?;
            }
            dev.synchronize()?;
            let mut graphs = Vec::with_capacity(self.buckets.len());
            for &b in &self.buckets {
                graphs.push(Graph::capture(&dev, || self.run(talker, b))?);
            }
            dev.synchronize()?;
            self.cache.reset();
            self.graphs = graphs;
            Ok(())
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = talker;
            candle_core::bail!("CUDA graphs need a build with the `cuda` feature")
        }
    }

    /// Starts an utterance: clears the owned cache (its prefill then runs eagerly into
    /// [`Self::cache_mut`]).
    pub fn reset(&mut self) {
        self.cache.reset();
    }

    /// The owned cache (positions so far of the utterance it serves).
    pub fn cache(&self) -> &LayerCaches {
        &self.cache
    }

    /// The owned cache, for the eager prefill and eager decode steps (which write the same
    /// buffers the graphs read).
    pub fn cache_mut(&mut self) -> &mut LayerCaches {
        &mut self.cache
    }

    /// Whether another position fits (else move to an eager cache: [`Self::cache_copy`]).
    pub fn has_room(&self) -> bool {
        self.cache.seq_len() < self.capacity
    }

    /// A copy of the owned cache with the positions so far, to continue eagerly.
    pub fn cache_copy(&self) -> LayerCaches {
        self.cache.clone()
    }

    /// One decode position: `input` `[1, 1, hidden]` at the next position of the owned cache.
    /// Returns the final-normed hidden state `[1, 1, hidden]` (a copy) and the codec-head logits
    /// (f32, `vocab_size` values), as [`Talker::forward`] does.
    /// Errors when the cache is full ([`Self::has_room`]).
    pub fn step(&mut self, talker: &Talker, input: &Tensor) -> Result<(Tensor, Vec<f32>)> {
        let p = self.cache.seq_len();
        let Some(bi) = self.buckets.iter().position(|&b| p < b) else {
            candle_core::bail!(
                "talker decode graph: position {p} is past {} slots",
                self.capacity
            );
        };
        self.input.slice_set(&input.to_dtype(self.dtype)?, 1, 0)?;
        let dev = self.pos.device().clone();
        self.pos.slice_set(&Tensor::new(&[p as u32], &dev)?, 0, 0)?;
        self.launch(talker, bi)?;
        self.cache.advance(1)?;
        let logits = readback::to_vec::<f32>(&self.logits)?;
        Ok((self.hidden.copy()?, logits))
    }

    fn launch(&self, talker: &Talker, bucket_index: usize) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Some(g) = self.graphs.get(bucket_index) {
            return g.launch();
        }
        self.run(talker, self.buckets[bucket_index])
    }

    /// The captured work: one talker position at `pos`, attending over `bucket` slots.
    fn run(&self, talker: &Talker, bucket: usize) -> Result<()> {
        #[cfg(feature = "cuda")]
        if self
            .cache
            .fused_ok(&talker.model.layers, &self.input, bucket)
        {
            // Fused kernels: the position is read on the device, no RoPE row pick, slot tensor or
            // mask, and attention reads only the live slots 0..=p of the bucket.
            let h = self.cache.run_fused(
                &talker.model.layers,
                &self.input,
                &self.cos,
                &self.sin,
                crate::nn::cuda_kernels::Pos::Device(&self.pos),
                bucket,
            )?;
            return self.finish(talker, &h);
        }
        let t = &talker.config().transformer;
        let (nkv, hd) = (t.num_key_value_heads, t.head_dim);
        let cos = self.cos.index_select(&self.pos, 0)?.to_dtype(self.dtype)?;
        let sin = self.sin.index_select(&self.pos, 0)?.to_dtype(self.dtype)?;
        let slot = self
            .pos
            .reshape((1, 1, 1, 1))?
            .broadcast_as((1, nkv, 1, hd))?
            .contiguous()?;
        let visible = self
            .arange
            .narrow(0, 0, bucket)?
            .broadcast_le(&self.pos.to_dtype(DType::F32)?)?;
        let mask = visible
            .where_cond(
                &self.zeros.narrow(0, 0, bucket)?,
                &self.neg_inf.narrow(0, 0, bucket)?,
            )?
            .reshape((1, bucket))?;
        let h =
            self.cache
                .run_at_slot(&talker.model.layers, &self.input, &cos, &sin, &slot, &mask)?;
        self.finish(talker, &h)
    }

    /// Final norm and codec head of a step's last hidden state `h` into the static buffers.
    fn finish(&self, talker: &Talker, h: &Tensor) -> Result<()> {
        let h = talker.model.norm.forward(h)?;
        self.hidden.slice_set(&h, 1, 0)?;
        let logits = talker.codec_head.forward(&h)?.to_dtype(DType::F32)?;
        self.logits.slice_set(&logits, 2, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_double_up_to_the_capacity() {
        assert_eq!(buckets_for(64), vec![64]);
        assert_eq!(buckets_for(300), vec![64, 128, 256, 300]);
        assert_eq!(buckets_for(512), vec![64, 128, 256, 512]);
    }
}
