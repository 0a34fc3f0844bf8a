//! Batched frames replayed from CUDA graphs ([`BatchGraphs`]): a whole frame (the code
//! predictor's 15 steps with the codes picked on the device, the talker's next input, its decode
//! step) for up to 64 streams in one graph launch.
//!
//! One graph per batch bucket (2, 4, 8, … up to the stage's `max_num_seqs`, at most
//! [`MAX_BATCH`]), captured at start-up before the stage reports ready. A batch of n streams
//! replays the smallest bucket ≥ n; the rows past n are padding: zero inputs, greedy picks, and
//! a talker step over a scratch KV cache of their own, so they touch no stream's state.
//!
//! Per frame the host uploads each row's inputs into the bucket's static buffers (the talker's
//! last hidden state, the frame's text row, codebook 0 as the host chose it, the code predictor's
//! sampling parameters and uniforms drawn from the row's own RNG as its solo frame would draw
//! them, and the device tables of the row's KV caches and position: `nn::rows_decode`), replays,
//! and reads back the codes `[rows, groups]` and the codec-head logits: one host round trip per
//! frame for the whole batch. Streams keep their own KV caches; joining or leaving the batch only
//! changes table entries.
//!
//! Numerics: each row's code-predictor picks and attention are the one-stream kernels' (the same
//! device functions), and the talker input sum is the one-row kernel's; the matmuls are cuBLAS
//! GEMMs over the rows instead of the one-row GEMV kernels, so hidden states and logits equal a
//! solo frame's up to the GEMM's summation order (greedy codes differ only where logits tie within
//! it: docs/cuda.md, "Batched frames").

#[cfg(feature = "cuda")]
use candle_core::{DType, Module, Result, Tensor};

#[cfg(feature = "cuda")]
use crate::models::qwen3_tts::ar_model::ArModel;
#[cfg(feature = "cuda")]
use crate::models::qwen3_tts::device_sampler::{PARAM_HEADER, greedy_row_params};
#[cfg(feature = "cuda")]
use crate::nn::LayerCaches;
#[cfg(feature = "cuda")]
use crate::nn::cuda_kernels::gather_rows::gather_rows;
#[cfg(feature = "cuda")]
use crate::nn::cuda_kernels::{embed_sum, pick_rows};
#[cfg(feature = "cuda")]
use crate::nn::readback;
#[cfg(feature = "cuda")]
use crate::nn::rows_decode::{RowTables, rows_fused_ok, run_rows_fused};

/// Largest batch a graph is captured for; more rows run eagerly.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub const MAX_BATCH: usize = 64;

/// The batch buckets for at most `max_rows` rows: 2, 4, … up to the first power of two ≥
/// `max_rows`, capped at [`MAX_BATCH`]. Empty below 2 rows (one stream takes the one-stream
/// graphs).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub fn buckets_for(max_rows: usize) -> Vec<usize> {
    let mut b = Vec::new();
    if max_rows < 2 {
        return b;
    }
    let mut n = 2;
    while n <= MAX_BATCH && (b.last().copied().unwrap_or(0) < max_rows) {
        b.push(n);
        n *= 2;
    }
    b
}

/// Writes `rows` (each `[1, 1, hidden]`) into the first rows of the static buffer `dst` `[rows',
/// 1, hidden]` and zeroes the rows after them up to `written` (what the frame before wrote), so
/// padding rows stay zero inputs. Rows of `dst`'s dtype go in one gather launch per 32 rows
/// ([`gather_rows`]) and one copy, instead of one copy each; others are converted and
/// concatenated.
#[cfg(feature = "cuda")]
fn write_rows(dst: &Tensor, rows: &[Tensor], written: usize) -> Result<()> {
    let n = rows.len();
    let stacked = if rows
        .iter()
        .all(|r| r.dtype() == dst.dtype() && r.is_contiguous())
    {
        gather_rows(&rows.iter().collect::<Vec<_>>())?
    } else {
        Tensor::cat(rows, 0)?.to_dtype(dst.dtype())?
    };
    dst.slice_set(&stacked, 0, 0)?;
    if written > n {
        let (_, t, d) = dst.dims3()?;
        dst.slice_set(
            &Tensor::zeros((written - n, t, d), dst.dtype(), dst.device())?,
            0,
            n,
        )?;
    }
    Ok(())
}

/// One row of a batched frame: a stream's inputs for the frame.
#[cfg(feature = "cuda")]
pub struct FrameRow<'a> {
    /// The talker's final-normed hidden state of the stream's last position, `[1, 1, hidden]`.
    pub hidden: Tensor,
    /// The frame's text row `[1, hidden]` (trailing text or `T(tts_pad)`).
    pub text: Tensor,
    /// Codebook 0 as the host chose it.
    pub code0: u32,
    /// The code predictor's sampling parameters, f64 `PARAM_HEADER + steps` values
    /// ([`frame_params`](crate::models::qwen3_tts::device_sampler::frame_params)), or
    /// [`greedy_row_params`].
    pub params: Vec<f64>,
    /// The stream's talker KV caches, with room for the next position.
    pub cache: &'a LayerCaches,
}

/// What a batched frame gives back, in row order.
#[cfg(feature = "cuda")]
pub struct FrameOut {
    /// `num_code_groups` codes per row.
    pub codes: Vec<Vec<u32>>,
    /// The talker's final-normed hidden states `[rows, 1, hidden]` (a copy).
    pub hidden: Tensor,
    /// Codec-head logits per row (f32, `vocab_size` values).
    pub logits: Vec<Vec<f32>>,
    /// Wall-clock ms from the replay's launch to the codes and logits read back: the frame's
    /// device work (and whatever of the device's queue ran before it) as the host waits for it.
    pub replay_ms: f64,
}

/// The static buffers, code-predictor cache and graph of one batch size.
#[cfg(feature = "cuda")]
struct Bucket {
    rows: usize,
    hidden: Tensor,
    text: Tensor,
    code0: Tensor,
    params: Tensor,
    tables: RowTables,
    codes: Tensor,
    hidden_out: Tensor,
    logits: Tensor,
    cp_cache: LayerCaches,
    graph: Option<crate::nn::cuda_graph::Graph>,
    /// Rows of `hidden` and `text` the last frame wrote (the rest are zero).
    written: usize,
}

/// The batched frame graphs of an [`ArModel`] (see the module documentation).
#[cfg(feature = "cuda")]
pub struct BatchGraphs {
    buckets: Vec<Bucket>,
    /// f32 RoPE tables `[positions, head_dim / 2]` from position 0.
    cos: Tensor,
    sin: Tensor,
    /// Positions a row may be at (the tables' length, the attention's key limit).
    positions: usize,
    /// The padding rows' KV cache (one position; nothing reads what they write).
    pad: LayerCaches,
}

#[cfg(feature = "cuda")]
impl std::fmt::Debug for BatchGraphs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rows: Vec<usize> = self.buckets.iter().map(|b| b.rows).collect();
        f.debug_struct("BatchGraphs")
            .field("buckets", &rows)
            .field("positions", &self.positions)
            .finish()
    }
}

#[cfg(feature = "cuda")]
impl BatchGraphs {
    /// Allocates the buckets for up to `max_rows` rows ([`buckets_for`]) and captures one graph
    /// each, after an eager run of each (allocates the code predictor's caches, uploads kernel
    /// parameters). Rows may be at positions below `positions` (≤ the attention kernel's key
    /// limit). Errors: not on CUDA in bf16/f32 with the fused kernels on, a stack the batched
    /// step does not take, fewer than 2 rows, a failed capture.
    pub fn capture(model: &ArModel, max_rows: usize, positions: usize) -> Result<BatchGraphs> {
        use crate::nn::cuda_graph::{Graph, htod_cache};
        let talker = &model.talker;
        let cp = &model.code_predictor;
        let dev = talker.device().clone();
        let dtype = model.dtype;
        let d = talker.config().transformer.hidden_size;
        let sizes = buckets_for(max_rows);
        if sizes.is_empty() {
            candle_core::bail!("batched frame graphs need at least 2 rows, {max_rows} asked");
        }
        let probe = Tensor::zeros((2, 1, d), dtype, &dev)?;
        if !rows_fused_ok(&talker.model.layers, &probe, positions)
            || cp.vocab_size() > pick_rows::MAX_VOCAB
            || cp.steps() + 1 > embed_sum::MAX_TABLES
        {
            candle_core::bail!(
                "batched frame graphs: this model ({dtype:?} on {dev:?}) does not take the \
                 batched CUDA kernels"
            );
        }
        let (cos, sin) = talker.rope().cos_sin(0, positions)?;
        let (cos, sin) = (cos.contiguous()?, sin.contiguous()?);
        // One position for the padding rows.
        let mut pad = talker.new_cache(1);
        pad.reserve_next(&talker.model.layers, dtype, &dev)?;
        let layers = talker.model.layers.len();
        let groups = cp.steps() + 1;
        let vocab = talker.config().vocab_size;
        let mut graphs = BatchGraphs {
            buckets: Vec::with_capacity(sizes.len()),
            cos,
            sin,
            positions,
            pad,
        };
        let _htod = htod_cache(&dev)?;
        for rows in sizes {
            let mut b = Bucket {
                rows,
                hidden: Tensor::zeros((rows, 1, d), dtype, &dev)?,
                text: Tensor::zeros((rows, 1, d), dtype, &dev)?,
                code0: Tensor::zeros(rows, DType::U32, &dev)?,
                params: Tensor::from_vec(
                    greedy_row_params(cp.steps()).repeat(rows),
                    (rows, PARAM_HEADER + cp.steps()),
                    &dev,
                )?,
                tables: RowTables::new(rows, layers, &dev)?,
                codes: Tensor::zeros((rows, groups), DType::U32, &dev)?,
                hidden_out: Tensor::zeros((rows, 1, d), dtype, &dev)?,
                logits: Tensor::zeros((rows, 1, vocab), DType::F32, &dev)?,
                cp_cache: cp.new_cache(),
                graph: None,
                written: 0,
            };
            b.tables.fill(&[], &graphs.pad)?;
            // Eager run: allocates the code predictor's cache, uploads the kernel parameters.
            graphs.run(model, &mut b)?;
            dev.synchronize()?;
            let graph = Graph::capture(&dev, || graphs.run(model, &mut b))?;
            dev.synchronize()?;
            b.graph = Some(graph);
            graphs.buckets.push(b);
        }
        Ok(graphs)
    }

    /// Most rows one frame takes (the largest bucket).
    pub fn max_rows(&self) -> usize {
        self.buckets.last().map_or(0, |b| b.rows)
    }

    /// The batch sizes captured, ascending.
    pub fn bucket_sizes(&self) -> Vec<usize> {
        self.buckets.iter().map(|b| b.rows).collect()
    }

    /// Whether `n` rows at positions `positions` fit a bucket.
    pub fn takes(&self, n: usize, mut positions: impl Iterator<Item = usize>) -> bool {
        n >= 2 && n <= self.max_rows() && positions.all(|p| p < self.positions)
    }

    /// One frame for `rows` (2 ..= [`Self::max_rows`], each cache with room for its next
    /// position below [`Self::positions`]) by replaying the smallest bucket that holds them. The
    /// caches' `seq_len()` is not changed: advance each by one after this returns. Errors when the
    /// rows do not fit, an input has the wrong shape, or a code read back is out of range (the
    /// frame is then lost for every row).
    pub fn frame(&mut self, model: &ArModel, rows: &[FrameRow<'_>]) -> Result<FrameOut> {
        let n = rows.len();
        let Some(bi) = self.buckets.iter().position(|b| b.rows >= n) else {
            candle_core::bail!(
                "{n} rows for batched frame graphs of at most {}",
                self.max_rows()
            );
        };
        if n < 2 {
            candle_core::bail!("a batched frame needs at least 2 rows, got {n}");
        }
        let cp = &model.code_predictor;
        let dev = model.talker.device().clone();
        let d = model.talker.config().transformer.hidden_size;
        let vocab = model.talker.config().vocab_size;
        let stride = PARAM_HEADER + cp.steps();
        let b = &mut self.buckets[bi];
        let hidden = rows
            .iter()
            .map(|r| r.hidden.reshape((1, 1, d)))
            .collect::<Result<Vec<_>>>()?;
        let text = rows
            .iter()
            .map(|r| r.text.reshape((1, 1, d)))
            .collect::<Result<Vec<_>>>()?;
        write_rows(&b.hidden, &hidden, b.written)?;
        write_rows(&b.text, &text, b.written)?;
        b.written = n;
        let mut code0: Vec<u32> = rows.iter().map(|r| r.code0).collect();
        code0.resize(b.rows, 0);
        b.code0
            .slice_set(&Tensor::new(code0.as_slice(), &dev)?, 0, 0)?;
        let mut params = Vec::with_capacity(b.rows * stride);
        for r in rows {
            if r.params.len() != stride {
                candle_core::bail!("{} sampling parameters, {stride} expected", r.params.len());
            }
            params.extend_from_slice(&r.params);
        }
        for _ in n..b.rows {
            params.extend(greedy_row_params(cp.steps()));
        }
        b.params
            .slice_set(&Tensor::from_vec(params, (b.rows, stride), &dev)?, 0, 0)?;
        let caches: Vec<&LayerCaches> = rows.iter().map(|r| r.cache).collect();
        let positions = b.tables.fill(&caches, &self.pad)?;
        if let Some(p) = positions.iter().find(|&&p| p as usize >= self.positions) {
            candle_core::bail!("batched frame: position {p} past {}", self.positions);
        }
        let t_launch = std::time::Instant::now();
        match &b.graph {
            Some(g) => g.launch()?,
            None => candle_core::bail!("batched frame graph of {} rows not captured", b.rows),
        }
        let width = b.codes.dim(1)?;
        let codes: Vec<Vec<u32>> = readback::to_vec::<u32>(&b.codes)?
            .chunks(width)
            .take(n)
            .map(<[u32]>::to_vec)
            .collect();
        if let Some(c) = codes
            .iter()
            .flat_map(|c| c.iter().skip(1))
            .find(|&&c| c as usize >= cp.vocab_size())
        {
            candle_core::bail!("batched frame graph: code {c} >= {}", cp.vocab_size());
        }
        let logits = readback::to_vec::<f32>(&b.logits)?;
        let replay_ms = t_launch.elapsed().as_secs_f64() * 1e3;
        let logits = logits.chunks(vocab).take(n).map(<[f32]>::to_vec).collect();
        let hidden = b.hidden_out.narrow(0, 0, n)?.copy()?;
        Ok(FrameOut {
            codes,
            hidden,
            logits,
            replay_ms,
        })
    }

    /// The captured work of bucket `b`: the code predictor's frame over its rows (picks on the
    /// device into `codes`), the talker's input sum and batched decode step into `hidden_out` and
    /// `logits`.
    fn run(&self, model: &ArModel, b: &mut Bucket) -> Result<()> {
        let talker = &model.talker;
        let cp = &model.code_predictor;
        let steps = cp.steps();
        let c0 = talker
            .model
            .codec_embedding
            .embeddings()
            .index_select(&b.code0, 0)?
            .unsqueeze(1)?;
        let mut x = Tensor::cat(&[&b.hidden, &c0], 1)?; // [rows, 2, d]
        b.codes.slice_set(&b.code0.unsqueeze(1)?, 1, 0)?;
        b.cp_cache.reset();
        for q in 0..steps {
            let logits = cp.step_logits(&x, q, &mut b.cp_cache)?.contiguous()?;
            let table = (q + 1 < steps).then(|| cp.model.codec_embedding[q].embeddings());
            if let Some(next) = pick_rows::pick_rows(&logits, &b.params, q, table, &b.codes, q + 1)?
            {
                x = next;
            }
        }
        let mut tables = vec![talker.model.codec_embedding.embeddings()];
        tables.extend(cp.model.codec_embedding.iter().map(|e| e.embeddings()));
        let input = embed_sum::embed_sum_rows(&b.codes, &tables, &b.text)?;
        let h = run_rows_fused(
            &talker.model.layers,
            &input,
            &self.cos,
            &self.sin,
            &b.tables,
            self.positions,
        )?;
        let h = talker.model.norm.forward(&h)?;
        b.hidden_out.slice_set(&h, 0, 0)?;
        let logits = talker.codec_head.forward(&h)?.to_dtype(DType::F32)?;
        b.logits.slice_set(&logits, 0, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_double_up_to_the_batch() {
        assert!(buckets_for(1).is_empty());
        assert_eq!(buckets_for(2), vec![2]);
        assert_eq!(buckets_for(3), vec![2, 4]);
        assert_eq!(buckets_for(16), vec![2, 4, 8, 16]);
        assert_eq!(buckets_for(17), vec![2, 4, 8, 16, 32]);
        assert_eq!(buckets_for(64), vec![2, 4, 8, 16, 32, 64]);
        assert_eq!(buckets_for(500), vec![2, 4, 8, 16, 32, 64]);
    }
}
