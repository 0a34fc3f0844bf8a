//! The code predictor ("sub-talker", MTP): a small Qwen3 decoder that fills codebooks 1.. of a
//! frame from the talker's hidden state and codebook-0 embedding (reference
//! `Qwen3TTSTalkerCodePredictorModelForConditionalGeneration`; qwen3-tts.md §4).
//! Weight prefix `talker.code_predictor.`.

use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::{Embedding, Linear};

use super::config::TalkerConfig;
use crate::nn::{DecoderLayer, LayerCaches, RmsNorm, RotaryEmbedding, WeightError, Weights};

/// `talker.code_predictor.model`.
#[derive(Debug, Clone)]
pub struct CodePredictorModel {
    /// `num_code_groups - 1` tables `[cp vocab_size, talker hidden]`; table q embeds codebook q+1.
    pub codec_embedding: Vec<Embedding>,
    pub layers: Vec<DecoderLayer>,
    pub norm: RmsNorm,
}

impl CodePredictorModel {
    pub fn new(cfg: &TalkerConfig, vb: &Weights) -> std::result::Result<Self, WeightError> {
        let c = &cfg.code_predictor_config;
        let t = &c.transformer;
        let codec_embedding = (0..c.num_code_groups - 1)
            .map(|i| {
                vb.pp("codec_embedding").embedding(
                    c.vocab_size,
                    cfg.transformer.hidden_size,
                    &i.to_string(),
                )
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let layers = (0..t.num_hidden_layers)
            .map(|i| DecoderLayer::new(t, &vb.pp(format!("layers.{i}"))))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(Self {
            codec_embedding,
            layers,
            norm: RmsNorm::new(t.hidden_size, t.rms_norm_eps, &vb.pp("norm"))?,
        })
    }
}

/// The code predictor with its heads and optional input projection.
#[derive(Debug, Clone)]
pub struct CodePredictor {
    pub model: CodePredictorModel,
    /// `num_code_groups - 1` heads `[cp vocab_size, cp hidden]`, no bias.
    pub lm_head: Vec<Linear>,
    /// `[cp hidden, talker hidden]` + bias, present iff the two hidden sizes differ (Identity
    /// otherwise, as in the reference).
    pub small_to_mtp_projection: Option<Linear>,
    rope: RotaryEmbedding,
    num_layers: usize,
    num_code_groups: usize,
    vocab_size: usize,
    device: Device,
}

impl CodePredictor {
    /// Loads at `vb` = the `talker.code_predictor` prefix.
    pub fn new(cfg: &TalkerConfig, vb: &Weights) -> std::result::Result<Self, WeightError> {
        let c = &cfg.code_predictor_config;
        let t = &c.transformer;
        let lm_head = (0..c.num_code_groups - 1)
            .map(|i| {
                vb.pp("lm_head")
                    .linear(t.hidden_size, c.vocab_size, false, &i.to_string())
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let small_to_mtp_projection = if t.hidden_size != cfg.transformer.hidden_size {
            Some(vb.linear(
                cfg.transformer.hidden_size,
                t.hidden_size,
                true,
                "small_to_mtp_projection",
            )?)
        } else {
            None
        };
        Ok(Self {
            model: CodePredictorModel::new(cfg, &vb.pp("model"))?,
            lm_head,
            small_to_mtp_projection,
            rope: RotaryEmbedding::new(t.head_dim, t.rope_theta, vb.device()),
            num_layers: t.num_hidden_layers,
            num_code_groups: c.num_code_groups,
            vocab_size: c.vocab_size,
            device: vb.device().clone(),
        })
    }

    /// Codebook size of codebooks 1.. .
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// A KV cache for one frame (reset it before each frame).
    pub fn new_cache(&self) -> LayerCaches {
        LayerCaches::new(self.num_layers, self.num_code_groups)
    }

    /// `codec_embedding[q](id)` for codebook `q + 1`: `[1, talker hidden]`.
    pub fn codec_embed(&self, q: usize, id: u32) -> Result<Tensor> {
        if id as usize >= self.vocab_size {
            candle_core::bail!("codebook {} code {id} >= {}", q + 1, self.vocab_size);
        }
        self.model.codec_embedding[q].forward(&Tensor::new(&[id], &self.device)?)
    }

    fn project(&self, x: &Tensor) -> Result<Tensor> {
        match &self.small_to_mtp_projection {
            Some(p) => p.forward(x),
            None => Ok(x.clone()),
        }
    }

    /// One step on the device: `x` `[1, t, talker hidden]` at the next positions of `cache` →
    /// f32 logits of head `head`, `[1, 1, vocab_size]`.
    fn step_logits(&self, x: &Tensor, head: usize, cache: &mut LayerCaches) -> Result<Tensor> {
        let t = x.dim(1)?;
        let h = cache.run(&self.model.layers, &self.rope, &self.project(x)?)?;
        let last = self.model.norm.forward(&h.narrow(1, t - 1, 1)?)?;
        self.lm_head[head].forward(&last)?.to_dtype(DType::F32)
    }

    fn step(&self, x: &Tensor, head: usize, cache: &mut LayerCaches) -> Result<Vec<f32>> {
        self.step_logits(x, head, cache)?
            .flatten_all()?
            .to_vec1::<f32>()
    }

    /// Captures the `num_code_groups - 1` steps of a frame as CUDA graphs (see [`CpGraphs`]).
    /// `dtype` is the activation dtype (the model's). Runs one eager frame first to allocate the
    /// KV buffers and upload the kernel parameters. Errors on a non-CUDA device or a build without
    /// the `cuda` feature.
    pub fn capture_graphs(&self, dtype: DType) -> Result<CpGraphs> {
        CpGraphs::capture(self, dtype)
    }

    /// [`Self::generate`] by replaying graphs captured with [`Self::capture_graphs`]: the same
    /// kernels on the same data, so the same logits bit for bit; sampling stays on the host.
    pub fn generate_graphed(
        &self,
        graphs: &mut CpGraphs,
        talker_hidden: &Tensor,
        code0_embed: &Tensor,
        choose: impl FnMut(usize, &mut [f32]) -> u32,
    ) -> Result<Vec<u32>> {
        graphs.generate(self, talker_hidden, code0_embed, choose)
    }

    /// Generates codebooks 1..num_code_groups of one frame.
    ///
    /// `talker_hidden`: the talker's final-normed hidden state that produced codebook 0
    /// (`[1, 1, talker hidden]`); `code0_embed`: `C_talker(a0)` (`[1, 1, talker hidden]`).
    /// `choose(q, logits)` picks codebook `q`'s code from its f32 logits (`vocab_size` values).
    /// The cache is reset first. Positions 0..num_code_groups-1.
    pub fn generate(
        &self,
        talker_hidden: &Tensor,
        code0_embed: &Tensor,
        cache: &mut LayerCaches,
        mut choose: impl FnMut(usize, &mut [f32]) -> u32,
    ) -> Result<Vec<u32>> {
        cache.reset();
        let mut codes = Vec::with_capacity(self.num_code_groups - 1);
        let prefill = Tensor::cat(&[talker_hidden, code0_embed], 1)?;
        let mut logits = self.step(&prefill, 0, cache)?;
        for q in 1..self.num_code_groups {
            let code = choose(q, &mut logits);
            if code as usize >= self.vocab_size {
                candle_core::bail!("codebook {q}: chosen code {code} >= {}", self.vocab_size);
            }
            codes.push(code);
            if q + 1 < self.num_code_groups {
                let x = self.codec_embed(q - 1, code)?.unsqueeze(0)?;
                logits = self.step(&x, q, cache)?;
            }
        }
        Ok(codes)
    }
}

/// The code predictor's per-frame steps as CUDA graphs, one per step (the prefill of 2 positions
/// with head 0, then 1 position with head q at position q + 1): positions and shapes are the same
/// in every frame, so each step is captured once and replayed per frame (field-lessons §5: capture
/// at start-up; graph output = eager output). Inputs go through static buffers (`input2`
/// `[1, 2, talker hidden]`, `input1` `[1, 1, talker hidden]`), the logits come out in the static
/// f32 `logits` `[1, 1, vocab]`, and the graphs own their KV cache. The host still picks every
/// code (greedy or sampled, unchanged), so each step is one graph launch + one 8 KiB copy back
/// instead of ~150 kernel launches.
pub struct CpGraphs {
    #[cfg(feature = "cuda")]
    steps: Vec<crate::nn::cuda_graph::Graph>,
    #[cfg(feature = "cuda")]
    input2: Tensor,
    #[cfg(feature = "cuda")]
    input1: Tensor,
    #[cfg(feature = "cuda")]
    logits: Tensor,
    /// Holds the KV buffers the graphs write (kept alive, never touched on the host again).
    #[cfg(feature = "cuda")]
    _cache: LayerCaches,
}

impl std::fmt::Debug for CpGraphs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CpGraphs")
    }
}

#[cfg(not(feature = "cuda"))]
impl CpGraphs {
    fn capture(_cp: &CodePredictor, _dtype: DType) -> Result<CpGraphs> {
        candle_core::bail!("CUDA graphs need a build with the `cuda` feature")
    }

    fn generate(
        &mut self,
        _cp: &CodePredictor,
        _talker_hidden: &Tensor,
        _code0_embed: &Tensor,
        _choose: impl FnMut(usize, &mut [f32]) -> u32,
    ) -> Result<Vec<u32>> {
        candle_core::bail!("CUDA graphs need a build with the `cuda` feature")
    }
}

#[cfg(feature = "cuda")]
impl CpGraphs {
    fn capture(cp: &CodePredictor, dtype: DType) -> Result<CpGraphs> {
        use crate::nn::cuda_graph::{Graph, htod_cache};
        let dev = &cp.device;
        if !dev.is_cuda() {
            candle_core::bail!("CUDA graphs need a CUDA device, the code predictor is on {dev:?}");
        }
        let d = cp.model.codec_embedding[0].embeddings().dim(1)?;
        let input2 = Tensor::zeros((1, 2, d), dtype, dev)?;
        let input1 = Tensor::zeros((1, 1, d), dtype, dev)?;
        let logits = Tensor::zeros((1, 1, cp.vocab_size), DType::F32, dev)?;
        let mut cache = cp.new_cache();
        let steps = cp.num_code_groups - 1;
        let _htod = htod_cache(dev)?;
        let step = |q: usize, cache: &mut LayerCaches| -> Result<()> {
            let x = if q == 0 { &input2 } else { &input1 };
            let out = cp.step_logits(x, q, cache)?;
            logits.slice_set(&out, 2, 0)
        };
        // Eager frame: allocates the KV buffers, uploads the parameter vectors, loads modules.
        cache.reset();
        for q in 0..steps {
            step(q, &mut cache)?;
        }
        dev.synchronize()?;
        cache.reset();
        let mut graphs = Vec::with_capacity(steps);
        for q in 0..steps {
            graphs.push(Graph::capture(dev, || step(q, &mut cache))?);
        }
        cache.reset();
        dev.synchronize()?;
        Ok(CpGraphs {
            steps: graphs,
            input2,
            input1,
            logits,
            _cache: cache,
        })
    }

    fn generate(
        &mut self,
        cp: &CodePredictor,
        talker_hidden: &Tensor,
        code0_embed: &Tensor,
        mut choose: impl FnMut(usize, &mut [f32]) -> u32,
    ) -> Result<Vec<u32>> {
        let groups = cp.num_code_groups;
        let mut codes = Vec::with_capacity(groups - 1);
        let prefill = Tensor::cat(&[talker_hidden, code0_embed], 1)?;
        self.input2.slice_set(&prefill, 1, 0)?;
        self.steps[0].launch()?;
        let mut logits = self.logits.flatten_all()?.to_vec1::<f32>()?;
        for q in 1..groups {
            let code = choose(q, &mut logits);
            if code as usize >= cp.vocab_size {
                candle_core::bail!("codebook {q}: chosen code {code} >= {}", cp.vocab_size);
            }
            codes.push(code);
            if q + 1 < groups {
                let x = cp.codec_embed(q - 1, code)?.unsqueeze(0)?;
                self.input1.slice_set(&x, 1, 0)?;
                self.steps[q].launch()?;
                logits = self.logits.flatten_all()?.to_vec1::<f32>()?;
            }
        }
        Ok(codes)
    }
}
