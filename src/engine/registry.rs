//! The process-wide engine registry: every user in one process that asks for the same checkpoint,
//! devices, dtype and stage configuration shares one loaded [`Engine`].
//!
//! [`acquire`] loads the engine for the first user and hands the same engine to every later one; the
//! engine is released (its stage threads joined, its weights freed) when the last [`SharedEngine`]
//! is dropped. Memory for N users is then one model plus N streams' state (KV caches, decoder
//! state), and stage 0 batches all their requests in each step (see `stage0.rs`).
//!
//! When the last share of an engine goes, the engine is dropped and the allocator is asked to hand
//! the freed memory back to the system ([`trim_allocator`]): every load and every stream runs on
//! threads of its own, which glibc serves from per-thread malloc arenas whose freed pages would
//! otherwise stay resident (2-8 MB per PLAYING ↔ NULL cycle of a dozen elements, never returned).
//!
//! Two users load the same engine once even when they start at the same moment: the second waits
//! for the first one's load and then joins it. Loads of different keys run in parallel.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError, Weak};

use super::{DeviceSpec, Engine, EngineError, EngineOptions, StageConfig};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What makes two engines interchangeable: the checkpoint directory (canonical path), the devices
/// the stages resolve to (`auto` becomes `cpu` or `cuda:0`), and the stage configuration (which
/// holds the dtype, the batch limits, the chunking and the sampling overrides).
#[derive(Debug, Clone, PartialEq)]
struct Key {
    model_dir: PathBuf,
    ar_device: DeviceSpec,
    decoder_device: DeviceSpec,
    stage_config: StageConfig,
}

impl Key {
    fn new(opts: &EngineOptions) -> Key {
        let mut stage_config = opts.stage_config.clone();
        let (ar_device, decoder_device) = (opts.ar_device.resolve(), opts.decoder_device.resolve());
        // The options' devices are authoritative; the config's only seed them.
        stage_config.ar.device = ar_device;
        stage_config.decoder.device = decoder_device;
        Key {
            model_dir: std::fs::canonicalize(&opts.model_dir)
                .unwrap_or_else(|_| opts.model_dir.clone()),
            ar_device,
            decoder_device,
            stage_config,
        }
    }
}

/// One key's engine. Its mutex is held while the engine loads, so users of the same key wait for
/// that load instead of starting their own.
struct Slot {
    key: Key,
    engine: Mutex<Weak<Engine>>,
}

static SLOTS: Mutex<Vec<Arc<Slot>>> = Mutex::new(Vec::new());

/// A user's share of a registry engine; derefs to the [`Engine`]. Dropping the last share of an
/// engine drops the engine (which cancels whatever is still running on it and joins its threads), so
/// a user should cancel its own requests before letting go.
pub struct SharedEngine {
    // Dropped before `_trim` (fields drop in order), which then sees whether it was the last.
    engine: Arc<Engine>,
    loaded: bool,
    _trim: TrimWhenReleased,
}

/// Trims the allocator once the engine it watches is gone (the last share's drop).
struct TrimWhenReleased(Weak<Engine>);

impl Drop for TrimWhenReleased {
    fn drop(&mut self) {
        if self.0.strong_count() == 0 {
            trim_allocator();
        }
    }
}

/// Hands the allocator's free memory back to the system: glibc's `malloc_trim(0)`, which releases
/// the free pages of every malloc arena (the main one and the per-thread ones), not only the top
/// of the heap. A no-op with other C libraries.
pub fn trim_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists under its locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The trim threshold [`bound_allocator_retention`] sets: glibc's own default, 128 KiB.
const TRIM_THRESHOLD: i32 = 128 * 1024;

/// Sets glibc's malloc so that what an engine frees goes back to the system, once per process:
/// the trim threshold fixed at its default, 128 KiB, and no fastbins (`M_MXFAST` 0). Unless the
/// environment sets one of those itself (`MALLOC_TRIM_THRESHOLD_`, `MALLOC_MMAP_THRESHOLD_`,
/// `MALLOC_TOP_PAD_`, `MALLOC_MXFAST_`, or those tunables in `GLIBC_TUNABLES`): then nothing is
/// changed.
///
/// Why (measured with tests/element_memory.rs, twelve elements cycled PLAYING ↔ NULL): memory
/// freed in a per-thread malloc arena that ends up in the arena's top chunk stays resident, as
/// `malloc_trim` returns the free chunks of every arena but the top of the main heap only. Two
/// ways it got there. glibc raises its trim threshold (up to 64 MiB) whenever a large mapped block
/// is freed, which an engine does (weights, decoder activations), and an arena then keeps that
/// much free at its top; setting the threshold turns the raising off. And small blocks freed into
/// fastbins (an engine frees a great many: its tokenizer's tables, per-request vectors) are only
/// merged, by `malloc_trim` itself, into a top that it then keeps; without fastbins a free merges at once
/// and the arena trims its top. Without these, the resident memory after NULL grew 45 -> 53 MB
/// and 54 -> 75 MB (medians of ten cycles, 2-11 against 41-50), single cycles up to 86 MB; with
/// them it stays at 25 MB, with the same CPU time (fastbins only save a little on tiny blocks,
/// which the per-thread caches serve first anyway).
pub fn bound_allocator_retention() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            let set = |name: &str| std::env::var_os(name).is_some();
            let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
            let user_set = ["TRIM_THRESHOLD", "MMAP_THRESHOLD", "TOP_PAD", "MXFAST"]
                .iter()
                .any(|p| set(&format!("MALLOC_{p}_")))
                || ["trim_threshold", "mmap_threshold", "top_pad", "mxfast"]
                    .iter()
                    .any(|t| tunables.contains(&format!("glibc.malloc.{t}")));
            if !user_set {
                // SAFETY: mallopt only sets the allocator's parameters, under its own lock.
                unsafe {
                    libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
                    libc::mallopt(libc::M_MXFAST, 0);
                }
            }
        });
    }
}

impl SharedEngine {
    fn new(engine: Arc<Engine>, loaded: bool) -> SharedEngine {
        bound_allocator_retention();
        let trim = TrimWhenReleased(Arc::downgrade(&engine));
        SharedEngine {
            engine,
            loaded,
            _trim: trim,
        }
    }
}

impl std::fmt::Debug for SharedEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedEngine")
            .field("engine", &self.engine)
            .field("loaded", &self.loaded)
            .field("users", &self.users())
            .finish()
    }
}

impl std::ops::Deref for SharedEngine {
    type Target = Engine;

    fn deref(&self) -> &Engine {
        &self.engine
    }
}

impl SharedEngine {
    /// An engine of its own, outside the registry (nobody else can join it).
    pub fn unshared(engine: Engine) -> SharedEngine {
        SharedEngine::new(Arc::new(engine), true)
    }

    /// Whether this share loaded the engine (`false`: it joined one that was already loaded).
    pub fn loaded(&self) -> bool {
        self.loaded
    }

    /// How many shares of this engine exist now, this one included.
    pub fn users(&self) -> usize {
        Arc::strong_count(&self.engine)
    }

    /// Whether `self` and `other` are shares of the same engine.
    pub fn same_engine(&self, other: &SharedEngine) -> bool {
        Arc::ptr_eq(&self.engine, &other.engine)
    }
}

/// The registry's engine for `opts`: joins the loaded engine of an equal key, or loads it (see
/// [`Engine::load`] for what that does and its errors). A failed load leaves nothing behind, so the
/// next call tries again.
pub fn acquire(opts: EngineOptions) -> Result<SharedEngine, EngineError> {
    let key = Key::new(&opts);
    let slot = {
        let mut slots = lock(&SLOTS);
        // Forget keys whose engine is gone (a slot that is loading is locked: keep it).
        slots.retain(|s| match s.engine.try_lock() {
            Ok(w) => w.strong_count() > 0,
            Err(TryLockError::WouldBlock) => true,
            Err(TryLockError::Poisoned(p)) => p.into_inner().strong_count() > 0,
        });
        match slots.iter().find(|s| s.key == key) {
            Some(s) => s.clone(),
            None => {
                let s = Arc::new(Slot {
                    key,
                    engine: Mutex::new(Weak::new()),
                });
                slots.push(s.clone());
                s
            }
        }
    };
    let mut engine = lock(&slot.engine);
    if let Some(e) = engine.upgrade() {
        return Ok(SharedEngine::new(e, false));
    }
    // Before the load, whose freed temporaries would otherwise raise glibc's thresholds.
    bound_allocator_retention();
    let e = Arc::new(Engine::load(opts)?);
    *engine = Arc::downgrade(&e);
    Ok(SharedEngine::new(e, true))
}
