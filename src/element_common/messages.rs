//! The element messages posted per utterance, their structure names and fields, and the errors
//! an utterance can end with.

use gst::prelude::GstObjectExt;

use crate::engine::{FinishReason, Metrics};

use super::input_error::quoted;
use super::sentences::split_sentences;

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
/// `ar-ms-per-frame`, `decoder-ms-per-frame` (f64), `underruns` (u32, live mode: silence
/// buffers inserted in its middle because its audio was late), `wait-ms` (f64,
/// live `omnittssrc`: the silence output at its start while its first audio was late, e.g.
/// waiting in a shared engine's queue; 0 otherwise), `silence-samples` (u64, live `omnittssrc`:
/// all silence inserted into it, so that `samples` + `silence-samples` samples make its
/// `duration`; 0 otherwise), `pts` (start), `duration` (u64 ns from the first to past the last
/// output sample).
pub const DONE: &str = "omnitts/utterance-done";
/// `omnittssrc`'s `append-text` opened an utterance (posted from the signal, before the
/// utterance's other messages), or `omnittssynth` opened the cue of its fragments
/// (`input-mode=fragments`). Fields: `id` (u64, the utterance's or the cue's), `mode` (string:
/// `token`, one text token per codec frame in the streaming prompt mode, `clause`, each clause
/// spoken whole once complete, or `sentence`, with `server=`: the server's streaming-input
/// websocket speaks each sentence once complete), `reason` (string: why this mode, e.g. the
/// checkpoint's `omnitts.json` saying `streaming_prompt=false`, or `prompt-mode` set).
pub const TEXT_STREAM_MODE: &str = "omnitts/text-stream-mode";

fn element_message(src: &gst::Element, s: gst::Structure) -> gst::Message {
    gst::message::Element::builder(s).src(src).build()
}

/// `text` as a message field. GStreamer strings are C strings, which end at a NUL: a NUL
/// character (valid UTF-8, which a text buffer or a Rust caller may carry) is left out instead
/// of panicking the thread that builds the message.
pub(crate) fn field_text(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains('\0') {
        text.replace('\0', "").into()
    } else {
        text.into()
    }
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
            .field("text", field_text(text).as_ref())
            .field("pts", pts.nseconds())
            .build(),
    )
}

/// The [`TEXT_STREAM_MODE`] message: utterance `id` is spoken in `mode` (`token`, `clause` or
/// `sentence`) because of `reason`.
pub(crate) fn text_stream_mode(
    src: &gst::Element,
    id: u64,
    mode: &str,
    reason: &str,
) -> gst::Message {
    element_message(
        src,
        gst::Structure::builder(TEXT_STREAM_MODE)
            .field("id", id)
            .field("mode", mode)
            .field("reason", reason)
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
    /// Live `omnittssrc`: silence samples output at its start, before its first audio.
    pub wait_samples: u64,
    /// Live `omnittssrc`: silence samples inserted in all (its start and its middle).
    pub silence_samples: u64,
    /// PTS of its first sample.
    pub pts: gst::ClockTime,
    /// From its first sample to past its last.
    pub duration: gst::ClockTime,
    /// The model's sample rate, Hz: the sample counts above are at it.
    pub rate: u32,
    /// `split-sentences` applies to its text: false for an open utterance (`append-text`) and
    /// for omnittssynth's fragments.
    pub splittable: bool,
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
                .field("text", field_text(&self.text).as_ref())
                .field("reason", self.reason.as_str())
                .field("error", field_text(error).as_ref())
                .field("frames", m.frames as u64)
                .field("samples", self.samples)
                .field("audio-ms", m.audio_ms)
                .field("ttfa-ms", m.ttfa_ms.unwrap_or(-1.0))
                .field("rtf", m.rtf)
                .field("wall-ms", m.wall_ms)
                .field("ar-ms-per-frame", m.ar_ms_per_frame)
                .field("decoder-ms-per-frame", m.decoder_ms_per_frame)
                .field("underruns", self.underruns)
                .field(
                    "wait-ms",
                    self.wait_samples as f64 * 1000.0 / f64::from(self.rate.max(1)),
                )
                .field("silence-samples", self.silence_samples)
                .field("pts", self.pts.nseconds())
                .field("duration", self.duration.nseconds())
                .build(),
        )
    }

    /// Why the utterance was cut short and what to change, when it ended at a limit instead of
    /// the model's end of speech: `max-new-tokens` (`length`) or the runaway guard (`guard`).
    /// Posted as a bus warning; `what` names the utterance as the element does (`utterance`,
    /// omnittssynth's `cue`). Suggests `split-sentences=true` only where it applies
    /// ([`Self::splittable`]) and the text has several sentences.
    pub fn limit_warning(&self, what: &str) -> Option<String> {
        let (id, frames) = (self.id, self.metrics.frames);
        let (text, secs) = (quoted(&self.text), self.metrics.audio_ms / 1000.0);
        // Splitting helps only a text of several sentences (one already split is one sentence).
        let split = if self.splittable && split_sentences(&self.text).len() > 1 {
            "set split-sentences=true, "
        } else {
            ""
        };
        match self.reason {
            FinishReason::Length => Some(format!(
                "{what} {id} ('{text}') ended by length: max-new-tokens was reached before \
                 the model ended the speech, after {} ({secs:.1} s of audio) in \
                 all, so its end may be cut off; raise max-new-tokens, {split}or send shorter \
                 text",
                count_of(frames, "frame")
            )),
            FinishReason::Guard => Some(format!(
                "{what} {id} ('{text}') ended by guard: the runaway guard stopped it after \
                 {} ({secs:.1} s of audio), more than its text should take, which \
                 usually means babble or noise; {split}send shorter or plainer text, or change \
                 runaway_guard in the stage-config",
                count_of(frames, "frame")
            )),
            _ => None,
        }
    }

    /// The bus message of an utterance whose synthesis failed (`reason` is `error`),
    /// "synthesis of utterance N failed: why".
    ///
    /// A failure of the synthesis itself (a server's error, a stage error) is a STREAM/FAILED
    /// warning: the stream goes on with the next utterance, and GStreamer treats an error message
    /// as fatal (a bin fails its pending state change on one, so an error before the first buffer
    /// reached the sink would leave the pipeline short of PLAYING for good, every later
    /// utterance's audio held back). Bad input that the engine only finds once the utterance runs
    /// (the engine's "invalid request", naming the property and value: the text of an open
    /// utterance that grows too long for one, say) stays a STREAM/FAILED error, as every other
    /// refusal of bad input is. Both carry a debug part as the element's other errors do: the
    /// source location and the element, then the text ([`located_debug`]).
    pub fn failure_message(&self, src: &gst::Element) -> Option<gst::Message> {
        let FinishReason::Error(e) = &self.reason else {
            return None;
        };
        let text = format!("synthesis of utterance {} failed: {e}", self.id);
        let debug = located_debug(
            src,
            (file!(), line!()),
            "UtteranceDone::failure_message",
            &debug_text(&self.text),
        );
        Some(if e.contains("invalid request:") {
            gst::message::Error::builder(gst::StreamError::Failed, &text)
                .debug(&debug)
                .src(src)
                .build()
        } else {
            gst::message::Warning::builder(gst::StreamError::Failed, &text)
                .debug(&debug)
                .src(src)
                .build()
        })
    }
}

/// An utterance refused before it started (bad text or settings, an unusable reference, a full
/// engine): its id, text and why (naming the property and value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub id: u64,
    pub text: String,
    pub error: String,
}

impl Refusal {
    /// Its error message: RESOURCE/SETTINGS, "utterance N refused: why", the source location
    /// and the text as debug ([`located_debug`]).
    pub fn message(&self, src: &gst::Element) -> gst::Message {
        gst::message::Error::builder(
            gst::ResourceError::Settings,
            &format!("utterance {} refused: {}", self.id, self.error),
        )
        .debug(&located_debug(
            src,
            (file!(), line!()),
            "Refusal::message",
            &debug_text(&self.text),
        ))
        .src(src)
        .build()
    }
}

/// Characters of an utterance's text a message's debug part shows.
const DEBUG_TEXT_CHARS: usize = 1000;

/// An utterance's text as a message's debug part shows it: `text: "…"` escaped, its first
/// [`DEBUG_TEXT_CHARS`] characters, then how many it has in all when it has more (a text too
/// long for one utterance can be megabytes).
fn debug_text(text: &str) -> String {
    let total = text.chars().count();
    if total <= DEBUG_TEXT_CHARS {
        return format!("text: {text:?}");
    }
    let head: String = text.chars().take(DEBUG_TEXT_CHARS).collect();
    format!("text: {head:?}… ({total} characters in all)")
}

/// The debug part of an error or warning built here for `src` to post later, as GStreamer writes
/// that of an element's own (GST_ELEMENT_ERROR): `file(line): function (): element path:`, then
/// `detail` (the utterance's text as [`debug_text`] shows it: the message line quotes only its
/// start).
fn located_debug(
    src: &gst::Element,
    (file, line): (&str, u32),
    function: &str,
    detail: &str,
) -> String {
    format!(
        "{file}({line}): {}::{function} (): {}:\n{detail}",
        module_path!(),
        src.path_string()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(reason: FinishReason) -> UtteranceDone {
        UtteranceDone {
            id: 3,
            text: "A long one.".into(),
            reason,
            metrics: Metrics {
                frames: 29,
                audio_ms: 2320.0,
                ..Metrics::default()
            },
            samples: 29 * 1920,
            underruns: 0,
            wait_samples: 0,
            silence_samples: 0,
            pts: gst::ClockTime::ZERO,
            duration: gst::ClockTime::ZERO,
            rate: 24_000,
            splittable: true,
        }
    }

    #[test]
    fn limits_warn_with_the_reason_frames_and_remedy() {
        let w = done(FinishReason::Length)
            .limit_warning("utterance")
            .unwrap();
        for word in [
            "utterance 3",
            "'A long one.'",
            "length",
            "29 frames",
            "2.3 s",
        ] {
            assert!(w.contains(word), "{word}: {w}");
        }
        for remedy in ["max-new-tokens", "shorter text"] {
            assert!(w.contains(remedy), "{remedy}: {w}");
        }
        let w = done(FinishReason::Guard)
            .limit_warning("utterance")
            .unwrap();
        for word in ["guard", "29 frames", "shorter", "runaway_guard"] {
            assert!(w.contains(word), "{word}: {w}");
        }
    }

    #[test]
    fn splitting_is_suggested_only_for_a_text_of_several_sentences() {
        for reason in [FinishReason::Length, FinishReason::Guard] {
            // One sentence (as every piece of a split text is): splitting cannot help.
            let w = done(reason.clone()).limit_warning("utterance").unwrap();
            assert!(!w.contains("split-sentences"), "{w}");
            let mut two = done(reason);
            two.text = "A long one. And another one after it.".into();
            let w = two.limit_warning("utterance").unwrap();
            assert!(w.contains("set split-sentences=true"), "{w}");
            // Where split-sentences does not apply (an open utterance, omnittssynth's
            // fragments), never.
            two.splittable = false;
            let w = two.limit_warning("cue").unwrap();
            assert!(!w.contains("split-sentences"), "{w}");
        }
    }

    #[test]
    fn only_limits_warn() {
        for quiet in [
            FinishReason::Eos,
            FinishReason::Cancelled,
            FinishReason::Error("x".into()),
        ] {
            assert_eq!(done(quiet).limit_warning("utterance"), None);
        }
    }

    /// A failed utterance's error (bad input stage 0 found) and warning (a failure of the
    /// engine), and a refused utterance's error, carry a debug part as the element's other
    /// errors do: the source location and the element, then the text's first 1,000 characters
    /// and its length (the message line quotes its start).
    #[test]
    fn failure_and_refusal_messages_carry_their_location_as_debug() {
        gst::init().unwrap();
        use gst::prelude::Cast;
        let src = gst::Bin::with_name("src").upcast::<gst::Element>();
        let long = "word ".repeat(10_000);
        for (e, error) in [
            (
                "stage 0 prefill: invalid request: text = \"x\": too long",
                true,
            ),
            ("stage 1 failed", false),
        ] {
            let mut d = done(FinishReason::Error(e.into()));
            d.text = long.clone();
            let m = d.failure_message(&src).unwrap();
            let (text, debug) = match m.view() {
                gst::MessageView::Error(m) if error => (m.error().to_string(), m.debug()),
                gst::MessageView::Warning(m) if !error => (m.error().to_string(), m.debug()),
                other => panic!("{e}: {other:?}"),
            };
            assert!(
                text.starts_with("synthesis of utterance 3 failed: "),
                "{text}"
            );
            let debug = debug.expect("a debug part").to_string();
            assert!(
                debug.starts_with("src/element_common/messages.rs("),
                "{debug}"
            );
            assert!(
                debug.contains("::UtteranceDone::failure_message (): /GstBin:src:\n"),
                "{debug}"
            );
            let head: String = long.chars().take(DEBUG_TEXT_CHARS).collect();
            assert!(
                debug.ends_with(&format!("\ntext: {head:?}… (50000 characters in all)")),
                "{debug}"
            );
        }
        let refusal = Refusal {
            id: 4,
            text: long.clone(),
            error: "text 'word…': too long".into(),
        };
        let m = refusal.message(&src);
        let gst::MessageView::Error(m) = m.view() else {
            panic!("{m:?}")
        };
        assert_eq!(
            m.error().to_string(),
            "utterance 4 refused: text 'word…': too long"
        );
        let debug = m.debug().unwrap().to_string();
        assert!(
            debug.starts_with("src/element_common/messages.rs("),
            "{debug}"
        );
        assert!(
            debug.contains("::Refusal::message (): /GstBin:src:\ntext: \"word word"),
            "{debug}"
        );
        assert!(debug.len() < 1200, "{} bytes", debug.len());
        // A short text is shown whole.
        let short = Refusal {
            text: "A \"short\" one.".into(),
            ..refusal
        };
        let m = short.message(&src);
        let debug = match m.view() {
            gst::MessageView::Error(m) => m.debug().unwrap().to_string(),
            other => panic!("{other:?}"),
        };
        assert!(
            debug.ends_with("\ntext: \"A \\\"short\\\" one.\""),
            "{debug}"
        );
    }
}

/// `n` of `noun` for a message: "no preset speakers", "1 voice", "3 voices" (`noun` singular,
/// the plural with an "s").
pub(crate) fn count_of(n: usize, noun: &str) -> String {
    match n {
        0 => format!("no {noun}s"),
        1 => format!("1 {noun}"),
        n => format!("{n} {noun}s"),
    }
}

#[cfg(test)]
mod count_tests {
    use super::{count_of, field_text};

    #[test]
    fn a_nul_is_left_out_of_a_message_field() {
        assert_eq!(field_text("Nul\0byte inside."), "Nulbyte inside.");
        assert!(matches!(
            field_text("plain"),
            std::borrow::Cow::Borrowed("plain")
        ));
        // A structure takes the result (a NUL in a string field panics glib).
        gst::init().unwrap();
        let s = gst::Structure::builder("t")
            .field("text", field_text("a\0b").as_ref())
            .build();
        assert_eq!(s.get::<String>("text").unwrap(), "ab");
    }

    #[test]
    fn counts_read_as_english() {
        assert_eq!(count_of(0, "preset speaker"), "no preset speakers");
        assert_eq!(count_of(1, "preset speaker"), "1 preset speaker");
        assert_eq!(count_of(9, "voice"), "9 voices");
    }
}
