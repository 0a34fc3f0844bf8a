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

    fn step(&self, x: &Tensor, head: usize, cache: &mut LayerCaches) -> Result<Vec<f32>> {
        let t = x.dim(1)?;
        let h = cache.run(&self.model.layers, &self.rope, &self.project(x)?)?;
        let last = self.model.norm.forward(&h.narrow(1, t - 1, 1)?)?;
        self.lm_head[head]
            .forward(&last)?
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()
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
