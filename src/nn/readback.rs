//! Small device → host reads (logits, codes, audio) through a pinned buffer.
//!
//! `Tensor::to_vec1` on CUDA copies into pageable host memory: the driver stages that copy itself
//! and the calling thread waits inside the copy call. With two stage threads on one GPU, stage 0
//! reads its logits back after every step and so sits in such a copy most of the time. Here the
//! copy goes into a page-locked buffer kept per thread (grown as needed, never shrunk), and the
//! thread waits on the stream instead (`cuStreamSynchronize`), then copies the values out.
//! `OMNITTS_PINNED_READBACK=0` ([`crate::nn::switches`]) goes back to `to_vec1`; on the CPU this
//! is `to_vec1`.

use candle_core::{Result, Tensor, WithDType};

/// The element types read back this way (`f32` and `u32`).
#[cfg(feature = "cuda")]
pub trait Readback:
    WithDType
    + candle_core::cuda_backend::CudaDType
    + candle_core::cuda_backend::cudarc::driver::DeviceRepr
    + candle_core::cuda_backend::cudarc::driver::ValidAsZeroBits
{
    #[doc(hidden)]
    fn with_buffer<R>(f: impl FnOnce(&mut Option<pinned::Buffer<Self>>) -> R) -> R;
}

/// The element types read back this way (`f32` and `u32`).
#[cfg(not(feature = "cuda"))]
pub trait Readback: WithDType {}

/// All elements of `t` (any shape, flattened in row-major order) on the host.
///
/// Errors: candle's for a dtype other than `T`, and the driver's for a failed copy or sync.
pub fn to_vec<T: Readback>(t: &Tensor) -> Result<Vec<T>> {
    #[cfg(feature = "cuda")]
    if t.device().is_cuda() && crate::nn::switches::Switches::get().pinned_readback {
        return pinned::to_vec(t);
    }
    t.flatten_all()?.to_vec1::<T>()
}

#[cfg(not(feature = "cuda"))]
impl Readback for f32 {}
#[cfg(not(feature = "cuda"))]
impl Readback for u32 {}

#[cfg(feature = "cuda")]
mod pinned {
    use std::cell::RefCell;

    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::WrapErr;
    use candle_core::cuda_backend::cudarc::driver::PinnedHostSlice;
    use candle_core::{Result, Storage, Tensor};

    use super::Readback;

    /// A thread's pinned buffer for one element type.
    pub struct Buffer<T>(PinnedHostSlice<T>);

    macro_rules! readback {
        ($t:ty) => {
            impl Readback for $t {
                fn with_buffer<R>(f: impl FnOnce(&mut Option<Buffer<Self>>) -> R) -> R {
                    thread_local! {
                        static BUF: RefCell<Option<Buffer<$t>>> = const { RefCell::new(None) };
                    }
                    BUF.with(|b| f(&mut b.borrow_mut()))
                }
            }
        };
    }
    readback!(f32);
    readback!(u32);

    pub(super) fn to_vec<T: Readback>(t: &Tensor) -> Result<Vec<T>> {
        let t = t.flatten_all()?.contiguous()?;
        let n = t.elem_count();
        let (storage, layout) = t.storage_and_layout();
        let Storage::Cuda(cs) = &*storage else {
            return t.to_vec1::<T>();
        };
        let start = layout.start_offset();
        let src = cs.as_cuda_slice::<T>()?.slice(start..start + n);
        let stream = cs.device().cuda_stream();
        T::with_buffer(|buf| {
            if buf.as_ref().is_none_or(|b| b.0.len() < n) {
                // SAFETY: the buffer is written by the copy below before it is read.
                let fresh = unsafe {
                    stream
                        .context()
                        .alloc_pinned_with_flags::<T>(n.next_power_of_two().max(4096), 0)
                }
                .w()?;
                *buf = Some(Buffer(fresh));
            }
            let Some(Buffer(host)) = buf.as_mut() else {
                candle_core::bail!("pinned readback buffer missing");
            };
            // The copy's length is the destination's: hand it exactly `n` elements of the
            // (larger) pinned buffer. The driver sees pinned memory and copies asynchronously.
            let dst = &mut host.as_mut_slice().w()?[..n];
            stream.memcpy_dtoh(&src, dst).w()?;
            stream.synchronize().w()?;
            Ok(dst.to_vec())
        })
    }
}
