//! Stage 1: the codec decoder's thread (see `stages.rs` for the request lifecycle), generic over
//! the model family's [`Stage1Model`] (monomorphised), and beside it, on CUDA by default, the
//! first-chunk lane (`first_chunk_lane.rs`), which decodes new requests' first chunks on a decoder
//! of its own and then hands them to this thread.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::chunk_buffer::{ChunkPolicy, Take};
use super::config::{DecoderStageConfig, DecoderStreamingMode};
use super::device::{StreamRole, TrimPoolOnExit};
use super::first_chunk_lane::{self, FirstChunkLane, Handover, LaneShared};
use super::metrics::{BatchCounters, DecoderTiming};
use super::pass_plan::{Waiting, next_pass};
use super::queue::{DeadOnExit, StageQueue};
use super::request::RequestShared;
use super::stages::{CudaGraphs, guarded, panic_message};
use super::{AudioChunk, DTypeSpec, DeviceSpec, EngineError, EngineEvent, FinishReason, Metrics};
use crate::models::tts::{Stage1Model, Stage1Options, Stage1Stream};
use crate::nn::switches::StreamPriority;
use candle_core::DType;

/// A chunk's decode result: its samples or the error text, and the decode time charged to it.
type Decoded = (Result<Vec<f32>, String>, Duration);

/// What stage 1 reports after loading.
pub(crate) struct DecInfo {
    pub sample_rate: u32,
    pub samples_per_frame: usize,
    pub quantizers: usize,
    pub device: DeviceSpec,
    pub first_chunk_lane: FirstChunkLane,
    pub decoder_graphs: CudaGraphs,
}

pub(crate) fn dec_thread<C: Stage1Model>(
    dir: PathBuf,
    device: DeviceSpec,
    cfg: DecoderStageConfig,
    priority: StreamPriority,
    queue: Arc<StageQueue>,
    ready: mpsc::SyncSender<Result<DecInfo, EngineError>>,
    batches: Arc<BatchCounters>,
) {
    let _dead_on_exit = DeadOnExit(queue.clone());
    // Declared before the model: dropped after it.
    let mut pool = TrimPoolOnExit::default();
    let loaded = (|| {
        let dev = device.open_as(StreamRole::Decoder, priority)?;
        pool.watch(&dev);
        let opts = Stage1Options {
            dtype: decoder_dtype(&cfg, &dev)?,
        };
        let (c2w, graphs) = load_decoder::<C>(&dir, &dev, &opts)?;
        Ok((c2w, graphs, opts))
    })();
    let (mut c2w, decoder_graphs, opts) = match loaded {
        Ok(m) => m,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    if cfg.max_num_batched_tokens > 0 {
        c2w.set_max_batch_frames(cfg.max_num_batched_tokens);
    }
    std::thread::scope(|scope| {
        let (lane, lane_state) = if cfg.first_chunk_lane_on(device) {
            let max_batch_frames = c2w.max_batch_frames();
            match first_chunk_lane::start::<C>(
                scope,
                &dir,
                device,
                priority,
                opts,
                max_batch_frames,
                queue.clone(),
            ) {
                Ok((lane, graphs)) => (Some((lane, graphs)), FirstChunkLane::On),
                Err(msg) => (None, FirstChunkLane::Fallback(msg)),
            }
        } else {
            (None, FirstChunkLane::Off)
        };
        let (lane, decoder_graphs) = match lane {
            Some((lane, lane_graphs)) => (Some(lane), with_lane(decoder_graphs, lane_graphs)),
            None => (None, decoder_graphs),
        };
        // Stops the lane however this scope is left (the scope then joins its thread).
        let _stop_lane = lane.as_ref().map(|l| l.stopper());
        let info = DecInfo {
            sample_rate: c2w.sample_rate(),
            samples_per_frame: c2w.samples_per_frame(),
            quantizers: c2w.num_codebooks(),
            device: device.resolve(),
            first_chunk_lane: lane_state,
            decoder_graphs,
        };
        if ready.send(Ok(info)).is_err() {
            return;
        }
        drop(ready);
        DecStage {
            c2w: &c2w,
            cfg: &cfg,
            batches: &batches,
            lane: lane.as_deref(),
        }
        .run(&queue);
    });
}

/// Stage 1's decoder graphs with the first-chunk lane's (which decodes most first chunks): a
/// fallback of either is what is reported.
fn with_lane(own: CudaGraphs, lane: CudaGraphs) -> CudaGraphs {
    match (own, lane) {
        (CudaGraphs::Fallback(m), _) => CudaGraphs::Fallback(m),
        (_, CudaGraphs::Fallback(m)) => {
            CudaGraphs::Fallback(format!("the first-chunk lane's decoder: {m}"))
        }
        (own, _) => own,
    }
}

/// Loads the family's codec decoder from `dir` on `dev`, a panic inside the loader turned into an
/// error, and on CUDA captures its graphs ([`Stage1Model::enable_cuda_graphs`]; a failed or
/// panicking capture leaves it eager and says why). Errors: [`EngineError::Load`] (the loader's
/// error), [`EngineError::Stage`] (a panic while loading).
pub(super) fn load_decoder<C: Stage1Model>(
    dir: &Path,
    dev: &candle_core::Device,
    opts: &Stage1Options,
) -> Result<(C, CudaGraphs), EngineError> {
    let mut c2w = match catch_unwind(AssertUnwindSafe(|| C::load(dir, dev, opts))) {
        Ok(r) => r.map_err(|e| EngineError::Load {
            stage: 1,
            name: C::NAME,
            source: e,
        })?,
        Err(p) => {
            return Err(EngineError::Stage {
                stage: 1,
                msg: format!("panicked while loading: {}", panic_message(p.as_ref())),
            });
        }
    };
    let graphs = if !dev.is_cuda() {
        CudaGraphs::NotApplicable
    } else {
        match catch_unwind(AssertUnwindSafe(|| c2w.enable_cuda_graphs())) {
            Ok(Ok(true)) => CudaGraphs::Enabled,
            Ok(Ok(false)) => CudaGraphs::NotApplicable,
            Ok(Err(e)) => CudaGraphs::Fallback(e.to_string()),
            Err(p) => CudaGraphs::Fallback(format!("panicked: {}", panic_message(p.as_ref()))),
        }
    };
    Ok((c2w, graphs))
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
    /// The first-chunk lane, when it runs: it consumes the queue, keeps new exact streams for
    /// their first [`first_chunk_lane::LANE_AUDIO`] of audio, and hands every request on here.
    lane: Option<&'c LaneShared>,
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
    /// Frames the first-chunk lane decoded and delivered: decoded again in front of the next
    /// chunk to bring this thread's stream to the same state, their audio dropped.
    carry: Vec<Vec<u32>>,
    /// Why a decode failed: the request is cancelled, and finishes with this reason once stage 0
    /// has let go of it.
    failed: Option<FinishReason>,
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
        let mut waiting: VecDeque<Handover> = VecDeque::new();
        let mut active: Vec<DecActive<'c, C>> = Vec::new();
        loop {
            let seen = queue.signal.epoch();
            // With the lane running, every request comes through it (the queue is the lane's);
            // without it (or once it has died) straight from the queue.
            let shutdown = match self.lane {
                Some(lane) if lane.is_alive() => {
                    waiting.extend(lane.take_back());
                    queue.is_shut_down()
                }
                lane => {
                    if let Some(lane) = lane {
                        waiting.extend(lane.take_back());
                    }
                    let (new, shutdown) = queue.drain();
                    waiting.extend(new.into_iter().map(Handover::untouched));
                    shutdown
                }
            };
            if shutdown {
                // The lane first, so that it sends nothing after a request's `Finished`.
                if let Some(lane) = self.lane {
                    lane.stop();
                    waiting.extend(lane.take_back());
                    let (left, _) = queue.drain();
                    waiting.extend(left.into_iter().map(Handover::untouched));
                }
                // Requests the lane saw to their end (all audio out, or failed) keep their reason.
                let all = active
                    .drain(..)
                    .map(|a| (a.req, a.timing, None))
                    .chain(waiting.drain(..).map(|h| (h.req, h.timing, h.finished)));
                for (req, timing, finished) in all {
                    req.cancel();
                    let reason = finished.unwrap_or(FinishReason::Cancelled);
                    Self::finish(&req, reason, &timing, self.sample_rate());
                }
                return;
            }
            let mut progress = false;
            // Over before they started here (the lane delivered all their audio, or failed), or
            // cancelled before they started (finished once stage 0 has let go).
            waiting.retain_mut(|h| {
                let reason = match h.finished.take() {
                    Some(reason) => reason,
                    None if h.req.is_cancelled() && h.req.ar_outcome().is_some() => {
                        FinishReason::Cancelled
                    }
                    None => return true,
                };
                Self::finish(&h.req, reason, &h.timing, self.sample_rate());
                progress = true;
                false
            });
            while active.len() < self.cfg.max_num_seqs {
                let Some(Handover {
                    req,
                    mut timing,
                    carry,
                    ..
                }) = waiting.pop_front()
                else {
                    break;
                };
                progress = true;
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
                    carry,
                    failed: None,
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
        let context = reference_context::<C>(req).cloned().unwrap_or_default();
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
                Take::Cancelled => {
                    let reason = a.failed.take().unwrap_or(FinishReason::Cancelled);
                    done.push((i, reason));
                }
                Take::Done => done.push((i, ar_reason(&a.req))),
                Take::Chunk {
                    frames,
                    first,
                    last,
                } => {
                    progress = true;
                    if !a.req.is_cancelled() {
                        let primed = a.carry.len();
                        let mut all = std::mem::take(&mut a.carry);
                        all.extend(frames);
                        a.pending = Some(Ready {
                            frames: all,
                            first: first.saturating_sub(primed),
                            last,
                            primed,
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
            let spf = self.c2w.samples_per_frame();
            match deliver::<C>(spf, &a.req, &mut a.timing, r, result) {
                None => {}
                Some(reason @ FinishReason::Error(_)) => fail(&a.req, &mut a.failed, reason),
                Some(reason) => done.push((*i, reason)),
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
                decode_batched(self.c2w, &mut streams, &chunks)
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
}

/// A chunk taken from a request's buffer, waiting for its decode.
pub(super) struct Ready {
    /// The frames to decode, `[n][codebooks]`.
    pub frames: Vec<Vec<u32>>,
    /// The utterance's index of `frames[0]`.
    pub first: usize,
    /// Nothing follows this chunk.
    pub last: bool,
    /// Leading frames whose audio the first-chunk lane already delivered: decoded only to bring
    /// the stream's state up to date, their samples dropped.
    pub primed: usize,
}

/// [`Stage1Model::decode_chunks`] with a panic or a wrong result count turned into every stream's
/// error: one result per stream, in order.
pub(super) fn decode_batched<'c, C: Stage1Model>(
    c2w: &'c C,
    streams: &mut [&mut C::Stream<'c>],
    chunks: &[&[Vec<u32>]],
) -> Vec<Result<Vec<f32>, String>> {
    let n = streams.len();
    match guarded(|| Ok(c2w.decode_chunks(streams, chunks))) {
        Ok(r) if r.len() == n => r
            .into_iter()
            .map(|x| x.map_err(|e| e.to_string()))
            .collect(),
        Ok(r) => vec![Err(format!("batched decode gave {} results for {n}", r.len())); n],
        Err(msg) => vec![Err(msg); n],
    }
}

/// Checks a decoded chunk (`r.frames.len() × spf` finite samples) and sends its audio past the
/// `r.primed` frames already delivered, with `FirstAudio` before the request's first audio; the
/// request's `timing` counts what was sent. `Some(reason)` when the request is over (the chunk
/// was its last, or the decode failed or gave bad samples: an error naming the frames).
pub(super) fn deliver<C: Stage1Model>(
    spf: usize,
    req: &RequestShared,
    timing: &mut DecoderTiming,
    r: &Ready,
    decoded: Result<Vec<f32>, String>,
) -> Option<FinishReason> {
    let (frames, first, last) = (&r.frames, r.first, r.last);
    let span = || {
        format!(
            "stage 1 ({}) frames {first}..{}",
            C::NAME,
            first + frames.len()
        )
    };
    let mut samples = match decoded {
        Ok(s) => s,
        Err(msg) => return Some(FinishReason::Error(format!("{}: {msg}", span()))),
    };
    if samples.len() != frames.len() * spf {
        return Some(FinishReason::Error(format!(
            "{}: decoder returned {} samples, expected {} × {spf} = {}",
            span(),
            samples.len(),
            frames.len(),
            frames.len() * spf
        )));
    }
    if let Some(bad) = samples.iter().position(|x| !x.is_finite()) {
        return Some(FinishReason::Error(format!(
            "{}: non-finite sample {} at {}",
            span(),
            samples[bad],
            first * spf + bad
        )));
    }
    if req.is_cancelled() {
        return None;
    }
    samples.drain(..(r.primed * spf).min(samples.len()));
    if timing.first_audio.is_none() {
        let now = Instant::now();
        timing.first_audio = Some(now);
        req.send(EngineEvent::FirstAudio {
            ttfa_ms: super::metrics::ms(now.saturating_duration_since(req.submitted)),
        });
    }
    let offset = timing.samples;
    timing.samples += samples.len() as u64;
    timing.frames += frames.len() - r.primed;
    req.send(EngineEvent::Audio(AudioChunk { samples, offset }));
    if last { Some(ar_reason(req)) } else { None }
}

/// A decode of `req` failed: cancels it (stage 0 stops and lets go) and keeps `reason` in
/// `failed` for its `Finished`, sent once stage 0 has let go (the buffer then reports the
/// cancellation).
pub(super) fn fail(req: &RequestShared, failed: &mut Option<FinishReason>, reason: FinishReason) {
    req.cancel();
    failed.get_or_insert(reason);
}

/// The reference codes an ICL clone's decoding starts from ([`Stage1Model::REFERENCE_CONTEXT`]),
/// `None` for every other request.
pub(super) fn reference_context<C: Stage1Model>(req: &RequestShared) -> Option<&Vec<Vec<u32>>> {
    req.request
        .voice
        .voice_clone
        .as_ref()
        .filter(|vc| vc.icl && C::REFERENCE_CONTEXT)
        .and_then(|vc| vc.ref_codes.as_ref())
        .filter(|codes| !codes.is_empty())
}

/// The reason stage 0 recorded; it is always set before the buffer reports Done.
pub(super) fn ar_reason(req: &RequestShared) -> FinishReason {
    req.ar_outcome().map(|o| o.reason).unwrap_or_else(|| {
        FinishReason::Error("stage 1: stage 0 finished without a reason".to_string())
    })
}
