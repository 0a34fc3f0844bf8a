//! The element message posted when a cue is over: where it was due, where it went, and what the
//! overflow policy did with it.

use crate::element_common::audio::pts_of;
use crate::element_common::messages;
use crate::engine::FinishReason;

use super::overflow::{Action, Overflow};
use super::shared::CueInfo;
use super::timeline::CueReport;

/// A cue is over (posted after its `omnitts/utterance-done`, or alone for a silent cue). Fields:
/// `id` (u64, as in the utterance messages), `text` (string, the text spoken), `pts` (u64 ns,
/// the text buffer's PTS; `GST_CLOCK_TIME_NONE` for a cue without one), `slot-duration` (u64
/// ns, the buffer's duration, or none), `start` (u64 ns, the PTS of its first audio sample, or
/// none when nothing of it was output; a silent cue: where its slot's silence starts), `end` (u64
/// ns, past its last output sample or where it was cut; a silent cue: its slot's end; none for a
/// cue a flush dropped before it started), `speech-duration` (u64 ns synthesised; for a clipped
/// cue, up to the cut),
/// `output-duration` (u64 ns of it output), `overflow` (string, the policy: `clip`, `overlap`,
/// `shift`, `compress`), `action` (string: `fit`, `clipped`, `overlapped`, `overran`, `shifted`,
/// `compressed`, `silent`, `flushed`: playing when a flush dropped it), `compression` (f64,
/// `compress`: how many times faster its speech was made, 1.0 when not),
/// `shifted-ms` (f64, how much later than its PTS it became due because the speech before it
/// ran long), `overrun-ms` (f64, how much longer than its slot its speech is), `clipped-ms`
/// (f64, speech cut off), `late` (u32, live: how many times its audio missed its deadline),
/// `late-ms` (f64, live: silence output in its place meanwhile) and `speech-complete` (bool: its
/// synthesis ran to its end; false when it was stopped at a cut, so that `speech-duration`,
/// `overrun-ms` and `clipped-ms` count only the speech made before the cut: lower bounds).
pub const CUE: &str = "omnitts/cue";

fn ms(samples: u64, rate: u32) -> f64 {
    pts_of(samples, rate).nseconds() as f64 / 1e6
}

/// The [`CUE`] message of `report` (positions from the segment start `segment_start`, samples
/// at the model's `rate` Hz) for the cue `info`.
pub(super) fn cue_message(
    src: &gst::Element,
    report: &CueReport,
    info: &CueInfo,
    segment_start: gst::ClockTime,
    policy: Overflow,
    rate: u32,
) -> gst::Message {
    let at = |p: u64| segment_start + pts_of(p, rate);
    // Its synthesis ran to the model's end (or a limit), or it had nothing to speak; not when the
    // element stopped it at a cut (cancelled, or still running when the cue ended) or it failed.
    let speech_complete = report.action == Action::Silent
        || matches!(
            info.finish,
            Some((
                FinishReason::Eos | FinishReason::Length | FinishReason::Guard,
                _
            ))
        );
    let s = gst::Structure::builder(CUE)
        .field("id", report.id)
        .field("text", messages::field_text(&info.text).as_ref())
        .field("pts", info.pts)
        .field("slot-duration", info.duration)
        .field("start", report.first.map(at))
        .field("end", (!report.never_started()).then(|| at(report.end)))
        .field("speech-duration", pts_of(report.speech, rate))
        .field("output-duration", pts_of(report.output, rate))
        .field("overflow", policy.nick())
        .field("action", report.action.as_str())
        .field("shifted-ms", ms(report.shifted, rate))
        .field("overrun-ms", ms(report.overrun, rate))
        .field("clipped-ms", ms(report.clipped, rate))
        .field(
            "compression",
            report
                .compressed
                .filter(|&c| c > 0)
                .map_or(1.0, |c| report.speech as f64 / c as f64),
        )
        .field("late", report.late)
        .field("late-ms", ms(report.late_samples, rate))
        .field("speech-complete", speech_complete)
        .build();
    gst::message::Element::builder(s).src(src).build()
}
