//! Per-request timing, and the batch tallies of the stages.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Timing of one finished request, delivered with `EngineEvent::Finished`. Times are in
/// milliseconds measured from `Engine::submit`; audio is at the codec's sample rate.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics {
    /// Codec frames decoded to audio (each `samples_per_frame` samples, 80 ms).
    pub frames: usize,
    /// Audio produced, ms.
    pub audio_ms: f64,
    /// Submit → first audio chunk ready, ms; `None` when no audio was produced.
    pub ttfa_ms: Option<f64>,
    /// Stage 0 time per frame, ms: the AR steps (`ArSession::next_frame`) divided by the frames
    /// they produced; the prefill is [`Metrics::ar_prefill_ms`].
    pub ar_ms_per_frame: f64,
    /// Stage 1 decode time per decoded frame, ms.
    pub decoder_ms_per_frame: f64,
    /// Real-time factor: processing time (Started → Finished) / audio duration; < 1 is faster than
    /// real time. 0 when no audio was produced.
    pub rtf: f64,
    /// Submit → Finished, ms.
    pub wall_ms: f64,
    /// Submit → Started (waiting for a free stage-0 slot), ms.
    pub queue_ms: f64,
    /// Tokenization, prompt construction and prefill (`ArModel::start`), ms.
    pub ar_prefill_ms: f64,
    /// Submit → stage 0's first frame, ms; `None` when stage 0 made none.
    pub first_frame_ms: Option<f64>,
    /// Stage-0 steps (batched frames of all running requests) from the request's arrival on
    /// stage 0 to the step that made its first frame, that step included; `None` without a frame.
    pub first_frame_steps: Option<u64>,
    /// Rows (requests) of the stage-0 step that made the request's first frame; `None` without a
    /// frame. With `first_frame_alone` that is often a step of the new requests only.
    pub first_frame_rows: Option<usize>,
    /// Frames (all requests' chunks together) of the stage-1 pass that decoded this request's first
    /// chunk; `None` without audio. Small when first chunks go first (`engine/pass_plan.rs`).
    pub first_pass_frames: Option<usize>,
    /// Submit → stage 0 pushed each of the request's first frames (at most [`TIMED_FRAMES`]),
    /// ms, in frame order: with the audio's arrival times, whether a late chunk waited for its
    /// frames or for its decode.
    pub frames_ready_ms: Vec<f64>,
}

/// How many of a request's first frames [`Metrics::frames_ready_ms`] times: with the chunk ramp
/// (1, 1, 2, 4, 8 frames), its first five chunks.
pub const TIMED_FRAMES: usize = 16;

/// Milliseconds in a duration.
pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// What stage 0 reports about a request when it lets go of it.
#[derive(Debug, Clone, Default)]
pub(crate) struct ArTiming {
    pub started: Option<Instant>,
    pub prefill: Duration,
    pub steps: Duration,
    pub frames: usize,
    /// Stage 0's step count when the request arrived on it.
    pub arrival_step: u64,
    /// When the first frame was pushed.
    pub first_frame: Option<FirstFrame>,
    /// When each of the first [`TIMED_FRAMES`] frames was pushed.
    pub frames_at: Vec<Instant>,
}

impl ArTiming {
    /// Counts a frame pushed at `at`.
    pub fn pushed(&mut self, at: Instant) {
        self.frames += 1;
        if self.frames_at.len() < TIMED_FRAMES {
            self.frames_at.push(at);
        }
    }
}

/// When and in which stage-0 step a request's first frame came.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FirstFrame {
    /// When it was pushed to the chunk buffer.
    pub at: Instant,
    /// Stage 0's steps from the request's arrival to it, that step included.
    pub steps: u64,
    /// Rows of that step.
    pub rows: usize,
}

/// Stage 1's tally for a request.
#[derive(Debug, Clone, Default)]
pub(crate) struct DecoderTiming {
    pub decode: Duration,
    pub frames: usize,
    pub samples: u64,
    pub first_audio: Option<Instant>,
    /// Frames of the pass that decoded the request's first chunk.
    pub first_pass_frames: Option<usize>,
}

impl Metrics {
    /// The figures of an utterance seen from outside the engine when it was cut short (cancelled,
    /// flushed): `samples` of audio out at `sample_rate` Hz, in frames of `samples_per_frame`,
    /// first audio after `ttfa_ms`, wall time since `since`; RTF = wall / audio (0 without
    /// audio). The per-stage figures stay 0.
    pub fn seen(
        samples: u64,
        samples_per_frame: usize,
        sample_rate: u32,
        ttfa_ms: Option<f64>,
        since: Instant,
    ) -> Metrics {
        let audio_ms = samples as f64 * 1e3 / sample_rate.max(1) as f64;
        let wall_ms = ms(since.elapsed());
        Metrics {
            frames: (samples / samples_per_frame.max(1) as u64) as usize,
            audio_ms,
            ttfa_ms,
            wall_ms,
            rtf: if audio_ms > 0.0 {
                wall_ms / audio_ms
            } else {
                0.0
            },
            ..Metrics::default()
        }
    }

    pub(crate) fn build(
        submitted: Instant,
        finished: Instant,
        ar: &ArTiming,
        dec: &DecoderTiming,
        sample_rate: u32,
    ) -> Metrics {
        let audio_ms = dec.samples as f64 * 1e3 / sample_rate.max(1) as f64;
        let started = ar.started.unwrap_or(finished);
        let processing = ms(finished.saturating_duration_since(started));
        Metrics {
            frames: dec.frames,
            audio_ms,
            ttfa_ms: dec
                .first_audio
                .map(|t| ms(t.saturating_duration_since(submitted))),
            ar_ms_per_frame: if ar.frames > 0 {
                ms(ar.steps) / ar.frames as f64
            } else {
                0.0
            },
            decoder_ms_per_frame: if dec.frames > 0 {
                ms(dec.decode) / dec.frames as f64
            } else {
                0.0
            },
            rtf: if audio_ms > 0.0 {
                processing / audio_ms
            } else {
                0.0
            },
            wall_ms: ms(finished.saturating_duration_since(submitted)),
            queue_ms: ms(started.saturating_duration_since(submitted)),
            ar_prefill_ms: ms(ar.prefill),
            first_frame_ms: ar
                .first_frame
                .map(|f| ms(f.at.saturating_duration_since(submitted))),
            first_frame_steps: ar.first_frame.map(|f| f.steps),
            first_frame_rows: ar.first_frame.map(|f| f.rows),
            first_pass_frames: dec.first_pass_frames,
            frames_ready_ms: ar
                .frames_at
                .iter()
                .map(|t| ms(t.saturating_duration_since(submitted)))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_values() {
        let t0 = Instant::now();
        let ar = ArTiming {
            started: Some(t0 + Duration::from_millis(10)),
            prefill: Duration::from_millis(5),
            steps: Duration::from_millis(100),
            frames: 10,
            arrival_step: 3,
            first_frame: Some(FirstFrame {
                at: t0 + Duration::from_millis(20),
                steps: 2,
                rows: 3,
            }),
            frames_at: vec![
                t0 + Duration::from_millis(20),
                t0 + Duration::from_millis(32),
            ],
        };
        let dec = DecoderTiming {
            decode: Duration::from_millis(20),
            frames: 10,
            samples: 19200,
            first_audio: Some(t0 + Duration::from_millis(30)),
            first_pass_frames: Some(4),
        };
        let m = Metrics::build(t0, t0 + Duration::from_millis(410), &ar, &dec, 24000);
        assert!((m.audio_ms - 800.0).abs() < 1e-9);
        assert!((m.ar_ms_per_frame - 10.0).abs() < 1e-9);
        assert!((m.decoder_ms_per_frame - 2.0).abs() < 1e-9);
        assert!((m.rtf - 0.5).abs() < 1e-9);
        assert!((m.wall_ms - 410.0).abs() < 1e-9);
        assert!((m.queue_ms - 10.0).abs() < 1e-9);
        assert!((m.ttfa_ms.unwrap() - 30.0).abs() < 1e-9);
        assert!((m.first_frame_ms.unwrap() - 20.0).abs() < 1e-9);
        assert_eq!(
            (m.first_frame_steps, m.first_frame_rows, m.first_pass_frames),
            (Some(2), Some(3), Some(4))
        );
        assert_eq!(m.frames_ready_ms, vec![20.0, 32.0]);
        let empty = Metrics::build(
            t0,
            t0,
            &ArTiming::default(),
            &DecoderTiming::default(),
            24000,
        );
        assert_eq!(empty.rtf, 0.0);
        assert_eq!(empty.ttfa_ms, None);
        assert_eq!(
            (
                empty.first_frame_ms,
                empty.first_frame_steps,
                empty.first_pass_frames
            ),
            (None, None, None)
        );
    }
}

/// What a stage's batched steps did since the engine loaded ([`super::Engine::batch_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Batched steps run (stage 0: frames for every running row, and the steps of new rows alone
    /// of `first_frame_alone`; stage 1: decode passes).
    pub steps: u64,
    /// Rows over all steps (frames produced, chunks decoded); `rows / steps` is the mean batch.
    pub rows: u64,
    /// Largest batch of one step.
    pub max_rows: u64,
}

/// Lock-free [`BatchStats`] counters, written by a stage thread.
#[derive(Debug, Default)]
pub(crate) struct BatchCounters {
    steps: AtomicU64,
    rows: AtomicU64,
    max_rows: AtomicU64,
}

impl BatchCounters {
    /// Counts one step of `rows` rows.
    pub fn step(&self, rows: usize) {
        let rows = rows as u64;
        self.steps.fetch_add(1, Ordering::Relaxed);
        self.rows.fetch_add(rows, Ordering::Relaxed);
        self.max_rows.fetch_max(rows, Ordering::Relaxed);
    }

    pub fn get(&self) -> BatchStats {
        BatchStats {
            steps: self.steps.load(Ordering::Relaxed),
            rows: self.rows.load(Ordering::Relaxed),
            max_rows: self.max_rows.load(Ordering::Relaxed),
        }
    }
}
