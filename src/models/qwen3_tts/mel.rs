//! The 128-bin log-mel front end of the Base speaker encoder (docs/qwen3-tts.md §6).
//!
//! Reference: `mel_spectrogram` in `qwen_tts/core/models/modeling_qwen3_tts.py`, called by
//! `Qwen3TTSForConditionalGeneration.extract_speaker_embedding` with n_fft 1024, hop 256,
//! window 1024, 128 mels, 24 kHz, fmin 0, fmax 12000:
//! reflect-pad `(n_fft - hop) / 2` samples on both sides, STFT with a periodic Hann window and
//! `center=False`, magnitude `sqrt(re² + im² + 1e-9)`, librosa's Slaney mel filterbank (Slaney
//! scale, Slaney area normalisation), then `ln(max(x, 1e-5))`.
//!
//! The FFT runs on the CPU (realfft) in f64; the result is f32 like the reference's.

use std::sync::Arc;

use realfft::{RealFftPlanner, RealToComplex};

use super::ModelError;

/// Parameters of [`MelSpectrogram`]; [`MelConfig::speaker_encoder`] are the reference values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MelConfig {
    pub sample_rate: u32,
    pub n_fft: usize,
    pub hop: usize,
    pub win: usize,
    pub n_mels: usize,
    pub fmin: f64,
    pub fmax: f64,
}

impl MelConfig {
    /// The speaker encoder's front end: 24 kHz, n_fft 1024, hop 256, window 1024, 128 mels,
    /// 0..12000 Hz.
    pub fn speaker_encoder() -> Self {
        Self {
            sample_rate: 24_000,
            n_fft: 1024,
            hop: 256,
            win: 1024,
            n_mels: 128,
            fmin: 0.0,
            fmax: 12_000.0,
        }
    }
}

/// A log-mel spectrogram computer (filterbank, window and FFT plan built once).
pub struct MelSpectrogram {
    cfg: MelConfig,
    /// `[n_mels][n_fft/2 + 1]`, row-major.
    filters: Vec<f64>,
    /// Periodic Hann window of `win` samples, zero-padded (centred) to `n_fft`.
    window: Vec<f64>,
    fft: Arc<dyn RealToComplex<f64>>,
}

impl std::fmt::Debug for MelSpectrogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MelSpectrogram")
            .field("cfg", &self.cfg)
            .finish()
    }
}

/// Slaney mel scale (librosa `hz_to_mel(htk=False)`).
fn hz_to_mel(hz: f64) -> f64 {
    let f_sp = 200.0 / 3.0;
    let min_log_hz = 1000.0;
    let min_log_mel = min_log_hz / f_sp;
    let logstep = 6.4f64.ln() / 27.0;
    if hz >= min_log_hz {
        min_log_mel + (hz / min_log_hz).ln() / logstep
    } else {
        hz / f_sp
    }
}

/// Inverse of [`hz_to_mel`] (librosa `mel_to_hz(htk=False)`).
fn mel_to_hz(mel: f64) -> f64 {
    let f_sp = 200.0 / 3.0;
    let min_log_hz = 1000.0;
    let min_log_mel = min_log_hz / f_sp;
    let logstep = 6.4f64.ln() / 27.0;
    if mel >= min_log_mel {
        min_log_hz * (logstep * (mel - min_log_mel)).exp()
    } else {
        f_sp * mel
    }
}

/// librosa `filters.mel(sr, n_fft, n_mels, fmin, fmax)` with the defaults `htk=False`,
/// `norm="slaney"`: `[n_mels][n_fft/2 + 1]`. librosa returns float32, so the weights are
/// rounded to f32 (then widened back) to match it.
pub fn slaney_mel_filterbank(
    sample_rate: u32,
    n_fft: usize,
    n_mels: usize,
    fmin: f64,
    fmax: f64,
) -> Vec<f64> {
    let n_freq = n_fft / 2 + 1;
    let sr = sample_rate as f64;
    let fft_freqs: Vec<f64> = (0..n_freq)
        .map(|i| i as f64 * (sr / 2.0) / (n_freq - 1) as f64)
        .collect();
    let (mel_min, mel_max) = (hz_to_mel(fmin), hz_to_mel(fmax));
    let mel_f: Vec<f64> = (0..n_mels + 2)
        .map(|i| mel_to_hz(mel_min + (mel_max - mel_min) * i as f64 / (n_mels + 1) as f64))
        .collect();
    let mut w = vec![0f64; n_mels * n_freq];
    for m in 0..n_mels {
        let fdiff_lo = mel_f[m + 1] - mel_f[m];
        let fdiff_hi = mel_f[m + 2] - mel_f[m + 1];
        let enorm = 2.0 / (mel_f[m + 2] - mel_f[m]);
        for (k, &f) in fft_freqs.iter().enumerate() {
            let lower = (f - mel_f[m]) / fdiff_lo;
            let upper = (mel_f[m + 2] - f) / fdiff_hi;
            let v = lower.min(upper).max(0.0) * enorm;
            w[m * n_freq + k] = v as f32 as f64;
        }
    }
    w
}

impl MelSpectrogram {
    pub fn new(cfg: MelConfig) -> Self {
        let filters =
            slaney_mel_filterbank(cfg.sample_rate, cfg.n_fft, cfg.n_mels, cfg.fmin, cfg.fmax);
        // torch.hann_window(win) is periodic: 0.5 - 0.5 cos(2πn / win); torch.stft centres a
        // shorter window inside n_fft.
        let mut window = vec![0f64; cfg.n_fft];
        let off = (cfg.n_fft - cfg.win) / 2;
        for n in 0..cfg.win {
            window[off + n] =
                0.5 - 0.5 * (2.0 * std::f64::consts::PI * n as f64 / cfg.win as f64).cos();
        }
        let fft = RealFftPlanner::<f64>::new().plan_fft_forward(cfg.n_fft);
        Self {
            cfg,
            filters,
            window,
            fft,
        }
    }

    pub fn config(&self) -> &MelConfig {
        &self.cfg
    }

    /// Number of frames for `samples` input samples:
    /// `(samples + 2·pad − n_fft) / hop + 1` with `pad = (n_fft − hop) / 2`.
    pub fn num_frames(&self, samples: usize) -> usize {
        let pad = (self.cfg.n_fft - self.cfg.hop) / 2;
        (samples + 2 * pad).saturating_sub(self.cfg.n_fft) / self.cfg.hop + 1
    }

    /// Log-mel spectrogram of mono `audio` at `sample_rate`: `[frames][n_mels]` row-major,
    /// `frames = num_frames(audio.len())`.
    ///
    /// Errors ([`ModelError::InvalidRequest`], field `ref_audio`) if the audio is shorter than
    /// `n_fft − pad + 1` samples (the reflect padding of the reference needs more samples than
    /// the pad) or contains a non-finite sample.
    pub fn compute(&self, audio: &[f32]) -> Result<Vec<f32>, ModelError> {
        let c = &self.cfg;
        let pad = (c.n_fft - c.hop) / 2;
        let min = (pad + 1).max(c.n_fft - 2 * pad);
        if audio.len() < min {
            return Err(ModelError::InvalidRequest {
                field: "ref_audio".into(),
                value: format!("{} samples", audio.len()),
                msg: format!("too short for the mel front end (at least {min} samples)"),
            });
        }
        if let Some(i) = audio.iter().position(|x| !x.is_finite()) {
            return Err(ModelError::InvalidRequest {
                field: "ref_audio".into(),
                value: format!("sample {i} = {}", audio[i]),
                msg: "reference audio contains a non-finite sample".into(),
            });
        }
        // Reflect padding (no edge repeat), like torch.nn.functional.pad(mode="reflect").
        let n = audio.len();
        let mut y = Vec::with_capacity(n + 2 * pad);
        y.extend((1..=pad).rev().map(|i| audio[i] as f64));
        y.extend(audio.iter().map(|&x| x as f64));
        y.extend((0..pad).map(|i| audio[n - 2 - i] as f64));

        let frames = (y.len() - c.n_fft) / c.hop + 1;
        let n_freq = c.n_fft / 2 + 1;
        let mut input = self.fft.make_input_vec();
        let mut spec = self.fft.make_output_vec();
        let mut scratch = self.fft.make_scratch_vec();
        let mut mag = vec![0f64; n_freq];
        let mut out = Vec::with_capacity(frames * c.n_mels);
        for f in 0..frames {
            let start = f * c.hop;
            for (i, v) in input.iter_mut().enumerate() {
                *v = y[start + i] * self.window[i];
            }
            self.fft
                .process_with_scratch(&mut input, &mut spec, &mut scratch)
                .map_err(|e| candle_core::Error::Msg(format!("mel FFT: {e}")))?;
            for (m, s) in mag.iter_mut().zip(&spec) {
                *m = (s.re * s.re + s.im * s.im + 1e-9).sqrt();
            }
            for m in 0..c.n_mels {
                let row = &self.filters[m * n_freq..(m + 1) * n_freq];
                let v: f64 = row.iter().zip(&mag).map(|(a, b)| a * b).sum();
                out.push(v.max(1e-5).ln() as f32);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slaney_scale_round_trips() {
        for hz in [0.0, 440.0, 1000.0, 4000.0, 12000.0] {
            assert!((mel_to_hz(hz_to_mel(hz)) - hz).abs() < 1e-6);
        }
        assert!((hz_to_mel(1000.0) - 15.0).abs() < 1e-12);
    }

    #[test]
    fn frames_follow_the_reference_formula() {
        let m = MelSpectrogram::new(MelConfig::speaker_encoder());
        assert_eq!(m.num_frames(31_200), 121);
        let out = m.compute(&vec![0.1f32; 31_200]).unwrap();
        assert_eq!(out.len(), 121 * 128);
        assert!(m.compute(&[0.0; 100]).is_err());
    }
}
