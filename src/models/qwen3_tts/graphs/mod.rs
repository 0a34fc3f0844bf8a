//! Stage 0's CUDA graphs and who may replay them.
//!
//! Two sets, captured once at start-up by [`ArModel::enable_cuda_graphs`]:
//! - the code predictor's frame ([`CpGraphs`]): its KV cache is reset every frame, so any session
//!   replays it, one at a time under a lock;
//! - the talker's decode step ([`TalkerGraphs`]): the graphs hold the device addresses of the one KV
//!   cache they own, so they serve one utterance from prefill to end. A session leases them
//!   ([`TalkerLease`], given back when it is dropped); a session that finds them leased, or a
//!   prompt that does not fit them, keeps its own cache and steps eagerly ([`TalkerCache`]).
//!
//! - a prompt's prefill ([`PrefillGraphs`], one graph per prompt-length bucket): it runs into a
//!   scratch KV cache and one kernel copies that into the session's cache, so any session replays
//!   it, one at a time under a lock (`OMNITTS_PREFILL_GRAPHS=0` leaves prefills eager).
//!
//! And, by [`ArModel::enable_batch_graphs`], the batched frames of several sessions
//! ([`batch::BatchGraphs`], one graph per batch bucket): the sessions keep their own caches, which
//! the graphs reach through device tables, so any sessions may share a replay.
//!
//! Without the `cuda` feature nothing is captured, but the talker graphs' work (the decode step at
//! a device-side position) still runs directly on any device: how the CPU tests check it.

pub mod batch;
mod code_predictor;
mod prefill;
mod talker;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use candle_core::Tensor;

pub use code_predictor::CpGraphs;
pub use prefill::PrefillGraphs;
pub use talker::TalkerGraphs;

use super::ar_model::ArModel;
use super::talker::Talker;
use crate::models::tts::ModelError;
use crate::nn::LayerCaches;

/// Positions (prompt + frames) of the KV cache that the talker decode graphs own
/// ([`ArModel::enable_cuda_graphs`]); a longer utterance continues eagerly past it.
pub const TALKER_GRAPH_POSITIONS: usize = 4096;

/// The graphs an [`ArModel`] holds: none until [`ArModel::enable_cuda_graphs`].
#[derive(Debug, Default)]
pub(super) struct ArGraphs {
    code_predictor: Option<Mutex<CpGraphs>>,
    talker: Option<TalkerSlot>,
    prefill: Option<Mutex<PrefillGraphs>>,
    /// Batched frames of 2..=`max_num_seqs` streams ([`batch::BatchGraphs`]).
    #[cfg(feature = "cuda")]
    batch: Option<Mutex<batch::BatchGraphs>>,
}

/// The talker decode graphs and whether a session holds them.
#[derive(Debug)]
struct TalkerSlot {
    graphs: Mutex<TalkerGraphs>,
    capacity: usize,
    leased: AtomicBool,
}

impl TalkerSlot {
    fn new(graphs: TalkerGraphs) -> Self {
        Self {
            capacity: graphs.capacity(),
            graphs: Mutex::new(graphs),
            leased: AtomicBool::new(false),
        }
    }
}

fn poisoned(what: &str) -> candle_core::Error {
    candle_core::Error::Msg(format!("{what}: lock poisoned by a panic"))
}

impl ArGraphs {
    /// The code predictor's frame graphs, when captured.
    pub(super) fn code_predictor(&self) -> Option<&Mutex<CpGraphs>> {
        self.code_predictor.as_ref()
    }

    /// The prefill graphs, when enabled.
    pub(super) fn prefill(&self) -> Option<&Mutex<PrefillGraphs>> {
        self.prefill.as_ref()
    }

    /// The batched frame graphs, when captured.
    #[cfg(feature = "cuda")]
    pub(super) fn batch(&self) -> Option<&Mutex<batch::BatchGraphs>> {
        self.batch.as_ref()
    }

    /// Leases the talker decode graphs for an utterance of `prefill_len` prompt positions, if
    /// enabled, free and large enough. Their cache is cleared for the new utterance.
    pub(super) fn lease_talker(&self, prefill_len: usize) -> Option<TalkerLease<'_>> {
        let slot = self.talker.as_ref()?;
        if prefill_len >= slot.capacity
            || slot
                .leased
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return None;
        }
        let lease = TalkerLease { slot };
        lease.lock().ok()?.reset();
        Some(lease)
    }

    /// Whether a session holds the talker decode graphs.
    #[cfg(test)]
    pub(super) fn talker_leased(&self) -> bool {
        self.talker
            .as_ref()
            .is_some_and(|s| s.leased.load(Ordering::Acquire))
    }
}

/// A session's hold on the talker decode graphs; dropping it gives them back.
#[derive(Debug)]
pub(super) struct TalkerLease<'a> {
    slot: &'a TalkerSlot,
}

impl TalkerLease<'_> {
    /// The graphs (the lock is uncontended: only the lease holder takes it).
    fn lock(&self) -> candle_core::Result<MutexGuard<'_, TalkerGraphs>> {
        self.slot
            .graphs
            .lock()
            .map_err(|_| poisoned("talker decode graphs"))
    }
}

impl Drop for TalkerLease<'_> {
    fn drop(&mut self) {
        self.slot.leased.store(false, Ordering::Release);
    }
}

/// The talker KV cache of one utterance: its own (eager steps), or the one of the leased decode
/// graphs.
#[derive(Debug)]
pub(super) enum TalkerCache<'a> {
    Own(LayerCaches),
    Leased(TalkerLease<'a>),
}

/// Mutable access to a [`TalkerCache`]'s layer caches (holding the graphs' lock when leased).
pub(super) enum CacheGuard<'g> {
    Own(&'g mut LayerCaches),
    Leased(MutexGuard<'g, TalkerGraphs>),
}

impl std::ops::Deref for CacheGuard<'_> {
    type Target = LayerCaches;
    fn deref(&self) -> &LayerCaches {
        match self {
            CacheGuard::Own(c) => c,
            CacheGuard::Leased(g) => g.cache(),
        }
    }
}

impl std::ops::DerefMut for CacheGuard<'_> {
    fn deref_mut(&mut self) -> &mut LayerCaches {
        match self {
            CacheGuard::Own(c) => c,
            CacheGuard::Leased(g) => g.cache_mut(),
        }
    }
}

impl<'a> TalkerCache<'a> {
    /// The leased graphs' cache when `graphs` can lease them for `prefill_len` prompt positions,
    /// else an own cache sized for `capacity_hint` positions.
    pub(super) fn for_utterance(
        graphs: &'a ArGraphs,
        talker: &Talker,
        prefill_len: usize,
        capacity_hint: usize,
    ) -> Self {
        match graphs.lease_talker(prefill_len) {
            Some(lease) => TalkerCache::Leased(lease),
            None => TalkerCache::Own(talker.new_cache(capacity_hint)),
        }
    }

    /// The layer caches, for an eager prefill or an eager decode step.
    pub(super) fn lock(&mut self) -> candle_core::Result<CacheGuard<'_>> {
        Ok(match self {
            TalkerCache::Own(c) => CacheGuard::Own(c),
            TalkerCache::Leased(l) => CacheGuard::Leased(l.lock()?),
        })
    }

    /// Before a decode step: past the leased graphs' capacity, continues on an own copy of the
    /// cache and gives the graphs back.
    pub(super) fn ensure_room(&mut self) -> candle_core::Result<()> {
        if let TalkerCache::Leased(l) = self {
            let g = l.lock()?;
            if !g.has_room() {
                let copy = g.cache_copy();
                drop(g);
                *self = TalkerCache::Own(copy);
            }
        }
        Ok(())
    }

    /// One decode position `input` `[1, 1, hidden]`: on the leased graphs, or eagerly. Returns
    /// what [`Talker::forward`] returns. Call [`Self::ensure_room`] first.
    pub(super) fn step(
        &mut self,
        talker: &Talker,
        input: &Tensor,
    ) -> candle_core::Result<(Tensor, Vec<f32>)> {
        match self {
            TalkerCache::Own(cache) => talker.forward(input, cache),
            TalkerCache::Leased(l) => l.lock()?.step(talker, input),
        }
    }

    /// Positions cached so far (prompt + frames).
    #[cfg(feature = "cuda")]
    pub(super) fn seq_len(&self) -> candle_core::Result<usize> {
        Ok(match self {
            TalkerCache::Own(c) => c.seq_len(),
            TalkerCache::Leased(l) => l.lock()?.cache().seq_len(),
        })
    }

    /// Whether the decode steps run on the leased graphs.
    pub(super) fn is_leased(&self) -> bool {
        matches!(self, TalkerCache::Leased(_))
    }
}

impl ArModel {
    /// Captures the code predictor's frame as CUDA graphs, replayed by every later frame instead
    /// of launching each kernel (same kernels, same data: identical logits; by default one graph per
    /// frame with the codes chosen on the device, one graph per step with `OMNITTS_CP_FRAME_GRAPH=0`,
    /// see [`CpGraphs`]). Call it once at start-up, before serving (capture needs the stream to
    /// itself). On error nothing changes and frames keep running eagerly. Errors: not a CUDA
    /// device, a build without the `cuda` feature, or a failed capture (the message names the
    /// CUDA call).
    ///
    /// Three sets are captured: the code predictor's frame, the talker's decode step (one
    /// graph per attention bucket over an owned KV cache of [`TALKER_GRAPH_POSITIONS`] positions;
    /// see [`TalkerGraphs`]), and the prefill of prompts of up to 256 positions ([`PrefillGraphs`];
    /// not with `OMNITTS_PREFILL_GRAPHS=0`). One utterance at a time replays the talker graphs;
    /// others run eagerly meanwhile. Batched frames ([`ArModel::next_frames`] with more than one row) run
    /// eagerly unless [`Self::enable_batch_graphs`] captures their graphs too.
    pub fn enable_cuda_graphs(&mut self) -> Result<(), ModelError> {
        let cp = CpGraphs::capture(&self.code_predictor, self.dtype)?;
        let mut talker = TalkerGraphs::new(&self.talker, self.dtype, TALKER_GRAPH_POSITIONS)?;
        talker.capture(&self.talker)?;
        let prefill = if crate::nn::switches::Switches::get().prefill_graphs {
            let mut p = PrefillGraphs::new(&self.talker, self.dtype, usize::MAX)?;
            p.capture(&self.talker)?;
            Some(Mutex::new(p))
        } else {
            None
        };
        self.graphs = ArGraphs {
            code_predictor: Some(Mutex::new(cp)),
            talker: Some(TalkerSlot::new(talker)),
            prefill,
            #[cfg(feature = "cuda")]
            batch: None,
        };
        Ok(())
    }

    /// Captures the batched frame graphs for 2..=`max_rows` streams (batch buckets 2, 4, … up to
    /// `max_rows`, at most [`batch::MAX_BATCH`]: [`batch::BatchGraphs`]), after
    /// [`Self::enable_cuda_graphs`]; batched frames ([`ArModel::next_frames`] with several
    /// rows) then replay them, rows at positions below [`TALKER_GRAPH_POSITIONS`]. Returns the
    /// bucket sizes. On error nothing changes and batched frames keep running eagerly. Errors:
    /// fewer than 2 rows, the one-stream graphs not enabled, a model the batched kernels do not
    /// take (not CUDA bf16/f32, fused kernels off), a build without `cuda`, a failed capture.
    pub fn enable_batch_graphs(&mut self, max_rows: usize) -> Result<Vec<usize>, ModelError> {
        #[cfg(feature = "cuda")]
        {
            if !self.cuda_graphs_enabled() {
                return Err(ModelError::Candle(candle_core::Error::Msg(
                    "batched frame graphs need the one-stream CUDA graphs first".into(),
                )));
            }
            if !crate::nn::cuda_kernels::all_enabled()
                || !crate::nn::switches::Switches::get().batch_graphs
            {
                return Err(ModelError::Candle(candle_core::Error::Msg(
                    "batched frame graphs are off (OMNITTS_BATCH_GRAPHS=0 or fused kernels off)"
                        .into(),
                )));
            }
            let g = batch::BatchGraphs::capture(self, max_rows, TALKER_GRAPH_POSITIONS)?;
            let sizes = g.bucket_sizes();
            self.graphs.batch = Some(Mutex::new(g));
            Ok(sizes)
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = max_rows;
            Err(ModelError::Candle(candle_core::Error::Msg(
                "CUDA graphs need a build with the `cuda` feature".into(),
            )))
        }
    }

    /// The talker decode step at a device-side position without capturing graphs (any device):
    /// the graphs' work run directly, so tests can compare it with the eager step.
    #[cfg(test)]
    pub(super) fn enable_slot_decode(&mut self, positions: usize) -> Result<(), ModelError> {
        let g = TalkerGraphs::new(&self.talker, self.dtype, positions)?;
        self.graphs.talker = Some(TalkerSlot::new(g));
        Ok(())
    }

    /// The prefill graphs' work for prompts of up to `max_len` positions without capturing
    /// graphs (any device), so tests can compare it with the eager prefill.
    #[cfg(test)]
    pub(super) fn enable_slot_prefill(&mut self, max_len: usize) -> Result<(), ModelError> {
        let g = PrefillGraphs::new(&self.talker, self.dtype, max_len)?;
        self.graphs.prefill = Some(Mutex::new(g));
        Ok(())
    }

    /// Back to eager execution (drops the graphs).
    pub fn disable_cuda_graphs(&mut self) {
        self.graphs = ArGraphs::default();
    }

    /// Whether frames replay CUDA graphs.
    pub fn cuda_graphs_enabled(&self) -> bool {
        self.graphs.code_predictor.is_some()
    }
}

#[cfg(test)]
mod tests {
    use crate::models::qwen3_tts::testing::fixture;
    use crate::models::qwen3_tts::{
        ArModel, ArStep, FinishReason, GenerationConfig, SamplingParams, VoiceRequest,
    };

    /// Greedy codes, finish reason, the logits before every frame and the prompt length.
    fn generate(
        m: &ArModel,
        g: &GenerationConfig,
        req: &VoiceRequest,
        max: usize,
    ) -> (Vec<Vec<u32>>, FinishReason, Vec<Vec<f32>>, usize, bool) {
        let sampling = SamplingParams {
            max_new_tokens: max,
            ..SamplingParams::from_generation_config(g)
        }
        .greedy();
        let mut s = m.start(req, &sampling).expect("start");
        let prompt = s.prompt_ids().rows.len();
        let mut frames = Vec::new();
        let mut logits = vec![s.pending_logits().to_vec()];
        loop {
            match s.next_frame().expect("frame") {
                ArStep::Frame(f) => {
                    frames.push(f);
                    logits.push(s.pending_logits().to_vec());
                }
                ArStep::Finished(r) => {
                    return (frames, r, logits, prompt, s.uses_talker_graphs());
                }
            }
        }
    }

    /// A run's codes, finish reason and logits.
    type Run<'a> = (&'a Vec<Vec<u32>>, &'a FinishReason, &'a Vec<Vec<f32>>);

    /// The same codes and finish reason, and logits within 1e-4 at every frame.
    fn assert_same_run(what: &str, got: Run<'_>, want: Run<'_>) {
        assert_eq!(got.0, want.0, "{what}: codes differ");
        assert_eq!(got.1, want.1, "{what}");
        for (i, (a, b)) in got.2.iter().zip(want.2).enumerate() {
            let d = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            assert!(d <= 1e-4, "{what} frame {i}: logits differ by {d}");
        }
    }

    /// The talker decode step at a device-side position (the work the CUDA graphs capture: scatter
    /// into the KV slot, bucketed masked attention, RoPE rows by index) gives the eager step's
    /// greedy codes and logits, across bucket boundaries and past its capacity (eager fallback),
    /// and the lease returns to the model after every utterance.
    #[test]
    fn slot_decode_equals_eager_decode() {
        let mut fell_back = false;
        for name in ["tiny-customvoice", "tiny-voicedesign"] {
            let (eager, gen_cfg) = fixture(name);
            let (mut slot, _) = fixture(name);
            // Buckets 64, 128, 150: prompts of ~20-40 positions cross two boundaries in 90 frames,
            // and the 140-frame run outgrows the cache and finishes eagerly.
            slot.enable_slot_decode(150).expect("slot decode");
            let speaker = eager.speakers().into_iter().next();
            let instruct = (name == "tiny-voicedesign").then(|| "A calm low voice.".to_string());
            for (text, max) in [("Hello world, this is a test.", 90), ("Short.", 140)] {
                let req = VoiceRequest {
                    text: text.into(),
                    speaker: speaker.clone(),
                    language: Some("english".into()),
                    instruct: instruct.clone(),
                    ..VoiceRequest::default()
                };
                let (codes_e, reason_e, logits_e, prompt, _) =
                    generate(&eager, &gen_cfg, &req, max);
                let (codes_s, reason_s, logits_s, _, on_graphs) =
                    generate(&slot, &gen_cfg, &req, max);
                let positions = prompt + codes_e.len();
                assert!(
                    positions > 64,
                    "{name}: {positions} positions cross no bucket"
                );
                assert_eq!(on_graphs, positions <= 150, "{name}: {positions} positions");
                fell_back |= !on_graphs;
                assert_same_run(
                    &format!("{name} '{text}'"),
                    (&codes_s, &reason_s, &logits_s),
                    (&codes_e, &reason_e, &logits_e),
                );
                assert!(!slot.graphs.talker_leased(), "lease not returned");
            }
        }
        assert!(fell_back, "no utterance outgrew the slot cache");
    }

    /// The prefill graphs' work (the prompt padded to a bucket, the last row picked on the device,
    /// the scratch cache copied into the session's) gives the eager prefill's greedy codes and
    /// logits: into an own cache and into the leased decode graphs' cache, for prompts shorter
    /// than the bucket after a longer one (stale padding rows), and eagerly past the buckets.
    #[test]
    fn slot_prefill_equals_eager_prefill() {
        // Buckets 16 and 32: the fixtures' prompts (16-57 positions) fill one exactly, leave
        // padding rows (stale after a longer prompt) or are past them.
        let (mut padded, mut stale, mut fell_back) = (false, false, false);
        for (name, leased) in [("tiny-customvoice", false), ("tiny-voicedesign", true)] {
            let (eager, gen_cfg) = fixture(name);
            let (mut slot, _) = fixture(name);
            slot.enable_slot_prefill(32).expect("slot prefill");
            if leased {
                slot.enable_slot_decode(150).expect("slot decode");
            }
            let speaker = eager.speakers().into_iter().next();
            let instructs = if name == "tiny-voicedesign" {
                vec![
                    Some("A calm low voice.".to_string()),
                    Some("An excited, fast and very high voice with a slight echo.".to_string()),
                ]
            } else {
                vec![None]
            };
            let mut longest_in_bucket = 0;
            for instruct in instructs {
                for text in [
                    "Hello world, this is a test.",
                    "Hi there, friend.",
                    "Short.",
                ] {
                    let req = VoiceRequest {
                        text: text.into(),
                        speaker: speaker.clone(),
                        language: Some("english".into()),
                        instruct: instruct.clone(),
                        ..VoiceRequest::default()
                    };
                    let (codes_e, reason_e, logits_e, prompt, _) =
                        generate(&eager, &gen_cfg, &req, 20);
                    let (codes_s, reason_s, logits_s, _, on_graphs) =
                        generate(&slot, &gen_cfg, &req, 20);
                    match prompt {
                        17..32 => {
                            padded = true;
                            stale |= prompt < longest_in_bucket;
                            longest_in_bucket = longest_in_bucket.max(prompt);
                        }
                        16 | 32 => {}
                        p if p < 16 => padded = true,
                        _ => fell_back = true,
                    }
                    assert_eq!(on_graphs, leased, "{name}: decode graphs");
                    assert_same_run(
                        &format!("{name} '{text}'"),
                        (&codes_s, &reason_s, &logits_s),
                        (&codes_e, &reason_e, &logits_e),
                    );
                }
            }
        }
        assert!(padded, "no prompt left padding rows in its bucket");
        assert!(
            stale,
            "no padded prompt followed a longer one in its bucket"
        );
        assert!(fell_back, "no prompt was past the prefill buckets");
    }
}
