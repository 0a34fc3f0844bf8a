//! Which of the chunks waiting on stage 1 go into its next decode pass.
//!
//! Stage 1 takes at most one chunk per request from its async-chunk buffer and holds it until a
//! pass decodes it. Passes are ordered by how soon each request's listener runs out of audio:
//!
//! - a chunk is **urgent** when its request has no audio yet (a first chunk), or when the audio
//!   it has delivered runs out within [`URGENT_SLACK`] if played in real time from its first
//!   audio. When any chunk is urgent, the next pass holds the urgent chunks only: a first chunk
//!   never waits behind a long pass of other requests' later chunks, it waits at most for the
//!   pass already running;
//! - otherwise the pass takes the chunks with the least slack first, up to the decoder's batch
//!   budget in frames (always at least one chunk), so no pass grows past what the decoder runs
//!   at once and new first chunks get their turn between such passes.
//!
//! The order changes only when a chunk is decoded, never what it decodes to: each request's chunks
//! are still decoded in order on its own decoder state.

use std::time::Duration;

/// Below this much audio ahead of a real-time listener, a request's next chunk is urgent.
pub const URGENT_SLACK: Duration = Duration::from_millis(250);

/// A chunk held by stage 1, waiting for a pass.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Waiting {
    /// Frames in the chunk.
    pub frames: usize,
    /// Audio the request has delivered beyond what a real-time listener that started at its first
    /// audio has played by now, seconds (negative: that listener would be starved); `None` before
    /// the request's first audio.
    pub slack: Option<f64>,
}

impl Waiting {
    /// No audio yet, or less than [`URGENT_SLACK`] ahead of the listener.
    pub fn is_urgent(&self) -> bool {
        self.slack.is_none_or(|s| s < URGENT_SLACK.as_secs_f64())
    }
}

/// The indices into `waiting` of the next pass, ascending; empty only when `waiting` is.
/// `budget`: frames one batched pass takes ([`crate::models::qwen3_tts::Code2Wav::max_batch_frames`]).
pub fn next_pass(waiting: &[Waiting], budget: usize) -> Vec<usize> {
    let urgent: Vec<usize> = (0..waiting.len())
        .filter(|&i| waiting[i].is_urgent())
        .collect();
    if !urgent.is_empty() {
        return urgent;
    }
    let mut by_slack: Vec<usize> = (0..waiting.len()).collect();
    by_slack.sort_by(|&a, &b| {
        let s = |i: usize| waiting[i].slack.unwrap_or(f64::NEG_INFINITY);
        s(a).total_cmp(&s(b)).then(a.cmp(&b))
    });
    let mut pass = Vec::new();
    let mut frames = 0;
    for i in by_slack {
        if !pass.is_empty() && frames + waiting[i].frames > budget {
            continue;
        }
        frames += waiting[i].frames;
        pass.push(i);
    }
    pass.sort_unstable();
    pass
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(frames: usize, slack: Option<f64>) -> Waiting {
        Waiting { frames, slack }
    }

    #[test]
    fn a_first_chunk_goes_before_a_long_pending_pass() {
        // Sixteen requests with 25-frame chunks and seconds of audio ahead, and one new request
        // whose first chunk (one frame) arrived meanwhile: the next pass is that chunk alone.
        let mut waiting: Vec<Waiting> = (0..16).map(|k| w(25, Some(1.0 + k as f64))).collect();
        waiting.insert(7, w(1, None));
        assert_eq!(next_pass(&waiting, 512), vec![7]);
        // Then the others, in one pass (400 frames fit the budget).
        waiting.remove(7);
        assert_eq!(next_pass(&waiting, 512), (0..16).collect::<Vec<_>>());
    }

    #[test]
    fn urgent_chunks_share_one_pass() {
        let waiting = [
            w(25, Some(2.0)),
            w(1, None),
            w(2, Some(0.1)),
            w(25, Some(-0.3)),
            w(4, Some(0.3)),
        ];
        assert_eq!(next_pass(&waiting, 512), vec![1, 2, 3]);
        assert!(w(8, Some(0.249)).is_urgent());
        assert!(!w(8, Some(0.25)).is_urgent());
    }

    #[test]
    fn the_budget_bounds_a_pass_least_slack_first() {
        let waiting = [
            w(25, Some(3.0)),
            w(25, Some(0.5)),
            w(25, Some(2.0)),
            w(25, Some(1.0)),
        ];
        assert_eq!(next_pass(&waiting, 50), vec![1, 3]);
        assert_eq!(next_pass(&waiting, 75), vec![1, 2, 3]);
        // A chunk larger than the budget still goes alone.
        assert_eq!(next_pass(&[w(600, Some(1.0))], 512), vec![0]);
        // Smaller chunks fill what a larger one leaves.
        let mixed = [w(500, Some(0.4)), w(25, Some(0.5)), w(8, Some(0.6))];
        assert_eq!(next_pass(&mixed, 512), vec![0, 2]);
        assert!(next_pass(&[], 512).is_empty());
    }
}
