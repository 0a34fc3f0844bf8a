//! Stage 1's first-chunk lane: new requests' first chunks decoded beside the pass in flight.
//!
//! Stage 1 decodes in passes and its thread waits for each pass's audio. [`super::pass_plan`]
//! puts a first chunk before other requests' later chunks, but a first chunk that becomes ready
//! while a long pass runs still waits for that pass: under load, most of the tail of the time to
//! first audio (docs/cuda.md, "First audio under load").
//!
//! The lane is a second decoder thread with its own copy of the codec decoder on its own device
//! handle (on CUDA its own stream, so its kernels run beside the pass in flight instead of after
//! it). When it runs, it is the consumer of stage 1's queue: it keeps each new request that
//! streams exactly from a fresh state and passes every other one straight on to stage 1's thread
//! (so that a new request never waits for that thread's pass in flight to be seen). It takes
//! the request's chunks from its buffer as they become ready, decodes them on a stream of its own
//! (the chunks of all its requests that are ready together in one batched pass) and sends their
//! audio (`FirstAudio`, `Audio`), until the request has [`LANE_AUDIO`] of audio out: with the
//! chunk ramp (1, 1, 2, 4 frames) its first four chunks. Only handing over after the first chunk
//! would bring the first audio forward but not the second chunk, which would then be due sooner
//! and still wait for stage 1's pass in flight: on an H200 at 40 requests a second that made more
//! requests underrun, not fewer (docs/cuda.md, "The first-chunk lane").
//!
//! Then it hands the request back ([`Handover`]) with its timing and every frame it decoded (the
//! *carry*). Stage 1 decodes the carry again on its own stream in front of the request's next
//! chunk and drops the carry's samples: with exact streaming the state after those frames is the
//! one a single decoder would have, and no audio is sent twice. A request is held by one thread
//! at a time, so its events stay in order.
//!
//! Costs: a second copy of the decoder's weights, and a request's first [`LANE_AUDIO`] decoded
//! twice. On by default on CUDA, off on the CPU (`first_chunk_lane` in the stage config).

use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::Scope;
use std::time::{Duration, Instant};

use super::chunk_buffer::{ChunkPolicy, Take};
use super::device::{StreamRole, TrimPoolOnExit};
use super::metrics::DecoderTiming;
use super::pass_plan::URGENT_SLACK;
use super::queue::StageQueue;
use super::request::RequestShared;
use super::stage1::{
    Ready, ar_reason, decode_batched, deliver, fail, load_decoder, reference_context,
};
use super::stages::CudaGraphs;
use super::stages::{guarded, lock};
use super::{DeviceSpec, FinishReason};
use crate::models::tts::{Stage1Model, Stage1Options};
use crate::nn::switches::StreamPriority;

/// The audio the lane delivers for a request before it hands the request back to stage 1 (0.5 s):
/// twice [`URGENT_SLACK`], so that the request's next chunk can wait for a pass in
/// flight on stage 1 without running dry.
pub const LANE_AUDIO: Duration = URGENT_SLACK.saturating_mul(2);

/// Whether stage 1 runs the first-chunk lane (reported by [`super::Engine::first_chunk_lane`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FirstChunkLane {
    /// Off: by the stage config, or by default on a CPU decoder or a windowed one.
    Off,
    /// Running beside stage 1's thread.
    On,
    /// Asked for, but its decoder did not load (the reason); stage 1 decodes every chunk itself.
    Fallback(String),
}

/// A request the lane gives back to stage 1.
pub(crate) struct Handover {
    pub req: Arc<RequestShared>,
    /// What the lane delivered (default when it delivered nothing).
    pub timing: DecoderTiming,
    /// The frames the lane decoded and delivered, to be decoded again in front of the next chunk
    /// (empty when it delivered nothing, or when the request is over).
    pub carry: Vec<Vec<u32>>,
    /// `Some` when the request is over: its first chunk was its last, or its decode failed.
    pub finished: Option<FinishReason>,
}

impl Handover {
    /// Given back as it came: stage 1 takes from its buffer what the lane found there (nothing
    /// yet, the end, or the cancellation; a take repeats these).
    pub(crate) fn untouched(req: Arc<RequestShared>) -> Self {
        Handover {
            req,
            timing: DecoderTiming::default(),
            carry: Vec::new(),
            finished: None,
        }
    }
}

#[derive(Default)]
struct Inbox {
    back: Vec<Handover>,
    shutdown: bool,
    /// The lane thread has exited.
    dead: bool,
}

/// What stage 1's thread and the lane share: stage 1's queue (the lane drains it; its signal
/// wakes both, and the requests' buffers advance it when frames arrive) and the requests the lane
/// gives back.
pub(crate) struct LaneShared {
    inbox: Mutex<Inbox>,
    queue: Arc<StageQueue>,
}

impl LaneShared {
    /// Whether the lane thread still runs (stage 1's thread drains its queue itself once it has
    /// exited).
    pub fn is_alive(&self) -> bool {
        !lock(&self.inbox).dead
    }

    /// The requests the lane has given back since the last call.
    pub fn take_back(&self) -> Vec<Handover> {
        std::mem::take(&mut lock(&self.inbox).back)
    }

    /// Asks the lane to stop and waits until its thread has exited; it sends nothing more.
    pub fn stop(&self) {
        lock(&self.inbox).shutdown = true;
        let signal = &self.queue.signal;
        signal.notify();
        loop {
            let seen = signal.epoch();
            if lock(&self.inbox).dead {
                return;
            }
            signal.wait_past(seen, None);
        }
    }

    /// A guard that [`Self::stop`]s the lane when dropped.
    pub fn stopper(self: &Arc<Self>) -> impl Drop + use<> {
        struct Stop(Arc<LaneShared>);
        impl Drop for Stop {
            fn drop(&mut self) {
                self.0.stop();
            }
        }
        Stop(self.clone())
    }
}

/// Marks the lane dead when its thread exits (normally or by a panic) and gives back every
/// request it still holds, untouched.
struct LaneExit<'a> {
    shared: &'a LaneShared,
    /// The requests the lane holds (given back untouched if the lane dies, so that no request
    /// waits on a lane that is gone).
    held: Vec<Arc<RequestShared>>,
}

impl Drop for LaneExit<'_> {
    fn drop(&mut self) {
        {
            let mut g = lock(&self.shared.inbox);
            g.dead = true;
            g.back.extend(self.held.drain(..).map(Handover::untouched));
        }
        self.shared.queue.signal.notify();
    }
}

/// Starts the lane's thread in `scope`: it opens `device` (a handle of its own), loads the
/// decoder of `dir` with `opts` and stage 1's pass budget `max_batch_frames`, and serves stage
/// 1's `queue`. Returns once the decoder has loaded. Errors: the load error or the thread's spawn
/// error, as text (stage 1 then runs without the lane).
pub(crate) fn start<'scope, C: Stage1Model>(
    scope: &'scope Scope<'scope, '_>,
    dir: &'scope Path,
    device: DeviceSpec,
    priority: StreamPriority,
    opts: Stage1Options,
    max_batch_frames: usize,
    queue: Arc<StageQueue>,
) -> Result<(Arc<LaneShared>, CudaGraphs), String> {
    let shared = Arc::new(LaneShared {
        inbox: Mutex::new(Inbox::default()),
        queue,
    });
    let (ready_tx, ready_rx) = mpsc::sync_channel::<Result<CudaGraphs, String>>(1);
    let lane = shared.clone();
    std::thread::Builder::new()
        .name("omnitts-stage1-first-chunks".to_string())
        .spawn_scoped(scope, move || {
            let mut exit = LaneExit {
                shared: &lane,
                held: Vec::new(),
            };
            // Declared before the decoder: dropped after it.
            let mut pool = TrimPoolOnExit::default();
            let loaded = device
                .open_as(StreamRole::Lane, priority)
                .and_then(|dev| {
                    pool.watch(&dev);
                    load_decoder::<C>(dir, &dev, &opts)
                })
                .map_err(|e| format!("the first-chunk lane's decoder: {e}"));
            let c2w = match loaded {
                Ok((mut c2w, graphs)) => {
                    c2w.set_max_batch_frames(max_batch_frames);
                    let _ = ready_tx.send(Ok(graphs));
                    c2w
                }
                Err(msg) => {
                    let _ = ready_tx.send(Err(msg));
                    return;
                }
            };
            drop(ready_tx);
            serve(&c2w, &mut exit);
        })
        .map_err(|e| format!("cannot spawn the first-chunk lane: {e}"))?;
    let graphs = ready_rx
        .recv()
        .unwrap_or_else(|_| Err("the first-chunk lane exited while loading".to_string()))?;
    Ok((shared, graphs))
}

/// A request the lane holds, with its own stream on the lane's decoder.
struct Held<S> {
    req: Arc<RequestShared>,
    stream: S,
    timing: DecoderTiming,
    /// Every frame decoded here so far.
    carry: Vec<Vec<u32>>,
    pending: Option<Ready>,
    /// A decode failed: the request is cancelled and handed back with this reason once stage 0
    /// has let go of it.
    failed: Option<FinishReason>,
}

impl<S> Held<S> {
    fn hand_back(self, finished: Option<FinishReason>) -> Handover {
        Handover {
            req: self.req,
            timing: self.timing,
            carry: if finished.is_none() {
                self.carry
            } else {
                Vec::new()
            },
            finished,
        }
    }
}

/// The lane's loop: takes each held request's next chunk as soon as it is ready, decodes the ready
/// ones together (each on its own stream), delivers their audio, and hands a request back once it
/// has [`LANE_AUDIO`] of audio out (or is over).
fn serve<C: Stage1Model>(c2w: &C, exit: &mut LaneExit<'_>) {
    let shared = exit.shared;
    let spf = c2w.samples_per_frame();
    let enough = (LANE_AUDIO.as_secs_f64() * f64::from(c2w.sample_rate())).ceil() as u64;
    let signal = &shared.queue.signal;
    let mut held: Vec<Held<C::Stream<'_>>> = Vec::new();
    loop {
        let seen = signal.epoch();
        if lock(&shared.inbox).shutdown {
            // Back with what was delivered, so that stage 1's `Finished` counts it (and a failed
            // request with its error).
            let back: Vec<Handover> = held
                .drain(..)
                .map(|mut h| {
                    let failed = h.failed.take();
                    h.hand_back(failed)
                })
                .collect();
            exit.held.clear();
            lock(&shared.inbox).back.extend(back);
            return;
        }
        let mut back: Vec<Handover> = Vec::new();
        let (new, _) = shared.queue.drain();
        // Held (for the exit guard) from the moment they leave the queue.
        exit.held.extend(new.iter().cloned());
        for req in new {
            let fresh = matches!(req.buffer.policy(), ChunkPolicy::Streaming { .. })
                && reference_context::<C>(&req).is_none();
            if !fresh {
                back.push(Handover::untouched(req));
                continue;
            }
            // The model's code: a panic here leaves the request to stage 1's thread (no audio is
            // out yet), and the lane serves the next.
            let Ok(stream) = guarded(|| Ok(c2w.stream())) else {
                back.push(Handover::untouched(req));
                continue;
            };
            held.push(Held {
                req,
                stream,
                timing: DecoderTiming::default(),
                carry: Vec::new(),
                pending: None,
                failed: None,
            });
        }
        let mut keep = Vec::with_capacity(held.len());
        for mut h in held.drain(..) {
            if h.failed.is_some() {
                if h.req.ar_outcome().is_some() {
                    let reason = h.failed.take();
                    back.push(h.hand_back(reason));
                } else {
                    keep.push(h);
                }
                continue;
            }
            if h.pending.is_none() {
                match h.req.buffer.try_take() {
                    Take::NotReady => {}
                    Take::Chunk {
                        frames,
                        first,
                        last,
                    } => {
                        h.pending = Some(Ready {
                            frames,
                            first,
                            last,
                            primed: 0,
                        })
                    }
                    // Every frame delivered and stage 0 done: over, with stage 0's reason.
                    Take::Done => {
                        let reason = ar_reason(&h.req);
                        back.push(h.hand_back(Some(reason)));
                        continue;
                    }
                    // Stage 1 takes the same from the buffer again and finishes the request.
                    Take::Cancelled => {
                        back.push(h.hand_back(None));
                        continue;
                    }
                }
            }
            keep.push(h);
        }
        held = keep;
        // Those going back now (not kept, or over) need not wait for the pass.
        publish(exit, &mut back);
        // A pass took chunks out of the buffers; the next chunks may be complete already (stage 0
        // ran ahead, or finished), with no notification to come: look again before sleeping.
        let decoded = held.iter().any(|h| h.pending.is_some());
        if decoded {
            let pass_frames: usize = held
                .iter()
                .filter_map(|h| h.pending.as_ref().map(|r| r.frames.len()))
                .sum();
            let t = Instant::now();
            let results = {
                let mut streams = Vec::new();
                let mut chunks: Vec<&[Vec<u32>]> = Vec::new();
                for h in held.iter_mut() {
                    if let Some(r) = &h.pending {
                        streams.push(&mut h.stream);
                        chunks.push(&r.frames);
                    }
                }
                decode_batched(c2w, &mut streams, &chunks)
            };
            let decode = t.elapsed();
            let mut results = results.into_iter();
            let mut keep = Vec::with_capacity(held.len());
            for mut h in held.drain(..) {
                let Some(r) = h.pending.take() else {
                    keep.push(h);
                    continue;
                };
                let result = results
                    .next()
                    .unwrap_or_else(|| Err("chunk not decoded".to_string()));
                h.timing.decode += decode;
                h.timing.first_pass_frames.get_or_insert(pass_frames);
                let finished = deliver::<C>(spf, &h.req, &mut h.timing, &r, result);
                h.carry.extend(r.frames);
                match finished {
                    Some(reason @ FinishReason::Error(_)) => {
                        fail(&h.req, &mut h.failed, reason);
                        keep.push(h);
                    }
                    Some(reason) => back.push(h.hand_back(Some(reason))),
                    None if h.timing.samples >= enough => back.push(h.hand_back(None)),
                    None => keep.push(h),
                }
            }
            held = keep;
        }
        if back.is_empty() && !decoded {
            signal.wait_past(seen, None);
        }
        publish(exit, &mut back);
    }
}

/// Hands `back` to stage 1's thread (and wakes it); the exit guard lets go of them.
fn publish(exit: &mut LaneExit<'_>, back: &mut Vec<Handover>) {
    if back.is_empty() {
        return;
    }
    exit.held
        .retain(|r| !back.iter().any(|b| Arc::ptr_eq(&b.req, r)));
    lock(&exit.shared.inbox).back.append(back);
    exit.shared.queue.signal.notify();
}

#[cfg(test)]
mod tests {
    //! Stage 1 with and without the lane, on a stand-in decoder whose passes the test can hold.

    use std::collections::HashMap;
    use std::path::PathBuf;
    use std::sync::mpsc::{Receiver, channel};
    use std::sync::{Condvar, LazyLock};
    use std::time::Duration;

    use super::*;
    use crate::engine::chunk_buffer::{ChunkRamp, Signal};
    use crate::engine::config::StageConfig;
    use crate::engine::metrics::ArTiming;
    use crate::engine::request::AdmissionControl;
    use crate::engine::stage1::{DecInfo, dec_thread};
    use crate::engine::{EngineError, EngineEvent, EngineRequest};
    use crate::models::tts::{ModelError, SamplingParams, Stage1Stream, VoiceRequest};

    const SPF: usize = 4;
    /// A frame whose second code is `HOLD` makes its pass wait until the test opens the gate.
    const HOLD: u32 = 1;
    /// A frame whose second code is `FAIL` fails its stream's decode.
    const FAIL: u32 = 2;

    /// The test's gate, found by the checkpoint directory the stand-in is "loaded" from (tests run
    /// in parallel, each with its own directory).
    #[derive(Default)]
    struct Gate {
        open: Mutex<bool>,
        cv: Condvar,
        /// Passes the stand-in has started, by thread name.
        passes: Mutex<Vec<String>>,
        /// The stand-in's sample rate (`SPF` samples a frame).
        rate: Mutex<u32>,
        /// Streams the stand-in is to refuse, by panicking, on the lane's thread.
        lane_streams_to_panic: Mutex<usize>,
    }

    static GATES: LazyLock<Mutex<HashMap<PathBuf, Arc<Gate>>>> = LazyLock::new(Default::default);

    fn gate(dir: &Path) -> Arc<Gate> {
        lock(&GATES).entry(dir.to_path_buf()).or_default().clone()
    }

    /// Frame `k` decodes to `SPF` samples of `1000 × p + code0`, `p` the frames its stream decoded
    /// before it: a stream that missed or repeated frames shows in the values.
    struct StandIn {
        gate: Arc<Gate>,
        rate: u32,
    }

    struct StandInStream {
        decoded: usize,
    }

    impl Stage1Stream for StandInStream {
        fn decode_chunk(&mut self, frames: &[Vec<u32>]) -> Result<Vec<f32>, ModelError> {
            if frames.iter().any(|f| f[1] == FAIL) {
                return Err(ModelError::InvalidRequest {
                    field: "frame".into(),
                    value: "FAIL".into(),
                    msg: "the stand-in fails this frame".into(),
                });
            }
            let mut out = Vec::new();
            for f in frames {
                let v = 1000.0 * self.decoded as f32 + f[0] as f32;
                out.extend(std::iter::repeat_n(v, SPF));
                self.decoded += 1;
            }
            Ok(out)
        }
    }

    impl Stage1Model for StandIn {
        const NAME: &'static str = "stand_in";
        const REFERENCE_CONTEXT: bool = false;
        type Stream<'c> = StandInStream;

        fn load(
            dir: &Path,
            _: &candle_core::Device,
            _: &Stage1Options,
        ) -> Result<Self, ModelError> {
            let gate = gate(dir);
            let rate = *lock(&gate.rate);
            Ok(StandIn { gate, rate })
        }
        fn sample_rate(&self) -> u32 {
            self.rate
        }
        fn samples_per_frame(&self) -> usize {
            SPF
        }
        fn num_codebooks(&self) -> usize {
            2
        }
        fn max_batch_frames(&self) -> usize {
            64
        }
        fn set_max_batch_frames(&mut self, _: usize) {}
        fn stream(&self) -> StandInStream {
            let on_lane = std::thread::current().name() == Some("omnitts-stage1-first-chunks");
            let mut left = lock(&self.gate.lane_streams_to_panic);
            if on_lane && *left > 0 {
                *left -= 1;
                drop(left);
                panic!("the stand-in refuses a stream on the lane");
            }
            StandInStream { decoded: 0 }
        }
        fn decode_chunks(
            &self,
            streams: &mut [&mut StandInStream],
            chunks: &[&[Vec<u32>]],
        ) -> Vec<Result<Vec<f32>, ModelError>> {
            let name = std::thread::current().name().unwrap_or("").to_string();
            lock(&self.gate.passes).push(name);
            if chunks.iter().any(|c| c.iter().any(|f| f[1] == HOLD)) {
                let open = lock(&self.gate.open);
                drop(
                    self.gate
                        .cv
                        .wait_while(open, |o| !*o)
                        .unwrap_or_else(std::sync::PoisonError::into_inner),
                );
            }
            streams
                .iter_mut()
                .zip(chunks)
                .map(|(s, c)| s.decode_chunk(c))
                .collect()
        }
        fn decode_window(&self, _: &[Vec<u32>], f: &[Vec<u32>]) -> Result<Vec<f32>, ModelError> {
            StandInStream { decoded: 0 }.decode_chunk(f)
        }
    }

    /// Stage 1 on the stand-in, in a thread of its own.
    struct Stage1 {
        queue: Arc<StageQueue>,
        info: DecInfo,
        admission: Arc<AdmissionControl>,
        gate: Arc<Gate>,
        thread: Option<std::thread::JoinHandle<()>>,
    }

    impl Stage1 {
        /// Stage 1 with the lane on or off, the stand-in at `rate` samples a second.
        fn start(name: &str, lane: bool, rate: u32) -> Stage1 {
            let dir = PathBuf::from(format!("/stand-in/{name}"));
            *lock(&gate(&dir).rate) = rate;
            let mut cfg = StageConfig::default_async().decoder;
            cfg.max_num_seqs = 8;
            cfg.first_chunk_lane = Some(lane);
            let queue = StageQueue::new();
            let (tx, rx) = mpsc::sync_channel::<Result<DecInfo, EngineError>>(1);
            let q = queue.clone();
            let d = dir.clone();
            let thread = std::thread::Builder::new()
                .name("omnitts-stage1-code2wav".to_string())
                .spawn(move || {
                    dec_thread::<StandIn>(
                        d,
                        DeviceSpec::Cpu,
                        cfg,
                        StreamPriority::default(),
                        q,
                        tx,
                        Arc::default(),
                    )
                })
                .expect("spawn stage 1");
            let info = rx.recv().expect("stage 1 reports").expect("stage 1 loads");
            Stage1 {
                queue,
                info,
                admission: AdmissionControl::new(16),
                gate: gate(&dir),
                thread: Some(thread),
            }
        }

        /// A request with chunks of 1, then 4 frames, queued on stage 1.
        fn submit(&self, id: u64) -> (Arc<RequestShared>, Receiver<EngineEvent>) {
            let (req, rx) = self.request(id);
            assert!(self.queue.push(req.clone()).is_ok());
            (req, rx)
        }

        /// A request with chunks of 1, then 4 frames, not queued yet.
        fn request(&self, id: u64) -> (Arc<RequestShared>, Receiver<EngineEvent>) {
            let sampling = SamplingParams::plain_greedy(100, 0);
            let (tx, rx) = channel();
            let req = Arc::new(RequestShared::new(
                id,
                EngineRequest::new(VoiceRequest::default(), sampling),
                ChunkPolicy::Streaming {
                    initial: 1,
                    chunk: 4,
                    ramp: ChunkRamp::Off,
                },
                16,
                Signal::new(),
                self.queue.signal.clone(),
                tx,
                Instant::now(),
                self.admission.admit().expect("a place"),
                None,
                None,
            ));
            (req, rx)
        }

        fn open_gate(&self) {
            *lock(&self.gate.open) = true;
            self.gate.cv.notify_all();
        }
    }

    impl Drop for Stage1 {
        fn drop(&mut self) {
            self.open_gate();
            self.queue.shut_down();
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }

    fn push(req: &RequestShared, frames: impl IntoIterator<Item = (u32, u32)>) {
        for (code0, mark) in frames {
            assert!(req.buffer.push(vec![code0, mark]).is_ok());
        }
    }

    /// The request's next event within `wait`.
    fn next(rx: &Receiver<EngineEvent>, wait: Duration) -> Option<EngineEvent> {
        rx.recv_timeout(wait).ok()
    }

    /// The next audio chunk within 10 s, skipping `FirstAudio`.
    fn audio(rx: &Receiver<EngineEvent>) -> (u64, Vec<f32>) {
        loop {
            match next(rx, Duration::from_secs(10)) {
                Some(EngineEvent::Audio(c)) => return (c.offset, c.samples),
                Some(EngineEvent::FirstAudio { .. }) => {}
                other => panic!("expected audio, got {other:?}"),
            }
        }
    }

    fn finished(rx: &Receiver<EngineEvent>) -> FinishReason {
        match next(rx, Duration::from_secs(10)) {
            Some(EngineEvent::Finished { reason, .. }) => reason,
            other => panic!("expected Finished, got {other:?}"),
        }
    }

    /// `SPF` samples per frame, frame `k` at stream position `k` (code0 = k).
    fn expected(frames: std::ops::Range<u32>) -> Vec<f32> {
        frames
            .flat_map(|k| std::iter::repeat_n(1001.0 * k as f32, SPF))
            .collect()
    }

    /// Waits until the stand-in has started `n` passes on stage 1's own thread.
    fn wait_for_stage1_passes(stage1: &Stage1, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while lock(&stage1.gate.passes)
            .iter()
            .filter(|p| *p == "omnitts-stage1-code2wav")
            .count()
            < n
        {
            assert!(Instant::now() < deadline, "stage 1 never started a pass");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn first_chunks_are_heard_while_a_pass_is_held() {
        // 16 samples a second: LANE_AUDIO is 8 samples, two frames, so the lane keeps a request
        // for its first chunk (one frame) and its second (four).
        let stage1 = Stage1::start("held", true, 16);
        assert_eq!(stage1.info.first_chunk_lane, FirstChunkLane::On);
        // A: its first two chunks through the lane, then a chunk whose pass the stand-in holds.
        let (a, a_rx) = stage1.submit(1);
        push(&a, [(0, 0)]);
        assert_eq!(audio(&a_rx), (0, expected(0..1)));
        push(&a, [(1, 0), (2, 0), (3, 0), (4, 0)]);
        assert_eq!(audio(&a_rx), (SPF as u64, expected(1..5)));
        assert!(
            lock(&stage1.gate.passes)
                .iter()
                .all(|p| p == "omnitts-stage1-first-chunks"),
            "A's first chunks were not decoded on the lane"
        );
        push(&a, [(5, HOLD), (6, 0), (7, 0), (8, 0)]);
        wait_for_stage1_passes(&stage1, 1);
        // B arrives while A's pass is held: its first two chunks are heard anyway.
        let (b, b_rx) = stage1.submit(2);
        push(&b, [(0, 0)]);
        assert_eq!(audio(&b_rx), (0, expected(0..1)));
        push(&b, [(1, 0), (2, 0), (3, 0), (4, 0)]);
        assert_eq!(audio(&b_rx), (SPF as u64, expected(1..5)));
        assert!(a_rx.try_recv().is_err(), "A's held pass delivered early");
        // A's pass goes on from the frames the lane decoded: positions 5..9, nothing repeated.
        stage1.open_gate();
        assert_eq!(audio(&a_rx), (5 * SPF as u64, expected(5..9)));
        push(&b, [(5, 0), (6, 0), (7, 0), (8, 0), (9, 0)]);
        a.release_from_ar(FinishReason::Length, ArTiming::default());
        assert_eq!(finished(&a_rx), FinishReason::Length);
        b.release_from_ar(FinishReason::Length, ArTiming::default());
        assert_eq!(audio(&b_rx), (5 * SPF as u64, expected(5..9)));
        assert_eq!(audio(&b_rx), (9 * SPF as u64, expected(9..10)));
        assert_eq!(finished(&b_rx), FinishReason::Length);
    }

    #[test]
    fn without_the_lane_a_first_chunk_waits_for_the_held_pass() {
        let stage1 = Stage1::start("no-lane", false, 16);
        assert_eq!(stage1.info.first_chunk_lane, FirstChunkLane::Off);
        let (a, a_rx) = stage1.submit(1);
        push(&a, [(0, 0)]);
        assert_eq!(audio(&a_rx), (0, expected(0..1)));
        push(&a, [(1, HOLD), (2, 0), (3, 0), (4, 0)]);
        // Stage 1's thread decoded A's first chunk, and has started on the held one.
        wait_for_stage1_passes(&stage1, 2);
        let (b, b_rx) = stage1.submit(2);
        push(&b, [(0, 0)]);
        let early = next(&b_rx, Duration::from_millis(300));
        assert!(
            early.is_none(),
            "B was heard during A's held pass: {early:?}"
        );
        stage1.open_gate();
        assert_eq!(audio(&a_rx), (SPF as u64, expected(1..5)));
        assert_eq!(audio(&b_rx), (0, expected(0..1)));
        for r in [&a, &b] {
            r.release_from_ar(FinishReason::Length, ArTiming::default());
        }
        assert_eq!(finished(&a_rx), FinishReason::Length);
        assert_eq!(finished(&b_rx), FinishReason::Length);
    }

    /// A failed decode cancels the request at once (so that stage 0 stops and lets go), and its
    /// `Finished` carries the error, sent only once stage 0 has let go.
    fn expect_failure_after_stage0_lets_go(
        req: &RequestShared,
        rx: &Receiver<EngineEvent>,
        message: &str,
    ) {
        wait_until_cancelled(req);
        let early = next(rx, Duration::from_millis(100));
        assert!(early.is_none(), "Finished before stage 0 let go: {early:?}");
        req.release_from_ar(FinishReason::Cancelled, ArTiming::default());
        match next(rx, Duration::from_secs(10)) {
            Some(EngineEvent::Finished {
                reason: FinishReason::Error(msg),
                ..
            }) => assert!(msg.contains(message), "{msg}"),
            other => panic!("expected an error, got {other:?}"),
        }
    }

    /// Waits (10 s at most) until a failed chunk has cancelled `req`.
    fn wait_until_cancelled(req: &RequestShared) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !req.is_cancelled() {
            assert!(
                Instant::now() < deadline,
                "the failed request was not cancelled"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_failed_chunk_on_stage_1s_thread_finishes_once_stage_0_lets_go() {
        let stage1 = Stage1::start("failed", false, 16);
        let (a, a_rx) = stage1.submit(1);
        push(&a, [(0, 0)]);
        assert_eq!(audio(&a_rx), (0, expected(0..1)));
        push(&a, [(1, FAIL), (2, 0), (3, 0), (4, 0)]);
        expect_failure_after_stage0_lets_go(&a, &a_rx, "stand_in) frames 1..5");
    }

    #[test]
    fn a_one_chunk_utterance_and_a_failed_first_chunk_finish_from_the_lane() {
        let stage1 = Stage1::start("short", true, 16);
        let (a, a_rx) = stage1.submit(1);
        push(&a, [(0, 0)]);
        a.release_from_ar(FinishReason::Eos, ArTiming::default());
        assert_eq!(audio(&a_rx), (0, expected(0..1)));
        assert_eq!(finished(&a_rx), FinishReason::Eos);
        let (b, b_rx) = stage1.submit(2);
        push(&b, [(7, FAIL)]);
        expect_failure_after_stage0_lets_go(&b, &b_rx, "stand_in) frames 0..1");
        // A request cancelled while the lane waits for its first chunk comes back and finishes.
        let (c, c_rx) = stage1.submit(3);
        c.cancel();
        c.release_from_ar(FinishReason::Cancelled, ArTiming::default());
        assert_eq!(finished(&c_rx), FinishReason::Cancelled);
    }

    #[test]
    fn at_shutdown_requests_the_lane_saw_to_their_end_keep_their_reason() {
        let stage1 = Stage1::start("shutdown", true, 16);
        // A: through the lane, then held in a pass on stage 1's thread.
        let (a, a_rx) = stage1.submit(1);
        push(&a, [(0, 0)]);
        assert_eq!(audio(&a_rx), (0, expected(0..1)));
        push(&a, [(1, 0), (2, 0), (3, 0), (4, 0)]);
        assert_eq!(audio(&a_rx), (SPF as u64, expected(1..5)));
        push(&a, [(5, HOLD), (6, 0), (7, 0), (8, 0)]);
        wait_for_stage1_passes(&stage1, 1);
        // B: a one-chunk utterance, all of it delivered by the lane, handed back over; C: failed
        // on the lane, stage 0 not yet gone.
        let (b, b_rx) = stage1.submit(2);
        push(&b, [(0, 0)]);
        b.release_from_ar(FinishReason::Eos, ArTiming::default());
        assert_eq!(audio(&b_rx), (0, expected(0..1)));
        let (c, c_rx) = stage1.submit(3);
        push(&c, [(7, FAIL)]);
        wait_until_cancelled(&c);
        // The engine shuts down before stage 1's thread looks at them again.
        stage1.queue.shut_down();
        stage1.open_gate();
        assert_eq!(audio(&a_rx), (5 * SPF as u64, expected(5..9)));
        assert_eq!(finished(&a_rx), FinishReason::Cancelled);
        assert_eq!(finished(&b_rx), FinishReason::Eos);
        match finished(&c_rx) {
            FinishReason::Error(msg) => assert!(msg.contains("frames 0..1"), "{msg}"),
            other => panic!("C finished {other:?}, not with its error"),
        }
    }

    #[test]
    fn a_stream_the_lane_cannot_make_goes_to_stage_1_and_the_lane_serves_on() {
        let stage1 = Stage1::start("no-stream", true, 16);
        *lock(&stage1.gate.lane_streams_to_panic) = 1;
        // A: the lane's stream for it panics; stage 1's thread decodes it from the start.
        let (a, a_rx) = stage1.submit(1);
        push(&a, [(0, 0)]);
        assert_eq!(audio(&a_rx), (0, expected(0..1)));
        assert_eq!(
            lock(&stage1.gate.passes).as_slice(),
            ["omnitts-stage1-code2wav"],
            "A's first chunk was not decoded on stage 1's thread"
        );
        // B: the lane is still there for it.
        let (b, b_rx) = stage1.submit(2);
        push(&b, [(0, 0)]);
        assert_eq!(audio(&b_rx), (0, expected(0..1)));
        assert_eq!(
            lock(&stage1.gate.passes).last().map(String::as_str),
            Some("omnitts-stage1-first-chunks"),
            "B's first chunk was not decoded on the lane"
        );
        for (r, rx) in [(&a, &a_rx), (&b, &b_rx)] {
            r.release_from_ar(FinishReason::Eos, ArTiming::default());
            assert_eq!(finished(rx), FinishReason::Eos);
        }
    }

    #[test]
    fn chunks_ready_before_the_lane_looks_are_all_taken() {
        // Every frame is in the buffer, and stage 0 done, before stage 1 sees the request: no
        // notification comes after the lane's first take, yet it must go on to the rest.
        let stage1 = Stage1::start("ready", true, 16);
        let (a, a_rx) = stage1.request(1);
        push(&a, [(0, 0), (1, 0), (2, 0), (3, 0), (4, 0), (5, 0), (6, 0)]);
        a.release_from_ar(FinishReason::Eos, ArTiming::default());
        assert!(stage1.queue.push(a.clone()).is_ok());
        assert_eq!(audio(&a_rx), (0, expected(0..1)));
        assert_eq!(audio(&a_rx), (SPF as u64, expected(1..5)));
        assert_eq!(audio(&a_rx), (5 * SPF as u64, expected(5..7)));
        assert_eq!(finished(&a_rx), FinishReason::Eos);
    }
}
