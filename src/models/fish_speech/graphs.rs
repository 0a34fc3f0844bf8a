//! Fish S2 Pro's frame replayed from CUDA graphs: the fast AR's positions ([`FastArGraphs`])
//! and the slow AR's batched step ([`SlowArGraphs`], CUDA only, described there).
//!
//! A frame of the fast AR is ten positions (the slow AR's hidden state, then one position per
//! code), each ~40 small kernels for every row, with a host draw between positions: eagerly about
//! 400 launches a frame, most of a frame's time at one stream on an H200 (docs/cuda.md, "Fish
//! Audio S2 Pro on CUDA"). Every frame runs the same positions and shapes, so each position is
//! captured once per batch bucket (1, 2, 4, … rows) over a KV cache and static inputs and
//! outputs that the bucket owns; per frame the host uploads the rows' hidden states, then for
//! each code uploads the previous codes, replays that position's graph and reads the logits
//! back to draw from them, as the eager frame does. Rows past the batch are padding (zero hidden
//! state, code 0): rows never mix in the fast AR, so they touch no real row.
//!
//! Off by default until measured on a GPU (`OMNITTS_FISH_GRAPHS=1`). Without a capture (no CUDA
//! device, a build without `cuda`) the same work runs directly, which is how the CPU tests check
//! it.

use candle_core::{DType, Result, Tensor};

use super::fast_ar::FastAr;
use crate::nn::LayerCaches;

/// Largest bucket captured; more rows run eagerly.
pub const MAX_ROWS: usize = 64;

/// The buckets for at most `max_rows` rows, from `min_rows`: powers of two up to the first ≥
/// `max_rows`, at most [`MAX_ROWS`].
pub fn buckets(min_rows: usize, max_rows: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut n = min_rows.max(1).next_power_of_two();
    while n <= MAX_ROWS && out.last().is_none_or(|&l| l < max_rows) {
        out.push(n);
        n *= 2;
    }
    out
}

/// One bucket's static tensors, cache and graphs.
struct Bucket {
    rows: usize,
    /// The rows' slow-AR hidden states `[rows, input_dim]`.
    hidden: Tensor,
    /// The rows' previous codes `[rows]` u32.
    ids: Tensor,
    /// The logits of the position just run `[rows, codebook_size]` f32.
    logits: Tensor,
    /// The frame's KV cache (written in place at the captured positions).
    cache: LayerCaches,
    /// Position `k`'s graph at index `k` (`num_codebooks` of them), once captured.
    #[cfg(feature = "cuda")]
    graphs: Vec<crate::nn::cuda_graph::Graph>,
}

impl Bucket {
    fn new(fast: &FastAr, rows: usize, device: &candle_core::Device) -> Result<Bucket> {
        Ok(Bucket {
            rows,
            hidden: Tensor::zeros((rows, fast.input_dim()), fast.dtype(), device)?,
            ids: Tensor::zeros(rows, DType::U32, device)?,
            logits: Tensor::zeros((rows, fast.codebook_size()), DType::F32, device)?,
            cache: fast.new_cache(),
            #[cfg(feature = "cuda")]
            graphs: Vec::new(),
        })
    }

    /// The work of position `k` over the static tensors (what a graph captures).
    fn run(&mut self, fast: &FastAr, k: usize) -> Result<()> {
        if k == 0 {
            self.cache.reset();
            fast.first_position(&self.hidden, &mut self.cache)
                .map_err(|e| candle_core::Error::Msg(e.to_string()))
        } else {
            let logits = fast
                .code_logits(&self.ids, &mut self.cache)
                .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
            self.logits.slice_set(&logits, 1, 0)
        }
    }

    /// Position `k`: its graph if captured, else its work directly.
    fn launch(&mut self, fast: &FastAr, k: usize) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Some(g) = self.graphs.get(k) {
            return g.launch();
        }
        self.run(fast, k)
    }

    #[cfg(feature = "cuda")]
    fn capture(&mut self, fast: &FastAr, device: &candle_core::Device) -> Result<()> {
        use crate::nn::cuda_graph::Graph;
        let n = fast.num_codebooks();
        for k in 0..n {
            self.run(fast, k)?;
        }
        device.synchronize()?;
        // Position 0's work resets the cache; each later capture finds it one position on.
        let mut graphs = Vec::with_capacity(n);
        for k in 0..n {
            graphs.push(Graph::capture(device, || self.run(fast, k))?);
        }
        device.synchronize()?;
        self.graphs = graphs;
        Ok(())
    }
}

/// The fast AR's frame per batch bucket (see the module documentation).
pub struct FastArGraphs {
    buckets: Vec<Bucket>,
    /// The RoPE table the graphs read (kept alive).
    _rope: (Tensor, Tensor),
}

impl std::fmt::Debug for FastArGraphs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FastArGraphs")
            .field(
                "buckets",
                &self.buckets.iter().map(|b| b.rows).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl FastArGraphs {
    /// Static tensors and caches for `buckets` (rows each, increasing) on `device`; nothing
    /// captured: [`Self::frame`] runs the work directly.
    pub fn new(fast: &FastAr, buckets: &[usize], device: &candle_core::Device) -> Result<Self> {
        Ok(Self {
            buckets: buckets
                .iter()
                .map(|&rows| Bucket::new(fast, rows, device))
                .collect::<Result<Vec<_>>>()?,
            _rope: fast.frame_rope()?,
        })
    }

    /// Captures every bucket's graphs, after one direct run each under the parameter upload
    /// cache. Errors: not a CUDA device, a build without `cuda`, a failed capture.
    pub fn capture(&mut self, fast: &FastAr, device: &candle_core::Device) -> Result<()> {
        #[cfg(feature = "cuda")]
        {
            if !device.is_cuda() {
                candle_core::bail!("CUDA graphs need a CUDA device, the fast AR is on {device:?}");
            }
            let _htod = crate::nn::cuda_graph::htod_cache(device)?;
            for b in &mut self.buckets {
                b.capture(fast, device)?;
            }
            Ok(())
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (fast, device);
            candle_core::bail!("CUDA graphs need a build with the `cuda` feature")
        }
    }

    /// Takes over `other`'s buckets (captured for other row counts), kept in increasing order.
    pub fn absorb(&mut self, other: FastArGraphs) {
        self.buckets.extend(other.buckets);
        self.buckets.sort_by_key(|b| b.rows);
    }

    /// The buckets' row counts.
    pub fn buckets(&self) -> Vec<usize> {
        self.buckets.iter().map(|b| b.rows).collect()
    }

    /// Whether a bucket holds `rows` rows.
    pub fn fits(&self, rows: usize) -> bool {
        self.buckets.iter().any(|b| b.rows >= rows)
    }

    /// [`FastAr::frame`] on the smallest bucket that holds the rows: `fast` is the model the
    /// graphs were captured from (a replay uses the captured weights), `hidden` `[b, input_dim]`,
    /// `code0` the rows' codebook-0 codes, `choose(step, logits)` picks each row's code of step
    /// k from the f32 logits `[b, codebook_size]` (a view of the bucket's output, valid until
    /// the next position runs). Errors: no bucket holds `b` rows, a failed replay, `choose`'s
    /// error.
    pub fn frame(
        &mut self,
        fast: &FastAr,
        hidden: &Tensor,
        code0: &[u32],
        mut choose: impl FnMut(usize, &Tensor) -> Result<Vec<u32>>,
    ) -> Result<Vec<Vec<u32>>> {
        let b = hidden.dim(0)?;
        if code0.len() != b {
            candle_core::bail!("fast AR graphs: {} codes for {b} rows", code0.len());
        }
        let Some(bucket) = self.buckets.iter_mut().find(|k| k.rows >= b) else {
            candle_core::bail!("fast AR graphs: no bucket holds {b} rows");
        };
        let pad = bucket.rows - b;
        let h = hidden.to_dtype(bucket.hidden.dtype())?;
        let h = if pad > 0 {
            Tensor::cat(
                &[&h, &h.zeros_like()?.narrow(0, 0, 1)?.repeat((pad, 1))?],
                0,
            )?
        } else {
            h
        };
        bucket.hidden.slice_set(&h, 0, 0)?;
        bucket.launch(fast, 0)?;
        let mut prev = code0.to_vec();
        let mut out: Vec<Vec<u32>> = vec![Vec::with_capacity(fast.num_codebooks() - 1); b];
        for step in 1..fast.num_codebooks() {
            let mut ids = prev.clone();
            ids.resize(bucket.rows, 0);
            let ids = Tensor::from_vec(ids, bucket.rows, bucket.ids.device())?;
            bucket.ids.slice_set(&ids, 0, 0)?;
            bucket.launch(fast, step)?;
            prev = choose(step, &bucket.logits.narrow(0, 0, b)?)?;
            if prev.len() != b {
                candle_core::bail!("fast AR graphs: {} codes chosen for {b} rows", prev.len());
            }
            for (row, &c) in out.iter_mut().zip(&prev) {
                row.push(c);
            }
        }
        Ok(out)
    }
}

/// The slow AR's step over a batch of streams replayed from CUDA graphs, one per bucket
/// (CUDA only): the fused batched kernels ([`crate::nn::rows_decode::run_rows_fused`]) read each
/// row's KV caches and position from device tables, so one graph serves any mix of streams, and
/// the rows past the batch point at a padding cache. Per step the host makes room in each row's
/// caches, writes the tables and the rows' inputs, replays, reads the logits back and advances the
/// caches. A batch with a row at 8,192 positions or more (`max_keys`) steps eagerly.
#[cfg(feature = "cuda")]
pub struct SlowArGraphs {
    buckets: Vec<SlowBucket>,
    /// The RoPE tables from position 0 over `max_keys` positions (the graphs read them).
    cos: Tensor,
    sin: Tensor,
    max_keys: usize,
}

#[cfg(feature = "cuda")]
struct SlowBucket {
    rows: usize,
    /// The rows' inputs `[rows, 1, dim]`.
    x: Tensor,
    tables: crate::nn::rows_decode::RowTables,
    /// What the padding rows write into and read (room for position 0; nothing reads it back).
    pad: LayerCaches,
    /// Allowed-token logits `[rows, allowed]` f32 and final-normed hidden states `[rows, dim]`.
    logits: Tensor,
    hidden: Tensor,
    graph: Option<crate::nn::cuda_graph::Graph>,
}

#[cfg(feature = "cuda")]
impl SlowBucket {
    fn run(
        &self,
        slow: &super::slow_ar::SlowAr,
        cos: &Tensor,
        sin: &Tensor,
        max_keys: usize,
    ) -> Result<()> {
        let (logits, hidden) = slow
            .rows_step_fused(&self.x, cos, sin, &self.tables, max_keys)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        self.logits.slice_set(&logits, 1, 0)?;
        self.hidden
            .slice_set(&hidden.to_dtype(self.hidden.dtype())?, 1, 0)
    }
}

#[cfg(feature = "cuda")]
impl std::fmt::Debug for SlowArGraphs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlowArGraphs")
            .field(
                "buckets",
                &self.buckets.iter().map(|b| b.rows).collect::<Vec<_>>(),
            )
            .field("max_keys", &self.max_keys)
            .finish()
    }
}

#[cfg(feature = "cuda")]
impl SlowArGraphs {
    /// Captures the step for `buckets` (rows each, increasing) on the slow AR's CUDA device, in
    /// `dtype` (the weights'). Errors: a stack the fused batched kernels do not take, a failed
    /// capture.
    pub fn capture(
        slow: &super::slow_ar::SlowAr,
        buckets: &[usize],
        dtype: DType,
    ) -> Result<SlowArGraphs> {
        use crate::nn::cuda_graph::{Graph, htod_cache};
        use crate::nn::rows_decode::{RowTables, rows_fused_ok};
        let dev = slow.device().clone();
        if !dev.is_cuda() {
            candle_core::bail!("CUDA graphs need a CUDA device, the slow AR is on {dev:?}");
        }
        let max_keys = slow
            .max_seq_len()
            .min(crate::nn::cuda_kernels::decode_attention::MAX_KEYS);
        let probe = Tensor::zeros((1, 1, slow.dim()), dtype, &dev)?;
        if !rows_fused_ok(slow.layers(), &probe, max_keys) {
            candle_core::bail!("the slow AR's stack does not take the fused batched kernels");
        }
        let (cos, sin) = slow.rope().cos_sin(0, max_keys)?;
        let (cos, sin) = (cos.contiguous()?, sin.contiguous()?);
        let _htod = htod_cache(&dev)?;
        let mut out = Vec::with_capacity(buckets.len());
        for &rows in buckets {
            // Room for position 0 only: the padding rows' keys and values land there, unread.
            let mut pad = LayerCaches::new(slow.layers().len(), 1);
            pad.reserve_next(slow.layers(), dtype, &dev)?;
            let tables = RowTables::new(rows, slow.layers().len(), &dev)?;
            tables.fill(&[], &pad)?;
            let (logits, hidden) = slow
                .rows_step_fused(&probe.repeat((rows, 1, 1))?, &cos, &sin, &tables, max_keys)
                .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
            let mut b = SlowBucket {
                rows,
                x: Tensor::zeros((rows, 1, slow.dim()), dtype, &dev)?,
                tables,
                pad,
                logits: logits.zeros_like()?,
                hidden: hidden.zeros_like()?,
                graph: None,
            };
            b.run(slow, &cos, &sin, max_keys)?;
            dev.synchronize()?;
            b.graph = Some(Graph::capture(&dev, || b.run(slow, &cos, &sin, max_keys))?);
            dev.synchronize()?;
            out.push(b);
        }
        Ok(SlowArGraphs {
            buckets: out,
            cos,
            sin,
            max_keys,
        })
    }

    /// Takes over `other`'s buckets (captured for other row counts), kept in increasing order.
    pub fn absorb(&mut self, other: SlowArGraphs) {
        self.buckets.extend(other.buckets);
        self.buckets.sort_by_key(|b| b.rows);
    }

    /// Whether a bucket holds `rows` rows whose caches are at positions `positions`.
    pub fn fits(&self, positions: &[usize]) -> bool {
        positions.iter().all(|&p| p < self.max_keys)
            && self.buckets.iter().any(|b| b.rows >= positions.len())
    }

    /// [`super::slow_ar::SlowAr::forward_rows`] on the smallest bucket that holds the rows
    /// (`slow`: the model the graphs were captured from): `x` `[b, 1, dim]`, row i appended to
    /// `caches[i]`. Returns the allowed-token logits `[b, allowed]` (f32) and the final-normed
    /// hidden states `[b, dim]`. Errors: `x`'s rows are not the caches', no bucket fits
    /// ([`Self::fits`]), a row past `max_seq_len`, a failed replay; the caches are advanced only
    /// once the replay has been enqueued (before that an error leaves their positions as they
    /// were).
    pub fn step(
        &self,
        slow: &super::slow_ar::SlowAr,
        x: &Tensor,
        caches: &mut [&mut LayerCaches],
    ) -> Result<(Tensor, Tensor)> {
        let b = caches.len();
        if x.dim(0)? != b {
            candle_core::bail!("slow AR graphs: {} input rows for {b} caches", x.dim(0)?);
        }
        let positions: Vec<usize> = caches.iter().map(|c| c.seq_len()).collect();
        if !self.fits(&positions) {
            candle_core::bail!("slow AR graphs: no bucket for {b} rows at {positions:?}");
        }
        let Some(bucket) = self.buckets.iter().find(|k| k.rows >= b) else {
            candle_core::bail!("slow AR graphs: no bucket holds {b} rows");
        };
        for c in caches.iter() {
            slow.check_room(c.seq_len() + 1)
                .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        }
        let dtype = bucket.x.dtype();
        for c in caches.iter_mut() {
            c.reserve_next(slow.layers(), dtype, x.device())?;
        }
        let streams: Vec<&LayerCaches> = caches.iter().map(|c| &**c).collect();
        bucket.tables.fill(&streams, &bucket.pad)?;
        let x = x.to_dtype(dtype)?;
        let pad = bucket.rows - b;
        let x = if pad > 0 {
            let zeros = Tensor::zeros((pad, 1, x.dim(2)?), dtype, x.device())?;
            Tensor::cat(&[&x, &zeros], 0)?
        } else {
            x
        };
        bucket.x.slice_set(&x, 0, 0)?;
        match &bucket.graph {
            Some(g) => g.launch()?,
            None => bucket.run(slow, &self.cos, &self.sin, self.max_keys)?,
        }
        for c in caches.iter_mut() {
            c.advance(1)?;
        }
        Ok((
            bucket.logits.narrow(0, 0, b)?.copy()?,
            bucket.hidden.narrow(0, 0, b)?.copy()?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use candle_core::{DType, Device, Tensor};

    use super::*;
    use crate::models::fish_speech::model::FishModel;

    /// Each row's highest logit.
    fn argmax(logits: &Tensor) -> Result<Vec<u32>> {
        let rows: Vec<Vec<f32>> = logits.to_vec2()?;
        Ok(rows
            .iter()
            .map(|r| {
                r.iter()
                    .enumerate()
                    .fold(
                        (0, f32::NEG_INFINITY),
                        |m, (i, &v)| if v > m.1 { (i, v) } else { m },
                    )
                    .0 as u32
            })
            .collect())
    }

    #[test]
    fn buckets_are_powers_of_two_up_to_the_rows() {
        assert_eq!(buckets(1, 1), [1]);
        assert_eq!(buckets(1, 5), [1, 2, 4, 8]);
        assert_eq!(buckets(2, 64), [2, 4, 8, 16, 32, 64]);
        assert_eq!(buckets(1, 100), [1, 2, 4, 8, 16, 32, 64]);
    }

    /// The bucketed frame (the graphs' work run directly, padded rows included) gives each row
    /// the eager frame's codes and logits, frame after frame.
    #[test]
    fn the_bucketed_frame_equals_the_eager_frame() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-fish");
        let m = FishModel::load(&dir, &Device::Cpu, DType::F32).expect("tiny fish");
        let fast = &m.fast;
        // Captured in two sets (batch buckets, then the one-stream one), used as one.
        let mut graphs = FastArGraphs::new(fast, &[4], &Device::Cpu).expect("buckets");
        graphs.absorb(FastArGraphs::new(fast, &[1], &Device::Cpu).expect("bucket 1"));
        assert_eq!(graphs.buckets(), [1, 4]);
        assert!(graphs.fits(4) && !graphs.fits(5));
        // The capture's sequence, run directly: a warm-up of every position, then each position
        // in order. After it the KV buffers must never grow (the graphs hold their addresses).
        let n = fast.num_codebooks();
        let mut capacity = Vec::new();
        for b in &mut graphs.buckets {
            for k in (0..n).chain(0..n) {
                b.run(fast, k).expect("a position");
            }
            capacity.push(b.cache.capacity());
        }
        let d = fast.input_dim();
        for (frame, rows) in [(0u32, 3usize), (1, 1), (2, 4), (3, 3)] {
            let values: Vec<f32> = (0..rows * d)
                .map(|i| ((i as f32 * 0.37 + frame as f32).sin()) * 2.0)
                .collect();
            let hidden = Tensor::from_vec(values, (rows, d), &Device::Cpu).expect("hidden");
            let code0: Vec<u32> = (0..rows as u32)
                .map(|r| (r * 97 + frame * 13) % 4096)
                .collect();
            let mut eager_logits = Vec::new();
            let eager = fast
                .frame(
                    &hidden,
                    &code0,
                    |_, l| Ok(argmax(l)?),
                    Some(&mut eager_logits),
                )
                .expect("eager frame");
            let mut step_logits = Vec::new();
            let bucketed = graphs
                .frame(fast, &hidden, &code0, |_, l| {
                    step_logits.push(l.copy()?);
                    argmax(l)
                })
                .expect("bucketed frame");
            assert_eq!(bucketed, eager, "frame {frame}, {rows} rows: codes");
            for (b, &c) in graphs.buckets.iter().zip(&capacity) {
                assert_eq!(
                    b.cache.capacity(),
                    c,
                    "frame {frame}: bucket {} grew",
                    b.rows
                );
            }
            let used = graphs
                .buckets
                .iter()
                .find(|b| b.rows >= rows)
                .expect("a bucket");
            assert_eq!(
                used.cache.seq_len(),
                n,
                "frame {frame}: one position per code"
            );
            assert_eq!(step_logits.len(), eager_logits.len());
            for (a, b) in step_logits.iter().zip(&eager_logits) {
                let diff = (a - b)
                    .and_then(|d| d.abs()?.max_all()?.to_scalar::<f32>())
                    .expect("diff");
                assert!(
                    diff <= 1e-4,
                    "frame {frame}, {rows} rows: logits differ by {diff}"
                );
            }
        }
        assert!(
            graphs
                .frame(
                    fast,
                    &Tensor::zeros((5, d), DType::F32, &Device::Cpu).expect("z"),
                    &[0; 5],
                    |_, l| argmax(l)
                )
                .is_err()
        );
    }
}
