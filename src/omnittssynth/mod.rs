//! `omnittssynth`: a filter that speaks timed text on the pipeline's timeline.
//!
//! Timed text (`text/x-raw`, `format=utf8` or `pango-markup`, as `subparse` emits subtitles, or as
//! transcribers and translators emit captions) comes in on the sink pad; each buffer is a cue,
//! spoken from its PTS, its duration being the cue's slot. Out comes one continuous,
//! sample-exact audio stream with the caps of `omnittssrc` (F32LE or S16LE, mono, at the
//! model's rate: 24000 Hz for Qwen3-TTS, 44100 Hz for Fish S2 Pro): the cues' speech at their
//! sample positions, GAP-flagged silence between them, in the input's TIME segment, EOS at the
//! end of the last cue: its slot's end (silence to there, for a silent cue too) or its audio's
//! end, whichever is later.
//!
//! - When speech is longer than its slot, the `overflow` property decides ([`Overflow`]): `clip`,
//!   `overlap` (the element mixes, soft-limited), `shift` (later cues later, never earlier than
//!   their PTS), or `compress` (sped up into the slot, pitch kept, by at most `max-compression`;
//!   `compress.rs`); see `timeline.rs` for the rules.
//! - Live upstream (its LATENCY answer): the element adds `latency` to it; a cue whose audio is not
//!   synthesised by its running time + that latency is handled by the overflow policy, with a
//!   warning and a count in its cue message. Not live: the element waits for synthesis, so the
//!   timeline is exact however slow the machine.
//! - Voice: the voice, sampling, model and device properties are omnittssrc's (shared, see
//!   [`element_common`](crate::element_common)); the custom downstream event `omnitts/voice` and
//!   `rstranscribe/speaker-change` (through `speaker-map`) change it for the cues after them
//!   (`voice.rs`).
//! - `input-mode=fragments` ([`fragments`]): the buffers are fragments of a running utterance
//!   (an LLM's reply), spoken while they arrive (as `omnittssrc`'s `append-text`: token or clause
//!   mode) as one cue at the first fragment's PTS, until an end (MARKER flag, `omnitts/end-text`
//!   event, a sentence end followed by `fragment-pause`, EOS).
//! - Messages per cue: omnittssrc's utterance messages (started, first audio, done) and
//!   [`cue_message::CUE`] (PTS, slot, speech duration, what the policy did).
//!
//! ```text
//! gst-launch-1.0 filesrc location=film.srt ! subparse ! omnittssynth overflow=shift ! audioconvert ! wavenc ! filesink location=dub.wav
//! ```
//!
//! Flow: sink pad (cues, events, `imp.rs`) → shared state (`shared.rs`) ← synthesis workers
//! (`synthesis.rs`, the engine); the source pad's task (`output.rs`) takes the timeline's output
//! and pushes it.

use gst::glib;
use gst::prelude::*;
use std::sync::LazyLock;

mod compress;
pub mod cue_message;
mod cue_text;
mod fragment_text;
pub mod fragments;
mod imp;
mod output;
mod overflow;
mod shared;
mod synthesis;
mod timeline;
mod voice;

pub use overflow::{Action, Overflow};
pub use timeline::soft_limit;
pub use voice::{SPEAKER_CHANGE_EVENT, VOICE_EVENT};

/// Debug category `omnittssynth` (`GST_DEBUG=omnittssynth:5`).
pub(crate) static CAT: LazyLock<gst::DebugCategory> = LazyLock::new(|| {
    gst::DebugCategory::new(
        "omnittssynth",
        gst::DebugColorFlags::empty(),
        Some("omnitts Qwen3-TTS timed-text synthesizer"),
    )
});

glib::wrapper! {
    /// The `omnittssynth` element (GType `GstOmniTtsSynth`).
    pub struct OmniTtsSynth(ObjectSubclass<imp::OmniTtsSynth>)
        @extends gst::Element, gst::Object;
}

/// Registers `omnittssynth` with `plugin` (rank NONE).
pub fn register(plugin: &gst::Plugin) -> Result<(), glib::BoolError> {
    gst::Element::register(
        Some(plugin),
        "omnittssynth",
        gst::Rank::NONE,
        OmniTtsSynth::static_type(),
    )
}
