//! The element messages posted per utterance, their structure names and fields, and the errors
//! an utterance can end with.

use crate::engine::{FinishReason, Metrics};

/// An utterance's first buffer is being output. Fields: `id` (u64), `text` (string),
/// `pts` (u64 ns, the PTS of its first sample).
pub const STARTED: &str = "omnitts/utterance-started";
/// The engine produced the utterance's first audio. Fields: `id`, `ttfa-ms` (f64, from
/// submission to the first decoded chunk), `pts` (the PTS of the next buffer output then).
pub const FIRST_AUDIO: &str = "omnitts/utterance-first-audio";
/// The utterance ended. Fields: `id`, `text`, `reason` (`eos`, `length`, `guard`, `cancelled`,
/// `error`), `error` (string, empty unless `reason` is `error`), `frames` (u64 codec frames
/// generated), `samples` (u64 audio samples output), `audio-ms` (f64 audio generated),
/// `ttfa-ms` (f64, -1 if none), `rtf` (f64, wall time / audio time), `wall-ms` (f64),
/// `ar-ms-per-frame`, `decoder-ms-per-frame` (f64), `underruns` (u32, live mode), `pts`
/// (start), `duration` (u64 ns from the first to past the last output sample).
pub const DONE: &str = "omnitts/utterance-done";

fn element_message(src: &gst::Element, s: gst::Structure) -> gst::Message {
    gst::message::Element::builder(s).src(src).build()
}

/// The [`STARTED`] message.
pub(crate) fn started(
    src: &gst::Element,
    id: u64,
    text: &str,
    pts: gst::ClockTime,
) -> gst::Message {
    element_message(
        src,
        gst::Structure::builder(STARTED)
            .field("id", id)
            .field("text", text)
            .field("pts", pts.nseconds())
            .build(),
    )
}

/// The [`FIRST_AUDIO`] message.
pub(crate) fn first_audio(
    src: &gst::Element,
    id: u64,
    ttfa_ms: f64,
    pts: gst::ClockTime,
) -> gst::Message {
    element_message(
        src,
        gst::Structure::builder(FIRST_AUDIO)
            .field("id", id)
            .field("ttfa-ms", ttfa_ms)
            .field("pts", pts.nseconds())
            .build(),
    )
}

/// What the [`DONE`] message of one utterance reports.
#[derive(Debug, Clone)]
pub(crate) struct UtteranceDone {
    pub id: u64,
    pub text: String,
    pub reason: FinishReason,
    /// The engine's figures (for a cancelled utterance, what the element saw).
    pub metrics: Metrics,
    /// Audio samples output (silence not counted).
    pub samples: u64,
    /// Live mode: silence buffers inserted because audio was late.
    pub underruns: u32,
    /// PTS of its first sample.
    pub pts: gst::ClockTime,
    /// From its first sample to past its last.
    pub duration: gst::ClockTime,
}

impl UtteranceDone {
    /// The [`DONE`] message.
    pub fn message(&self, src: &gst::Element) -> gst::Message {
        let m = &self.metrics;
        let error = match &self.reason {
            FinishReason::Error(e) => e.as_str(),
            _ => "",
        };
        element_message(
            src,
            gst::Structure::builder(DONE)
                .field("id", self.id)
                .field("text", self.text.as_str())
                .field("reason", self.reason.as_str())
                .field("error", error)
                .field("frames", m.frames as u64)
                .field("samples", self.samples)
                .field("audio-ms", m.audio_ms)
                .field("ttfa-ms", m.ttfa_ms.unwrap_or(-1.0))
                .field("rtf", m.rtf)
                .field("wall-ms", m.wall_ms)
                .field("ar-ms-per-frame", m.ar_ms_per_frame)
                .field("decoder-ms-per-frame", m.decoder_ms_per_frame)
                .field("underruns", self.underruns)
                .field("pts", self.pts.nseconds())
                .field("duration", self.duration.nseconds())
                .build(),
        )
    }

    /// The error message of an utterance whose synthesis failed (`reason` is `error`).
    pub fn error_message(&self, src: &gst::Element) -> Option<gst::Message> {
        let FinishReason::Error(e) = &self.reason else {
            return None;
        };
        Some(
            gst::message::Error::builder(
                gst::StreamError::Failed,
                &format!("synthesis of utterance {} failed: {e}", self.id),
            )
            .src(src)
            .build(),
        )
    }
}

/// The error message of an utterance refused before it started (bad text or settings, an
/// unusable reference): RESOURCE/SETTINGS, the reason naming the property and value.
pub(crate) fn refused(src: &gst::Element, id: u64, text: &str, error: &str) -> gst::Message {
    gst::message::Error::builder(
        gst::ResourceError::Settings,
        &format!("utterance {id} refused: {error}"),
    )
    .debug(&format!("text: {text:?}"))
    .src(src)
    .build()
}
