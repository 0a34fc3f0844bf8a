//! What a listener hears of one streamed request: when its audio becomes audible (an RMS detector
//! over short windows) and whether a player that starts at the first chunk runs dry (underruns).
//! Pure functions of the samples and of the chunks' arrival times, so that they can be tested on
//! hand-made signals.

/// Level at or above which a window counts as audible, dBFS (RMS of the window after its mean is
/// removed, full scale = 1.0).
pub const AUDIBLE_DBFS: f64 = -45.0;
/// Detector window, seconds.
pub const WINDOW_S: f64 = 0.020;
/// Detector hop, seconds.
pub const HOP_S: f64 = 0.010;
/// Audible windows in a row that make an onset (the onset is the first of them).
pub const ACTIVE_IN_A_ROW: usize = 2;

/// One audio chunk as the client received it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Chunk {
    /// When it arrived, seconds since the request's scheduled arrival.
    pub arrival_s: f64,
    /// Index of its first sample in the utterance.
    pub offset: u64,
    /// Samples in it.
    pub len: usize,
}

/// Whether one window is audible: RMS of the samples minus their mean at or above
/// [`AUDIBLE_DBFS`].
pub fn window_is_audible(window: &[f32]) -> bool {
    if window.is_empty() {
        return false;
    }
    let n = window.len() as f64;
    let mean = window.iter().map(|&x| x as f64).sum::<f64>() / n;
    let power = window
        .iter()
        .map(|&x| (x as f64 - mean).powi(2))
        .sum::<f64>()
        / n;
    power.sqrt() >= 10f64.powf(AUDIBLE_DBFS / 20.0)
}

/// The first audible sample of `audio` at `sample_rate`: the start of the first of
/// [`ACTIVE_IN_A_ROW`] audible windows in a row ([`WINDOW_S`] long, every [`HOP_S`]); `None` when
/// no such run exists (silence, or audio too short for the windows).
pub fn audible_onset(audio: &[f32], sample_rate: u32) -> Option<usize> {
    let window = ((sample_rate as f64 * WINDOW_S).round() as usize).max(1);
    let hop = ((sample_rate as f64 * HOP_S).round() as usize).max(1);
    let mut run = 0;
    let mut start = 0;
    while start + window <= audio.len() {
        if window_is_audible(&audio[start..start + window]) {
            run += 1;
            if run == ACTIVE_IN_A_ROW {
                return Some(start - (ACTIVE_IN_A_ROW - 1) * hop);
            }
        } else {
            run = 0;
        }
        start += hop;
    }
    None
}

/// The chunk that holds sample `sample`, if any.
pub fn chunk_holding(chunks: &[Chunk], sample: usize) -> Option<&Chunk> {
    let s = sample as u64;
    chunks
        .iter()
        .find(|c| c.offset <= s && s < c.offset + c.len as u64)
}

/// A player without a buffer: it starts when the first chunk arrives and plays every sample
/// `1 / sample_rate` s after the previous one, waiting when a chunk is not there yet.
#[derive(Debug, Clone, PartialEq)]
pub struct Playback {
    /// Indices (in arrival order, the first chunk 0) of the chunks that arrived after the moment
    /// the player needed them: one underrun each. The first chunk starts the timeline, so it is
    /// never among them.
    pub late_chunks: Vec<usize>,
    /// Time the player spent waiting, seconds.
    pub stalled_s: f64,
    /// When each chunk started to play, seconds since the scheduled arrival (same order as the
    /// chunks).
    pub play_start_s: Vec<f64>,
    /// When the player needed each chunk (the end of the audio before it on the timeline),
    /// seconds since the scheduled arrival: a chunk arriving later was late.
    pub needed_s: Vec<f64>,
}

/// Plays `chunks` (in order, contiguous) on the timeline of [`Playback`]: chunk k is needed at
/// `t_first + offset_k / sample_rate + stalls so far`; arriving later than that is one underrun,
/// and the timeline then shifts by the wait, as a player that waits would.
pub fn play(chunks: &[Chunk], sample_rate: u32) -> Playback {
    let mut out = Playback {
        late_chunks: Vec::new(),
        stalled_s: 0.0,
        play_start_s: Vec::with_capacity(chunks.len()),
        needed_s: Vec::with_capacity(chunks.len()),
    };
    let Some(first) = chunks.first() else {
        return out;
    };
    let rate = sample_rate as f64;
    for (k, c) in chunks.iter().enumerate() {
        let needed = first.arrival_s + (c.offset - first.offset) as f64 / rate + out.stalled_s;
        if c.arrival_s > needed {
            out.late_chunks.push(k);
            out.stalled_s += c.arrival_s - needed;
        }
        out.play_start_s.push(needed.max(c.arrival_s));
        out.needed_s.push(needed);
    }
    out
}

impl Playback {
    /// Chunks that arrived after the moment the player needed them.
    pub fn underruns(&self) -> usize {
        self.late_chunks.len()
    }
}

/// When sample `sample` plays on `playback`'s timeline, seconds since the scheduled arrival.
pub fn played_at(
    chunks: &[Chunk],
    playback: &Playback,
    sample: usize,
    sample_rate: u32,
) -> Option<f64> {
    let k = chunks
        .iter()
        .position(|c| c.offset <= sample as u64 && (sample as u64) < c.offset + c.len as u64)?;
    Some(playback.play_start_s[k] + (sample as u64 - chunks[k].offset) as f64 / sample_rate as f64)
}

/// Nearest-rank percentile `p` (0–100) of `values` (the `ceil(p·n/100)`-th smallest, as the
/// serving benchmarks compute it); `NaN` for no values. Infinite values sort last.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    const SR: u32 = 24_000;

    /// `silence_s` of zeros, then a 440 Hz sine of amplitude `amp` for `tone_s`.
    fn silence_then_tone(silence_s: f64, tone_s: f64, amp: f32) -> Vec<f32> {
        let quiet = (silence_s * SR as f64) as usize;
        let loud = (tone_s * SR as f64) as usize;
        let mut v = vec![0.0f32; quiet];
        v.extend(
            (0..loud)
                .map(|i| amp * (2.0 * std::f32::consts::PI * 440.0 * i as f32 / SR as f32).sin()),
        );
        v
    }

    fn chunks_of(lens: &[usize], arrivals: &[f64]) -> Vec<Chunk> {
        let mut offset = 0;
        lens.iter()
            .zip(arrivals)
            .map(|(&len, &arrival_s)| {
                let c = Chunk {
                    arrival_s,
                    offset,
                    len,
                };
                offset += len as u64;
                c
            })
            .collect()
    }

    #[test]
    fn onset_of_silence_then_tone_is_the_tone_start() {
        // The first window that overlaps the tone by a quarter is already audible (0.1 · 0.707 ·
        // √¼ ≈ −29 dBFS), so the onset is the tone's start to within one window (20 ms), never
        // after it.
        for silence_s in [0.5, 0.505, 1.234] {
            let audio = silence_then_tone(silence_s, 0.3, 0.1);
            let start = (silence_s * SR as f64) as usize;
            let onset = audible_onset(&audio, SR).expect("tone is audible");
            assert!(
                onset <= start && start < onset + 480,
                "onset at sample {onset}, tone starts at {start}"
            );
        }
        // Aligned on the hop: the window one hop before the tone holds 240 tone samples.
        assert_eq!(
            audible_onset(&silence_then_tone(0.5, 0.3, 0.1), SR),
            Some(11_760)
        );
    }

    #[test]
    fn quiet_tone_and_dc_are_not_audible() {
        // −50 dBFS RMS: amplitude 10^(−50/20)·√2 ≈ 0.00447.
        let quiet = silence_then_tone(0.1, 0.5, 0.004_47);
        assert_eq!(audible_onset(&quiet, SR), None);
        // A constant offset has no RMS once its mean is removed.
        assert_eq!(audible_onset(&vec![0.5; SR as usize], SR), None);
        // −40 dBFS is heard.
        let louder = silence_then_tone(0.1, 0.5, 0.014_1);
        assert!(audible_onset(&louder, SR).is_some());
    }

    #[test]
    fn a_click_or_a_lone_audible_window_is_not_an_onset() {
        // Two samples at ±0.05: RMS over 480 samples ≈ 0.05 · √(2/480) ≈ −50 dBFS.
        let mut click = vec![0.0f32; SR as usize / 2];
        click[6_000] = 0.05;
        click[6_001] = -0.05;
        assert_eq!(audible_onset(&click, SR), None);
        // A burst in the last 10 ms lies in one whole window only (the next would run past the
        // end): one audible window is not two in a row.
        let burst = |tail: usize| {
            let mut v = vec![0.0f32; 12_000 + tail];
            for (i, x) in v[11_760..12_000].iter_mut().enumerate() {
                *x = if i % 2 == 0 { 0.1 } else { -0.1 };
            }
            v
        };
        assert_eq!(audible_onset(&burst(0), SR), None);
        // With 10 ms of silence after it the burst lies in two windows: heard, from the first.
        assert_eq!(audible_onset(&burst(240), SR), Some(11_520));
    }

    #[test]
    fn the_onset_is_found_in_the_chunk_that_holds_it() {
        let chunks = chunks_of(&[1920, 1920, 1920], &[0.3, 0.35, 0.4]);
        assert_eq!(chunk_holding(&chunks, 0).map(|c| c.arrival_s), Some(0.3));
        assert_eq!(
            chunk_holding(&chunks, 1920).map(|c| c.arrival_s),
            Some(0.35)
        );
        assert_eq!(chunk_holding(&chunks, 5759).map(|c| c.arrival_s), Some(0.4));
        assert_eq!(chunk_holding(&chunks, 5760), None);
    }

    #[test]
    fn chunks_in_time_give_no_underrun() {
        // 80 ms chunks arriving every 50 ms: always ahead of the player.
        let chunks = chunks_of(&[1920; 4], &[0.2, 0.25, 0.3, 0.35]);
        let p = play(&chunks, SR);
        assert_eq!(p.underruns(), 0);
        assert_eq!(p.stalled_s, 0.0);
        assert_eq!(p.play_start_s, vec![0.2, 0.28, 0.36, 0.44]);
        // Exactly on time is not late.
        let p = play(&chunks_of(&[1920; 2], &[0.2, 0.28]), SR);
        assert_eq!(p.underruns(), 0);
    }

    #[test]
    fn a_chunk_late_by_50_ms_is_one_underrun_and_shifts_the_timeline() {
        // Chunk 1 is needed at 0.28 s and arrives at 0.33 s; chunk 2 is then needed at 0.41 s
        // (0.36 + the 50 ms stall) and arrives at 0.40 s: in time only because of the shift.
        let chunks = chunks_of(&[1920; 3], &[0.2, 0.33, 0.40]);
        let p = play(&chunks, SR);
        assert_eq!(p.underruns(), 1);
        assert_eq!(p.late_chunks, vec![1], "the second chunk was the late one");
        assert!((p.stalled_s - 0.05).abs() < 1e-9, "stalled {}", p.stalled_s);
        assert!((p.play_start_s[1] - 0.33).abs() < 1e-9);
        assert!((p.play_start_s[2] - 0.41).abs() < 1e-9);
        // Needed: the first at its arrival, the second at 0.28 s, the third after the stall.
        let needed = [0.2, 0.28, 0.41];
        assert!(
            p.needed_s
                .iter()
                .zip(needed)
                .all(|(a, b)| (a - b).abs() < 1e-9)
        );
        // Two late chunks in a row are two underruns.
        let p = play(&chunks_of(&[1920; 3], &[0.2, 0.33, 0.45]), SR);
        assert_eq!(p.underruns(), 2);
        assert_eq!(p.late_chunks, vec![1, 2]);
        assert!((p.stalled_s - 0.09).abs() < 1e-9, "stalled {}", p.stalled_s);
        // A late fourth chunk after three in time.
        let p = play(&chunks_of(&[1920; 4], &[0.2, 0.25, 0.3, 0.5]), SR);
        assert_eq!(p.late_chunks, vec![3]);
    }

    #[test]
    fn the_timeline_follows_the_sample_rate() {
        // At 16 kHz a 1920-sample chunk lasts 120 ms: the second chunk at 0.3 s (needed at
        // 0.32 s) is in time, though it would be late at 24 kHz (needed at 0.28 s).
        let chunks = chunks_of(&[1920; 2], &[0.2, 0.3]);
        assert_eq!(play(&chunks, 16_000).underruns(), 0);
        assert_eq!(play(&chunks, SR).underruns(), 1);
    }

    #[test]
    fn played_at_adds_the_offset_inside_the_chunk_and_the_stalls() {
        let chunks = chunks_of(&[1920; 3], &[0.2, 0.33, 0.40]);
        let p = play(&chunks, SR);
        // Sample 480 of chunk 0: 0.2 + 0.02.
        assert!((played_at(&chunks, &p, 480, SR).unwrap() - 0.22).abs() < 1e-9);
        // Sample 960 of chunk 2 (index 4800): 0.41 + 0.04.
        assert!((played_at(&chunks, &p, 4800, SR).unwrap() - 0.45).abs() < 1e-9);
        assert_eq!(played_at(&chunks, &p, 5760, SR), None);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 95.0), 95.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&[3.0, 1.0, 2.0], 50.0), 2.0);
        // A request with no value yet (∞) counts, and sorts last.
        assert_eq!(percentile(&[1.0, f64::INFINITY], 95.0), f64::INFINITY);
        assert_eq!(percentile(&[1.0, f64::INFINITY], 50.0), 1.0);
        assert!(percentile(&[], 50.0).is_nan());
    }
}
