//! `overflow=compress`: a cue whose speech is longer than its slot is time-compressed into it,
//! pitch kept, by at most the `max-compression` factor; speech that would need more is compressed
//! by that factor and then clipped at the slot's end like `clip` does (10 ms fade-out).
//!
//! The stretching is Signalsmith Stretch (the `signalsmith-stretch` crate: the MIT C++ library,
//! a phase-vocoder-style stretcher that keeps the pitch), run once over the cue's whole speech
//! ([`compress`]), so a compressed cue's audio reaches the timeline when its synthesis has ended.

use signalsmith_stretch::Stretch;

/// The most `max-compression` may be: beyond about 2× speech becomes hard to follow.
pub const MAX_FACTOR: f64 = 3.0;
/// The `max-compression` default: 1.5× (speech stays natural).
pub const DEFAULT_FACTOR: f64 = 1.5;

/// What `overflow=compress` needs to know of a cue: its slot (samples) and the most its speech may
/// be sped up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Squeeze {
    pub slot: u64,
    pub max: f64,
    /// The model's sample rate, Hz (of `slot` and of the speech).
    pub rate: u32,
}

impl Squeeze {
    /// Samples of speech worth synthesising: what compressed by `max` fills the slot, and a
    /// little more (100 ms) for the stretcher's window at the end; more would only be clipped.
    pub fn enough(&self) -> u64 {
        (self.slot as f64 * self.max) as u64 + u64::from(self.rate) / 10
    }

    /// The factor that `speech` samples are compressed by: 1 when they fit the slot, else their
    /// ratio to it, at most `max`.
    pub fn factor(&self, speech: u64) -> f64 {
        if speech <= self.slot || self.slot == 0 {
            return 1.0;
        }
        (speech as f64 / self.slot as f64).min(self.max)
    }
}

/// `speech` (mono, at `rate` Hz) made `factor` (> 1) times shorter with its pitch kept. `None`
/// when it is too short for the stretcher's window (about 0.1 s of output): the caller keeps it
/// as it is.
pub fn compress(speech: &[f32], factor: f64, rate: u32) -> Option<Vec<f32>> {
    if speech.is_empty() || !factor.is_finite() || factor <= 1.0 {
        return None;
    }
    let len = ((speech.len() as f64 / factor).round() as usize).max(1);
    let mut out = vec![0.0f32; len];
    let mut stretch = Stretch::preset_default(1, rate);
    if !stretch.exact(speech, &mut out) {
        return None;
    }
    for x in &mut out {
        *x = x.clamp(-1.0, 1.0);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RATE: u32 = 24_000;

    fn sine(freq: f32, len: usize) -> Vec<f32> {
        (0..len)
            .map(|i| 0.5 * (std::f32::consts::TAU * freq * i as f32 / RATE as f32).sin())
            .collect()
    }

    /// The dominant frequency of `x` from its upward zero crossings (Hz), over its middle half
    /// (away from the stretcher's edges).
    fn frequency(x: &[f32]) -> f64 {
        let mid = &x[x.len() / 4..x.len() * 3 / 4];
        let crossings: Vec<usize> = mid
            .windows(2)
            .enumerate()
            .filter(|(_, w)| w[0] < 0.0 && w[1] >= 0.0)
            .map(|(i, _)| i)
            .collect();
        let (first, last) = (crossings[0], crossings[crossings.len() - 1]);
        (crossings.len() - 1) as f64 * RATE as f64 / (last - first) as f64
    }

    #[test]
    fn compression_shortens_and_keeps_the_pitch() {
        let input = sine(220.0, 2 * RATE as usize);
        assert!((frequency(&input) - 220.0).abs() < 1.0);
        for factor in [1.25, 1.5, 2.0] {
            let out = compress(&input, factor, RATE).expect("long enough");
            assert_eq!(out.len(), (input.len() as f64 / factor).round() as usize);
            let f = frequency(&out);
            assert!((f - 220.0).abs() < 4.0, "{factor}×: {f:.1} Hz, not 220");
            let rms = (out.iter().map(|x| x * x).sum::<f32>() / out.len() as f32).sqrt();
            assert!(rms > 0.25 && rms < 0.5, "{factor}×: rms {rms}");
            // Plain resampling to that length would raise the pitch by the factor.
            assert!((f - 220.0 * factor).abs() > 40.0);
        }
        assert_eq!(compress(&input, 1.0, RATE), None, "nothing to do");
        assert_eq!(compress(&[], 2.0, RATE), None);
        assert_eq!(compress(&sine(220.0, 400), 2.0, RATE), None, "too short");
    }

    #[test]
    fn the_factor_fills_the_slot_up_to_the_maximum() {
        let s = Squeeze {
            slot: 24_000,
            max: 1.5,
            rate: RATE,
        };
        assert_eq!(s.factor(20_000), 1.0);
        assert_eq!(s.factor(24_000), 1.0);
        assert_eq!(s.factor(30_000), 1.25);
        assert_eq!(s.factor(48_000), 1.5, "at most max");
        assert_eq!(s.enough(), 36_000 + 2_400);
        let none = Squeeze {
            slot: 0,
            max: 2.0,
            rate: RATE,
        };
        assert_eq!(none.factor(1_000), 1.0);
    }
}
