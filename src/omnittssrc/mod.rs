//! `omnittssrc`: a GStreamer source element that speaks text (Qwen3-TTS, Fish S2 Pro).
//!
//! Text (the `text` property, or the `push-text` action signal) goes to the two-stage
//! [`engine`](crate::engine); the audio chunks it streams back become timestamped
//! `audio/x-raw` buffers (F32LE or S16LE, mono, at the model's rate: 24000 Hz for Qwen3-TTS,
//! 44100 Hz for Fish S2 Pro), with PTS, duration, offset and offset-end taken from a sample
//! counter. Non-live (`is-live=false`, the default) it sends EOS
//! after the last queued utterance; live it paces by the pipeline clock, reports the first chunk's
//! duration as latency, fills the time between utterances with GAP-flagged silence, and speaks text
//! pushed later at the running time it arrives.
//!
//! Per utterance it posts element messages (see [`messages`](crate::element_common::messages)): started, first audio (TTFA), and
//! done (finish reason, frames, audio ms, RTF). With `split-sentences` every sentence of a text
//! (Unicode sentence boundaries, `element_common/sentences.rs`) is an utterance of its own: by
//! default (`auto`) for texts longer than the checkpoint speaks well as one utterance
//! (`element_common/split_policy.rs`, shared with `omnittssynth`).
//!
//! Base checkpoints clone the voice of a reference recording (`ref-audio`, read by
//! [`ref_audio`](crate::element_common::ref_audio); `ref-text` for ICL, or `x-vector-only`),
//! encoded once by the engine's cache.
//!
//! The properties, request building, model loading and messages it shares with the other
//! omnitts elements are in [`element_common`](crate::element_common); here: `imp.rs` (the
//! GObject glue, `create()`), `output.rs` (what each `create()` returns), `runtime.rs` (the text
//! queue and the worker thread).
//!
//! ```text
//! gst-launch-1.0 omnittssrc model=tests/fixtures/tiny-customvoice text="Hello." ! audioconvert ! wavenc ! filesink location=out.wav
//! ```

use gst::glib;
use gst::prelude::*;
use std::sync::LazyLock;

mod imp;
mod output;
mod runtime;

/// Debug category `omnittssrc` (`GST_DEBUG=omnittssrc:5`).
pub(crate) static CAT: LazyLock<gst::DebugCategory> = LazyLock::new(|| {
    gst::DebugCategory::new(
        "omnittssrc",
        gst::DebugColorFlags::empty(),
        Some("omnitts Qwen3-TTS source"),
    )
});

glib::wrapper! {
    /// The `omnittssrc` element (GType `GstOmniTtsSrc`).
    pub struct OmniTtsSrc(ObjectSubclass<imp::OmniTtsSrc>)
        @extends gst_base::PushSrc, gst_base::BaseSrc, gst::Element, gst::Object;
}

/// Registers `omnittssrc` with `plugin` (rank NONE).
pub fn register(plugin: &gst::Plugin) -> Result<(), glib::BoolError> {
    gst::Element::register(
        Some(plugin),
        "omnittssrc",
        gst::Rank::NONE,
        OmniTtsSrc::static_type(),
    )
}
