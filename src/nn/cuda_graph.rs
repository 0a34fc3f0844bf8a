//! CUDA graph capture of candle work (feature `cuda`).
//!
//! A [`Graph`] records every kernel, copy, allocation and free that a closure enqueues on a CUDA
//! device's stream and replays them with one launch. What the closure may do:
//! - candle ops on tensors of that device whose *shapes and positions* are the same at every replay
//!   (the recorded kernels keep their arguments: addresses, sizes, offsets);
//! - read inputs from, and write outputs into, **static** tensors allocated before the capture
//!   (update inputs in place with `Tensor::slice_set` before each [`Graph::launch`], copy outputs
//!   out after it); temporaries allocated and dropped inside the closure become graph memory nodes;
//! - small host-to-device uploads that candle makes for kernel parameters (strides of
//!   non-contiguous layouts, a causal mask) only if the same closure ran once eagerly under
//!   [`htod_cache`] first, which uploads them once and serves them from the device afterwards.
//!
//! It must not copy device data to the host or synchronise (candle fails the capture with an error
//! then), nor use host data that changes between replays.
//!
//! Capture uses `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`, so another thread (the other pipeline stage)
//! may keep using the GPU meanwhile.

use candle_core::cuda_backend::cudarc::driver::{CudaGraph, sys};
use candle_core::{Device, Result};

/// Turns on candle's per-thread cache of small host-to-device parameter uploads until the
/// returned guard is dropped (see the module documentation); required around the eager warm-up
/// and the capture. Errors when `device` is not a CUDA device.
pub fn htod_cache(device: &Device) -> Result<impl Sized> {
    Ok(device.as_cuda_device()?.enable_cuda_graph_htod_cache())
}

/// A captured, instantiated CUDA graph on the stream of one candle CUDA device.
pub struct Graph {
    graph: CudaGraph,
}

// SAFETY: the CUDA graph handles may be used from any thread as long as calls on one graph are
// serialised (CUDA "graph thread safety"); `Graph` exposes only `&self` methods that call
// `cuGraphLaunch`, so the owner must keep it behind `&mut` or a `Mutex` to be shared, which
// `Send` alone (without `Sync`) guarantees.
unsafe impl Send for Graph {}

impl Graph {
    /// Captures what `f` enqueues on `device`'s stream (see the module documentation for what it
    /// may do). The caller must hold a [`htod_cache`] guard and have run the same work eagerly
    /// once under it.
    /// The capture is always ended, also when `f` fails or panics (the stream must not stay in
    /// capture mode); `f`'s error is returned first, its panic resumed after the end.
    pub fn capture(device: &Device, f: impl FnOnce() -> Result<()>) -> Result<Graph> {
        let cuda = device.as_cuda_device()?;
        let stream = cuda.cuda_stream();
        stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| candle_core::Error::Msg(format!("CUDA graph begin capture: {e}")))?;
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        let g = stream.end_capture(sys::CUgraphInstantiate_flags(0));
        let r = match r {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        r?;
        let graph = g
            .map_err(|e| candle_core::Error::Msg(format!("CUDA graph end capture: {e}")))?
            .ok_or_else(|| candle_core::Error::Msg("CUDA graph capture recorded nothing".into()))?;
        graph
            .upload()
            .map_err(|e| candle_core::Error::Msg(format!("CUDA graph upload: {e}")))?;
        Ok(Graph { graph })
    }

    /// Enqueues one replay on the stream it was captured on (asynchronous, like a kernel).
    pub fn launch(&self) -> Result<()> {
        self.graph
            .launch()
            .map_err(|e| candle_core::Error::Msg(format!("CUDA graph launch: {e}")))
    }
}
