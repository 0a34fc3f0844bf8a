//! Stage 1: the codec decoder's thread (see `stages.rs` for the request lifecycle), generic over
//! the model family's [`Stage1Model`] (monomorphised).

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::chunk_buffer::{ChunkPolicy, Take};
use super::config::{DecoderStageConfig, DecoderStreamingMode};
use super::metrics::{BatchCounters, DecoderTiming};
use super::pass_plan::{Waiting, next_pass};
use super::queue::{DeadOnExit, StageQueue};
use super::request::RequestShared;
use super::stages::{guarded, panic_message};
use super::{AudioChunk, DTypeSpec, DeviceSpec, EngineError, EngineEvent, FinishReason, Metrics};
use crate::models::tts::{Stage1Model, Stage1Options, Stage1Stream};
use candle_core::DType;

/// A chunk's decode result: its samples or the error text, and the decode time charged to it.
type Decoded = (Result<Vec<f32>, String>, Duration);

/// What stage 1 reports after loading.
pub(crate) struct DecInfo {
    pub sample_rate: u32,
    pub samples_per_frame: usize,
    pub quantizers: usize,
    pub device: DeviceSpec,
}

pub(crate) fn dec_thread<C: Stage1Model>(
    dir: PathBuf,
    device: DeviceSpec,
    cfg: DecoderStageConfig,
    queue: Arc<StageQueue>,
    ready: mpsc::SyncSender<Result<DecInfo, EngineError>>,
    batches: Arc<BatchCounters>,
) {
    let _dead_on_exit = DeadOnExit(queue.clone());
    let loaded = (|| {
        let dev = device.open()?;
        let dtype = decoder_dtype(&cfg, &dev)?;
        let opts = Stage1Options { dtype };
        match catch_unwind(AssertUnwindSafe(|| C::load(&dir, &dev, &opts))) {
            Ok(r) => r.map_err(|e| EngineError::Load {
                stage: 1,
                name: C::NAME,
                source: e,
            }),
            Err(p) => Err(EngineError::Stage {
                stage: 1,
                msg: format!("panicked while loading: {}", panic_message(p.as_ref())),
            }),
        }
    })();
    let mut c2w = match loaded {
        Ok(m) => m,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    if cfg.max_num_batched_tokens > 0 {
        c2w.set_max_batch_frames(cfg.max_num_batched_tokens);
    }
    let info = DecInfo {
        sample_rate: c2w.sample_rate(),
        samples_per_frame: c2w.samples_per_frame(),
        quantizers: c2w.num_codebooks(),
        device: device.resolve(),
    };
    if ready.send(Ok(info)).is_err() {
        return;
    }
    drop(ready);
    DecStage {
        c2w: &c2w,
        cfg: &cfg,
        batches: &batches,
    }
    .run(&queue);
}

/// The compute dtype of the codec decoder for `cfg` on `dev` (`dtype: bfloat16` needs CUDA); with
/// `allow_tf32` on CUDA, turns on candle's process-wide TF32 switch for f32 matrix products.
///
/// Errors: [`EngineError::Stage`] for bfloat16 on a CPU device (candle's CPU bf16 convolutions
/// are many times slower than f32 there).
fn decoder_dtype(
    cfg: &DecoderStageConfig,
    dev: &candle_core::Device,
) -> Result<DType, EngineError> {
    if cfg.allow_tf32 && dev.is_cuda() {
        #[cfg(feature = "cuda")]
        candle_core::cuda::set_gemm_reduced_precision_f32(true);
    }
    match cfg.dtype {
        DTypeSpec::Bf16 if dev.is_cuda() => Ok(DType::BF16),
        DTypeSpec::Bf16 => Err(EngineError::Stage {
            stage: 1,
            msg: "engine_args.dtype bfloat16 needs a CUDA device for the codec decoder (use float32 on the CPU)"
                .into(),
        }),
        _ => Ok(DType::F32),
    }
}

struct DecStage<'c, C: Stage1Model> {
    c2w: &'c C,
    cfg: &'c DecoderStageConfig,
    batches: &'c BatchCounters,
}

enum DecState<'c, C: Stage1Model> {
    /// Batch: one whole-utterance decode after the ICL reference codes (empty otherwise).
    Whole(Vec<Vec<u32>>),
    /// Stateful exact streaming.
    Exact(C::Stream<'c>),
    /// Stateless windows; the last `codec_left_context_frames` frames decoded so far.
    Windowed(Vec<Vec<u32>>),
}

/// One request on stage 1.
struct DecActive<'c, C: Stage1Model> {
    req: Arc<RequestShared>,
    state: DecState<'c, C>,
    timing: DecoderTiming,
    /// The chunk taken from the request's buffer and not decoded yet (one at a time, so a
    /// request's chunks are decoded in order).
    pending: Option<Ready>,
}

impl<C: Stage1Model> DecActive<'_, C> {
    /// The pending chunk as the pass planner sees it (`None` without one).
    fn waiting(&self, now: Instant, rate: u32) -> Option<Waiting> {
        let r = self.pending.as_ref()?;
        let slack = self.timing.first_audio.map(|t0| {
            self.timing.samples as f64 / f64::from(rate.max(1))
                - now.saturating_duration_since(t0).as_secs_f64()
        });
        Some(Waiting {
            frames: r.frames.len(),
            slack,
        })
    }
}

impl<'c, C: Stage1Model> DecStage<'c, C> {
    fn run(&self, queue: &StageQueue) {
        let mut waiting: VecDeque<Arc<RequestShared>> = VecDeque::new();
        let mut active: Vec<DecActive<'c, C>> = Vec::new();
        loop {
            let seen = queue.signal.epoch();
            let (new, shutdown) = queue.drain();
            waiting.extend(new);
            if shutdown {
                let all = active
                    .drain(..)
                    .map(|a| (a.req, a.timing))
                    .chain(waiting.drain(..).map(|r| (r, DecoderTiming::default())));
                for (req, timing) in all {
                    req.cancel();
                    Self::finish(&req, FinishReason::Cancelled, &timing, self.sample_rate());
                }
                return;
            }
            let mut progress = false;
            // Cancelled before they started here: finish once stage 0 has let go.
            waiting.retain(|r| {
                if r.is_cancelled() && r.ar_outcome().is_some() {
                    Self::finish(
                        r,
                        FinishReason::Cancelled,
                        &DecoderTiming::default(),
                        self.sample_rate(),
                    );
                    progress = true;
                    false
                } else {
                    true
                }
            });
            while active.len() < self.cfg.max_num_seqs {
                let Some(req) = waiting.pop_front() else {
                    break;
                };
                progress = true;
                let mut timing = DecoderTiming::default();
                let state = match self.init_state(&req, &mut timing) {
                    Ok(state) => state,
                    Err(msg) => {
                        req.cancel();
                        let reason = FinishReason::Error(format!(
                            "stage 1 ({}) reference codes: {msg}",
                            C::NAME
                        ));
                        Self::finish(&req, reason, &timing, self.sample_rate());
                        continue;
                    }
                };
                active.push(DecActive {
                    req,
                    state,
                    timing,
                    pending: None,
                });
            }
            progress |= self.decode_round(&mut active);
            if !progress {
                queue.signal.wait_past(seen, None);
            }
        }
    }

    fn sample_rate(&self) -> u32 {
        self.c2w.sample_rate()
    }

    /// The decoder state a request starts with. For Qwen3-TTS Base ICL
    /// ([`Stage1Model::REFERENCE_CONTEXT`]) the reference codes are the decoder's
    /// left context for the whole utterance (docs/field-lessons.md §4): the exact stream is primed
    /// with them and their audio dropped, the windowed history starts with their tail, and a whole
    /// decode prepends them.
    fn init_state(
        &self,
        req: &RequestShared,
        timing: &mut DecoderTiming,
    ) -> Result<DecState<'c, C>, String> {
        let context = req
            .request
            .voice
            .voice_clone
            .as_ref()
            .filter(|vc| vc.icl && C::REFERENCE_CONTEXT)
            .and_then(|vc| vc.ref_codes.clone())
            .unwrap_or_default();
        Ok(match (req.buffer.policy(), self.cfg.streaming_mode) {
            (ChunkPolicy::Whole, _) => DecState::Whole(context),
            (_, DecoderStreamingMode::Exact) => {
                let mut stream = self.c2w.stream();
                if !context.is_empty() {
                    let t = Instant::now();
                    guarded(|| stream.decode_chunk(&context))?;
                    timing.decode += t.elapsed();
                }
                DecState::Exact(stream)
            }
            (_, DecoderStreamingMode::Windowed) => {
                let keep = self.cfg.codec_left_context_frames;
                DecState::Windowed(context[context.len().saturating_sub(keep)..].to_vec())
            }
        })
    }

    fn finish(req: &RequestShared, reason: FinishReason, timing: &DecoderTiming, rate: u32) {
        let ar = req.ar_outcome();
        let ar_timing = ar.as_ref().map(|o| o.timing.clone()).unwrap_or_default();
        let metrics = Metrics::build(req.submitted, Instant::now(), &ar_timing, timing, rate);
        req.send(EngineEvent::Finished { reason, metrics });
    }

    /// The reason stage 0 recorded; it is always set before the buffer reports Done.
    fn ar_reason(req: &RequestShared) -> FinishReason {
        req.ar_outcome().map(|o| o.reason).unwrap_or_else(|| {
            FinishReason::Error("stage 1: stage 0 finished without a reason".to_string())
        })
    }

    /// One round: every active request without a pending chunk takes its next chunk if it is
    /// ready; then one pass decodes the pending chunks [`next_pass`] chooses (urgent ones first:
    /// a request's first chunk never waits behind a long pass), the chunks of the requests on the
    /// exact streaming decoder together ([`Stage1Model::decode_chunks`]: each stream keeps its own
    /// state, so every request's audio is what it would be alone), the others one by one; then
    /// each decoded chunk's audio is checked and sent. Requests that are over leave. Returns
    /// whether anything happened or is still pending.
    fn decode_round(&self, active: &mut Vec<DecActive<'c, C>>) -> bool {
        let mut progress = false;
        let mut done: Vec<(usize, FinishReason)> = Vec::new();
        for (i, a) in active.iter_mut().enumerate() {
            if a.req.is_cancelled() {
                a.pending = None;
            }
            if a.pending.is_some() {
                continue;
            }
            match a.req.buffer.try_take() {
                Take::NotReady => {}
                // Wait until stage 0 has let go as well.
                Take::Cancelled if a.req.ar_outcome().is_none() => {}
                Take::Cancelled => done.push((i, FinishReason::Cancelled)),
                Take::Done => done.push((i, Self::ar_reason(&a.req))),
                Take::Chunk {
                    frames,
                    first,
                    last,
                } => {
                    progress = true;
                    if !a.req.is_cancelled() {
                        a.pending = Some(Ready {
                            frames,
                            first,
                            last,
                        });
                    }
                }
            }
        }
        let now = Instant::now();
        let rate = self.sample_rate();
        let (rows, waiting): (Vec<usize>, Vec<Waiting>) = active
            .iter()
            .enumerate()
            .filter_map(|(i, a)| a.waiting(now, rate).map(|w| (i, w)))
            .unzip();
        let pass: Vec<usize> = next_pass(&waiting, self.c2w.max_batch_frames())
            .into_iter()
            .map(|k| rows[k])
            .collect();
        let ready: Vec<(usize, Ready)> = pass
            .iter()
            .filter_map(|&i| active[i].pending.take().map(|r| (i, r)))
            .collect();
        let pass_frames: usize = ready.iter().map(|(_, r)| r.frames.len()).sum();
        let decoded = self.decode_ready(active, &ready);
        for ((i, r), (result, elapsed)) in ready.iter().zip(decoded) {
            let a = &mut active[*i];
            a.timing.decode += elapsed;
            if a.timing.first_pass_frames.is_none() {
                a.timing.first_pass_frames = Some(pass_frames);
            }
            if let Some(reason) = self.deliver(a, r, result) {
                done.push((*i, reason));
            }
        }
        progress |= !ready.is_empty() || !done.is_empty();
        done.sort_by_key(|(i, _)| std::cmp::Reverse(*i));
        for (i, reason) in done {
            let DecActive {
                req, state, timing, ..
            } = active.remove(i);
            drop(state);
            Self::finish(&req, reason, &timing, self.sample_rate());
        }
        progress || active.iter().any(|a| a.pending.is_some())
    }

    /// Decodes the ready chunks (`ready[k]` belongs to `active[ready[k].0]`), in `ready`'s order:
    /// the exact-streaming ones in one batched pass, the rest one by one. Each result comes with
    /// the decode time it is charged (a batched pass is charged to each of its requests).
    fn decode_ready(
        &self,
        active: &mut [DecActive<'c, C>],
        ready: &[(usize, Ready)],
    ) -> Vec<Decoded> {
        let mut out: Vec<Option<Decoded>> = (0..ready.len()).map(|_| None).collect();
        // The exact streams, batched.
        let exact: Vec<usize> = (0..ready.len())
            .filter(|&k| matches!(active[ready[k].0].state, DecState::Exact(_)))
            .collect();
        if !exact.is_empty() {
            let t = Instant::now();
            let results = {
                let mut streams: Vec<&mut C::Stream<'c>> = Vec::with_capacity(exact.len());
                let mut chunks: Vec<&[Vec<u32>]> = Vec::with_capacity(exact.len());
                // `ready` is in ascending order of `active` index, so one pass splits them off.
                let mut rest: &mut [DecActive<'c, C>] = active;
                let mut base = 0;
                for &k in &exact {
                    let (i, r) = (&ready[k].0, &ready[k].1);
                    let (_, tail) = std::mem::take(&mut rest).split_at_mut(*i - base);
                    let (row, tail) = tail.split_at_mut(1);
                    if let DecState::Exact(stream) = &mut row[0].state {
                        streams.push(stream);
                        chunks.push(&r.frames);
                    }
                    rest = tail;
                    base = i + 1;
                }
                let n = streams.len();
                match guarded(|| Ok(self.c2w.decode_chunks(&mut streams, &chunks))) {
                    Ok(r) if r.len() == n => r
                        .into_iter()
                        .map(|x| x.map_err(|e| e.to_string()))
                        .collect(),
                    Ok(r) => {
                        vec![Err(format!("batched decode gave {} results for {n}", r.len())); n]
                    }
                    Err(msg) => vec![Err(msg); n],
                }
            };
            let elapsed = t.elapsed();
            self.batches.step(exact.len());
            for (&k, result) in exact.iter().zip(results) {
                out[k] = Some((result, elapsed));
            }
        }
        for (k, (i, r)) in ready.iter().enumerate() {
            if out[k].is_some() {
                continue;
            }
            let t = Instant::now();
            let result = match &mut active[*i].state {
                DecState::Whole(context) => guarded(|| self.c2w.decode_window(context, &r.frames)),
                DecState::Exact(stream) => guarded(|| stream.decode_chunk(&r.frames)),
                DecState::Windowed(history) => {
                    let result = guarded(|| self.c2w.decode_window(history, &r.frames));
                    history.extend(r.frames.iter().cloned());
                    let keep = self.cfg.codec_left_context_frames;
                    if history.len() > keep {
                        history.drain(..history.len() - keep);
                    }
                    result
                }
            };
            out[k] = Some((result, t.elapsed()));
        }
        out.into_iter()
            .map(|o| o.unwrap_or_else(|| (Err("chunk not decoded".to_string()), Duration::ZERO)))
            .collect()
    }

    /// Checks a decoded chunk and sends its audio (and `FirstAudio` before the first);
    /// `Some(reason)` when the request is over.
    fn deliver(
        &self,
        a: &mut DecActive<'c, C>,
        r: &Ready,
        decoded: Result<Vec<f32>, String>,
    ) -> Option<FinishReason> {
        let (frames, first, last) = (&r.frames, r.first, r.last);
        let spf = self.c2w.samples_per_frame();
        let samples = match decoded {
            Ok(s) => s,
            Err(msg) => {
                return Some(FinishReason::Error(format!(
                    "stage 1 ({}) frames {first}..{}: {msg}",
                    C::NAME,
                    first + frames.len()
                )));
            }
        };
        if samples.len() != frames.len() * spf {
            return Some(FinishReason::Error(format!(
                "stage 1 ({}) frames {first}..{}: decoder returned {} samples, \
                         expected {} × {spf} = {}",
                C::NAME,
                first + frames.len(),
                samples.len(),
                frames.len(),
                frames.len() * spf
            )));
        }
        if let Some(bad) = samples.iter().position(|x| !x.is_finite()) {
            return Some(FinishReason::Error(format!(
                "stage 1 ({}) frames {first}..{}: non-finite sample {} at {}",
                C::NAME,
                first + frames.len(),
                samples[bad],
                a.timing.samples + bad as u64
            )));
        }
        if a.req.is_cancelled() {
            return None;
        }
        if a.timing.first_audio.is_none() {
            let now = Instant::now();
            a.timing.first_audio = Some(now);
            a.req.send(EngineEvent::FirstAudio {
                ttfa_ms: super::metrics::ms(now.saturating_duration_since(a.req.submitted)),
            });
        }
        let offset = a.timing.samples;
        a.timing.samples += samples.len() as u64;
        a.timing.frames += frames.len();
        a.req
            .send(EngineEvent::Audio(AudioChunk { samples, offset }));
        if last {
            Some(Self::ar_reason(&a.req))
        } else {
            None
        }
    }
}

/// A chunk taken from a request's buffer, waiting for its decode.
struct Ready {
    frames: Vec<Vec<u32>>,
    first: usize,
    last: bool,
}
