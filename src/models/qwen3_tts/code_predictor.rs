//! The code predictor ("sub-talker", MTP): a small Qwen3 decoder that fills codebooks 1.. of a
//! frame from the talker's hidden state and codebook-0 embedding (reference
//! `Qwen3TTSTalkerCodePredictorModelForConditionalGeneration`; docs/qwen3-tts.md §4).
//! Weight prefix `talker.code_predictor.`.

use candle_core::{DType, Device, Module, Result, Tensor};

use super::config::TalkerConfig;
use super::device_sampler::DeviceSampler;
use candle_nn::Embedding;

use crate::nn::{
    DecoderLayer, LayerCaches, Linear, RmsNorm, RotaryEmbedding, WeightError, Weights,
};

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
    /// `num_code_groups - 1` heads `[cp vocab_size, cp hidden]`, no bias; always dense.
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
                    .dense()
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

    /// The device the weights are on.
    pub fn device(&self) -> &Device {
        &self.device
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
        if let (Some(bias), Some(weight)) = (p.bias(), p.weight())
            && crate::nn::cuda_kernels::all_usable_for(x)
            && crate::nn::cuda_kernels::gemv::takes(x, weight)
            && crate::nn::cuda_kernels::gemv::vector_ok(bias, weight.dim(0)?, x.dtype())
        {
            // One launch instead of a matmul and a bias add.
            return crate::nn::cuda_kernels::gemv::gemv_bias(x, weight, bias);
        }
        p.forward(x)
    }

    /// One step on the device: `x` `[rows, t, talker hidden]` at the next positions of `cache` →
    /// f32 logits of head `head` for the last position, `[rows, 1, vocab_size]`.
    pub(super) fn step_logits(
        &self,
        x: &Tensor,
        head: usize,
        cache: &mut LayerCaches,
    ) -> Result<Tensor> {
        let t = x.dim(1)?;
        let h = cache.run(&self.model.layers, &self.rope, &self.project(x)?)?;
        let last = h.narrow(1, t - 1, 1)?;
        let lm_head = &self.lm_head[head];
        #[cfg(feature = "cuda")]
        if let Some(head_weight) = lm_head.weight()
            && crate::nn::cuda_kernels::all_usable_for(&last)
            && lm_head.bias().is_none()
            && crate::nn::cuda_kernels::gemv::takes(&last, head_weight)
        {
            let norm = &self.model.norm;
            let w = norm.weight_as(last.dtype())?;
            if crate::nn::cuda_kernels::gemv::vector_ok(&w, last.dim(2)?, last.dtype()) {
                // Final norm, head and f32 cast in one launch.
                return crate::nn::cuda_kernels::gemv::norm_gemv_logits(
                    &last,
                    &w,
                    norm.eps(),
                    head_weight,
                );
            }
        }
        lm_head
            .forward(&self.model.norm.forward(&last)?)?
            .to_dtype(DType::F32)
    }

    /// [`Self::step_logits`] on the host: `rows × vocab_size` values, row after row.
    fn step(&self, x: &Tensor, head: usize, cache: &mut LayerCaches) -> Result<Vec<f32>> {
        self.step_logits(x, head, cache)?
            .flatten_all()?
            .to_vec1::<f32>()
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
        let rows = self.generate_rows(talker_hidden, code0_embed, cache, |_, q, l| choose(q, l))?;
        let n = rows.len();
        match <[Vec<u32>; 1]>::try_from(rows) {
            Ok([codes]) => Ok(codes),
            Err(_) => candle_core::bail!("code predictor: one frame asked, {n} made"),
        }
    }

    /// [`Self::generate`] for the frames of `rows` utterances at once: `talker_hidden` and
    /// `code0_embed` `[rows, 1, talker hidden]`. Every row is at the same positions, so they run
    /// as the batch dimension of every step (`cache` holds `rows` sequences).
    /// `choose(row, q, logits)` picks row `row`'s codebook-`q` code; within a step the rows are
    /// asked in order. Returns each row's `num_code_groups - 1` codes. For one row this is
    /// exactly [`Self::generate`]; for several, each row's logits equal its own frame's up to the
    /// matmul's float rounding.
    pub fn generate_rows(
        &self,
        talker_hidden: &Tensor,
        code0_embed: &Tensor,
        cache: &mut LayerCaches,
        mut choose: impl FnMut(usize, usize, &mut [f32]) -> u32,
    ) -> Result<Vec<Vec<u32>>> {
        cache.reset();
        let rows = talker_hidden.dim(0)?;
        let mut codes = vec![Vec::with_capacity(self.num_code_groups - 1); rows];
        let prefill = Tensor::cat(&[talker_hidden, code0_embed], 1)?;
        let mut logits = self.step(&prefill, 0, cache)?;
        for q in 1..self.num_code_groups {
            let mut ids = Vec::with_capacity(rows);
            for (row, l) in logits.chunks_mut(self.vocab_size).enumerate() {
                let code = choose(row, q, l);
                if code as usize >= self.vocab_size {
                    candle_core::bail!("codebook {q}: chosen code {code} >= {}", self.vocab_size);
                }
                codes[row].push(code);
                ids.push(code);
            }
            if q + 1 < self.num_code_groups {
                let ids = Tensor::from_vec(ids, rows, &self.device)?;
                let x = self.model.codec_embedding[q - 1]
                    .forward(&ids)?
                    .unsqueeze(1)?;
                logits = self.step(&x, q, cache)?;
            }
        }
        Ok(codes)
    }
}
