//! Per-utterance generation state over a shared [`ArModel`]: an [`ArSession`] holds one utterance's
//! talker KV cache, decoding settings, RNG stream and codebook-0 history, and makes its frames one
//! at a time ([`ArSession::next_frame`]) or together with other sessions' in one batched forward
//! ([`ArModel::next_frames`], `batch.rs`). Sessions start from a prefill (`prefill.rs`).

use std::time::Instant;

use candle_core::Tensor;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

use super::ar_model::ArModel;
use super::graphs::TalkerCache;
use super::prompt::Prompt;
use super::sampling::{TalkerProcessors, TokenChooser};
use crate::models::tts::ModelError;
use crate::models::tts::SamplingParams;
pub use crate::models::tts::{ArStep, FinishReason};
use crate::nn::LayerCaches;

/// One utterance's decoding settings and random stream (from its [`SamplingParams`]).
#[derive(Debug, Clone)]
pub(super) struct Decoding {
    processors: TalkerProcessors,
    talker_chooser: TokenChooser,
    pub(super) cp_chooser: TokenChooser,
    max_new_tokens: usize,
    /// The ChaCha20 stream of every draw of the utterance, in the order the frames make them.
    pub(super) rng: ChaCha20Rng,
}

impl Decoding {
    /// The settings of `sampling` (validated) with the checkpoint's codec EOS id.
    pub(super) fn new(sampling: &SamplingParams, eos: u32) -> Self {
        Self {
            processors: TalkerProcessors {
                repetition_penalty: sampling.repetition_penalty as f32,
                min_new_tokens: 2,
                eos,
            },
            talker_chooser: TokenChooser {
                do_sample: sampling.do_sample,
                temperature: sampling.temperature as f32,
                top_k: sampling.top_k,
                top_p: sampling.top_p as f32,
            },
            cp_chooser: TokenChooser {
                do_sample: sampling.subtalker_do_sample,
                temperature: sampling.subtalker_temperature as f32,
                top_k: sampling.subtalker_top_k,
                top_p: sampling.subtalker_top_p as f32,
            },
            max_new_tokens: sampling.max_new_tokens,
            rng: ChaCha20Rng::seed_from_u64(sampling.seed),
        }
    }
}

/// One utterance in progress: the talker KV cache and the sampling state. Dropping it gives
/// leased talker decode graphs back to the model. Made by [`ArModel::start`] or
/// [`PendingSession::into_session`](super::PendingSession::into_session).
pub struct ArSession<'a> {
    pub(super) model: &'a ArModel,
    pub(super) decoding: Decoding,
    prompt: Prompt,
    prefill: Tensor,
    /// `[trailing.len(), hidden]`.
    trailing: Tensor,
    /// Rows of `trailing` that are text (0 when an open text had none yet).
    trailing_rows: usize,
    /// Open text ([`ArSession::extend_text`]): the text rows that arrived after the start, each
    /// `[k, hidden]`, in order.
    more_text: Vec<Tensor>,
    /// Text rows in `more_text`.
    more_rows: usize,
    /// The text is still open: a frame whose text row has not arrived waits.
    text_open: bool,
    pub(super) cache: TalkerCache<'a>,
    cp_cache: LayerCaches,
    /// Final-normed talker hidden state of the last position, `[1, 1, hidden]`.
    pub(super) hidden: Tensor,
    /// Codec-head logits of the last position (f32).
    logits: Vec<f32>,
    /// Codebook-0 tokens sampled so far.
    history: Vec<u32>,
    frames: usize,
    finished: Option<FinishReason>,
    timing: StepTiming,
}

/// What a prefill leaves for the first frame: the session's parts and the last prompt position's
/// final-normed hidden state `[1, 1, hidden]` and codec-head logits.
pub(super) struct Prefilled<'a> {
    pub(super) model: &'a ArModel,
    pub(super) decoding: Decoding,
    pub(super) prompt: Prompt,
    pub(super) prefill: Tensor,
    pub(super) trailing: Tensor,
    /// Rows of `trailing` that are text.
    pub(super) trailing_rows: usize,
    /// Whether the text is still open ([`ArSession::extend_text`]).
    pub(super) text_open: bool,
    pub(super) cache: TalkerCache<'a>,
    pub(super) hidden: Tensor,
    pub(super) logits: Vec<f32>,
}

/// Wall-clock split of the last [`ArSession::next_frame`] that produced a frame, in ms. Both device
/// parts end with a device-to-host copy of logits, so on a GPU they include the device work.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTiming {
    /// The code predictor's 15 steps (codebooks 1..), sampling included; for a frame of several
    /// rows on the batched frame graphs, the whole replay (code predictor and talker step) from
    /// its launch to the codes and logits read back.
    pub code_predictor_ms: f64,
    /// The talker decode step that follows (input sum, 1 position, codec-head logits); 0 when
    /// `code_predictor_ms` holds the whole replay.
    pub talker_ms: f64,
    /// For a frame of several rows: the host's part of the step, every row's codebook-0 choice, and
    /// on the batched frame graphs also the work around the replay (the rows' inputs, parameters,
    /// tables and their uploads before it, the copies after it); 0 for a frame made alone.
    pub host_ms: f64,
}

impl StepTiming {
    /// The split of a frame whose code predictor started at `t_cp` and whose talker step started
    /// at `t_talker` and ends now.
    pub(super) fn between(t_cp: Instant, t_talker: Instant) -> Self {
        Self {
            code_predictor_ms: (t_talker - t_cp).as_secs_f64() * 1e3,
            talker_ms: t_talker.elapsed().as_secs_f64() * 1e3,
            host_ms: 0.0,
        }
    }
}

impl ArSession<'_> {
    /// The prompt plan (token ids, rows, trailing text ids).
    pub fn prompt_ids(&self) -> &Prompt {
        &self.prompt
    }

    /// The prefill `inputs_embeds`, `[1, rows, hidden]` in the model dtype.
    pub fn prefill_embeds(&self) -> &Tensor {
        &self.prefill
    }

    /// The decode-time text vectors, `[trailing, hidden]`.
    pub fn trailing_embeds(&self) -> &Tensor {
        &self.trailing
    }

    pub fn frames_generated(&self) -> usize {
        self.frames
    }

    /// Base ICL: the reference frames in the prompt. They are the codec decoder's left context:
    /// decode `ref_codes ++ frames` (or prime a stream with them) and drop exactly
    /// `ref_frames × samples_per_frame` samples from the front. 0 otherwise.
    pub fn ref_frames(&self) -> usize {
        self.prompt.ref_frames
    }

    /// Base ICL: the reference codes `[ref_frames][num_code_groups]` (see [`Self::ref_frames`]).
    pub fn ref_codes(&self) -> Option<&[Vec<u32>]> {
        self.prompt
            .voice_clone
            .as_ref()
            .filter(|v| v.icl)
            .and_then(|v| v.ref_codes.as_deref())
    }

    /// The talker's codec-head logits (f32, `vocab_size` values, before any logits processor) that
    /// the next [`Self::next_frame`] samples codebook 0 from; right after [`ArModel::start`] these
    /// are the prefill logits. Empty once finished.
    pub fn pending_logits(&self) -> &[f32] {
        &self.logits
    }

    /// Timing of the last frame (see [`StepTiming`]).
    pub fn last_timing(&self) -> StepTiming {
        self.timing
    }

    /// Codebook-0 tokens sampled so far (frames plus a final EOS/limit token).
    pub fn tokens_sampled(&self) -> usize {
        self.history.len() + usize::from(self.finished == Some(FinishReason::Eos))
    }

    /// One AR step: `Ok(ArStep::Frame(codes))` with `codes.len() == num_code_groups`, or
    /// `Ok(ArStep::Finished(reason))` (repeated on later calls). Frames exclude EOS; EOS is masked
    /// until 2 tokens exist; when `max_new_tokens` tokens have been sampled the last one gets no
    /// residual codes and is dropped (frames = tokens − 1), as in the reference. After an error
    /// the session cannot go on (drop it).
    pub fn next_frame(&mut self) -> Result<ArStep, ModelError> {
        if self.waits_for_text() {
            return Err(ModelError::TextPending);
        }
        match self.choose_code0() {
            Ok(a0) => self.finish_frame(a0).map(ArStep::Frame),
            Err(reason) => Ok(ArStep::Finished(reason)),
        }
    }

    /// Whether the talker's decode steps run on the leased decode graphs.
    pub fn uses_talker_graphs(&self) -> bool {
        self.cache.is_leased()
    }

    /// Open text (streaming prompt mode, text still arriving): whether the next frame's text
    /// row has not arrived yet, so the session must sit out the step (no sampling, no RNG draw:
    /// its codes do not depend on when the text comes). Always false once the text has ended.
    pub fn waits_for_text(&self) -> bool {
        self.text_open
            && self.finished.is_none()
            && self.frames >= self.trailing_rows + self.more_rows
    }

    /// Whether the session's text is still open ([`Self::extend_text`]).
    pub fn text_open(&self) -> bool {
        self.text_open
    }

    /// Open text: the assistant text's ids committed so far (`ids`: the role header, then the
    /// body; once `ended`, the whole tokenization with its 5-id tail, as
    /// [`ArModel::plan`] tokenizes the whole text). Appends the new body ids (and `tts_eos` at
    /// the end) as decode-time text rows; the plan's `trailing` grows alike, so at the end the
    /// session holds exactly the whole text's streaming prompt. Errors: not an open session
    /// ([`ModelError::InvalidRequest`], field `text`), ids that do not extend what came before,
    /// a whole text with no body id; a failed embedding.
    pub fn extend_text(&mut self, ids: &[u32], ended: bool) -> Result<(), ModelError> {
        let bad = |msg: &str| ModelError::InvalidRequest {
            field: "text".into(),
            value: format!("{} ids", ids.len()),
            msg: msg.into(),
        };
        if !self.text_open {
            return Err(bad("the session's text has already ended"));
        }
        let n = ids.len();
        let body = if ended {
            if n < 9 {
                return Err(bad("the text has no token to speak"));
            }
            &ids[3..n - 5]
        } else {
            ids.get(3..).unwrap_or(&[])
        };
        let cfg = &self.model.config;
        // Trailing text = body[1..] (+ tts_eos once ended); the prefill holds body[0].
        let fed = self.trailing_rows + self.more_rows;
        let have = self.prompt.trailing.len().min(fed);
        if body.len() < have + 1 || body[1..have + 1] != self.prompt.trailing[..have] {
            return Err(bad("streamed text ids do not extend the ids before them"));
        }
        let mut new: Vec<u32> = body[1 + fed..].to_vec();
        if ended {
            new.push(cfg.tts_eos_token_id);
        }
        if !new.is_empty() {
            let rows = self.model.talker.text_embed(&new)?;
            self.more_rows += new.len();
            self.more_text.push(rows);
            self.prompt.trailing.truncate(fed);
            self.prompt.trailing.extend_from_slice(&new);
        }
        if ended {
            self.prompt.input_ids = ids.to_vec();
            self.text_open = false;
        } else {
            self.prompt.input_ids = ids.to_vec();
        }
        Ok(())
    }

    /// Whether the utterance has ended (every later frame is [`ArStep::Finished`]).
    pub fn is_finished(&self) -> bool {
        self.finished.is_some()
    }

    /// Runs [`Self::next_frame`] to the end; returns the frames and the reason.
    pub fn run_to_end(&mut self) -> Result<(Vec<Vec<u32>>, FinishReason), ModelError> {
        let mut frames = Vec::new();
        loop {
            match self.next_frame()? {
                ArStep::Frame(f) => frames.push(f),
                ArStep::Finished(r) => return Ok((frames, r)),
            }
        }
    }
}

impl<'a> ArSession<'a> {
    pub(super) fn new(p: Prefilled<'a>) -> Self {
        ArSession {
            cp_cache: p.model.code_predictor.new_cache(),
            model: p.model,
            decoding: p.decoding,
            prompt: p.prompt,
            prefill: p.prefill,
            trailing: p.trailing,
            trailing_rows: p.trailing_rows,
            more_text: Vec::new(),
            more_rows: 0,
            text_open: p.text_open,
            cache: p.cache,
            hidden: p.hidden,
            logits: p.logits,
            history: Vec::new(),
            frames: 0,
            finished: None,
            timing: StepTiming::default(),
        }
    }

    /// A frame's first part: codebook 0 from the pending logits (processors, then the talker's
    /// choice with the session's RNG). `Err(reason)` when the utterance is over (EOS, the token
    /// limit, or earlier).
    pub(super) fn choose_code0(&mut self) -> Result<u32, FinishReason> {
        if let Some(r) = self.finished {
            return Err(r);
        }
        let d = &mut self.decoding;
        let mut logits = std::mem::take(&mut self.logits);
        d.processors.apply(&mut logits, &self.history);
        let a0 = d.talker_chooser.choose(&mut logits, &mut d.rng);
        if a0 == d.processors.eos {
            self.finished = Some(FinishReason::Eos);
            return Err(FinishReason::Eos);
        }
        self.history.push(a0);
        if self.history.len() >= d.max_new_tokens {
            self.finished = Some(FinishReason::Length);
            return Err(FinishReason::Length);
        }
        Ok(a0)
    }

    /// The rest of a frame alone, after [`Self::choose_code0`] gave `a0`: the code predictor
    /// (on its CUDA graphs when captured), the talker's next input and decode step (on the leased
    /// graphs when held). Returns the frame's codes.
    pub(super) fn finish_frame(&mut self, a0: u32) -> Result<Vec<u32>, ModelError> {
        let m = self.model;
        let c0 = m.talker.codec_embed(&[a0])?; // [1, d]
        let chooser = self.decoding.cp_chooser;
        let rng = &mut self.decoding.rng;
        let t_cp = Instant::now();
        let code0_embed = c0.unsqueeze(0)?;
        let rest = match m.graphs.code_predictor() {
            Some(graphs) => {
                let mut graphs = graphs.lock().map_err(|_| {
                    ModelError::Candle(candle_core::Error::Msg(
                        "code predictor CUDA graphs: lock poisoned by a panic".into(),
                    ))
                })?;
                graphs.generate(&m.code_predictor, &self.hidden, &code0_embed, &chooser, rng)?
            }
            None => m.code_predictor.generate(
                &self.hidden,
                &code0_embed,
                &mut self.cp_cache,
                |_, l| chooser.choose(l, rng),
            )?,
        };
        let t_talker = Instant::now();
        let mut codes = Vec::with_capacity(m.num_code_groups());
        codes.push(a0);
        codes.extend_from_slice(&rest);
        let input = m.talker_input(&codes, &c0, &self.text_row()?)?;
        self.cache.ensure_room()?;
        let (hidden, logits) = self.cache.step(&m.talker, &input)?;
        self.store_step(hidden, logits, StepTiming::between(t_cp, t_talker));
        Ok(codes)
    }

    /// The text vector `[1, hidden]` added to the talker input of the frame being made: the next
    /// trailing text row, or `T(tts_pad)` after the text.
    pub(super) fn text_row(&self) -> candle_core::Result<Tensor> {
        if self.frames < self.trailing_rows {
            return self.trailing.narrow(0, self.frames, 1);
        }
        let mut i = self.frames - self.trailing_rows;
        for block in &self.more_text {
            let n = block.dim(0)?;
            if i < n {
                return block.narrow(0, i, 1);
            }
            i -= n;
        }
        if self.text_open {
            return Err(candle_core::Error::Msg(format!(
                "frame {}: its text has not arrived (the row should have waited)",
                self.frames
            )));
        }
        Ok(self.model.tts_pad_embed.clone())
    }

    /// A frame's last part: the talker step's hidden state `[1, 1, hidden]` and logits become the
    /// pending ones.
    pub(super) fn store_step(&mut self, hidden: Tensor, logits: Vec<f32>, timing: StepTiming) {
        self.hidden = hidden;
        self.logits = logits;
        self.frames += 1;
        self.timing = timing;
    }
}
