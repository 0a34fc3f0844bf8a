//! A prompt's prefill through the talker, replayed from CUDA graphs.
//!
//! Eagerly, a prefill of a short prompt (the streaming prompt of a CustomVoice request is ~10
//! positions) launches ~25 candle operations per talker layer, ~700 for the 1.7B talker, and the
//! host's launch overhead, not the GPU, sets its time (~11 ms on an H200, against ~1 ms of GPU
//! work): it is most of a lone request's first audio, and every stream in the batch waits for it.
//!
//! Here a prefill always starts at position 0, so its work depends only on its length. A prompt of
//! `t` positions runs in the smallest bucket of `L ≥ t` positions ([`BUCKETS`]): its rows are
//! copied into a static input `[1, L, hidden]` (the rows past `t` hold whatever the last prompt
//! left: finite values that no real position sees, since attention is causal and every layer works
//! row by row otherwise), the graph runs the talker's layers over all `L` rows into a scratch KV
//! cache, picks the hidden state of row `t − 1` with an index held on the device, and runs the
//! final norm and codec head into static outputs. Then one kernel copies the scratch cache's first
//! `t` positions into the stream's own cache ([`LayerCaches::fill_prefix_from`]). The result
//! equals the eager prefill up to the products' summation order over `L` instead of `t` rows.
//!
//! One set of graphs serves every stream, one prefill at a time (the stage-0 thread). Without the
//! `cuda` feature, or before capture, [`PrefillGraphs::prefill`] runs the same work directly (how
//! the CPU tests check the padding and the copy).

use candle_core::{DType, Module, Result, Tensor};

use crate::models::qwen3_tts::talker::Talker;
use crate::nn::LayerCaches;
use crate::nn::readback;

/// Prompt lengths (positions) a prefill graph is captured for; longer prompts prefill eagerly.
pub const BUCKETS: [usize; 5] = [16, 32, 64, 128, 256];

/// The static buffers, scratch cache and graphs of the prefill. Shapes: `input` `[1, L_max,
/// hidden]` (model dtype), `last` u32 `[1]`, `hidden` `[1, 1, hidden]`, `logits` f32 `[1, 1,
/// vocab_size]`, `masks` f32 `[L, L]` per bucket (the causal masks, on the device before capture:
/// a graph cannot upload them); the scratch cache holds `L_max` positions per layer.
pub struct PrefillGraphs {
    buckets: Vec<usize>,
    masks: Vec<Tensor>,
    input: Tensor,
    last: Tensor,
    hidden: Tensor,
    logits: Tensor,
    scratch: LayerCaches,
    dtype: DType,
    #[cfg(feature = "cuda")]
    graphs: Vec<crate::nn::cuda_graph::Graph>,
}

impl std::fmt::Debug for PrefillGraphs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefillGraphs")
            .field("buckets", &self.buckets)
            .finish()
    }
}

impl PrefillGraphs {
    /// Allocates the static buffers and the scratch cache for prompts of up to `max_len`
    /// positions (the buckets of [`BUCKETS`] up to the first that holds `max_len`) in `dtype` on
    /// the talker's device, by running the largest bucket once. Nothing is captured yet. Errors:
    /// a talker with a sliding window, or a failed allocation.
    pub fn new(talker: &Talker, dtype: DType, max_len: usize) -> Result<PrefillGraphs> {
        let cfg = talker.config();
        let t = &cfg.transformer;
        if t.sliding_window.is_some() {
            candle_core::bail!("the prefill graphs do not support a sliding window");
        }
        let mut buckets: Vec<usize> = BUCKETS.iter().copied().filter(|&b| b < max_len).collect();
        if let Some(&b) = BUCKETS.iter().find(|&&b| b >= max_len) {
            buckets.push(b);
        }
        let Some(&longest) = buckets.last() else {
            candle_core::bail!("prefill graphs for prompts of {max_len} positions");
        };
        let dev = talker.device().clone();
        let d = t.hidden_size;
        let masks = buckets
            .iter()
            .map(|&b| crate::nn::attention::causal_mask(b, 0, None, &dev))
            .collect::<Result<Vec<_>>>()?;
        let mut g = PrefillGraphs {
            buckets,
            masks,
            input: Tensor::zeros((1, longest, d), dtype, &dev)?,
            last: Tensor::zeros(1, DType::U32, &dev)?,
            hidden: Tensor::zeros((1, 1, d), dtype, &dev)?,
            logits: Tensor::zeros((1, 1, cfg.vocab_size), DType::F32, &dev)?,
            scratch: talker.new_cache(longest),
            dtype,
            #[cfg(feature = "cuda")]
            graphs: Vec::new(),
        };
        // The largest bucket allocates the scratch cache's buffers (`longest` slots a layer).
        g.run(talker, g.buckets.len() - 1)?;
        Ok(g)
    }

    /// The longest prompt (positions) the buckets hold.
    pub fn max_len(&self) -> usize {
        self.buckets.last().copied().unwrap_or(0)
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
            for bi in 0..self.buckets.len() {
                self.run(talker, bi)?;
            }
            dev.synchronize()?;
            let mut graphs = Vec::with_capacity(self.buckets.len());
            for bi in 0..self.buckets.len() {
                graphs.push(Graph::capture(&dev, || self.run(talker, bi))?);
            }
            dev.synchronize()?;
            self.graphs = graphs;
            Ok(())
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = talker;
            candle_core::bail!("CUDA graphs need a build with the `cuda` feature")
        }
    }

    /// Runs a whole prompt `x` (`[1, t, hidden]`, `t` ≤ [`Self::max_len`]) through the talker
    /// into `cache` (empty: [`LayerCaches::seq_len`] 0), as [`Talker::forward`] does from position
    /// 0: afterwards `cache` holds the prompt's `t` positions. Returns the final-normed hidden
    /// state of the last position `[1, 1, hidden]` (a copy) and its codec-head logits (f32,
    /// `vocab_size` values). Errors when `t` is 0 or past the buckets, or `cache` is not empty.
    pub fn prefill(
        &mut self,
        talker: &Talker,
        x: &Tensor,
        cache: &mut LayerCaches,
    ) -> Result<(Tensor, Vec<f32>)> {
        let t = x.dim(1)?;
        let Some(bi) = self.buckets.iter().position(|&b| t <= b) else {
            candle_core::bail!(
                "prefill graphs: a prompt of {t} positions is past {}",
                self.max_len()
            );
        };
        if t == 0 || cache.seq_len() != 0 {
            candle_core::bail!(
                "prefill graphs: {t} positions into a cache holding {}",
                cache.seq_len()
            );
        }
        self.input.slice_set(&x.to_dtype(self.dtype)?, 1, 0)?;
        let dev = self.last.device().clone();
        self.last
            .slice_set(&Tensor::new(&[(t - 1) as u32], &dev)?, 0, 0)?;
        self.launch(talker, bi)?;
        cache.fill_prefix_from(&self.scratch, t)?;
        let logits = readback::to_vec::<f32>(&self.logits)?;
        Ok((self.hidden.copy()?, logits))
    }

    fn launch(&mut self, talker: &Talker, bucket_index: usize) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Some(g) = self.graphs.get(bucket_index) {
            return g.launch();
        }
        self.run(talker, bucket_index)
    }

    /// The captured work: the talker's layers over the first `L` input rows of bucket
    /// `bucket_index` from position 0 into the scratch cache (its mask, no upload), then the
    /// final norm and codec head of row `last`.
    fn run(&mut self, talker: &Talker, bucket_index: usize) -> Result<()> {
        self.scratch.reset();
        let x = self.input.narrow(1, 0, self.buckets[bucket_index])?;
        let h = self.scratch.run_masked(
            &talker.model.layers,
            talker.rope(),
            &x,
            &self.masks[bucket_index],
        )?;
        let h = talker.model.norm.forward(&h.index_select(&self.last, 1)?)?;
        self.hidden.slice_set(&h, 1, 0)?;
        let logits = talker.codec_head.forward(&h)?.to_dtype(DType::F32)?;
        self.logits.slice_set(&logits, 2, 0)
    }
}
