//! Per-stage device selection: `cpu`, `cuda:N`, `auto`.

use std::fmt;
use std::str::FromStr;

use candle_core::{DType, Device};

use super::EngineError;
use crate::nn::switches::StreamPriority;

/// Which stage thread a device handle is for ([`DeviceSpec::open_as`]): it decides the priority
/// of the handle's CUDA stream ([`StreamPriority`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamRole {
    /// Stage 0's thread: latency-bound steps every stream waits for.
    Ar,
    /// Stage 1's thread: Code2Wav passes.
    Decoder,
    /// The first-chunk lane: new requests' first chunks.
    Lane,
}

impl StreamRole {
    /// This role's rank in `priority` (`None`: the default priority).
    pub(crate) fn rank(self, priority: StreamPriority) -> Option<u8> {
        match self {
            StreamRole::Ar => priority.ar,
            StreamRole::Decoder => priority.decoder,
            StreamRole::Lane => priority.lane,
        }
    }
}

/// The CUDA priority value `rank` levels below `greatest`, held at `least` (numerically lower
/// values are greater priorities: `greatest` ≤ `least`).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn priority_level(rank: u8, greatest: i32, least: i32) -> i32 {
    (greatest + i32::from(rank)).min(least)
}

/// Where a stage runs. Parsed from `"cpu"`, `"cuda:N"` (or a bare GPU index `"N"`, as vLLM-Omni's
/// `runtime.devices` writes it) and `"auto"` (CUDA device 0 when the crate was built with the `cuda`
/// feature and a GPU is present, otherwise the CPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceSpec {
    /// The host CPU.
    Cpu,
    /// CUDA device with this ordinal; needs the `cuda` feature.
    Cuda(usize),
    /// CUDA 0 when available, else the CPU.
    #[default]
    Auto,
}

impl FromStr for DeviceSpec {
    type Err = EngineError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().to_ascii_lowercase();
        let bad = |msg: &str| EngineError::Device {
            spec: s.to_string(),
            msg: msg.to_string(),
        };
        match t.as_str() {
            "cpu" => Ok(DeviceSpec::Cpu),
            "auto" => Ok(DeviceSpec::Auto),
            "cuda" => Ok(DeviceSpec::Cuda(0)),
            _ => {
                let idx = t.strip_prefix("cuda:").unwrap_or(&t);
                idx.parse::<usize>().map(DeviceSpec::Cuda).map_err(|_| {
                    bad("expected \"cpu\", \"cuda:N\" (N a GPU index), \"N\" or \"auto\"")
                })
            }
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Cpu => write!(f, "cpu"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
            DeviceSpec::Auto => write!(f, "auto"),
        }
    }
}

impl DeviceSpec {
    /// Whether this build can run CUDA at all (`cuda` feature).
    pub const CUDA_COMPILED: bool = cfg!(feature = "cuda");

    /// Checks that the spec can be honoured by this build, without opening anything: `cuda:N`
    /// fails on a build without the `cuda` feature.
    pub fn check_supported(&self) -> Result<(), EngineError> {
        match self {
            DeviceSpec::Cuda(_) if !Self::CUDA_COMPILED => Err(EngineError::Device {
                spec: self.to_string(),
                msg: "this build of omnitts has no CUDA support (rebuild with `--features cuda`); \
                      use \"cpu\" or \"auto\""
                    .to_string(),
            }),
            _ => Ok(()),
        }
    }

    /// The concrete device `auto` resolves to on this machine (never `Auto`).
    pub fn resolve(&self) -> DeviceSpec {
        match self {
            DeviceSpec::Auto => {
                if Self::CUDA_COMPILED && candle_core::utils::cuda_is_available() {
                    DeviceSpec::Cuda(0)
                } else {
                    DeviceSpec::Cpu
                }
            }
            other => *other,
        }
    }

    /// Opens a fresh device handle. Call this on the stage thread that will own it. For CUDA every
    /// call creates its own stream on the device's context (`Device::new_cuda_with_stream`), so two
    /// stages on one GPU queue their kernels independently and can overlap; cudarc's cross-stream
    /// event tracking is turned off for it (nothing device-side crosses stages).
    pub fn open(&self) -> Result<Device, EngineError> {
        self.open_with_priority(None)
    }

    /// As [`DeviceSpec::open`], for a stage thread of `role`: on CUDA its stream runs at the rank
    /// `priority` gives the role (rank 0 the device's greatest priority, each rank after it one
    /// level lower; [`super::StageConfig::stream_priority`]), so that its kernels start before
    /// the queued blocks of lower streams. Errors as `open`, and an [`EngineError::Device`]
    /// naming the driver call if the priority cannot be set.
    pub(crate) fn open_as(
        &self,
        role: StreamRole,
        priority: StreamPriority,
    ) -> Result<Device, EngineError> {
        self.open_with_priority(role.rank(priority))
    }

    fn open_with_priority(&self, rank: Option<u8>) -> Result<Device, EngineError> {
        self.check_supported()?;
        match self.resolve() {
            DeviceSpec::Cpu => {
                pin_cpu_threads();
                Ok(Device::Cpu)
            }
            DeviceSpec::Cuda(n) => {
                let dev = Device::new_cuda_with_stream(n).map_err(|e| EngineError::Device {
                    spec: self.to_string(),
                    msg: format!("cannot open CUDA device {n}: {e}"),
                })?;
                #[cfg(feature = "cuda")]
                if let Device::Cuda(cuda) = &dev {
                    // A second stream puts cudarc in multi-stream mode, where every use of a
                    // buffer waits on and records CUDA events. A stage never shares device buffers
                    // with another stream (codes and audio cross stages through the host), so the
                    // events only cost launches, and a wait on an event recorded before a CUDA
                    // graph capture invalidates the capture (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                    // then recorded as the context's error for every later call).
                    // SAFETY: all of this handle's buffers are used and freed on its one stream.
                    unsafe { cuda.cuda_stream().context().disable_event_tracking() };
                    if crate::nn::switches::Switches::get().keep_freed {
                        keep_freed_memory(cuda);
                    }
                    if let Some(rank) = rank {
                        set_priority(cuda, rank).map_err(|msg| EngineError::Device {
                            spec: self.to_string(),
                            msg,
                        })?;
                    }
                }
                #[cfg(not(feature = "cuda"))]
                let _ = rank;
                Ok(dev)
            }
            DeviceSpec::Auto => unreachable!("resolve() never returns Auto"),
        }
    }
}

/// The memory pool `cuda`'s allocations come from: the device's current pool, from which cudarc
/// allocates every buffer with `cuMemAllocAsync` when the device has memory pools (`None` when it
/// has none, or when the driver does not answer).
#[cfg(feature = "cuda")]
fn memory_pool(
    cuda: &candle_core::CudaDevice,
) -> Option<candle_core::cuda_backend::cudarc::driver::sys::CUmemoryPool> {
    use candle_core::cuda_backend::cudarc::driver::result;
    let stream = cuda.cuda_stream();
    let context = stream.context();
    if !context.has_async_alloc() {
        return None;
    }
    // SAFETY: the device handle is the context's own, obtained from the driver.
    unsafe { result::device::get_mem_pool(context.cu_device()) }.ok()
}

/// Makes `cuda`'s [`memory_pool`] keep the memory freed into it: a release threshold of
/// `u64::MAX` bytes instead of CUDA's default 0, with which the pool gives back every free byte
/// at each stream, event or context synchronisation, and the next eager operations map it
/// again. Stage threads synchronise at every step (codes and audio are read back), so with the
/// default the memory of each eager pass (Code2Wav's passes, prompts through the talker) went
/// back and forth between the pool and the driver every step (docs/cuda.md, "Freed memory kept
/// in the pool"). The pool is the device's, for the whole process: it grows to the largest
/// moment of everything that allocates from it, and each stage thread gives what is free back
/// when it ends ([`TrimPoolOnExit`]). `OMNITTS_KEEP_FREED=0` keeps CUDA's default. Best effort:
/// only speed depends on it, so a device without memory pools or a driver call that fails leaves
/// the default.
#[cfg(feature = "cuda")]
fn keep_freed_memory(cuda: &candle_core::CudaDevice) {
    use candle_core::cuda_backend::cudarc::driver::{result, sys};
    let Some(pool) = memory_pool(cuda) else {
        return;
    };
    let mut threshold = u64::MAX;
    // SAFETY: a valid pool; `threshold` is the u64 the release-threshold attribute takes and
    // lives across the call.
    let _ = unsafe {
        result::mem_pool::set_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&raw mut threshold).cast(),
        )
    };
}

/// Gives the free memory of a stage's device pool back to the driver when dropped, so that a
/// stage's weights and buffers, freed as its thread ends, do not stay in the pool
/// ([`keep_freed_memory`]) for the rest of the process. A stage thread declares one before it
/// loads its model (so that it drops after it) and [`Self::watch`]es its device handle. The
/// trim releases every free block of the device's pool, other engines' too: their live buffers
/// stay, and their next eager passes map what they need again once. Nothing on the CPU.
#[derive(Default)]
pub(crate) struct TrimPoolOnExit(Option<Device>);

impl TrimPoolOnExit {
    /// Trims `dev`'s pool on drop.
    pub(crate) fn watch(&mut self, dev: &Device) {
        if dev.is_cuda() {
            self.0 = Some(dev.clone());
        }
    }
}

impl Drop for TrimPoolOnExit {
    fn drop(&mut self) {
        #[cfg(feature = "cuda")]
        if let Some(Device::Cuda(cuda)) = &self.0 {
            // The frees queued on the stream complete before the trim (an unfinished free
            // still holds its block); on an error (a failed context) nothing is given back.
            if cuda.cuda_stream().synchronize().is_err() {
                return;
            }
            if let Some(pool) = memory_pool(cuda) {
                use candle_core::cuda_backend::cudarc::driver::result;
                // SAFETY: a valid pool; trimming releases only memory no allocation holds.
                let _ = unsafe { result::mem_pool::trim_to(pool, 0) };
            }
        }
    }
}

/// Sets `cuda`'s stream to the priority `rank` levels below the device's greatest, at most the
/// least (`cuStreamSetAttribute`; numerically lower values are greater priorities). CUDA graphs
/// launched on the stream run at its priority. Errors name the driver call that failed.
#[cfg(feature = "cuda")]
fn set_priority(cuda: &candle_core::CudaDevice, rank: u8) -> Result<(), String> {
    use candle_core::cuda_backend::cudarc::driver::sys;
    let check = |what: &str, r: sys::CUresult| {
        if r == sys::CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(format!("setting the stream priority: {what}: {r:?}"))
        }
    };
    let stream = cuda.cuda_stream();
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| format!("binding the CUDA context: {e}"))?;
    let (mut least, mut greatest) = (0, 0);
    // SAFETY: driver calls on the bound context with valid out-pointers; the stream is this
    // handle's own and outlives the calls.
    unsafe {
        check(
            "cuCtxGetStreamPriorityRange",
            sys::cuCtxGetStreamPriorityRange(&mut least, &mut greatest),
        )?;
        let asked = priority_level(rank, greatest, least);
        let mut value: sys::CUstreamAttrValue = std::mem::zeroed();
        value.priority = asked;
        check(
            "cuStreamSetAttribute",
            sys::cuStreamSetAttribute(
                stream.cu_stream(),
                sys::CUstreamAttrID::CU_LAUNCH_ATTRIBUTE_PRIORITY,
                &value,
            ),
        )?;
        let mut now = least;
        check(
            "cuStreamGetPriority",
            sys::cuStreamGetPriority(stream.cu_stream(), &mut now),
        )?;
        if now != asked {
            return Err(format!(
                "setting the stream priority: the stream kept priority {now} (asked {asked})"
            ));
        }
        Ok(())
    }
}

/// Puts omnitts' CPU thread counts into the environment when the user has not set them, once per
/// process (called by [`DeviceSpec::open`] for the CPU):
///
/// - `RAYON_NUM_THREADS` (candle's f32 matmuls): candle's own default, the core count. candle's CPU
///   matmul asks for its thread count on every call, and without the variable that means counting
///   physical cores by parsing `/proc/cpuinfo` each time: with the bundled voice about 270 file
///   reads per frame, which made stage 0 3.8× slower on a 2-core machine (10.7 against 2.8 ms per
///   frame). The value is the one candle would compute, so the thread count does not change.
/// - `CANDLE_NUM_THREADS` (candle's barrier pool, which runs the quantized matmuls and the
///   elementwise ops of 64 Ki elements or more; candle's default is `RAYON_NUM_THREADS`): one
///   fewer than `RAYON_NUM_THREADS` (yours if you set it), at least 1. The two
///   stages are two threads of their own, and the pool's workers spin after each job (candle:
///   25,000 spins before they park), so a pool as wide as the machine takes the core the other
///   stage is running on: on 2 cores with the bundled voice, RTF 0.11-0.15 with a pool of 1
///   against 0.15-0.18 with 2 (docs/cpu.md, "Threads").
///
/// Values the user set are kept.
pub fn pin_cpu_threads() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // candle's matmul thread count: `RAYON_NUM_THREADS` if set, else the physical cores.
        for (var, n) in default_cpu_threads(candle_core::utils::get_num_threads()) {
            if std::env::var_os(var).is_none() {
                // SAFETY: runs once, when the first stage opens the CPU, before any stage thread
                // of ours exists; Rust's own environment access is synchronised, and GStreamer
                // and GLib read the environment during initialisation, not while an element
                // starts.
                unsafe { std::env::set_var(var, n.to_string()) };
            }
        }
    });
}

/// The thread counts [`pin_cpu_threads`] puts into the environment (where unset) for a matmul
/// thread count of `threads`: `RAYON_NUM_THREADS` = `threads`, `CANDLE_NUM_THREADS` =
/// `threads - 1` (each at least 1).
fn default_cpu_threads(threads: usize) -> [(&'static str, usize); 2] {
    [
        ("RAYON_NUM_THREADS", threads.max(1)),
        ("CANDLE_NUM_THREADS", threads.saturating_sub(1).max(1)),
    ]
}

/// Weight/activation dtype of a stage (`engine_args.dtype`). The decoder runs in f32 unless its config asks for bf16
/// (docs/field-lessons.md §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DTypeSpec {
    /// bf16 on CUDA, f32 on the CPU.
    #[default]
    Auto,
    /// float32.
    F32,
    /// bfloat16.
    Bf16,
    /// float16.
    F16,
}

impl DTypeSpec {
    /// Parses the vLLM spellings: `auto`, `float32`/`float`/`fp32`, `bfloat16`/`bf16`,
    /// `float16`/`half`/`fp16`. `None` for anything else.
    pub fn parse(s: &str) -> Option<DTypeSpec> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Some(DTypeSpec::Auto),
            "float32" | "float" | "fp32" | "f32" => Some(DTypeSpec::F32),
            "bfloat16" | "bf16" => Some(DTypeSpec::Bf16),
            "float16" | "half" | "fp16" | "f16" => Some(DTypeSpec::F16),
            _ => None,
        }
    }

    /// The candle dtype on `device`.
    pub fn for_device(&self, device: &Device) -> DType {
        match self {
            DTypeSpec::Auto => {
                if device.is_cuda() {
                    DType::BF16
                } else {
                    DType::F32
                }
            }
            DTypeSpec::F32 => DType::F32,
            DTypeSpec::Bf16 => DType::BF16,
            DTypeSpec::F16 => DType::F16,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_ranks_become_priority_levels() {
        // A range of six levels (greatest −5, least 0).
        assert_eq!(priority_level(0, -5, 0), -5);
        assert_eq!(priority_level(1, -5, 0), -4);
        assert_eq!(priority_level(9, -5, 0), 0);
        // A device with one level.
        assert_eq!(priority_level(1, 0, 0), 0);
        let p = StreamPriority::OVER_DECODER;
        assert_eq!(StreamRole::Lane.rank(p), Some(0));
        assert_eq!(StreamRole::Ar.rank(p), Some(1));
        assert_eq!(StreamRole::Decoder.rank(p), None);
    }

    #[test]
    fn parses_device_strings() {
        assert_eq!("cpu".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cpu);
        assert_eq!(" CPU ".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cpu);
        assert_eq!("auto".parse::<DeviceSpec>().unwrap(), DeviceSpec::Auto);
        assert_eq!("cuda:0".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(0));
        assert_eq!("cuda:3".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(3));
        assert_eq!("1".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(1));
        for bad in ["cuda:", "cuda:x", "tpu", "gpu", "", "cuda:-1"] {
            let err = bad.parse::<DeviceSpec>().unwrap_err().to_string();
            assert!(err.contains("expected \"cpu\""), "{bad}: {err}");
        }
        assert_eq!(DeviceSpec::Cuda(2).to_string(), "cuda:2");
    }

    #[test]
    fn cuda_without_feature_is_a_clear_error() {
        let r = DeviceSpec::Cuda(0).check_supported();
        if DeviceSpec::CUDA_COMPILED {
            assert!(r.is_ok());
        } else {
            let msg = r.unwrap_err().to_string();
            assert!(
                msg.contains("cuda:0") && msg.contains("--features cuda"),
                "{msg}"
            );
            assert_eq!(DeviceSpec::Auto.resolve(), DeviceSpec::Cpu);
            assert!(matches!(DeviceSpec::Auto.open(), Ok(Device::Cpu)));
        }
        assert!(matches!(DeviceSpec::Cpu.open(), Ok(Device::Cpu)));
        // Opening the CPU leaves a thread count in the environment (candle's matmul reads it on
        // every call; without it, it parses /proc/cpuinfo each time).
        for var in ["RAYON_NUM_THREADS", "CANDLE_NUM_THREADS"] {
            let n: usize = std::env::var(var)
                .unwrap_or_else(|_| panic!("{var} set by DeviceSpec::open"))
                .parse()
                .expect("a number");
            assert!(n >= 1, "{var}");
        }
        // The barrier pool leaves a core to the other stage's thread; never below one.
        let counts = |cores| default_cpu_threads(cores).map(|(_, n)| n);
        assert_eq!(counts(2), [2, 1]);
        assert_eq!(counts(16), [16, 15]);
        assert_eq!(counts(1), [1, 1]);
        assert_eq!(counts(0), [1, 1]);
    }

    #[test]
    fn dtype_names() {
        assert_eq!(DTypeSpec::parse("bfloat16"), Some(DTypeSpec::Bf16));
        assert_eq!(DTypeSpec::parse("float32"), Some(DTypeSpec::F32));
        assert_eq!(DTypeSpec::parse("auto"), Some(DTypeSpec::Auto));
        assert_eq!(DTypeSpec::parse("int8"), None);
        assert_eq!(DTypeSpec::Auto.for_device(&Device::Cpu), DType::F32);
    }
}
