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

/// Fewest whole prompts of one length class that run as one batched pass
/// ([`ArModel::prefill_steps`]); fewer run one by one. A prompt alone replays its prefill graph
/// (one launch, ~4.4 ms for a sentence on an H100), an eager batched pass is host-bound (~700
/// launches, ~11 ms on an H200 whatever the batch): from three prompts on, one pass is the
/// shorter. Without graphs (the CPU) batching never costs more than the prompts one by one.
pub const BATCHED_PREFILL_MIN: usize = 3;

/// The most rows (prompts × their padded length) one batched prefill pass runs.
pub const BATCHED_PREFILL_ROWS: usize = 2 * PREFILL_CHUNK;

/// A prompt's length class for batching: the power of two at or above its length, so that a
/// batch pads each prompt to less than twice its length.
fn length_class(positions: usize) -> usize {
    positions.next_power_of_two()
}

/// Which of one step's prefills run together: `whole[i]` is prefill `i`'s prompt length when
/// it runs its whole prompt from the start (`None`: it runs a piece, or goes on from one). Groups
/// of indices, in order, each of one [`length_class`], at least [`BATCHED_PREFILL_MIN`] prompts
/// and at most [`BATCHED_PREFILL_ROWS`] padded rows.
fn prefill_groups(whole: &[Option<usize>]) -> Vec<Vec<usize>> {
    let mut classes: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
    for (i, len) in whole.iter().enumerate() {
        if let Some(len) = len {
            classes.entry(length_class(*len)).or_default().push(i);
        }
    }
    classes
        .into_iter()
        .flat_map(|(class, members)| {
            let per_pass = (BATCHED_PREFILL_ROWS / class).max(1);
            members
                .chunks(per_pass)
                .filter(|g| g.len() >= BATCHED_PREFILL_MIN)
                .map(<[usize]>::to_vec)
                .collect::<Vec<_>>()
        })
        .collect()
}

impl ArModel {
    /// Runs one engine step's prefill work: `steps[i]` is a session and the positions it may
    /// run, each result what [`PendingSession::prefill_step`] returns for it alone. Whole prompts
    /// that have not started run together where at least [`BATCHED_PREFILL_MIN`] of one length
    /// class ([`length_class`]) are in the step ([`Self::prefill_together`]; off with
    /// `OMNITTS_BATCHED_PREFILL=0`); the others step one by one, in order.
    pub fn prefill_steps(
        &self,
        steps: &mut [(&mut PendingSession<'_>, usize)],
    ) -> Vec<Result<bool, ModelError>> {
        let mut results: Vec<Option<Result<bool, ModelError>>> =
            steps.iter().map(|_| None).collect();
        if crate::nn::switches::Switches::get().batched_prefill {
            let whole: Vec<Option<usize>> = steps
                .iter()
                .map(|(p, n)| {
                    let len = p.prefill_len();
                    (p.done == 0 && *n >= len && len > 0).then_some(len)
                })
                .collect();
            for group in prefill_groups(&whole) {
                let mut batch: Vec<&mut PendingSession<'_>> = steps
                    .iter_mut()
                    .enumerate()
                    .filter(|(i, _)| group.contains(i))
                    .map(|(_, (p, _))| &mut **p)
                    .collect();
                let outcome = self.prefill_together(&mut batch);
                for &i in &group {
                    results[i] = Some(match &outcome {
                        Ok(()) => Ok(true),
                        Err(e) => Err(ModelError::Candle(candle_core::Error::Msg(format!(
                            "batched prefill of {} prompts: {e}",
                            group.len()
                        )))),
                    });
                }
            }
        }
        steps
            .iter_mut()
            .zip(results)
            .map(|((p, n), r)| r.unwrap_or_else(|| p.prefill_step(*n)))
            .collect()
    }

    /// Runs the whole prompts of `pendings` (none started) through the talker in one batched
    /// pass: each prompt `[1, t_i, hidden]` padded to the longest `T` into `[B, T, hidden]`, the
    /// layers from position 0 with one causal mask into a scratch cache of `B` sequences, then
    /// each sequence's first `t_i` positions copied into its own cache
    /// ([`LayerCaches::fill_prefix_from_row`]) and the final norm and codec head of each row
    /// `t_i − 1`, read back once. Padding rows sit after every real position, so causal attention
    /// keeps them unseen: each session ends as [`PendingSession::prefill_step`] of its whole
    /// prompt leaves it, up to the products' summation order. Errors: a session already started,
    /// or a failed pass (the sessions cannot go on: drop them).
    pub fn prefill_together(
        &self,
        pendings: &mut [&mut PendingSession<'_>],
    ) -> candle_core::Result<()> {
        let Some(longest) = pendings.iter().map(|p| p.prefill_len()).max() else {
            return Ok(());
        };
        if pendings.iter().any(|p| p.done != 0 || p.prefill_len() == 0) {
            candle_core::bail!("a batched prefill takes whole prompts that have not started");
        }
        let talker = &self.talker;
        let rows = pendings
            .iter()
            .map(|p| {
                let (_, t, d) = p.prefill.dims3()?;
                if t == longest {
                    Ok(p.prefill.clone())
                } else {
                    let pad =
                        Tensor::zeros((1, longest - t, d), p.prefill.dtype(), p.prefill.device())?;
                    Tensor::cat(&[&p.prefill, &pad], 1)
                }
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        let x = Tensor::cat(&rows, 0)?;
        let (b, _, hidden) = x.dims3()?;
        let mut scratch = talker.new_cache(longest);
        let h = talker.run(&x, &mut scratch)?;
        let last: Vec<u32> = pendings
            .iter()
            .enumerate()
            .map(|(i, p)| (i * longest + p.prefill_len() - 1) as u32)
            .collect();
        let last = Tensor::new(last.as_slice(), x.device())?;
        let last = h.reshape((b * longest, hidden))?.index_select(&last, 0)?;
        let (normed, logits) = talker.head(&last.unsqueeze(1)?)?;
        let vocab = logits.len() / b;
        for (i, p) in pendings.iter_mut().enumerate() {
            let t = p.prefill_len();
            p.cache.lock()?.fill_prefix_from_row(&scratch, i, t)?;
            p.done = t;
            p.last = Some((
                normed.narrow(0, i, 1)?.copy()?,
                logits[i * vocab..(i + 1) * vocab].to_vec(),
            ));
        }
        Ok(())
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
    use super::{BATCHED_PREFILL_MIN, PendingSession, prefill_groups};
    use crate::models::qwen3_tts::{ArModel, ArStep, SamplingParams, VoiceRequest};

    /// Greedy codes and the logits before every frame of `frames` frames after a prefill.
    fn frames_after(p: PendingSession<'_>, frames: usize) -> (Vec<Vec<u32>>, Vec<Vec<f32>>) {
        let mut s = p.into_session().expect("session");
        let (mut codes, mut logits) = (Vec::new(), vec![s.pending_logits().to_vec()]);
        while codes.len() < frames {
            match s.next_frame().expect("frame") {
                ArStep::Frame(f) => {
                    codes.push(f);
                    logits.push(s.pending_logits().to_vec());
                }
                ArStep::Finished(_) => break,
            }
        }
        (codes, logits)
    }

    fn begin_all<'m>(
        m: &'m ArModel,
        texts: &[&str],
        sampling: &SamplingParams,
    ) -> Vec<PendingSession<'m>> {
        let speaker = m.speakers().into_iter().next();
        texts
            .iter()
            .map(|text| {
                let req = VoiceRequest {
                    text: (*text).into(),
                    speaker: speaker.clone(),
                    language: Some("english".into()),
                    ..VoiceRequest::default()
                };
                m.begin(&req, sampling).expect("begin")
            })
            .collect()
    }

    /// Whole prompts of different lengths prefilled in one batched pass (padded to the longest,
    /// one scratch cache of several sequences, each copied into its own cache) leave every
    /// session as its prompt alone does: the same greedy codes and logits within 1e-4 frame after
    /// frame, so the caches hold the same positions. Through `prefill_steps` too, where a piece
    /// of a longer prompt in the same step runs alone.
    #[test]
    fn prompts_prefilled_together_equal_each_alone() {
        let (m, g) = fixture("tiny-customvoice");
        let sampling = SamplingParams {
            max_new_tokens: 24,
            ..SamplingParams::from_generation_config(&g)
        }
        .greedy();
        let texts = [
            "Hello world, this is a test.",
            "Hi there, friend.",
            "Short.",
            "A somewhat longer sentence, so that its prompt is the longest of the four.",
        ];
        let alone: Vec<_> = begin_all(&m, &texts, &sampling)
            .into_iter()
            .map(|mut p| {
                assert!(p.prefill_step(usize::MAX).expect("prefill alone"));
                frames_after(p, 20)
            })
            .collect();
        let lens: Vec<usize> = begin_all(&m, &texts, &sampling)
            .iter()
            .map(PendingSession::prefill_len)
            .collect();
        assert!(
            lens.iter().any(|&l| l != lens[0]),
            "prompts of one length: {lens:?}"
        );
        let check = |what: &str, together: Vec<PendingSession<'_>>| {
            for (i, p) in together.into_iter().enumerate() {
                let (codes, logits) = frames_after(p, 20);
                assert_eq!(codes, alone[i].0, "{what} prompt {i}: codes differ");
                for (f, (a, b)) in logits.iter().zip(&alone[i].1).enumerate() {
                    let d = a
                        .iter()
                        .zip(b)
                        .map(|(x, y)| (x - y).abs())
                        .fold(0f32, f32::max);
                    assert!(
                        d <= 1e-4,
                        "{what} prompt {i} frame {f}: logits differ by {d}"
                    );
                }
            }
        };
        let mut together = begin_all(&m, &texts, &sampling);
        let mut refs: Vec<&mut PendingSession<'_>> = together.iter_mut().collect();
        m.prefill_together(&mut refs).expect("prefill together");
        assert!(together.iter().all(|p| p.remaining() == 0));
        check("prefill_together", together);
        // A started prompt is refused.
        let mut started = begin_all(&m, &texts[..1], &sampling);
        assert!(!started[0].prefill_step(2).expect("a piece"));
        let mut refs: Vec<&mut PendingSession<'_>> = started.iter_mut().collect();
        assert!(m.prefill_together(&mut refs).is_err());
        // Through prefill_steps: the three shortest whole, the longest in two pieces.
        let mut steps_run = begin_all(&m, &texts, &sampling);
        let first = lens[3] / 2;
        let results = {
            let mut steps: Vec<(&mut PendingSession<'_>, usize)> = steps_run
                .iter_mut()
                .enumerate()
                .map(|(i, p)| (p, if i == 3 { first } else { usize::MAX }))
                .collect();
            m.prefill_steps(&mut steps)
        };
        let done: Vec<bool> = results.into_iter().map(|r| r.expect("step")).collect();
        assert_eq!(done, [true, true, true, false]);
        assert!(steps_run[3].prefill_step(usize::MAX).expect("the rest"));
        check("prefill_steps", steps_run);
    }

    /// Batches are whole prompts of one length class, at least BATCHED_PREFILL_MIN of them, in
    /// order; pieces and lone prompts of a class are left out.
    #[test]
    fn prefill_groups_are_whole_prompts_of_one_length_class() {
        const { assert!(BATCHED_PREFILL_MIN == 3) };
        let whole = [
            Some(40),
            Some(33),
            None,
            Some(64),
            Some(12),
            Some(50),
            Some(16),
            Some(9),
        ];
        // 40, 33, 64, 50: class 64; 12, 16, 9: class 16; index 2 runs a piece.
        assert_eq!(
            prefill_groups(&whole),
            vec![vec![4, 6, 7], vec![0, 1, 3, 5]]
        );
        assert!(prefill_groups(&[Some(40), Some(40), None]).is_empty());
        // At most BATCHED_PREFILL_ROWS padded rows a pass: 1024 / 256 = 4 prompts of class 256
        // (the ninth alone is left out).
        let long = vec![Some(200); 9];
        let groups = prefill_groups(&long);
        assert_eq!(groups, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
    }

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
