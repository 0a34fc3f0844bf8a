//! `omnittssrc`: a GStreamer source element that speaks text with Qwen3-TTS.
//!
//! Text (the `text` property, or the `push-text` action signal) goes to the two-stage
//! [`engine`](crate::engine); the audio chunks it streams back become timestamped
//! `audio/x-raw` buffers (F32LE or S16LE, 24000 Hz, mono), with PTS, duration, offset and
//! offset-end taken from a sample counter. Non-live (`is-live=false`, the default) it sends EOS
//! after the last queued utterance; live it paces by the pipeline clock, reports the first chunk's
//! duration as latency, fills the time between utterances with GAP-flagged silence, and speaks text
//! pushed later at the running time it arrives.
//!
//! Per utterance it posts element messages (see [`messages`]): started, first audio (TTFA), and
//! done (finish reason, frames, audio ms, RTF). With `split-sentences` every sentence of a text
//! (Unicode sentence boundaries, `sentences.rs`) is an utterance of its own.
//!
//! Base checkpoints clone the voice of a reference recording (`ref-audio`, read by
//! [`ref_audio`]; `ref-text` for ICL, or `x-vector-only`), encoded once by the engine's cache.
//!
//! ```text
//! gst-launch-1.0 omnittssrc model=tests/fixtures/tiny-customvoice text="Hello." ! audioconvert ! wavenc ! filesink location=out.wav
//! ```

use gst::glib;
use gst::prelude::*;
use std::sync::LazyLock;

pub mod hub;
mod imp;
pub mod ref_audio;
mod runtime;
mod sentences;
mod voice_clone;

pub use runtime::messages;

/// Debug category `omnittssrc` (`GST_DEBUG=omnittssrc:5`).
pub(crate) static CAT: LazyLock<gst::DebugCategory> = LazyLock::new(|| {
    gst::DebugCategory::new(
        "omnittssrc",
        gst::DebugColorFlags::empty(),
        Some("omnitts Qwen3-TTS source"),
    )
});

/// Longest value, in characters, quoted in an error message (longer ones are cut with "…").
const QUOTED_VALUE_CHARS: usize = 80;

/// A rejected input, reported as "property 'value': why"; the value is escaped (control and
/// invisible characters as `\u{…}`, so no terminal escape reaches a log) and cut to
/// [`QUOTED_VALUE_CHARS`] characters.
#[derive(Debug)]
pub(crate) struct InputError {
    pub property: &'static str,
    pub value: String,
    pub why: String,
}

impl std::fmt::Display for InputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut shown: String = self.value.chars().take(QUOTED_VALUE_CHARS).collect();
        if self.value.chars().nth(QUOTED_VALUE_CHARS).is_some() {
            shown.push('…');
        }
        write!(
            f,
            "{} '{}': {}",
            self.property,
            shown.escape_debug(),
            self.why
        )
    }
}

pub(crate) fn input_error(
    property: &'static str,
    value: &str,
    why: impl Into<String>,
) -> InputError {
    InputError {
        property,
        value: value.to_string(),
        why: why.into(),
    }
}

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
