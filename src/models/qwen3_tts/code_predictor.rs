//! The code predictor ("sub-talker", MTP): a small Qwen3 decoder that fills codebooks 1.. of a
//! frame from the talker's hidden state and codebook-0 embedding (reference
//! `Qwen3TTSTalkerCodePredictorModelForConditionalGeneration`; qwen3-tts.md §4).
//! Weight prefix `talker.code_predictor.`.

use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::{Embedding, Linear};

use rand_chacha::ChaCha20Rng;

use super::config::TalkerConfig;
use super::device_sampler::DeviceSampler;
use super::sampling::TokenChooser;
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
        let Some(p) = &self.small_to_mtp_projection else {
            return Ok(x.clone());
        };
        #[cfg(feature = "cuda")]
        if let Some(bias) = p.bias()
            && crate::nn::cuda_kernels::all_usable_for(x)
            && crate::nn::cuda_kernels::gemv::takes(x, p.weight())
            && crate::nn::cuda_kernels::gemv::vector_ok(bias, p.weight().dim(0)?, x.dtype())
        {
            // One launch instead of a matmul and a bias add.
            return crate::nn::cuda_kernels::gemv::gemv_bias(x, p.weight(), bias);
        }
        p.forward(x)
    }

    /// One step on the device: `x` `[1, t, talker hidden]` at the next positions of `cache` →
    /// f32 logits of head `head`, `[1, 1, vocab_size]`.
    fn step_logits(&self, x: &Tensor, head: usize, cache: &mut LayerCaches) -> Result<Tensor> {
        let t = x.dim(1)?;
        let h = cache.run(&self.model.layers, &self.rope, &self.project(x)?)?;
        let last = h.narrow(1, t - 1, 1)?;
        let lm_head = &self.lm_head[head];
        #[cfg(feature = "cuda")]
        if crate::nn::cuda_kernels::all_usable_for(&last)
            && lm_head.bias().is_none()
            && crate::nn::cuda_kernels::gemv::takes(&last, lm_head.weight())
        {
            let norm = &self.model.norm;
            let w = norm.weight_as(last.dtype())?;
            if crate::nn::cuda_kernels::gemv::vector_ok(&w, last.dim(2)?, last.dtype()) {
                // Final norm, head and f32 cast in one launch.
                return crate::nn::cuda_kernels::gemv::norm_gemv_logits(
                    &last,
                    &w,
                    norm.eps(),
                    lm_head.weight(),
                );
            }
        }
        lm_head
            .forward(&self.model.norm.forward(&last)?)?
            .to_dtype(DType::F32)
    }

    fn step(&self, x: &Tensor, head: usize, cache: &mut LayerCaches) -> Result<Vec<f32>> {
        self.step_logits(x, head, cache)?
            .flatten_all()?
            .to_vec1::<f32>()
    }

    /// Captures a frame of the code predictor as CUDA graphs (see [`CpGraphs`]).
    /// `dtype` is the activation dtype (the model's). Runs eager frames first to allocate the
    /// KV buffers and upload the kernel parameters. Errors on a non-CUDA device or a build without
    /// the `cuda` feature.
    pub fn capture_graphs(&self, dtype: DType) -> Result<CpGraphs> {
        CpGraphs::capture(self, dtype)
    }

    /// [`Self::generate`] by replaying graphs captured with [`Self::capture_graphs`]: the same
    /// model kernels on the same data, so the same logits bit for bit. With whole-frame graphs
    /// (the default; `OMNITTS_CP_FRAME_GRAPH=0` turns them off) the codes are chosen on the device by
    /// [`DeviceSampler`] (greedy: the same
    /// codes as the host; sampling: the host's codes for the same uniforms, which are drawn from
    /// `rng` as the host sampler would, except for float-rounding ties at a CDF boundary); with
    /// per-step graphs the host picks every code with `chooser`.
    pub fn generate_graphed(
        &self,
        graphs: &mut CpGraphs,
        talker_hidden: &Tensor,
        code0_embed: &Tensor,
        chooser: &TokenChooser,
        rng: &mut ChaCha20Rng,
    ) -> Result<Vec<u32>> {
        graphs.generate(self, talker_hidden, code0_embed, chooser, rng)
    }

    /// Number of codes a frame of the code predictor produces (`num_code_groups - 1`).
    pub fn steps(&self) -> usize {
        self.num_code_groups - 1
    }

    /// A whole frame with the codes chosen on the device, chained without leaving it (the work a
    /// whole-frame CUDA graph captures; on the CPU the same ops run directly). `input2`:
    /// `[1, 2, talker hidden]` = the talker's final-normed hidden state ++ `C_talker(a0)`, in the
    /// model dtype. Step q's f32 logits `[1, 1, vocab]` go to `sampler` (greedy, or sampled with
    /// `params` = [`super::device_sampler::frame_params`], f64 `[PARAM_HEADER + steps]`); the
    /// chosen id, a u32 `[1]` tensor, is looked up in `codec_embedding[q]` for the next step (on
    /// CUDA a greedy step does both in one `argmax_embed` kernel, the same first-index argmax).
    /// `cache` is reset first (host-side only). Returns the codes, u32 `[num_code_groups - 1]`,
    /// on the device.
    pub fn frame_on_device(
        &self,
        input2: &Tensor,
        cache: &mut LayerCaches,
        sampler: &DeviceSampler,
        params: Option<&Tensor>,
    ) -> Result<Tensor> {
        cache.reset();
        let steps = self.steps();
        let mut ids = Vec::with_capacity(steps);
        let mut x = input2.clone();
        for q in 0..steps {
            let logits = self.step_logits(&x, q, cache)?;
            #[cfg(feature = "cuda")]
            if crate::nn::cuda_kernels::all_usable_for(&x) {
                use crate::nn::cuda_kernels::{argmax_embed, sample_embed};
                // The pick and the next input's embedding row in one launch.
                let table = (q + 1 < steps).then(|| self.model.codec_embedding[q].embeddings());
                let picked = match params {
                    None => Some(argmax_embed::argmax_embed(&logits, table)?),
                    Some(p)
                        if sample_embed::enabled()
                            && sampler.vocab() <= sample_embed::MAX_VOCAB =>
                    {
                        Some(sample_embed::sample_embed(&logits, p, q, table)?)
                    }
                    Some(_) => None,
                };
                if let Some((id, next)) = picked {
                    if let Some(next) = next {
                        x = next;
                    }
                    ids.push(id);
                    continue;
                }
            }
            let id = match params {
                Some(p) => sampler.sample(&logits, p, q)?,
                None => sampler.greedy(&logits)?,
            };
            if q + 1 < steps {
                x = self.model.codec_embedding[q]
                    .embeddings()
                    .index_select(&id, 0)?
                    .unsqueeze(0)?;
            }
            ids.push(id);
        }
        Tensor::cat(&ids, 0)
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

/// The code predictor's frame as CUDA graphs, captured once at start-up (field-lessons §5:
/// positions and shapes are the same in every frame; graph output = eager output). Two kinds:
///
/// - **whole frame** (the default; docs/cuda.md has its GPU parity and speed): all
///   `num_code_groups - 1` steps in one graph with the codes
///   chosen on the device ([`CodePredictor::frame_on_device`]); two graphs, greedy and sampling.
///   Per frame the host uploads the prefill `[1, 2, talker hidden]` into a static buffer (and, when
///   sampling, the warper parameters and one pre-drawn uniform per step, f64
///   `[PARAM_HEADER + steps]`), replays once and copies the `steps` u32 codes back: one host round
///   trip per frame instead of one per step.
/// - **per step** (`OMNITTS_CP_FRAME_GRAPH=0`): one graph per step (the prefill of 2
///   positions with head 0, then 1 position with head q at position q + 1), the f32 logits
///   `[1, 1, vocab]` copied back after each and the code picked on the host.
///
/// The graphs own their KV cache and the device sampler's constants.
pub struct CpGraphs {
    #[cfg(feature = "cuda")]
    kind: GraphKind,
    #[cfg(feature = "cuda")]
    input2: Tensor,
    /// Holds the KV buffers the graphs write (kept alive, never touched on the host again).
    #[cfg(feature = "cuda")]
    _cache: LayerCaches,
}

#[cfg(feature = "cuda")]
enum GraphKind {
    Frame {
        greedy: crate::nn::cuda_graph::Graph,
        sample: crate::nn::cuda_graph::Graph,
        /// f64 `[PARAM_HEADER + steps]`, read by the sampling graph.
        params: Tensor,
        /// u32 `[steps]`, written by both graphs.
        codes: Tensor,
        /// Constants the sampling graph reads (kept alive).
        _sampler: DeviceSampler,
    },
    Steps {
        steps: Vec<crate::nn::cuda_graph::Graph>,
        input1: Tensor,
        logits: Tensor,
    },
}

impl std::fmt::Debug for CpGraphs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CpGraphs")
    }
}

impl CpGraphs {
    /// Whether a frame is one graph with sampling on the device (else one graph per step).
    pub fn whole_frame(&self) -> bool {
        #[cfg(feature = "cuda")]
        return matches!(self.kind, GraphKind::Frame { .. });
        #[cfg(not(feature = "cuda"))]
        false
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
        _chooser: &TokenChooser,
        _rng: &mut ChaCha20Rng,
    ) -> Result<Vec<u32>> {
        candle_core::bail!("CUDA graphs need a build with the `cuda` feature")
    }
}

#[cfg(feature = "cuda")]
impl CpGraphs {
    fn capture(cp: &CodePredictor, dtype: DType) -> Result<CpGraphs> {
        let dev = &cp.device;
        if !dev.is_cuda() {
            candle_core::bail!("CUDA graphs need a CUDA device, the code predictor is on {dev:?}");
        }
        let whole_frame = !std::env::var("OMNITTS_CP_FRAME_GRAPH").is_ok_and(|v| v == "0");
        if whole_frame {
            Self::capture_frame(cp, dtype)
        } else {
            Self::capture_steps(cp, dtype)
        }
    }

    fn capture_frame(cp: &CodePredictor, dtype: DType) -> Result<CpGraphs> {
        use super::device_sampler::PARAM_HEADER;
        use crate::nn::cuda_graph::{Graph, htod_cache};
        let dev = &cp.device;
        let d = cp.model.codec_embedding[0].embeddings().dim(1)?;
        let steps = cp.steps();
        let input2 = Tensor::zeros((1, 2, d), dtype, dev)?;
        let codes = Tensor::zeros(steps, DType::U32, dev)?;
        // Valid values for the warm-up (temperature 1, no top-k, no top-p, u = 0.5).
        let mut init = vec![1.0, 0.0, -1.0];
        init.resize(PARAM_HEADER + steps, 0.5);
        let params = Tensor::from_vec(init, PARAM_HEADER + steps, dev)?;
        let sampler = DeviceSampler::new(cp.vocab_size, dev)?;
        let mut cache = cp.new_cache();
        let _htod = htod_cache(dev)?;
        let frame = |cache: &mut LayerCaches, sample: bool| -> Result<()> {
            let out = cp.frame_on_device(&input2, cache, &sampler, sample.then_some(&params))?;
            codes.slice_set(&out, 0, 0)
        };
        // Eager frames: allocate the KV buffers, upload the parameter vectors, load modules.
        frame(&mut cache, false)?;
        frame(&mut cache, true)?;
        dev.synchronize()?;
        let greedy = Graph::capture(dev, || frame(&mut cache, false))?;
        let sample = Graph::capture(dev, || frame(&mut cache, true))?;
        cache.reset();
        dev.synchronize()?;
        Ok(CpGraphs {
            kind: GraphKind::Frame {
                greedy,
                sample,
                params,
                codes,
                _sampler: sampler,
            },
            input2,
            _cache: cache,
        })
    }

    fn capture_steps(cp: &CodePredictor, dtype: DType) -> Result<CpGraphs> {
        use crate::nn::cuda_graph::{Graph, htod_cache};
        let dev = &cp.device;
        let d = cp.model.codec_embedding[0].embeddings().dim(1)?;
        let input2 = Tensor::zeros((1, 2, d), dtype, dev)?;
        let input1 = Tensor::zeros((1, 1, d), dtype, dev)?;
        let logits = Tensor::zeros((1, 1, cp.vocab_size), DType::F32, dev)?;
        let mut cache = cp.new_cache();
        let steps = cp.steps();
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
            kind: GraphKind::Steps {
                steps: graphs,
                input1,
                logits,
            },
            input2,
            _cache: cache,
        })
    }

    fn generate(
        &mut self,
        cp: &CodePredictor,
        talker_hidden: &Tensor,
        code0_embed: &Tensor,
        chooser: &TokenChooser,
        rng: &mut ChaCha20Rng,
    ) -> Result<Vec<u32>> {
        let groups = cp.num_code_groups;
        let prefill = Tensor::cat(&[talker_hidden, code0_embed], 1)?;
        self.input2.slice_set(&prefill, 1, 0)?;
        let (steps, input1, logits) = match &self.kind {
            GraphKind::Frame {
                greedy,
                sample,
                params,
                codes,
                ..
            } => {
                if chooser.do_sample {
                    let p = super::device_sampler::frame_params(
                        chooser,
                        cp.vocab_size,
                        cp.steps(),
                        rng,
                    );
                    params.slice_set(&Tensor::from_vec(p, params.dims1()?, &cp.device)?, 0, 0)?;
                    sample.launch()?;
                } else {
                    greedy.launch()?;
                }
                let codes = codes.to_vec1::<u32>()?;
                if let Some(c) = codes.iter().find(|&&c| c as usize >= cp.vocab_size) {
                    candle_core::bail!("code predictor graph: code {c} >= {}", cp.vocab_size);
                }
                return Ok(codes);
            }
            GraphKind::Steps {
                steps,
                input1,
                logits,
            } => (steps, input1, logits),
        };
        let mut codes = Vec::with_capacity(groups - 1);
        steps[0].launch()?;
        let mut host = logits.flatten_all()?.to_vec1::<f32>()?;
        for q in 1..groups {
            let code = chooser.choose(&mut host, rng);
            if code as usize >= cp.vocab_size {
                candle_core::bail!("codebook {q}: chosen code {code} >= {}", cp.vocab_size);
            }
            codes.push(code);
            if q + 1 < groups {
                let x = cp.codec_embed(q - 1, code)?.unsqueeze(0)?;
                input1.slice_set(&x, 1, 0)?;
                steps[q].launch()?;
                host = logits.flatten_all()?.to_vec1::<f32>()?;
            }
        }
        Ok(codes)
    }
}
