//! When stage 0 gives new requests their first frame in a step of their own
//! (`engine_args.first_frame_alone`, [`super::config::ArStageConfig`]).
//!
//! A request whose prefill has just ended would otherwise get its first frame with the next
//! batched step of every running stream, which under load takes two to three times a one-row
//! step. A step of the new rows alone brings the first frame one small step after the prefill,
//! and the running streams wait that step. That cost is bounded here, so that the steps alone
//! never take the room stage 0 needs to keep up: a step alone is taken only
//! - while no request waits for a place, and fewer streams run than half of `max_num_seqs` (near
//!   its places, stage 0 keeps up only if each request leaves its place soon, and steps alone
//!   lengthen every request);
//! - while the steps alone have taken at most [`ALONE_SHARE`] of stage 0's stepping time over
//!   about the last second ([`TAU`]).

use std::time::{Duration, Instant};

/// How stage 0 gives new requests their first frame.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct FirstFrameRules {
    /// A step of the new rows alone, within [`AloneBudget`]
    /// ([`super::StageConfig::first_frame_alone_on`]).
    pub alone: bool,
    /// The most of the stepping time steps alone may take ([`ALONE_SHARE`]).
    pub alone_share: f64,
    /// After a step alone, requests that arrived during it start (prefill, and their own step
    /// alone if allowed) before the batched step instead of after it, once a batched step
    /// (on by default; `OMNITTS_ALONE_ARRIVALS=0` turns it off: docs/cuda.md).
    pub arrivals_first: bool,
}

/// The most of stage 0's stepping time that steps alone may take. On the H200 at 40 requests a
/// second (1.7B, 64 places), steps alone for every arrival took about a quarter of it and stage 0
/// fell behind its arrivals; held to this share alone, they still cost underruns there
/// (docs/cuda.md, "The first frame alone, and stream priorities").
pub const ALONE_SHARE: f64 = 0.1;

/// The time constant of the stepping-time averages: steps count less the longer ago they were.
pub const TAU: Duration = Duration::from_secs(1);

/// Stage 0's recent stepping time, all steps and steps alone, decayed with [`TAU`].
#[derive(Debug, Clone)]
pub(crate) struct AloneBudget {
    /// The share of the stepping time steps alone may take.
    share: f64,
    /// Seconds of steps alone, decayed.
    alone: f64,
    /// Seconds of all steps, decayed.
    all: f64,
    /// When the sums were last decayed.
    at: Option<Instant>,
}

impl Default for AloneBudget {
    fn default() -> Self {
        Self::new(ALONE_SHARE)
    }
}

impl AloneBudget {
    /// A budget that lets steps alone take `share` of the stepping time.
    pub fn new(share: f64) -> Self {
        Self {
            share,
            alone: 0.0,
            all: 0.0,
            at: None,
        }
    }

    fn decay(&mut self, now: Instant) {
        if let Some(at) = self.at {
            let k = (-now.saturating_duration_since(at).as_secs_f64() / TAU.as_secs_f64()).exp();
            self.alone *= k;
            self.all *= k;
        }
        self.at = Some(now);
    }

    /// Whether a step alone may run at `now` while `running` streams (with frames made) hold
    /// places of stage 0's `places` (`max_num_seqs`) and `waiting` requests wait for one.
    pub fn allows(&mut self, now: Instant, running: usize, places: usize, waiting: usize) -> bool {
        self.decay(now);
        waiting == 0 && 2 * running < places && self.alone <= self.share * self.all
    }

    /// Counts a step of `took` that ended at `now`; `alone`: a step of new rows alone.
    pub fn record(&mut self, now: Instant, took: Duration, alone: bool) {
        self.decay(now);
        let s = took.as_secs_f64();
        self.all += s;
        if alone {
            self.alone += s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn steps_alone_are_held_to_their_share_of_the_time() {
        let t0 = Instant::now();
        let mut b = AloneBudget::default();
        assert!(
            b.allows(t0, 0, 16, 0),
            "a first step alone on an idle stage"
        );
        assert!(b.allows(t0, 7, 16, 0));
        assert!(
            !b.allows(t0, 8, 16, 0),
            "not with half of the places running"
        );
        assert!(
            !b.allows(t0, 0, 16, 1),
            "never while a request waits for a place"
        );
        b.record(t0 + 5 * MS, 5 * MS, true);
        // 5 ms alone of 5: none until the batched steps have taken ten times that.
        let mut t = t0 + 5 * MS;
        let mut batched = 0;
        while !b.allows(t, 4, 16, 0) {
            t += 8 * MS;
            b.record(t, 8 * MS, false);
            batched += 1;
            assert!(batched < 100, "the budget never came back");
        }
        // 45 ms of batched steps at least (5 ≤ 0.1 · (5 + 8 n)): n ≥ 6.
        assert!((6..=7).contains(&batched), "{batched} batched steps");
        // Arrivals at every step: the steps alone settle at about their share.
        let (mut alone, mut all) = (Duration::ZERO, Duration::ZERO);
        for _ in 0..2000 {
            let one = b.allows(t, 4, 16, 0);
            if one {
                t += 5 * MS;
                b.record(t, 5 * MS, true);
                alone += 5 * MS;
                all += 5 * MS;
            }
            t += 8 * MS;
            b.record(t, 8 * MS, false);
            all += 8 * MS;
        }
        let share = alone.as_secs_f64() / all.as_secs_f64();
        assert!(
            (0.08..=0.11).contains(&share),
            "steps alone took {share:.3} of the time"
        );
    }

    #[test]
    fn old_steps_alone_are_forgotten() {
        let t0 = Instant::now();
        let mut b = AloneBudget::default();
        b.record(t0, 50 * MS, true);
        b.record(t0 + MS, MS, false);
        assert!(!b.allows(t0 + 2 * MS, 4, 16, 0));
        // Without steps the sums decay together: the share stays until new steps come.
        let later = t0 + 10 * TAU;
        assert!(!b.allows(later, 4, 16, 0));
        b.record(later + 8 * MS, 8 * MS, false);
        assert!(
            b.allows(later + 8 * MS, 4, 16, 0),
            "a long quiet time forgets the steps alone"
        );
    }
}
