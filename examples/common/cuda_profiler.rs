//! The CUDA profiler's range (`cuProfilerStart` / `cuProfilerStop`) for benchmarks run under
//! `ncu --profile-from-start off`, so that only the marked work is profiled.

/// Starts (`true`) or stops the CUDA profiler's range (CUDA builds; a no-op elsewhere). A failing
/// call is reported on stderr, not an error: the benchmark's figures do not depend on it.
pub fn profiler_range(on: bool) {
    #[cfg(feature = "cuda")]
    {
        use candle_core::cuda_backend::cudarc::driver::sys;
        // SAFETY: plain driver calls without arguments; the context is current on this thread.
        let r = unsafe {
            if on {
                sys::cuProfilerStart()
            } else {
                sys::cuProfilerStop()
            }
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            eprintln!("profiler range call returned {r:?}");
        }
    }
    #[cfg(not(feature = "cuda"))]
    let _ = on;
}
