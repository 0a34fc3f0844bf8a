//! The CUDA profiler's range (`cuProfilerStart` / `cuProfilerStop`) for benchmarks run under
//! `ncu --profile-from-start off` or `nsys profile --capture-range=cudaProfilerApi`, so that only
//! the marked work is profiled.

/// Starts (`true`) or stops the CUDA profiler's range (CUDA builds; a no-op elsewhere). On a
/// thread without a current CUDA context (a benchmark whose GPU work runs on the engine's
/// threads), device 0's primary context, the one candle's devices use, is made current first. A
/// failing call is reported on stderr, not an error: the benchmark's figures do not depend on it.
pub fn profiler_range(on: bool) {
    #[cfg(feature = "cuda")]
    {
        use candle_core::cuda_backend::cudarc::driver::sys;
        let call = || {
            // SAFETY: plain driver calls without arguments on the current context.
            unsafe {
                if on {
                    sys::cuProfilerStart()
                } else {
                    sys::cuProfilerStop()
                }
            }
        };
        let mut r = call();
        if r == sys::CUresult::CUDA_ERROR_INVALID_CONTEXT {
            let mut ctx = std::ptr::null_mut();
            // SAFETY: retains device 0's primary context into `ctx` (kept for the process's
            // life, as candle keeps it) and makes it current on this thread.
            r = unsafe {
                match sys::cuDevicePrimaryCtxRetain(&mut ctx, 0) {
                    sys::CUresult::CUDA_SUCCESS => sys::cuCtxSetCurrent(ctx),
                    e => e,
                }
            };
            if r == sys::CUresult::CUDA_SUCCESS {
                r = call();
            }
        }
        if r != sys::CUresult::CUDA_SUCCESS {
            eprintln!("profiler range call returned {r:?}");
        }
    }
    #[cfg(not(feature = "cuda"))]
    let _ = on;
}
