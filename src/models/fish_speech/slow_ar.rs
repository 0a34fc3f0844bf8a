//! The slow AR: a Qwen3 backbone over the prompt and the generated frames (`text_model.model.*`
//! in the checkpoint: `embeddings`, `layers.N`, `norm`; the codebook embeddings live under
//! `audio_decoder.codebook_embeddings`).
//!
//! Input at position p: the token embedding of `rows[0][p]`; at a semantic position (a token in
//! `<|semantic:0|>..=<|semantic:4095|>`) plus the sum of the 10 codebook embeddings
//! `codebook_embeddings[rows[1 + i][p] + i · codebook_size]`, the whole divided by
//! `sqrt(num_codebooks + 1)` (= sqrt(11)). Output: the final-normed hidden state of the last
//! position (the fast AR's input) and its logits over the allowed tokens only — the 4096
//! semantic tokens, then `<|im_end|>` — through the tied embedding (or `output` when untied).

use candle_core::{DType, Device, Tensor};

use super::config::{FishConfig, StackDims};
use super::error::{FishError, Result};
use super::layers::{load_stack, rope};
use super::tokenizer::FishTokenizer;
use crate::nn::{DecoderLayer, LayerCaches, RmsNorm, RotaryEmbedding, Weights};

/// Positions a KV cache grows by.
const CACHE_STEP: usize = 256;

/// The slow AR's weights.
#[derive(Debug, Clone)]
pub struct SlowAr {
    /// Token embeddings `[vocab, dim]`.
    embeddings: Tensor,
    /// `[num_codebooks · codebook_size, dim]`.
    codebook_embeddings: Tensor,
    /// `text_model.model.layers.N` ([`super::layers`]).
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    /// The head rows of the allowed tokens, `[num_semantic + 1, dim]`: semantic 0..N, then
    /// `<|im_end|>`.
    head: Tensor,
    rope: RotaryEmbedding,
    dims: StackDims,
    semantic_begin: u32,
    semantic_end: u32,
    im_end: u32,
    num_codebooks: usize,
    codebook_size: usize,
    max_seq_len: usize,
    /// `sqrt(num_codebooks + 1)` as a scalar tensor (f32).
    scale: Tensor,
}

impl SlowAr {
    /// Loads the slow AR from `vb` (the checkpoint root) in `vb`'s dtype.
    pub fn new(cfg: &FishConfig, tok: &FishTokenizer, vb: &Weights) -> Result<Self> {
        let d = cfg.slow();
        let t = &cfg.text_config;
        let m = vb.pp("text_model.model");
        let embeddings = m.get(&[t.vocab_size, d.dim], "embeddings.weight")?;
        let (ncb, cbs) = (cfg.num_codebooks(), cfg.codebook_size());
        let codebook_embeddings = vb.get(
            &[ncb * cbs, d.dim],
            "audio_decoder.codebook_embeddings.weight",
        )?;
        let head_full = if t.tie_word_embeddings {
            embeddings.clone()
        } else {
            m.get(&[t.vocab_size, d.dim], "output.weight")?
        };
        if tok.semantic_end as usize >= t.vocab_size || tok.im_end as usize >= t.vocab_size {
            return Err(FishError::Config {
                path: "config.json".into(),
                msg: format!(
                    "the tokenizer's semantic/<|im_end|> ids exceed vocab_size {}",
                    t.vocab_size
                ),
            });
        }
        if let (Some(s), Some(e)) = (cfg.semantic_start_token_id, cfg.semantic_end_token_id)
            && (s, e) != (tok.semantic_begin, tok.semantic_end)
        {
            return Err(FishError::Config {
                path: "config.json".into(),
                msg: format!(
                    "semantic ids {s}..={e} differ from the tokenizer's {}..={}",
                    tok.semantic_begin, tok.semantic_end
                ),
            });
        }
        let n_sem = tok.num_semantic();
        let head = Tensor::cat(
            &[
                head_full.narrow(0, tok.semantic_begin as usize, n_sem)?,
                head_full.narrow(0, tok.im_end as usize, 1)?,
            ],
            0,
        )?
        .contiguous()?;
        let device = vb.device().clone();
        Ok(Self {
            layers: load_stack(&d, &m)?,
            norm: RmsNorm::new(d.dim, d.norm_eps, &m.pp("norm"))?,
            rope: rope(&d, &device),
            scale: Tensor::new(((ncb + 1) as f32).sqrt(), &device)?.to_dtype(vb.dtype())?,
            embeddings,
            codebook_embeddings,
            head,
            dims: d,
            semantic_begin: tok.semantic_begin,
            semantic_end: tok.semantic_end,
            im_end: tok.im_end,
            num_codebooks: ncb,
            codebook_size: cbs,
            max_seq_len: t.max_seq_len,
        })
    }

    /// Longest sequence (prompt + frames) the RoPE table covers.
    pub fn max_seq_len(&self) -> usize {
        self.max_seq_len
    }

    /// Residual width.
    pub fn dim(&self) -> usize {
        self.dims.dim
    }

    /// The dtype of the weights (the rows' activations).
    pub fn dtype(&self) -> DType {
        self.embeddings.dtype()
    }

    pub fn device(&self) -> &Device {
        self.embeddings.device()
    }

    /// An empty KV cache.
    pub fn new_cache(&self) -> LayerCaches {
        LayerCaches::new(self.layers.len(), CACHE_STEP)
    }

    /// Input embeddings of `batch` sequences of equal length: `rows[b]` holds
    /// `1 + num_codebooks` rows of ids (see the module docs). Returns `[batch, t, dim]`.
    pub fn embed(&self, batch: &[&[Vec<u32>]]) -> Result<Tensor> {
        let b = batch.len();
        let t = batch.first().map_or(0, |r| r[0].len());
        let rows = self.num_codebooks + 1;
        let mut tokens = Vec::with_capacity(b * t);
        let mut semantic = Vec::with_capacity(b * t);
        let mut codes: Vec<Vec<u32>> = vec![Vec::with_capacity(b * t); self.num_codebooks];
        for seq in batch {
            if seq.len() != rows || seq.iter().any(|r| r.len() != t) {
                return Err(FishError::InvalidRequest {
                    field: "prompt",
                    msg: format!("expected {rows} rows of {t} ids"),
                });
            }
            for p in 0..t {
                let tok = seq[0][p];
                tokens.push(tok);
                semantic.push(u8::from(
                    (self.semantic_begin..=self.semantic_end).contains(&tok),
                ));
                for (i, c) in codes.iter_mut().enumerate() {
                    let code = seq[1 + i][p];
                    if code as usize >= self.codebook_size {
                        return Err(FishError::InvalidRequest {
                            field: "codes",
                            msg: format!("code {code} ≥ codebook size {}", self.codebook_size),
                        });
                    }
                    c.push(code + (i * self.codebook_size) as u32);
                }
            }
        }
        let dev = self.device();
        let ids = Tensor::new(tokens.as_slice(), dev)?;
        let x = self.embeddings.index_select(&ids, 0)?;
        let mut vq: Option<Tensor> = None;
        for c in &codes {
            let e = self
                .codebook_embeddings
                .index_select(&Tensor::new(c.as_slice(), dev)?, 0)?;
            vq = Some(match vq {
                Some(s) => (s + e)?,
                None => e,
            });
        }
        let mask = Tensor::new(semantic.as_slice(), dev)?.unsqueeze(1)?;
        let x = match vq {
            Some(vq) => {
                let with_codes = (&x + vq)?.broadcast_div(&self.scale)?;
                let shape = x.shape().clone();
                mask.broadcast_as(shape)?.where_cond(&with_codes, &x)?
            }
            None => x,
        };
        Ok(x.reshape((b, t, self.dims.dim))?)
    }

    /// Runs `x` `[b, t, dim]` through the stack (appending to `cache`); returns the logits of the
    /// last position over the allowed tokens `[b, num_semantic + 1]` (f32) and its final-normed
    /// hidden state `[b, dim]`. Errors past `max_seq_len`.
    pub fn forward(&self, x: &Tensor, cache: &mut LayerCaches) -> Result<(Tensor, Tensor)> {
        let t = x.dim(1)?;
        self.check_room(cache.seq_len() + t)?;
        let h = cache.run(&self.layers, &self.rope, x)?;
        self.head(&h.narrow(1, t - 1, 1)?.squeeze(1)?)
    }

    /// One position for each of several sequences, each at its own position with its own cache:
    /// `x` `[rows, 1, dim]`, row i appended to `caches[i]` (on CUDA one batched step over every
    /// row: [`LayerCaches::decode_rows`]). Returns [`Self::forward`]'s values for every row,
    /// `[rows, num_semantic + 1]` and `[rows, dim]`, each row's equal to its own
    /// [`Self::forward`] up to the matmul's summation order. Errors past `max_seq_len`.
    pub fn forward_rows(
        &self,
        x: &Tensor,
        caches: &mut [&mut LayerCaches],
    ) -> Result<(Tensor, Tensor)> {
        for c in caches.iter() {
            self.check_room(c.seq_len() + 1)?;
        }
        let h = LayerCaches::decode_rows(&self.layers, &self.rope, x, caches)?;
        self.head(&h.squeeze(1)?)
    }

    /// The decoder layers (`text_model.model.layers.N`).
    #[cfg(feature = "cuda")]
    pub(crate) fn layers(&self) -> &[DecoderLayer] {
        &self.layers
    }

    /// The RoPE table (bf16-rounded, interleaved pairs reordered: `layers.rs`).
    #[cfg(feature = "cuda")]
    pub(crate) fn rope(&self) -> &RotaryEmbedding {
        &self.rope
    }

    /// One decode position of every row on the fused batched kernels, as a CUDA graph captures
    /// it: `x` `[rows, 1, dim]`, the rows' caches and positions in `tables`
    /// ([`crate::nn::rows_decode::run_rows_fused`]; the caches are not advanced), then the head.
    /// Returns [`Self::forward_rows`]' values.
    #[cfg(feature = "cuda")]
    pub(crate) fn rows_step_fused(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        tables: &crate::nn::rows_decode::RowTables,
        max_keys: usize,
    ) -> Result<(Tensor, Tensor)> {
        let h =
            crate::nn::rows_decode::run_rows_fused(&self.layers, x, cos, sin, tables, max_keys)?;
        self.head(&h.squeeze(1)?)
    }

    /// An error when `positions` exceed `max_seq_len`.
    pub(crate) fn check_room(&self, positions: usize) -> Result<()> {
        if positions > self.max_seq_len {
            return Err(FishError::InvalidRequest {
                field: "prompt",
                msg: format!(
                    "{positions} positions exceed max_seq_len {}",
                    self.max_seq_len
                ),
            });
        }
        Ok(())
    }

    /// The final norm and the allowed-token logits of `last` `[b, dim]`.
    fn head(&self, last: &Tensor) -> Result<(Tensor, Tensor)> {
        let hidden = self.norm.forward(last)?;
        let logits = hidden.matmul(&self.head.t()?)?.to_dtype(DType::F32)?;
        Ok((logits, hidden))
    }

    /// The token id of allowed-logit index `i` (semantic `i`, or `<|im_end|>` for the last).
    pub fn allowed_token(&self, i: usize) -> u32 {
        let n_sem = (self.semantic_end - self.semantic_begin + 1) as usize;
        if i < n_sem {
            self.semantic_begin + i as u32
        } else {
            self.im_end
        }
    }

    /// Codebook 0 of a frame whose main token is `token`: `token − semantic_begin`, and 0 when
    /// that is outside `0..codebook_size` (`<|im_end|>` maps to 0), as the reference does.
    pub fn code0(&self, token: u32) -> u32 {
        let c = token as i64 - self.semantic_begin as i64;
        if c < 0 || c >= self.codebook_size as i64 {
            0
        } else {
            c as u32
        }
    }

    pub fn im_end(&self) -> u32 {
        self.im_end
    }

    pub fn is_semantic(&self, token: u32) -> bool {
        (self.semantic_begin..=self.semantic_end).contains(&token)
    }
}
