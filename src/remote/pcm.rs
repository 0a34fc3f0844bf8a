//! 16-bit PCM from the server → the element's f32 samples.
//!
//! vLLM-Omni writes its streamed PCM with soundfile (`AudioMixin.create_audio`, format RAW,
//! subtype PCM_16), whose libsndfile backend turns a float sample `x` into `lrintf(x * 0x7FFF)`
//! (libsndfile/libsndfile src/pcm.c, `f2les_array`, commit 06514d012e37230a03ac52d75d3f17c315a7710c).
//! Dividing by the same 32767 inverts that scale, and the element's S16LE output
//! (`round(x * 32767)`) then gives back the server's integers unchanged: S16LE caps pass the
//! server's samples through bit for bit, F32LE caps carry them within half a step (1 / 65534) of
//! the server's own float samples.

/// Scale of the server's float → PCM16 conversion (libsndfile's `0x7FFF`).
pub const S16_SCALE: f32 = 32767.0;

/// One 16-bit sample as a float in [-1, 1]: `v / 32767`. −32768, which the server's conversion
/// produces only for a float below −1, becomes −1.
pub fn s16_to_f32(v: i16) -> f32 {
    (v as f32 / S16_SCALE).max(-1.0)
}

/// Turns a byte stream of little-endian 16-bit samples into f32 samples, whatever the byte
/// boundaries of the pieces it arrives in (an HTTP read, an SSE delta may end inside a sample).
#[derive(Debug, Default)]
pub struct S16Decoder {
    /// The first byte of a sample whose second byte has not arrived yet.
    carry: Option<u8>,
    /// Samples decoded so far.
    samples: u64,
}

impl S16Decoder {
    /// Decodes `bytes`, appending whole samples to `out`; a trailing odd byte is kept for the
    /// next call.
    pub fn push(&mut self, mut bytes: &[u8], out: &mut Vec<f32>) {
        let before = out.len();
        if let Some(lo) = self.carry
            && let Some((&hi, rest)) = bytes.split_first()
        {
            out.push(s16_to_f32(i16::from_le_bytes([lo, hi])));
            self.carry = None;
            bytes = rest;
        }
        let mut pairs = bytes.chunks_exact(2);
        out.extend(
            pairs
                .by_ref()
                .map(|p| s16_to_f32(i16::from_le_bytes([p[0], p[1]]))),
        );
        if let [odd] = pairs.remainder() {
            self.carry = Some(*odd);
        }
        self.samples += (out.len() - before) as u64;
    }

    /// Whether a sample is half received (the stream must not end here).
    pub fn mid_sample(&self) -> bool {
        self.carry.is_some()
    }

    /// Samples decoded so far.
    pub fn samples(&self) -> u64 {
        self.samples
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The element's S16LE conversion (`make_buffer`), which must give every server sample back.
    fn element_s16(x: f32) -> i16 {
        (x.clamp(-1.0, 1.0) * 32767.0).round() as i16
    }

    #[test]
    fn every_sample_round_trips_through_the_element_s16_output() {
        for v in -32767..=i16::MAX {
            let x = s16_to_f32(v);
            assert!((-1.0..=1.0).contains(&x), "{v} -> {x}");
            assert_eq!(element_s16(x), v, "sample {v} ({x})");
        }
        assert_eq!(s16_to_f32(i16::MIN), -1.0);
        assert_eq!(s16_to_f32(0), 0.0);
        assert_eq!(s16_to_f32(i16::MAX), 1.0);
    }

    #[test]
    fn a_float_sample_comes_back_within_half_a_step() {
        // What the server does to the engine's float output, then the element.
        for i in 0..=20_000 {
            let x = -1.0 + i as f32 / 10_000.0;
            let server = (x * S16_SCALE).round_ties_even() as i16;
            let back = s16_to_f32(server);
            assert!((back - x).abs() <= 0.5 / S16_SCALE + 1e-7, "{x} -> {back}");
        }
    }

    #[test]
    fn samples_split_across_pieces_are_joined() {
        let values: Vec<i16> = vec![0, 1, -1, 12345, -32767, 32767, -200];
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let whole: Vec<f32> = values.iter().map(|&v| s16_to_f32(v)).collect();
        for split in [vec![1], vec![3, 4], vec![1, 1, 1, 5], vec![13]] {
            let mut d = S16Decoder::default();
            let mut out = Vec::new();
            let mut at = 0;
            for n in split {
                d.push(&bytes[at..at + n], &mut out);
                at += n;
            }
            d.push(&bytes[at..], &mut out);
            assert_eq!(out, whole);
            assert!(!d.mid_sample());
            assert_eq!(d.samples(), values.len() as u64);
        }
        let mut d = S16Decoder::default();
        let mut out = Vec::new();
        d.push(&bytes[..5], &mut out);
        assert_eq!(out.len(), 2);
        assert!(d.mid_sample());
    }
}
