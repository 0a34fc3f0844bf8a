//! The elements' audio output: caps, the sample ↔ time mapping, and buffers.
//!
//! Every element produces mono `audio/x-raw` (F32LE preferred, or S16LE) at its model's rate
//! (24 kHz for Qwen3-TTS, 44.1 kHz for Fish S2 Pro, from the model's description); a buffer at
//! sample position `n` of `len` samples carries offset `n`, offset-end `n + len`, and PTS and
//! duration from [`pts_of`] (integer nanoseconds, rounded down, so that consecutive buffers tile
//! the timeline exactly).

use gst::prelude::*;

/// The rate the elements offer before a model is loaded (the bundled Qwen3-TTS voice's): the
/// pad templates list every family's rate, a started element offers exactly its model's.
pub const DEFAULT_RATE: u32 = 24_000;

/// Time of sample position `n` at `rate` Hz: `n * SECOND / rate`, integer, rounded down.
pub fn pts_of(n: u64, rate: u32) -> gst::ClockTime {
    gst::ClockTime::from_nseconds(
        n.mul_div_floor(gst::ClockTime::SECOND.nseconds(), u64::from(rate.max(1)))
            .unwrap_or(u64::MAX),
    )
}

/// Sample position of time `t` at `rate` Hz, rounded up: the first sample at or after `t`
/// (samples `0..pos_of(t)` start before `t`, so a cue at `t` never starts a sample early, and a
/// slot of duration `d` holds `pos_of(d)` samples). The inverse of [`pts_of`]:
/// `pos_of(pts_of(n)) == n`.
pub fn pos_of(t: gst::ClockTime, rate: u32) -> u64 {
    t.nseconds()
        .mul_div_ceil(u64::from(rate), gst::ClockTime::SECOND.nseconds())
        .unwrap_or(u64::MAX)
}

/// The caps of an element's audio pad at `rate` Hz: F32LE or S16LE, mono, interleaved.
pub fn caps(rate: u32) -> gst::Caps {
    gst_audio::AudioCapsBuilder::new_interleaved()
        .format_list([gst_audio::AudioFormat::F32le, gst_audio::AudioFormat::S16le])
        .rate(rate.min(i32::MAX as u32) as i32)
        .channels(1)
        .build()
}

/// The error when downstream takes none of `element`'s audio caps `ours` (another rate or
/// format), with what to put in between.
pub fn refused_by_downstream(element: &str, ours: &gst::Caps) -> String {
    format!(
        "downstream takes none of {element}'s audio caps ({ours}); put audioconvert and \
         audioresample after it"
    )
}

/// The pad templates' caps: as [`caps`] at the rate of each model family omnitts runs
/// ([`crate::models::registry::FAMILIES`]: 24,000 Hz for Qwen3-TTS, 44,100 Hz for Fish S2 Pro); a
/// started element offers exactly its model's.
pub fn template_caps() -> gst::Caps {
    let rates = crate::models::registry::FAMILIES
        .iter()
        .map(|f| f.sample_rate.min(i32::MAX as u32) as i32);
    gst_audio::AudioCapsBuilder::new_interleaved()
        .format_list([gst_audio::AudioFormat::F32le, gst_audio::AudioFormat::S16le])
        .rate_list(rates)
        .channels(1)
        .build()
}

/// The negotiated sample format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleFormat {
    F32,
    S16,
}

impl SampleFormat {
    /// The format of negotiated `caps`, or why they are not ones [`caps`] at `rate` allows.
    pub fn from_caps(caps: &gst::CapsRef, rate: u32) -> Result<SampleFormat, String> {
        let info =
            gst_audio::AudioInfo::from_caps(caps).map_err(|_| format!("invalid caps {caps}"))?;
        let format = match info.format() {
            gst_audio::AudioFormat::F32le => SampleFormat::F32,
            gst_audio::AudioFormat::S16le => SampleFormat::S16,
            f => return Err(format!("unsupported format {f:?}")),
        };
        if info.rate() != rate || info.channels() != 1 {
            return Err(format!(
                "unsupported caps {caps} (the model's output is mono at {rate} Hz)"
            ));
        }
        Ok(format)
    }

    /// Bytes per sample.
    pub fn bytes(self) -> usize {
        match self {
            SampleFormat::F32 => 4,
            SampleFormat::S16 => 2,
        }
    }
}

/// What one output buffer holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Samples {
    /// Samples in [-1, 1] (S16 clamps to that range).
    Audio(Vec<f32>),
    /// This many zero samples, GAP-flagged.
    Silence(usize),
}

impl Samples {
    /// Number of samples.
    pub fn len(&self) -> usize {
        match self {
            Samples::Audio(s) => s.len(),
            Samples::Silence(n) => *n,
        }
    }

    /// True when there are no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One output buffer, as the element's output logic decided it.
#[derive(Debug, Clone, PartialEq)]
pub struct OutBuffer {
    pub samples: Samples,
    /// Stream sample position of the first sample (offset; offset-end adds the length).
    pub offset: u64,
    /// PTS of the first sample.
    pub pts: gst::ClockTime,
    /// Up to the PTS of the sample after the last.
    pub duration: gst::ClockTime,
    /// The timeline starts or jumps here.
    pub discont: bool,
}

impl OutBuffer {
    /// The GStreamer buffer in `format`: samples, PTS, duration, offsets, GAP (silence) and
    /// DISCONT flags.
    pub fn to_buffer(&self, format: SampleFormat) -> Result<gst::Buffer, gst::FlowError> {
        let len = self.samples.len();
        let mut buffer =
            gst::Buffer::with_size(len * format.bytes()).map_err(|_| gst::FlowError::Error)?;
        {
            let b = buffer.get_mut().ok_or(gst::FlowError::Error)?;
            {
                let mut map = b.map_writable().map_err(|_| gst::FlowError::Error)?;
                let out = map.as_mut_slice();
                match (&self.samples, format) {
                    (Samples::Silence(_), _) => out.fill(0),
                    (Samples::Audio(s), SampleFormat::F32) => {
                        for (o, x) in out.chunks_exact_mut(4).zip(s) {
                            o.copy_from_slice(&x.to_le_bytes());
                        }
                    }
                    (Samples::Audio(s), SampleFormat::S16) => {
                        for (o, x) in out.chunks_exact_mut(2).zip(s) {
                            let v = (x.clamp(-1.0, 1.0) * 32767.0).round() as i16;
                            o.copy_from_slice(&v.to_le_bytes());
                        }
                    }
                }
            }
            b.set_pts(self.pts);
            b.set_duration(self.duration);
            b.set_offset(self.offset);
            b.set_offset_end(self.offset + len as u64);
            let mut flags = gst::BufferFlags::empty();
            if matches!(self.samples, Samples::Silence(_)) {
                flags |= gst::BufferFlags::GAP;
            }
            if self.discont {
                flags |= gst::BufferFlags::DISCONT;
            }
            b.set_flags(flags);
        }
        Ok(buffer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_time_mapping() {
        assert_eq!(pts_of(24_000, 24_000), gst::ClockTime::SECOND);
        // One sample is 41666.67 ns, rounded down.
        assert_eq!(pts_of(1, 24_000).nseconds(), 41_666);
        // Fish S2 Pro's 44.1 kHz: one second, one sample.
        assert_eq!(pts_of(44_100, 44_100), gst::ClockTime::SECOND);
        assert_eq!(pts_of(1, 44_100).nseconds(), 22_675);
        // The round trip is exact, whole nanoseconds or not.
        for rate in [24_000, 44_100] {
            for n in [0u64, 1, 2, 3, 441, 2048, 24_000, 44_100 * 7 + 4410, 3 << 40] {
                assert_eq!(pos_of(pts_of(n, rate), rate), n, "n={n} at {rate} Hz");
            }
        }
        // A time between two samples maps to the sample after it: a cue at 333 ms at 44.1 kHz
        // (14,685.3 samples) starts at sample 14,686, not a sample before 333 ms.
        let t = gst::ClockTime::from_mseconds(333);
        assert_eq!(pos_of(t, 44_100), 14_686);
        assert!(pts_of(pos_of(t, 44_100), 44_100) >= t);
        assert_eq!(
            pos_of(pts_of(1, 24_000) + gst::ClockTime::from_nseconds(1), 24_000),
            2
        );
    }

    #[test]
    fn buffers_carry_samples_times_and_flags() {
        gst::init().unwrap();
        let out = OutBuffer {
            samples: Samples::Audio(vec![0.5, -2.0, 1.0]),
            offset: 480,
            pts: pts_of(480, 24_000),
            duration: pts_of(483, 24_000) - pts_of(480, 24_000),
            discont: true,
        };
        let b = out.to_buffer(SampleFormat::S16).unwrap();
        let m = b.map_readable().unwrap();
        let s: Vec<i16> = m
            .as_slice()
            .chunks_exact(2)
            .map(|c| i16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(s, [16384, -32767, 32767]);
        assert_eq!((b.offset(), b.offset_end()), (480, 483));
        assert_eq!(b.pts(), Some(pts_of(480, 24_000)));
        assert_eq!(
            b.duration(),
            Some(pts_of(483, 24_000) - pts_of(480, 24_000))
        );
        assert_eq!(b.flags(), gst::BufferFlags::DISCONT);

        let gap = OutBuffer {
            samples: Samples::Silence(2),
            discont: false,
            ..out
        };
        let b = gap.to_buffer(SampleFormat::F32).unwrap();
        assert_eq!(b.size(), 8);
        assert!(b.map_readable().unwrap().iter().all(|x| *x == 0));
        assert_eq!(b.flags(), gst::BufferFlags::GAP);
    }
}
