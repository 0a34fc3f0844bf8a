//! The two stage threads and the per-request state they share.
//!
//! Each stage thread opens its own device context, loads its model, reports back to
//! [`super::Engine::load`], and then serves requests: it keeps a FIFO of requests not yet started
//! and up to `max_num_seqs` active ones, gives every active request one unit of work per round
//! (stage 0: one AR frame; stage 1: one scheduled chunk), and sleeps on its stage [`Signal`] when
//! none can progress. The signal is advanced by new requests, by the request buffers (space freed,
//! frames pushed, finish, cancel) and by shutdown, so no wake-up is lost. Stage 0 also runs the
//! voice-clone encoding jobs of [`super::Engine::voice_clone_prompt`] (Base: speaker encoder and
//! codec encoder, owned by its `ArModel`), each before its next round of frames.
//!
//! Stage 0 lets go of a request by recording its outcome and then finishing (or cancelling) the
//! request's buffer; stage 1 sends `Finished` only after that, so when a handle sees `Finished`
//! neither stage holds the request's session, decoder state or frames any more.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};

use super::first_chunk_lane::FirstChunkLane;
use super::first_frame::FirstFrameRules;
use super::metrics::BatchCounters;
use super::queue::StageQueue;
use super::stage0::{ArInfo, ar_thread};
use super::stage1::{DecInfo, dec_thread};
use super::{DeviceSpec, EngineError, EngineOptions};
use crate::models::registry::StageVisitor;
use crate::models::tts::{ModelError, Stage0Model, Stage1Model};
use crate::nn::WeightForm;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn panic_message(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
}

/// Runs `f`, turning a panic into an error message (a panic inside a model call fails only the
/// request, never the stage thread).
pub(crate) fn guarded<T>(f: impl FnOnce() -> Result<T, ModelError>) -> Result<T, String> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(p) => Err(format!("panicked: {}", panic_message(p.as_ref()))),
    }
}

/// What the stages report after loading.
#[derive(Debug, Clone)]
pub(crate) struct LoadedInfo {
    pub sample_rate: u32,
    pub samples_per_frame: usize,
    pub ar_device: DeviceSpec,
    pub decoder_device: DeviceSpec,
    pub cuda_graphs: CudaGraphs,
    pub batch_graphs: BatchGraphs,
    /// Whether stage 1 runs its first-chunk lane.
    pub first_chunk_lane: FirstChunkLane,
    /// Whether stage 1's decoder replays CUDA graphs (Code2Wav: a fresh stream's one-frame
    /// first chunk; the first-chunk lane's decoder captures the same).
    pub decoder_graphs: CudaGraphs,
    /// How stage 0's linear weights are stored.
    pub weight_forms: Vec<WeightForm>,
    /// Stage 0's and stage 1's batch tallies.
    pub batches: [Arc<BatchCounters>; 2],
}

/// Whether a stage replays CUDA graphs (stage 0: its frames; stage 1: what its decoder
/// captures, Code2Wav's one-frame first chunk).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CudaGraphs {
    /// The stage is not on a CUDA device (stage 1: or its decoder captures nothing, as with
    /// `OMNITTS_DECODER_FIRST_GRAPH=0`).
    NotApplicable,
    /// Captured at load, before the engine reported ready; the work they cover replays them.
    Enabled,
    /// Not captured; the work runs eagerly. The reason says why (the failing CUDA call, or a
    /// switch that is off).
    Fallback(String),
}

/// Whether stage 0's batched frames (several streams in one step) replay CUDA graphs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchGraphs {
    /// Not on a CUDA device, `max_num_seqs` is 1, or the one-stream graphs are not enabled.
    NotApplicable,
    /// Captured at load for these batch sizes (a batch replays the smallest that holds it).
    Enabled(Vec<usize>),
    /// Capture failed or the model does not take the batched kernels; batched frames run
    /// eagerly. The reason says why.
    Fallback(String),
}

/// [`spawn`] as the registry's visitor: the family picks `A` and `C`.
pub(crate) struct Spawn<'o>(pub &'o EngineOptions);

/// What [`spawn`] returns.
pub(crate) type Spawned = (LoadedInfo, Arc<StageQueue>, Arc<StageQueue>, Threads);

impl StageVisitor for Spawn<'_> {
    type Out = Result<Spawned, EngineError>;
    fn visit<A: Stage0Model, C: Stage1Model>(self) -> Self::Out {
        spawn::<A, C>(self.0)
    }
}

/// The stage-0 and stage-1 threads.
pub(crate) type Threads = (JoinHandle<()>, JoinHandle<()>);

/// Spawns both stage threads, stage 0 running `A` and stage 1 `C` (the model family's two
/// halves), and waits for them to load.
pub(crate) fn spawn<A: Stage0Model, C: Stage1Model>(
    opts: &EngineOptions,
) -> Result<Spawned, EngineError> {
    let ar_queue = StageQueue::new();
    let (ar_batches, dec_batches) = (
        Arc::<BatchCounters>::default(),
        Arc::<BatchCounters>::default(),
    );
    let dec_queue = StageQueue::new();
    let mut threads: Vec<JoinHandle<()>> = Vec::new();

    let (ar_tx, ar_rx) = mpsc::sync_channel::<Result<ArInfo, EngineError>>(1);
    let ar_cfg = opts.stage_config.ar.clone();
    let ar_device = opts.ar_device;
    let first_frame = FirstFrameRules {
        alone: opts.stage_config.first_frame_alone_on(ar_device),
        alone_share: super::first_frame::ALONE_SHARE,
        arrivals_first: crate::nn::switches::Switches::get().arrivals_after_alone,
    };
    let priority = opts.stage_config.stream_priority();
    let q = ar_queue.clone();
    let counters = ar_batches.clone();
    let dir = opts.model_dir.clone();
    let stage0 = thread::Builder::new()
        .name("omnitts-stage0-ar".to_string())
        .spawn(move || {
            ar_thread::<A>(
                dir,
                ar_device,
                ar_cfg,
                first_frame,
                priority,
                q,
                ar_tx,
                counters,
            )
        });

    let (dec_tx, dec_rx) = mpsc::sync_channel::<Result<DecInfo, EngineError>>(1);
    let dec_cfg = opts.stage_config.decoder.clone();
    let dec_device = opts.decoder_device;
    let counters = dec_batches.clone();
    let dir = opts.model_dir.clone();
    let q = dec_queue.clone();
    let stage1 = thread::Builder::new()
        .name("omnitts-stage1-code2wav".to_string())
        .spawn(move || dec_thread::<C>(dir, dec_device, dec_cfg, priority, q, dec_tx, counters));

    let spawn_err = |stage, e: std::io::Error| EngineError::Stage {
        stage,
        msg: format!("cannot spawn the stage thread: {e}"),
    };
    let mut first_err = None;
    match stage0 {
        Ok(h) => threads.push(h),
        Err(e) => first_err = Some(spawn_err(0, e)),
    }
    match stage1 {
        Ok(h) => threads.push(h),
        Err(e) => first_err = first_err.or(Some(spawn_err(1, e))),
    }
    let died = |stage| EngineError::Stage {
        stage,
        msg: "the stage thread exited while loading".to_string(),
    };
    let ar = ar_rx.recv().unwrap_or_else(|_| Err(died(0)));
    let dec = dec_rx.recv().unwrap_or_else(|_| Err(died(1)));
    let result = match (first_err, ar, dec) {
        (Some(e), _, _) | (None, Err(e), _) | (None, Ok(_), Err(e)) => Err(e),
        (None, Ok(ar), Ok(dec)) if ar.groups != dec.quantizers => {
            Err(EngineError::Mismatch(format!(
                "stage 0 ({}) makes frames of {} codes but the codec decoder ({}) takes {}",
                A::NAME,
                ar.groups,
                C::NAME,
                dec.quantizers
            )))
        }
        (None, Ok(ar), Ok(dec)) => Ok(LoadedInfo {
            sample_rate: dec.sample_rate,
            samples_per_frame: dec.samples_per_frame,
            ar_device: ar.device,
            decoder_device: dec.device,
            cuda_graphs: ar.cuda_graphs,
            batch_graphs: ar.batch_graphs,
            first_chunk_lane: dec.first_chunk_lane,
            decoder_graphs: dec.decoder_graphs,
            weight_forms: ar.weight_forms,
            batches: [ar_batches, dec_batches],
        }),
    };
    match result {
        Ok(info) => {
            let mut it = threads.into_iter();
            match (it.next(), it.next()) {
                (Some(t0), Some(t1)) => Ok((info, ar_queue, dec_queue, (t0, t1))),
                _ => unreachable!("both threads were spawned when loading succeeded"),
            }
        }
        Err(e) => {
            ar_queue.shut_down();
            dec_queue.shut_down();
            for t in threads {
                let _ = t.join();
            }
            Err(e)
        }
    }
}
