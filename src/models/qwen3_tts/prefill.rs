//! The start of an utterance: [`ArModel::begin`] validates the request and builds its prompt
//! embeddings (no talker work); the [`PendingSession`] it returns runs the talker over the prompt
//! in steps of a bounded number of positions ([`PendingSession::prefill_step`]), so a scheduler can
//! interleave a long prompt with other streams' frames, and then becomes an [`ArSession`].
//! [`ArModel::start`] does all of it at once.

use candle_core::Tensor;

use super::ar_model::ArModel;
use super::graphs::TalkerCache;
use super::prompt::Prompt;
use super::session::{ArSession, Decoding, Prefilled};
use crate::models::tts::ModelError;
use crate::models::tts::{SamplingParams, VoiceRequest};
use crate::nn::transformer::PREFILL_CHUNK;

/// KV-cache positions an utterance's own talker cache allocates beyond its prompt at first (it
/// grows by as many when full).
const DECODE_CAPACITY_HINT: usize = 4096;

/// An utterance whose prompt is still being run through the talker (see the module
/// documentation). Holds the talker KV cache from the start (the leased decode graphs' when they
/// are free: dropping it gives them back).
pub struct PendingSession<'a> {
    model: &'a ArModel,
    decoding: Decoding,
    prompt: Prompt,
    /// `[1, rows, hidden]`.
    prefill: Tensor,
    /// `[trailing.len(), hidden]`.
    trailing: Tensor,
    /// Rows of `trailing` that are text.
    trailing_rows: usize,
    /// Open text: more arrives after the start ([`ArModel::begin_open`]).
    text_open: bool,
    cache: TalkerCache<'a>,
    /// Prompt positions run so far.
    done: usize,
    /// After the last position: its final-normed hidden state `[1, 1, hidden]` and logits.
    last: Option<(Tensor, Vec<f32>)>,
}

impl ArModel {
    /// Validates the request (unknown speaker/language, empty text, bad sampling values, a prompt
    /// beyond the talker's position budget → [`ModelError::InvalidRequest`] naming the field and
    /// value), tokenizes it, builds the dual-track prompt and its embeddings and takes a talker KV
    /// cache. Runs nothing through the
    /// talker: that is [`PendingSession::prefill_step`].
    pub fn begin(
        &self,
        req: &VoiceRequest,
        sampling: &SamplingParams,
    ) -> Result<PendingSession<'_>, ModelError> {
        sampling.validate()?;
        let prompt = self.plan(req)?;
        prompt.check_position_budget(&self.config, &req.text, sampling.max_new_tokens)?;
        let prefill = self.prompt_embeds(&prompt)?;
        let trailing = self.talker.text_embed(&prompt.trailing)?;
        let rows = prompt.rows.len();
        if rows == 0 {
            return Err(ModelError::InvalidRequest {
                field: "text".into(),
                value: req.text.clone(),
                msg: "the prompt is empty".into(),
            });
        }
        let cache = TalkerCache::for_utterance(
            &self.graphs,
            &self.talker,
            rows,
            rows + sampling.max_new_tokens.min(DECODE_CAPACITY_HINT) + 1,
        );
        Ok(PendingSession {
            model: self,
            decoding: Decoding::new(sampling, self.config.talker_config.codec_eos_token_id),
            trailing_rows: prompt.trailing.len(),
            text_open: false,
            prompt,
            prefill,
            trailing,
            cache,
            done: 0,
            last: None,
        })
    }

    /// [`Self::begin`] for a text still arriving (streaming prompt mode only, no ICL): `ids` are
    /// the assistant text's ids committed so far by an
    /// [`IncrementalTokenizer`](super::text_stream::IncrementalTokenizer) (the 3-id role header
    /// and at least one body id, the one the prefill holds); `req.text` only passes the request's
    /// checks (any speakable text). The rest comes through [`ArSession::extend_text`]. The
    /// position budget is checked with `max_new_tokens` and the text so far (the caller checks
    /// the whole text at its end). Errors as [`Self::begin`], and [`ModelError::InvalidRequest`]
    /// for a non-streaming prompt mode (`prompt_mode`), an ICL voice clone (`voice_clone`), or
    /// fewer than 4 ids (`text`).
    pub fn begin_open(
        &self,
        req: &VoiceRequest,
        sampling: &SamplingParams,
        ids: &[u32],
    ) -> Result<PendingSession<'_>, ModelError> {
        let bad = |field: &str, value: String, msg: &str| ModelError::InvalidRequest {
            field: field.into(),
            value,
            msg: msg.into(),
        };
        sampling.validate()?;
        let r = super::prompt::resolve(&self.config, req)?;
        if r.mode != super::PromptMode::Streaming {
            return Err(bad(
                "prompt_mode",
                format!("{:?}", r.mode),
                "text that is still arriving needs the streaming prompt mode",
            ));
        }
        if r.ref_text.is_some() {
            return Err(bad(
                "voice_clone",
                "icl".into(),
                "text that is still arriving cannot use an ICL voice clone (use x-vector-only)",
            ));
        }
        if ids.len() < 4 {
            return Err(bad(
                "text",
                format!("{} ids", ids.len()),
                "the prefill needs the role header and the first text id",
            ));
        }
        let instruct_ids = match &r.instruct_text {
            Some(t) => Some(self.tokenizer().encode(t)?),
            None => None,
        };
        // A provisional tail so that `build` slices the body as it will at the end.
        let tail = [self.config.tts_pad_token_id; 5];
        let mut prompt = Prompt::build(
            &self.config,
            &r,
            ids.iter().chain(&tail).copied().collect(),
            instruct_ids,
        )?;
        prompt.voice_clone = req.voice_clone.clone();
        prompt.input_ids = ids.to_vec();
        // `build` ended the trailing text with tts_eos: it comes when the text ends.
        prompt.trailing.pop();
        prompt.check_position_budget(&self.config, &req.text, sampling.max_new_tokens)?;
        let prefill = self.prompt_embeds(&prompt)?;
        let trailing_rows = prompt.trailing.len();
        let trailing = if trailing_rows > 0 {
            self.talker.text_embed(&prompt.trailing)?
        } else {
            self.tts_pad_embed.clone()
        };
        let rows = prompt.rows.len();
        let cache = TalkerCache::for_utterance(
            &self.graphs,
            &self.talker,
            rows,
            rows + sampling.max_new_tokens.min(DECODE_CAPACITY_HINT) + 1,
        );
        Ok(PendingSession {
            model: self,
            decoding: Decoding::new(sampling, self.config.talker_config.codec_eos_token_id),
            trailing_rows,
            text_open: true,
            prompt,
            prefill,
            trailing,
            cache,
            done: 0,
            last: None,
        })
    }

    /// [`Self::begin`], the whole prefill in steps of [`PREFILL_CHUNK`] positions and
    /// [`PendingSession::into_session`]: a session ready for its first frame.
    pub fn start(
        &self,
        req: &VoiceRequest,
        sampling: &SamplingParams,
    ) -> Result<ArSession<'_>, ModelError> {
        self.start_until(req, sampling, &|| false)
    }

    /// [`Self::start`] that asks `stop` before each prefill step of [`PREFILL_CHUNK`] prompt
    /// positions and gives up with [`ModelError::Stopped`] when it answers true: the engine's
    /// cancel, so a long prompt does not hold up a cancelled request.
    pub fn start_until(
        &self,
        req: &VoiceRequest,
        sampling: &SamplingParams,
        stop: &dyn Fn() -> bool,
    ) -> Result<ArSession<'_>, ModelError> {
        let mut pending = self.begin(req, sampling)?;
        loop {
            if stop() {
                return Err(ModelError::Stopped);
            }
            if pending.prefill_step(PREFILL_CHUNK)? {
                return pending.into_session();
            }
        }
    }
}

impl<'a> PendingSession<'a> {
    /// Prompt positions still to run through the talker (0 once the prefill is complete).
    pub fn remaining(&self) -> usize {
        self.prefill_len() - self.done
    }

    /// The prompt's length in positions (rows).
    pub fn prefill_len(&self) -> usize {
        self.prompt.rows.len()
    }

    /// The prompt plan (token ids, rows, trailing text ids).
    pub fn prompt_ids(&self) -> &Prompt {
        &self.prompt
    }

    /// Runs the next `min(max_positions, remaining())` prompt positions through the talker (one
    /// piece of at most [`PREFILL_CHUNK`] positions at a time) and, after the last one, its final
    /// norm and codec head. Returns whether the prefill is complete; `max_positions` 0 runs
    /// nothing. The result depends on the steps' lengths only through float rounding: steps of
    /// [`PREFILL_CHUNK`] positions give exactly [`ArModel::start`]'s session. A whole prompt in one
    /// step replays the prefill graphs when the model has them and they hold its length
    /// ([`super::graphs::PrefillGraphs`]: equal up to the products' summation order). After an
    /// error the session cannot go on (drop it).
    pub fn prefill_step(&mut self, max_positions: usize) -> Result<bool, ModelError> {
        let n = max_positions.min(self.remaining());
        if n > 0 && n == self.prefill_len() {
            // The whole prompt at once: on the prefill graphs when they hold it.
            if let Some(graphs) = self.model.graphs.prefill() {
                let mut g = graphs
                    .lock()
                    .map_err(|_| candle_core::Error::Msg("prefill graphs: lock poisoned".into()))?;
                if n <= g.max_len() {
                    let talker = &self.model.talker;
                    let last = g.prefill(talker, &self.prefill, &mut *self.cache.lock()?)?;
                    self.done = n;
                    self.last = Some(last);
                    return Ok(true);
                }
            }
        }
        if n > 0 {
            let talker = &self.model.talker;
            let x = self.prefill.narrow(1, self.done, n)?;
            let h = talker.run(&x, &mut *self.cache.lock()?)?;
            self.done += n;
            if self.remaining() == 0 {
                self.last = Some(talker.head(&h.narrow(1, n - 1, 1)?)?);
            }
        }
        Ok(self.last.is_some())
    }

    /// The session, once the prefill is complete; [`ModelError::PrefillIncomplete`] before.
    pub fn into_session(self) -> Result<ArSession<'a>, ModelError> {
        let remaining = self.remaining();
        let Some((hidden, logits)) = self.last else {
            return Err(ModelError::PrefillIncomplete { remaining });
        };
        Ok(ArSession::new(Prefilled {
            model: self.model,
            decoding: self.decoding,
            prompt: self.prompt,
            prefill: self.prefill,
            trailing: self.trailing,
            trailing_rows: self.trailing_rows,
            text_open: self.text_open,
            cache: self.cache,
            hidden,
            logits,
        }))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    use super::super::testing::fixture;

    /// A prompt longer than the prefill chunk runs in chunks with the result of one piece: the
    /// same hidden states and the same KV cache (checked through the decode step after it).
    #[test]
    fn chunked_prefill_equals_one_piece() {
        let (m, _) = fixture("tiny-customvoice");
        let hidden = m.config.talker_config.transformer.hidden_size;
        let (layers, rope) = (&m.talker.model.layers, m.talker.rope());
        let max_diff = |a: &Tensor, b: &Tensor| -> f32 {
            (a - b)
                .and_then(|d| d.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>())
                .expect("diff")
        };
        let x = Tensor::randn(0f32, 1f32, (1, 37, hidden), &Device::Cpu).expect("x");
        let (mut one, mut chunked) = (m.talker.new_cache(64), m.talker.new_cache(64));
        let a = one.run_in_chunks(layers, rope, &x, 37).expect("one piece");
        let b = chunked.run_in_chunks(layers, rope, &x, 8).expect("chunks");
        assert_eq!(b.dims(), &[1, 37, hidden]);
        assert_eq!(chunked.seq_len(), 37);
        let d = max_diff(&a, &b);
        assert!(d <= 1e-5, "prefill differs by {d}");
        let next = Tensor::randn(0f32, 1f32, (1, 1, hidden), &Device::Cpu).expect("next");
        let a = one
            .run(layers, rope, &next)
            .expect("decode after one piece");
        let b = chunked
            .run(layers, rope, &next)
            .expect("decode after chunks");
        let d = max_diff(&a, &b);
        assert!(d <= 1e-5, "decode after the prefill differs by {d}");
    }
}
