//! Fish S2 Pro's stage 0 through the model seam: the slow AR and the fast AR ([`FishAr`]) as a
//! [`Stage0Model`]. A request's prompt is embedded at `begin`, prefilled a chunk of positions at
//! a time ([`FishPrefill`]), then each step gives one frame of 10 codes ([`FishSession`]).
//! Speaker-tagged text of several generation batches is generated batch after batch in the same
//! session, each batch's prompt holding the earlier ones and their codes ([`Batches`]).
//!
//! Frames follow the reference's `generate` exactly (`generate.rs`): the prefill's frame is
//! kept without a stop check, a later frame whose main token is `<|im_end|>` stops, and the last
//! generated frame is dropped — so a session holds each frame back until the next one exists.
//! `next_frames` runs the slow AR's step once for all rows, each at its own position over its own
//! cache (`SlowAr::forward_rows`: on CUDA the fused batched decode kernels), then the fast AR
//! once for all rows (`[rows, dim]`; its 10 positions are the same for every row), each row
//! drawing from its own random stream in the order it draws alone, so that a row's codes are its
//! solo run's. With `OMNITTS_FISH_GRAPHS=1` on CUDA the slow AR's step and the fast AR's
//! positions replay graphs per batch bucket (`graphs.rs`).

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Mutex, PoisonError};

use candle_core::{Device, Tensor};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::codec::Codec;
use super::generate::{PROMPT_HEADROOM, frame_rows, frames, main_token};
use super::graphs::{FastArGraphs, buckets};
use super::model::FishModel;
use super::prompt::{CHUNK_LENGTH, Codes, VoiceReference};
use super::rules::{MAX_REF_SAMPLES, MIN_REF_SAMPLES, check_prompt_positions, check_voice};
use super::sampler::{RAS_WINDOW, SamplingParams as FishSampling, sample};
use crate::models::tts::text::unspeakable;
use crate::models::tts::{
    ArStep, FinishReason, ModelError, NoOpenText, ReferenceRules, ReferenceUse, SamplingParams,
    Stage0Model, Stage0Options, Stage0Prefill, Stage0Session, VoiceClonePrompt, VoiceRequest,
};
use crate::nn::{LayerCaches, Quantization, QuantizationSpec, WeightForm};

/// Stage 0 of Fish S2 Pro: tokenizer, prompt builder, slow AR and fast AR, and the codec (its
/// encoder turns a reference recording into the codes a clone's prompt holds).
pub struct FishAr {
    model: FishModel,
    codec: Codec,
    /// The fast AR's frame graphs ([`Stage0Model::enable_cuda_graphs`] and
    /// [`Stage0Model::enable_batch_graphs`]).
    fast_graphs: Option<Mutex<FastArGraphs>>,
    /// The slow AR's step graphs, captured with the fast AR's.
    #[cfg(feature = "cuda")]
    slow_graphs: Option<Mutex<super::graphs::SlowArGraphs>>,
}

impl FishAr {
    /// The text-to-codes model.
    pub fn model(&self) -> &FishModel {
        &self.model
    }

    fn reference_rules(&self) -> ReferenceRules {
        ReferenceRules {
            use_: ReferenceUse::Optional,
            sample_rate: self.codec.sample_rate(),
            min_samples: MIN_REF_SAMPLES,
            max_samples: MAX_REF_SAMPLES,
            speaker_embedding_only: false,
        }
    }
}

/// The seam's sampling values as Fish's sampler takes them: greedy (top_k 1) without
/// `do_sample`; `top_k` 0 means no top-k limit. Both ARs use the same settings, as the
/// reference does (the `subtalker_*` and `repetition_penalty` values do not apply).
pub fn fish_sampling(s: &SamplingParams) -> FishSampling {
    if !s.do_sample {
        return FishSampling::GREEDY;
    }
    FishSampling {
        temperature: s.temperature as f32,
        top_p: s.top_p as f32,
        top_k: if s.top_k == 0 { usize::MAX } else { s.top_k },
    }
}

/// `[frames][codebooks]` ↔ `[codebooks][frames]`.
pub(crate) fn transpose(rows: &[Vec<u32>]) -> Vec<Vec<u32>> {
    let n = rows.first().map_or(0, Vec::len);
    (0..n)
        .map(|i| {
            rows.iter()
                .map(|r| r.get(i).copied().unwrap_or(0))
                .collect()
        })
        .collect()
}

impl Stage0Model for FishAr {
    const NAME: &'static str = "fish_speech";
    type Prefill<'m> = FishPrefill<'m>;
    type Session<'m> = FishSession<'m>;
    type OpenText<'m> = NoOpenText;

    /// Loads the slow and fast ARs in `opts.dtype` and the codec (f32). Errors: a quantized
    /// form (`engine_args.quantization`; Fish loads dense weights only), unreadable files.
    fn load(dir: &Path, device: &Device, opts: &Stage0Options) -> Result<Self, ModelError> {
        match opts.quantization {
            QuantizationSpec::Auto | QuantizationSpec::Form(Quantization::None) => {}
            QuantizationSpec::Form(q) => {
                return Err(ModelError::Config {
                    file: dir.join("config.json"),
                    field: "engine_args.quantization".into(),
                    msg: format!(
                        "{q}: Fish S2 Pro's stage 0 loads dense weights only (none or auto)"
                    ),
                });
            }
        }
        Ok(FishAr {
            model: FishModel::load(dir, device, opts.dtype)?,
            codec: Codec::load(dir, device)?,
            fast_graphs: None,
            #[cfg(feature = "cuda")]
            slow_graphs: None,
        })
    }

    /// A frame of one stream on CUDA graphs (`graphs.rs`: the slow AR's step and the fast AR's
    /// positions), with `OMNITTS_FISH_GRAPHS=1` only until they are measured on a GPU. Errors:
    /// the switch is off, or the capture failed (frames then run eagerly).
    fn enable_cuda_graphs(&mut self) -> Result<(), ModelError> {
        self.capture_graphs(&[1])?;
        Ok(())
    }

    /// The frame graphs for batches of 2 … `max_rows` rows (powers of two, at most 64), beside
    /// the one-stream graphs. Errors as [`Stage0Model::enable_cuda_graphs`].
    fn enable_batch_graphs(&mut self, max_rows: usize) -> Result<Vec<usize>, ModelError> {
        let batch = buckets(2, max_rows);
        self.capture_graphs(&batch)?;
        Ok(batch)
    }

    /// Fish's stage 0 is dense throughout; its layers are not itemised.
    fn weight_forms(&self) -> Vec<WeightForm> {
        Vec::new()
    }

    fn num_codebooks(&self) -> usize {
        self.model.config.num_codebooks()
    }

    fn text_tokens(&self, text: &str) -> usize {
        self.model
            .prompts
            .tokenizer
            .encode(text)
            .map(|ids| ids.len())
            .unwrap_or_else(|_| text.chars().count())
    }

    fn begin<'m>(
        &'m self,
        voice: &VoiceRequest,
        sampling: &SamplingParams,
    ) -> Result<FishPrefill<'m>, ModelError> {
        sampling.validate()?;
        let m = &self.model;
        check_voice(&m.prompts, m.config.codebook_size(), voice)?;
        let reference = voice.voice_clone.as_ref().map(|vc| VoiceReference {
            codes: transpose(vc.ref_codes.as_deref().unwrap_or(&[])),
            transcript: vc.ref_text.clone().unwrap_or_default(),
        });
        let mut batches: VecDeque<String> = m.prompts.batches(&voice.text, CHUNK_LENGTH)?.into();
        // Every later batch must fit alone (its history gives way when it does not fit;
        // `begin_next_batch`).
        for b in batches.iter().skip(1) {
            let alone = m.prompts.build(b, reference.as_ref(), &[])?;
            self.batch_cap(&voice.text, alone.len(), 0)?;
        }
        let batch = batches.pop_front().unwrap_or_default();
        let prompt = m.prompts.build(&batch, reference.as_ref(), &[])?;
        let max_new = self.batch_cap(&voice.text, prompt.len(), sampling.max_new_tokens)?;
        let x = m.slow.embed(&[&prompt.rows])?;
        Ok(FishPrefill {
            ar: self,
            x,
            done: 0,
            cache: m.slow.new_cache(),
            last: None,
            sampling: fish_sampling(sampling),
            seed: sampling.seed,
            max_new,
            batches: Batches {
                text: voice.text.clone(),
                current: batch,
                rest: batches,
                history: Vec::new(),
                frames: Vec::new(),
                reference,
                max_new_tokens: sampling.max_new_tokens,
                cut: false,
            },
        })
    }

    fn open_text(&self) -> Result<NoOpenText, ModelError> {
        Err(ModelError::InvalidRequest {
            field: "model".into(),
            value: super::rules::MODEL_TYPE.into(),
            msg: "Fish S2 Pro takes whole texts only".into(),
        })
    }

    fn begin_open<'m>(
        &'m self,
        _voice: &VoiceRequest,
        _sampling: &SamplingParams,
        _ids: &[u32],
    ) -> Result<FishPrefill<'m>, ModelError> {
        Err(ModelError::InvalidRequest {
            field: "model".into(),
            value: super::rules::MODEL_TYPE.into(),
            msg: "Fish S2 Pro takes whole texts only".into(),
        })
    }

    fn next_frames<'m>(
        &'m self,
        rows: &mut [&mut FishSession<'m>],
    ) -> Vec<Result<ArStep, ModelError>> {
        let mut out: Vec<Option<Result<ArStep, ModelError>>> = rows.iter().map(|_| None).collect();
        // Each row's slow AR step (or its answer when it needs none).
        let mut made: Vec<(usize, Step)> = Vec::with_capacity(rows.len());
        for (i, s) in rows.iter_mut().enumerate() {
            if !std::ptr::eq(s.ar, self) {
                out[i] = Some(Err(ModelError::InvalidRequest {
                    field: "sessions".into(),
                    value: format!("row {i}"),
                    msg: "a session of another model".into(),
                }));
                continue;
            }
            match s.prepare() {
                Ok(Prep::Done(step)) => out[i] = Some(Ok(step)),
                Ok(Prep::Make(step)) => made.push((i, step)),
                Err(e) => out[i] = Some(Err(e)),
            }
        }
        if !made.is_empty() {
            match self.make_frames(rows, &made) {
                Ok(frames) => {
                    for ((i, step), (main, codes)) in made.into_iter().zip(frames) {
                        out[i] = Some(Ok(rows[i].finish(main, codes, step.emit)));
                    }
                }
                Err(e) => {
                    let msg = format!("batched frame of {} rows: {e}", made.len());
                    for (i, _) in made {
                        out[i] = Some(Err(ModelError::Candle(candle_core::Error::Msg(
                            msg.clone(),
                        ))));
                    }
                }
            }
        }
        out.into_iter()
            .map(|o| {
                o.unwrap_or_else(|| {
                    Err(ModelError::Candle(candle_core::Error::Msg(
                        "row without a result".into(),
                    )))
                })
            })
            .collect()
    }

    /// The codec encoder's codes of `audio` (mono, 44.1 kHz) and its transcript. Errors
    /// (`InvalidRequest`): `x_vector_only` (Fish has no speaker-embedding mode), `ref_audio`
    /// (too short, too long, non-finite, silent), `ref_text` (missing, with nothing to speak,
    /// or holding control tokens).
    fn encode_reference(
        &self,
        audio: &[f32],
        ref_text: Option<&str>,
        speaker_only: bool,
    ) -> Result<VoiceClonePrompt, ModelError> {
        if speaker_only {
            return Err(ModelError::InvalidRequest {
                field: "x_vector_only".into(),
                value: "true".into(),
                msg: "Fish S2 Pro clones from the reference's codes and transcript only".into(),
            });
        }
        self.reference_rules().check(audio)?;
        let text = ref_text
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| ModelError::InvalidRequest {
                field: "ref_text".into(),
                value: String::new(),
                msg: "Fish S2 Pro's voice cloning needs the transcript of the reference audio"
                    .into(),
            })?;
        if let Some(why) = unspeakable(text) {
            return Err(ModelError::InvalidRequest {
                field: "ref_text".into(),
                value: text.into(),
                msg: format!("the transcript of the reference audio has {why}"),
            });
        }
        self.model
            .prompts
            .tokenizer
            .check_user_text("ref_text", text)?;
        let codes = self.codec.encode(audio)?;
        Ok(VoiceClonePrompt {
            ref_codes: Some(transpose(&codes)),
            x_vector: Vec::new(),
            ref_text: Some(text.to_string()),
            icl: true,
        })
    }
}

impl FishAr {
    /// Frames a generation batch whose prompt takes `t` positions may make: `max_new_tokens`,
    /// less where the slow AR's `max_seq_len` ends first. Errors (`InvalidRequest` on `text`):
    /// an empty prompt, or one past `max_seq_len` less [`PROMPT_HEADROOM`].
    fn batch_cap(&self, text: &str, t: usize, max_new_tokens: usize) -> Result<usize, ModelError> {
        let max_len = self.model.slow.max_seq_len();
        check_prompt_positions(text, t, max_len)?;
        Ok(if t + max_new_tokens > max_len {
            max_len - t
        } else {
            max_new_tokens
        })
    }

    /// Captures the fast AR's frame graphs for `rows` (bucket sizes), and the slow AR's step
    /// graphs when its stack takes the fused batched kernels (else its step stays eager; see
    /// [`FishAr::graphs`]), beside the buckets captured before. Errors: the switch is off, a CPU
    /// device, a failed capture of the fast AR's (nothing changes then).
    fn capture_graphs(&mut self, rows: &[usize]) -> Result<(), ModelError> {
        if !crate::nn::switches::Switches::get().fish_graphs {
            return Err(ModelError::Candle(candle_core::Error::Msg(
                "Fish S2 Pro's CUDA graphs are off by default (a one-stream first audio later \
                 than eager on an H100; OMNITTS_FISH_GRAPHS=1 turns them on): frames run eagerly"
                    .into(),
            )));
        }
        let fast = &self.model.fast;
        let device = self.model.slow.device().clone();
        let mut g = FastArGraphs::new(fast, rows, &device)?;
        g.capture(fast, &device)?;
        if let Some(before) = self.fast_graphs.take() {
            g.absorb(before.into_inner().unwrap_or_else(PoisonError::into_inner));
        }
        #[cfg(feature = "cuda")]
        {
            let slow = &self.model.slow;
            let before = self
                .slow_graphs
                .take()
                .map(|m| m.into_inner().unwrap_or_else(PoisonError::into_inner));
            let new = super::graphs::SlowArGraphs::capture(slow, rows, slow.dtype()).ok();
            self.slow_graphs = match (new, before) {
                (Some(mut new), Some(before)) => {
                    new.absorb(before);
                    Some(new)
                }
                (new, before) => new.or(before),
            }
            .map(Mutex::new);
        }
        self.fast_graphs = Some(Mutex::new(g));
        Ok(())
    }

    /// Which parts of a frame replay CUDA graphs: (the slow AR's step, the fast AR's positions).
    pub fn graphs(&self) -> (bool, bool) {
        #[cfg(feature = "cuda")]
        let slow = self.slow_graphs.is_some();
        #[cfg(not(feature = "cuda"))]
        let slow = false;
        (slow, self.fast_graphs.is_some())
    }

    /// The slow AR's step for the rows `x` `[rows, 1, dim]` over `caches`: on its graphs when
    /// captured and a bucket fits the rows, else [`super::slow_ar::SlowAr::forward_rows`].
    fn slow_step(
        &self,
        x: &Tensor,
        caches: &mut [&mut LayerCaches],
    ) -> Result<(Tensor, Tensor), ModelError> {
        #[cfg(feature = "cuda")]
        if let Some(g) = self.slow_graphs.as_ref().and_then(|g| g.lock().ok()) {
            let positions: Vec<usize> = caches.iter().map(|c| c.seq_len()).collect();
            if g.fits(&positions) {
                match g.step(&self.model.slow, x, caches) {
                    Ok(out) => return Ok(out),
                    // Failed before the caches moved on: the eager step instead.
                    Err(_)
                        if caches
                            .iter()
                            .map(|c| c.seq_len())
                            .eq(positions.iter().copied()) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(self.model.slow.forward_rows(x, caches)?)
    }

    /// The next frame of the rows `made` (indices into `rows`, increasing, with their slow AR
    /// inputs): one slow AR step over all of them, each row's main token from its own stream,
    /// then the fast AR once for all of them.
    fn make_frames(
        &self,
        rows: &mut [&mut FishSession<'_>],
        made: &[(usize, Step)],
    ) -> Result<Vec<(u32, Vec<u32>)>, ModelError> {
        let slow = &self.model.slow;
        let inputs: Vec<&[Vec<u32>]> = made.iter().map(|(_, s)| s.ids.as_slice()).collect();
        let x = slow.embed(&inputs)?;
        let mut picked: Vec<&mut FishSession<'_>> = rows
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| made.iter().any(|(m, _)| m == i))
            .map(|(_, s)| &mut **s)
            .collect();
        let (logits, hidden) = {
            let mut caches: Vec<&mut LayerCaches> =
                picked.iter_mut().map(|s| &mut s.cache).collect();
            self.slow_step(&x, &mut caches)?
        };
        let logits: Vec<Vec<f32>> = logits.to_vec2()?;
        let mains: Vec<u32> = picked
            .iter_mut()
            .zip(&logits)
            .map(|(s, l)| main_token(slow, l, s.sampling, Some(&s.window), &mut s.rng))
            .collect();
        let code0: Vec<u32> = mains.iter().map(|&t| slow.code0(t)).collect();
        let mut streams: Vec<(&mut ChaCha8Rng, FishSampling)> = picked
            .iter_mut()
            .map(|s| (&mut s.rng, s.sampling))
            .collect();
        let mut draw = |logits: &Tensor| -> candle_core::Result<Vec<u32>> {
            let l: Vec<Vec<f32>> = logits.to_vec2()?;
            Ok(l.iter()
                .zip(streams.iter_mut())
                .map(|(row, (rng, p))| sample(row, *p, *rng) as u32)
                .collect())
        };
        let graphs = self.fast_graphs.as_ref().and_then(|g| g.lock().ok());
        let rest = match graphs {
            Some(mut g) if g.fits(code0.len()) => {
                g.frame(&self.model.fast, &hidden, &code0, |_, l| draw(l))?
            }
            _ => self
                .model
                .fast
                .frame(&hidden, &code0, |_, l| Ok(draw(l)?), None)?,
        };
        Ok(frames(mains, code0, rest))
    }
}

/// A row's slow AR input for this step (the held frame's main token and codes, one position
/// each: `1 + num_codebooks` rows of one id) and the frame it gives out once the next one is
/// made.
struct Step {
    ids: Vec<Vec<u32>>,
    emit: Vec<u32>,
}

/// What a row needs this step.
enum Prep {
    /// Its answer without a new frame (finished, or the cap reached).
    Done(ArStep),
    /// A new frame from this slow AR step.
    Make(Step),
}

/// A Fish request's prompt, embedded, running through the slow AR a chunk at a time.
pub struct FishPrefill<'m> {
    ar: &'m FishAr,
    /// The prompt's input embeddings `[1, T, dim]`.
    x: Tensor,
    /// Positions run so far.
    done: usize,
    cache: LayerCaches,
    /// The last chunk's allowed logits and final-normed hidden state.
    last: Option<(Tensor, Tensor)>,
    sampling: FishSampling,
    seed: u64,
    max_new: usize,
    batches: Batches,
}

/// A request's generation batches (`prompt.rs`): speaker-tagged text of more than 5 turns or
/// [`CHUNK_LENGTH`] bytes is generated batch after batch, as the reference's `generate_long`
/// does — each batch's prompt holds the earlier batches and their codes, and is prefilled afresh;
/// each batch stops on `<|im_end|>` or at `max_new_tokens` frames, its last frame dropped; the
/// frames of all batches make one utterance.
struct Batches {
    /// The request's whole text (for errors).
    text: String,
    /// The batch being generated.
    current: String,
    /// The batches after it.
    rest: VecDeque<String>,
    /// The earlier batches and their frames `[codebooks][frames]`.
    history: Vec<(String, Codes)>,
    /// The current batch's frames given out so far, `[frames][codebooks]` (kept only while
    /// batches follow).
    frames: Vec<Vec<u32>>,
    reference: Option<VoiceReference>,
    max_new_tokens: usize,
    /// An earlier batch ended at its cap: the utterance then ends by its length
    /// ([`FinishReason::Length`]) whatever ends the last batch, so that a dialogue cut in the
    /// middle is reported as cut.
    cut: bool,
}

impl Batches {
    /// How the utterance ends when its last batch stops on `<|im_end|>`.
    fn end_by_eos(&self) -> FinishReason {
        if self.cut {
            FinishReason::Length
        } else {
            FinishReason::Eos
        }
    }
}

impl<'m> Stage0Prefill for FishPrefill<'m> {
    type Session = FishSession<'m>;

    fn remaining(&self) -> usize {
        self.x.dim(1).unwrap_or(0).saturating_sub(self.done)
    }

    fn step(&mut self, positions: usize) -> Result<bool, ModelError> {
        let n = positions.max(1).min(self.remaining());
        if n > 0 {
            let chunk = self.x.narrow(1, self.done, n)?;
            let out = self.ar.model.slow.forward(&chunk, &mut self.cache)?;
            self.done += n;
            self.last = Some(out);
        }
        Ok(self.remaining() == 0)
    }

    fn into_session(self) -> Result<FishSession<'m>, ModelError> {
        let remaining = self.remaining();
        match self.last {
            Some(first) if remaining == 0 => Ok(FishSession {
                ar: self.ar,
                cache: self.cache,
                rng: ChaCha8Rng::seed_from_u64(self.seed),
                sampling: self.sampling,
                window: Vec::with_capacity(RAS_WINDOW),
                first: Some(first),
                held: None,
                generated: 0,
                max_new: self.max_new,
                finished: None,
                batches: self.batches,
                next_batch: false,
                pending: None,
            }),
            _ => Err(ModelError::PrefillIncomplete {
                remaining: remaining.max(1),
            }),
        }
    }
}

/// One Fish utterance's generation state.
pub struct FishSession<'m> {
    ar: &'m FishAr,
    cache: LayerCaches,
    rng: ChaCha8Rng,
    sampling: FishSampling,
    /// The last main tokens of the decode steps (repetition-aware sampling).
    window: Vec<u32>,
    /// The prefill's logits and hidden state, until the first frame is made from them.
    first: Option<(Tensor, Tensor)>,
    /// The newest frame (main token, codes), given out once the next one exists.
    held: Option<(u32, Vec<u32>)>,
    /// Frames made so far, the held one included.
    generated: usize,
    /// Frames to make at most in the current batch.
    max_new: usize,
    finished: Option<FinishReason>,
    batches: Batches,
    /// The current batch is over and another follows: its prompt is built on the next
    /// [`Stage0Session::prefill_pending`] (or step).
    next_batch: bool,
    /// The next batch's prompt `[1, t, dim]` and the positions of it already run, until all
    /// have run.
    pending: Option<(Tensor, usize)>,
}

impl FishSession<'_> {
    /// The next frame, or the end (see the module docs); as one row of
    /// [`Stage0Model::next_frames`].
    pub fn next_frame(&mut self) -> Result<ArStep, ModelError> {
        let ar = self.ar;
        ar.next_frames(&mut [self]).pop().unwrap_or_else(|| {
            Err(ModelError::Candle(candle_core::Error::Msg(
                "no result for the row".into(),
            )))
        })
    }

    /// Everything of a step before the batched slow AR: the next batch's prompt if it has not
    /// run yet (whole, for a caller that did not run it between steps), the prefill's frame on
    /// the first call (made alone, as the reference makes it), the cap, then the slow AR's input
    /// from the held frame.
    fn prepare(&mut self) -> Result<Prep, ModelError> {
        loop {
            if let Some(r) = self.finished {
                return Ok(Prep::Done(ArStep::Finished(r)));
            }
            while self.has_pending_prompt() {
                self.prefill_pending(usize::MAX)?;
            }
            let (slow, fast) = (&self.ar.model.slow, &self.ar.model.fast);
            if let Some((logits, hidden)) = self.first.take() {
                let f0 = frame_rows(
                    (slow, fast),
                    &logits,
                    &hidden,
                    self.sampling,
                    &[None],
                    &mut self.rng,
                    None,
                )?;
                self.held = f0.into_iter().next();
                self.generated = 1;
                if self.at_cap() {
                    continue;
                }
            }
            let Some((main, codes)) = self.held.take() else {
                return Err(ModelError::Candle(candle_core::Error::Msg(
                    "Fish session without a frame to continue from".into(),
                )));
            };
            let mut ids = vec![vec![main]];
            ids.extend(codes.iter().map(|&c| vec![c]));
            return Ok(Prep::Make(Step { ids, emit: codes }));
        }
    }

    /// The cap: once the batch has made `max_new` frames, the held (last) frame is dropped, as
    /// the reference drops it, and the next batch follows or the utterance is over. Whether the
    /// cap was reached.
    fn at_cap(&mut self) -> bool {
        if self.generated < self.max_new {
            return false;
        }
        self.held = None;
        if self.batches.rest.is_empty() {
            self.finished = Some(FinishReason::Length);
        } else {
            self.batches.cut = true;
            self.next_batch = true;
        }
        true
    }

    /// The next generation batch ([`Batches`]): the current one and its frames join the
    /// history, and the next batch's prompt, holding the earlier batches and their codes, is
    /// embedded for [`Stage0Session::prefill_pending`] to run over a fresh cache (as the
    /// reference prefills each batch's prompt afresh). When the prompt with the whole history
    /// passes `max_seq_len` less [`PROMPT_HEADROOM`], the oldest batches leave the history until
    /// it fits (the reference stops with an error there). Errors: the batch alone does not fit
    /// (refused at `begin`).
    fn begin_next_batch(&mut self) -> Result<(), ModelError> {
        let (ar, b) = (self.ar, &mut self.batches);
        let Some(next) = b.rest.pop_front() else {
            return Err(ModelError::Candle(candle_core::Error::Msg(
                "Fish session: no batch follows".into(),
            )));
        };
        let done = std::mem::replace(&mut b.current, next);
        let m = &ar.model;
        // `[codebooks][frames]`, also for a batch that gave no frame (a cap of one step).
        let mut codes = vec![Vec::new(); m.config.num_codebooks()];
        for frame in std::mem::take(&mut b.frames) {
            for (row, c) in codes.iter_mut().zip(frame) {
                row.push(c);
            }
        }
        b.history.push((done, codes));
        let limit = m.slow.max_seq_len().saturating_sub(PROMPT_HEADROOM);
        let (prompt, dropped) =
            m.prompts
                .build_within(&b.current, b.reference.as_ref(), &b.history, limit)?;
        b.history.drain(..dropped);
        self.max_new = ar.batch_cap(&b.text, prompt.len(), b.max_new_tokens)?;
        self.pending = Some((m.slow.embed(&[&prompt.rows])?, 0));
        self.cache = m.slow.new_cache();
        self.held = None;
        self.generated = 0;
        self.window.clear();
        self.next_batch = false;
        Ok(())
    }

    /// Takes the new frame (`main`, `codes`): the window moves on; `<|im_end|>` ends the
    /// utterance (its frame dropped), any other frame is held. Gives out `emit`, the frame
    /// before it.
    fn finish(&mut self, main: u32, codes: Vec<u32>, emit: Vec<u32>) -> ArStep {
        if self.window.len() == RAS_WINDOW {
            self.window.remove(0);
        }
        self.window.push(main);
        self.generated += 1;
        if !self.batches.rest.is_empty() {
            self.batches.frames.push(emit.clone());
        }
        if main == self.ar.model.slow.im_end() {
            if self.batches.rest.is_empty() {
                self.finished = Some(self.batches.end_by_eos());
            } else {
                self.next_batch = true;
            }
        } else {
            self.held = Some((main, codes));
            // At the cap now rather than on the next step, so that a next batch's prompt can
            // run between steps.
            self.at_cap();
        }
        ArStep::Frame(emit)
    }
}

impl Stage0Session for FishSession<'_> {
    fn extend_text(&mut self, _ids: &[u32], _ended: bool) -> Result<(), ModelError> {
        Err(ModelError::InvalidRequest {
            field: "model".into(),
            value: super::rules::MODEL_TYPE.into(),
            msg: "Fish S2 Pro takes whole texts only".into(),
        })
    }

    fn check_text_budget(&self, _text: &str, _max_new_tokens: usize) -> Result<(), ModelError> {
        Ok(())
    }

    fn has_pending_prompt(&self) -> bool {
        self.finished.is_none() && (self.next_batch || self.pending.is_some())
    }

    fn prefill_pending(&mut self, positions: usize) -> Result<usize, ModelError> {
        if self.finished.is_some() {
            return Ok(0);
        }
        if self.next_batch {
            self.begin_next_batch()?;
        }
        let Some((x, done)) = self.pending.take() else {
            return Ok(0);
        };
        let t = x.dim(1)?;
        let n = positions.max(1).min(t - done);
        let out = self
            .ar
            .model
            .slow
            .forward(&x.narrow(1, done, n)?, &mut self.cache)?;
        if done + n == t {
            self.first = Some(out);
        } else {
            self.pending = Some((x, done + n));
        }
        Ok(n)
    }
}
