//! The CUDA settings of a stage's device handle (feature `cuda`): its stream's priority, and the
//! device memory pool's release threshold.
//!
//! Both stages of an engine on one GPU queue their work on streams of their own. Two settings keep
//! stage 1's small decodes from waiting behind stage 0's back-to-back steps (docs/cuda.md, "First
//! audio under load"):
//! - stage 1's stream runs at the device's greatest priority (`cuStreamSetAttribute`, priority
//!   attribute), so the block scheduler starts its kernels before queued stage-0 kernels;
//! - the default memory pool keeps freed memory (release threshold `u64::MAX`) instead of handing
//!   it back to the driver at every synchronisation, so an allocation after a sync is a pool hit,
//!   not a new mapping.
//!
//! `OMNITTS_STAGE1_PRIORITY=0` and `OMNITTS_POOL_KEEP=0` turn them off, for A/B runs
//! ([`crate::nn::switches`]).

use candle_core::CudaDevice;
use candle_core::cuda_backend::cudarc::driver::sys;

use super::device::StreamPriority;
use crate::nn::switches::Switches;

fn check(what: &str, r: sys::CUresult) -> Result<(), String> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what}: {r:?}"))
    }
}

/// Applies the stream priority and the pool threshold to `cuda`'s stream and device.
/// Errors name the driver call that failed.
pub(super) fn apply(cuda: &CudaDevice, priority: StreamPriority) -> Result<(), String> {
    let stream = cuda.cuda_stream();
    let ctx = stream.context();
    ctx.bind_to_thread().map_err(|e| format!("binding the CUDA context: {e}"))?;
    if priority == StreamPriority::High && Switches::get().stage1_priority {
        let (mut least, mut greatest) = (0, 0);
        // SAFETY: driver calls on the bound context with valid out-pointers; the stream is this
        // handle's own and outlives the call.
        unsafe {
            check(
                "cuCtxGetStreamPriorityRange",
                sys::cuCtxGetStreamPriorityRange(&mut least, &mut greatest),
            )?;
            let mut value: sys::CUstreamAttrValue = std::mem::zeroed();
            value.priority = greatest;
            check(
                "cuStreamSetAttribute(priority)",
                sys::cuStreamSetAttribute(
                    stream.cu_stream(),
                    sys::CUstreamAttrID::CU_LAUNCH_ATTRIBUTE_PRIORITY,
                    &value,
                ),
            )?;
        }
    }
    if Switches::get().pool_keep {
        // SAFETY: as above; the attribute value is a u64 that outlives the call.
        unsafe {
            let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
            check(
                "cuDeviceGetDefaultMemPool",
                sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()),
            )?;
            let mut threshold: u64 = u64::MAX;
            check(
                "cuMemPoolSetAttribute(release threshold)",
                sys::cuMemPoolSetAttribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    (&mut threshold as *mut u64).cast(),
                ),
            )?;
        }
    }
    Ok(())
}
