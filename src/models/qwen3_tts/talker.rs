//! The talker: a Qwen3 decoder over summed text + codec embeddings with a codec head
//! (reference `Qwen3TTSTalkerForConditionalGeneration` / `Qwen3TTSTalkerModel`; docs/qwen3-tts.md
//! §3). Weight prefix `talker.`.

use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::Embedding;

use super::config::TalkerConfig;
use crate::nn::{
    DecoderLayer, LayerCaches, Linear, RmsNorm, RotaryEmbedding, WeightError, Weights,
};

/// `talker.model`: embeddings, decoder layers and final norm.
#[derive(Debug, Clone)]
pub struct TalkerModel {
    /// `[text_vocab_size, text_hidden_size]`; on the CPU its rows are read from the mapped
    /// checkpoint when looked up ([`crate::nn::Embedding::Mapped`]).
    pub text_embedding: crate::nn::Embedding,
    /// `[vocab_size, hidden]`: codebook-0 codes, control tags, languages, speakers.
    pub codec_embedding: Embedding,
    pub layers: Vec<DecoderLayer>,
    pub norm: RmsNorm,
}

impl TalkerModel {
    pub fn new(cfg: &TalkerConfig, vb: &Weights) -> std::result::Result<Self, WeightError> {
        let t = &cfg.transformer;
        let layers = (0..t.num_hidden_layers)
            .map(|i| DecoderLayer::new(t, &vb.pp(format!("layers.{i}"))))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(Self {
            text_embedding: vb.mapped_embedding(
                cfg.text_vocab_size,
                cfg.text_hidden_size,
                "text_embedding",
            )?,
            codec_embedding: vb.embedding(cfg.vocab_size, t.hidden_size, "codec_embedding")?,
            layers,
            norm: RmsNorm::new(t.hidden_size, t.rms_norm_eps, &vb.pp("norm"))?,
        })
    }
}

/// `talker.text_projection` (reference `Qwen3TTSTalkerResizeMLP`):
/// `linear_fc2(silu(linear_fc1(x)))`, both with bias;
/// fc1 `[text_hidden, text_hidden]`, fc2 `[hidden, text_hidden]`.
#[derive(Debug, Clone)]
pub struct TextProjection {
    pub linear_fc1: Linear,
    pub linear_fc2: Linear,
}

impl TextProjection {
    pub fn new(cfg: &TalkerConfig, vb: &Weights) -> std::result::Result<Self, WeightError> {
        let th = cfg.text_hidden_size;
        Ok(Self {
            linear_fc1: vb.linear(th, th, true, "linear_fc1")?,
            linear_fc2: vb.linear(th, cfg.transformer.hidden_size, true, "linear_fc2")?,
        })
    }

    /// `[.., text_hidden]` → `[.., hidden]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = candle_nn::ops::silu(&self.linear_fc1.forward(x)?)?;
        self.linear_fc2.forward(&h)
    }
}

/// The talker (without its code predictor, see `code_predictor.rs`).
#[derive(Debug, Clone)]
pub struct Talker {
    pub model: TalkerModel,
    pub text_projection: TextProjection,
    /// `[vocab_size, hidden]`, no bias; always dense (the logits are the checkpoint's f32
    /// products whatever the quantization).
    pub codec_head: Linear,
    rope: RotaryEmbedding,
    cfg: TalkerConfig,
    device: Device,
}

impl Talker {
    /// Loads at `vb` = the `talker` prefix.
    pub fn new(cfg: &TalkerConfig, vb: &Weights) -> std::result::Result<Self, WeightError> {
        let t = &cfg.transformer;
        Ok(Self {
            model: TalkerModel::new(cfg, &vb.pp("model"))?,
            text_projection: TextProjection::new(cfg, &vb.pp("text_projection"))?,
            codec_head: vb
                .dense()
                .linear(t.hidden_size, cfg.vocab_size, false, "codec_head")?,
            rope: RotaryEmbedding::new(t.head_dim, t.rope_theta, vb.device()),
            cfg: cfg.clone(),
            device: vb.device().clone(),
        })
    }

    pub fn config(&self) -> &TalkerConfig {
        &self.cfg
    }

    /// The device the weights are on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The RoPE tables (f32, cached on the device).
    pub fn rope(&self) -> &RotaryEmbedding {
        &self.rope
    }

    pub fn hidden_size(&self) -> usize {
        self.cfg.transformer.hidden_size
    }

    fn ids_tensor(&self, ids: &[u32], limit: usize, what: &str) -> Result<Tensor> {
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= limit) {
            candle_core::bail!("{what} id {bad} is outside the table of {limit} rows");
        }
        Tensor::new(ids, &self.device)
    }

    /// `T(ids)`: text embedding + text projection. Returns `[ids.len(), hidden]`.
    pub fn text_embed(&self, ids: &[u32]) -> Result<Tensor> {
        let ids = self.ids_tensor(ids, self.cfg.text_vocab_size, "text")?;
        self.text_projection
            .forward(&self.model.text_embedding.forward(&ids)?)
    }

    /// `C(ids)`: rows of the codec embedding. Returns `[ids.len(), hidden]`.
    pub fn codec_embed(&self, ids: &[u32]) -> Result<Tensor> {
        let ids = self.ids_tensor(ids, self.cfg.vocab_size, "codec")?;
        self.model.codec_embedding.forward(&ids)
    }

    /// A fresh KV cache for one utterance.
    pub fn new_cache(&self, capacity_hint: usize) -> LayerCaches {
        LayerCaches::new(self.cfg.transformer.num_hidden_layers, capacity_hint)
    }

    /// Runs `embeds` (`[1, t, hidden]`, the model dtype) at the next positions of `cache`.
    /// Returns the final-normed hidden state of the last position (`[1, 1, hidden]`) and the
    /// codec-head logits of that position as f32 (`vocab_size` values).
    pub fn forward(&self, embeds: &Tensor, cache: &mut LayerCaches) -> Result<(Tensor, Vec<f32>)> {
        let h = self.run(embeds, cache)?;
        self.head(&h.narrow(1, h.dim(1)? - 1, 1)?)
    }

    /// The decoder layers alone over `embeds` (`[1, t, hidden]`) at the next positions of
    /// `cache` (a prefill chunk): the last layer's output `[1, t, hidden]`, before the final norm.
    pub fn run(&self, embeds: &Tensor, cache: &mut LayerCaches) -> Result<Tensor> {
        cache.run(&self.model.layers, &self.rope, embeds)
    }

    /// The final norm and the codec head of last positions `last` (`[rows, 1, hidden]`, a layer
    /// output): the final-normed hidden states `[rows, 1, hidden]` and the logits as f32,
    /// `rows × vocab_size` values row after row.
    pub fn head(&self, last: &Tensor) -> Result<(Tensor, Vec<f32>)> {
        let last = self.model.norm.forward(last)?;
        let logits = self
            .codec_head
            .forward(&last)?
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        Ok((last, logits))
    }

    /// One decode position for each of `caches.len()` utterances, each at its own position with
    /// its own KV cache ([`LayerCaches::run_rows`]): `input` `[rows, 1, hidden]`. Returns the
    /// final-normed hidden states `[rows, 1, hidden]` and each row's codec-head logits (f32,
    /// `vocab_size` values), as [`Self::forward`] gives them for each row alone up to float
    /// rounding.
    pub fn decode_rows(
        &self,
        input: &Tensor,
        caches: &mut [&mut LayerCaches],
    ) -> Result<(Tensor, Vec<Vec<f32>>)> {
        let h = LayerCaches::run_rows(&self.model.layers, &self.rope, input, caches)?;
        let (hidden, logits) = self.head(&h)?;
        let rows = logits
            .chunks(self.cfg.vocab_size)
            .map(<[f32]>::to_vec)
            .collect();
        Ok((hidden, rows))
    }
}
