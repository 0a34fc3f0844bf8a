//! Reading a voice-clone reference recording with GStreamer: any file or URI GStreamer can decode
//! (WAV, FLAC, Ogg, MP3, … at any rate and channel count) becomes 24 kHz mono `f32` samples, the
//! input of [`Engine::voice_clone_prompt`](crate::engine::Engine::voice_clone_prompt).
//!
//! A private pipeline decodes at the recording's own rate, outside any application pipeline:
//!
//! ```text
//! uridecodebin uri=… ! audioconvert ! audio/x-raw,format=F32LE,channels=1,layout=interleaved ! fakesink
//! ```
//!
//! `audioconvert` mixes channels down to mono (the mean for stereo, as `librosa.load(mono=True)`).
//! A rate other than 24 kHz is then converted as the official reference does
//! (`qwen_tts`' `librosa.resample(y, orig_sr=sr, target_sr=24000)`, i.e. libsoxr's high-quality
//! recipe through python-soxr, then `librosa.util.fix_length` to ⌈n · (24000 / sr)⌉ samples):
//! [`resample_to_ref_rate`]. A 24 kHz mono F32 file passes through unchanged, sample for sample.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gst::glib;
use gst::prelude::*;

/// Sample rate of decoded references, Hz (the Qwen3-TTS speaker and codec encoders' input rate).
pub const REF_AUDIO_RATE: u32 = 24_000;

/// How long decoding may take before it is abandoned (a stalled source, e.g. a network URI).
pub const DECODE_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a reference recording could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RefAudioError {
    /// The location is empty, or a path that is not an existing file.
    #[error("{0}")]
    NotFound(String),
    /// GStreamer could not open, recognise or decode it (not an audio file, unreadable, …).
    #[error("cannot decode it: {0}")]
    Decode(String),
    /// Decodable, but it has no audio stream (or the audio stream is empty).
    #[error("no audio in it{0}")]
    NoAudio(String),
    /// More audio than `max_samples`; decoding stopped there.
    #[error("longer than the {limit_s:.1} s limit (decoding stopped there)")]
    TooLong {
        /// The limit, seconds.
        limit_s: f64,
    },
    /// Decoding took longer than [`DECODE_TIMEOUT`].
    #[error("decoding did not finish within {0:?}")]
    Timeout(Duration),
    /// A GStreamer element needed for decoding is missing (gst-plugins-base not installed) or the
    /// pipeline could not be built.
    #[error("cannot build the decoding pipeline: {0}")]
    Pipeline(String),
}

/// The URI of `location`: a URI (`file:///…`, `https://…`) is kept as it is (a `file` URI must name
/// an existing regular file, as a path must); anything else is a
/// file path (relative to the working directory), which must exist.
pub fn location_to_uri(location: &str) -> Result<String, RefAudioError> {
    let location = location.trim();
    if location.is_empty() {
        return Err(RefAudioError::NotFound("empty location".into()));
    }
    if let Some(scheme) = glib::uri_parse_scheme(location) {
        // A local file must be a regular file: opening a FIFO or device would block the
        // decoding pipeline's state change, before any timeout can apply.
        if scheme.eq_ignore_ascii_case("file") {
            let (path, _) = glib::filename_from_uri(location)
                .map_err(|e| RefAudioError::NotFound(e.to_string()))?;
            regular_file(&path)?;
        }
        return Ok(location.to_string());
    }
    let path = Path::new(location);
    regular_file(path)?;
    let abs = std::path::absolute(path).map_err(|e| RefAudioError::NotFound(e.to_string()))?;
    glib::filename_to_uri(&abs, None)
        .map(|u| u.to_string())
        .map_err(|e| RefAudioError::NotFound(e.to_string()))
}

/// `Ok` for an existing regular file (links followed), else why not.
fn regular_file(path: &Path) -> Result<(), RefAudioError> {
    if path.is_file() {
        return Ok(());
    }
    Err(RefAudioError::NotFound(if path.exists() {
        "not a regular file".into()
    } else {
        "no such file".into()
    }))
}

/// What the sink collected.
#[derive(Default)]
struct Collected {
    /// Mono samples at `rate`.
    samples: Vec<f32>,
    /// The decoded stream's sample rate, Hz (0 before the first buffer).
    rate: u32,
    /// A buffer would have passed `max_samples` (counted at the target rate).
    too_long: bool,
    /// The rate changed mid-stream: (first rate, new rate).
    rate_changed: Option<(u32, u32)>,
}

/// Decodes `location` (a file path or URI) to mono `f32` samples at 24 kHz, at most `max_samples`
/// of them (more is [`RefAudioError::TooLong`], found without decoding the rest). Calls
/// `gst::init()` (harmless when already initialised) and blocks until the end of the stream,
/// an error, or [`DECODE_TIMEOUT`].
pub fn decode_ref_audio(location: &str, max_samples: usize) -> Result<Vec<f32>, RefAudioError> {
    decode_ref_audio_at(location, max_samples, REF_AUDIO_RATE)
}

/// [`decode_ref_audio`] at `target_rate` Hz (the rate the model's encoder takes: 24000 for
/// Qwen3-TTS Base, 44100 for Fish S2 Pro); `max_samples` counts samples at that rate.
pub fn decode_ref_audio_at(
    location: &str,
    max_samples: usize,
    target_rate: u32,
) -> Result<Vec<f32>, RefAudioError> {
    gst::init().map_err(|e| RefAudioError::Pipeline(e.to_string()))?;
    let uri = location_to_uri(location)?;
    let pipeline = gst::Pipeline::new();
    let make = |name: &str| {
        gst::ElementFactory::make(name)
            .build()
            .map_err(|e| RefAudioError::Pipeline(format!("{name}: {e}")))
    };
    let src = make("uridecodebin")?;
    src.set_property("uri", &uri);
    let convert = make("audioconvert")?;
    let filter = make("capsfilter")?;
    filter.set_property(
        "caps",
        gst_audio::AudioCapsBuilder::new_interleaved()
            .format(gst_audio::AudioFormat::F32le)
            .channels(1)
            .build(),
    );
    let sink = make("fakesink")?;
    sink.set_property("sync", false);
    sink.set_property("signal-handoffs", true);
    let chain = [&convert, &filter, &sink];
    let built = pipeline
        .add_many([&src, &convert, &filter, &sink])
        .and_then(|()| gst::Element::link_many(chain));
    built.map_err(|e| RefAudioError::Pipeline(e.to_string()))?;

    // The first audio pad of the decoder feeds the chain; other streams (video, …) are ignored.
    let linked = Arc::new(AtomicBool::new(false));
    let no_more_pads = Arc::new(AtomicBool::new(false));
    let convert_sink = convert
        .static_pad("sink")
        .ok_or_else(|| RefAudioError::Pipeline("audioconvert has no sink pad".into()))?;
    {
        let linked = linked.clone();
        src.connect_pad_added(move |_, pad| {
            let is_audio = pad
                .current_caps()
                .or_else(|| Some(pad.query_caps(None)))
                .and_then(|c| c.structure(0).map(|s| s.name().starts_with("audio/")))
                .unwrap_or(false);
            if is_audio && !convert_sink.is_linked() && pad.link(&convert_sink).is_ok() {
                linked.store(true, Ordering::SeqCst);
            }
        });
    }
    {
        let no_more_pads = no_more_pads.clone();
        src.connect_no_more_pads(move |_| no_more_pads.store(true, Ordering::SeqCst));
    }
    let collected = Arc::new(Mutex::new(Collected::default()));
    {
        let collected = collected.clone();
        sink.connect("handoff", false, move |args| {
            let buffer = args.get(1).and_then(|v| v.get::<gst::Buffer>().ok())?;
            let rate = args
                .get(2)
                .and_then(|v| v.get::<gst::Pad>().ok())
                .and_then(|pad| pad.current_caps())
                .and_then(|caps| gst_audio::AudioInfo::from_caps(&caps).ok())
                .map(|info| info.rate())?;
            let map = buffer.map_readable().ok()?;
            let mut c = collected.lock().unwrap_or_else(|p| p.into_inner());
            if c.rate == 0 {
                c.rate = rate;
            } else if c.rate != rate {
                let first = c.rate;
                c.rate_changed.get_or_insert((first, rate));
                return None;
            }
            let n = map.len() / 4;
            // the limit counts target-rate samples: ⌈(decoded + n) · target / rate⌉ after
            // resampling
            let at_ref_rate =
                ((c.samples.len() + n) as u64 * target_rate as u64).div_ceil(rate.max(1) as u64);
            if c.too_long || at_ref_rate > max_samples as u64 {
                c.too_long = true;
                return None;
            }
            c.samples.extend(
                map.as_slice()
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            );
            None
        });
    }

    let limit_s = max_samples as f64 / target_rate.max(1) as f64;
    let result = run_to_eos(&pipeline, &collected, &linked, &no_more_pads, limit_s);
    let _ = pipeline.set_state(gst::State::Null);
    result?;
    let c = std::mem::take(&mut *collected.lock().unwrap_or_else(|p| p.into_inner()));
    if let Some((from, to)) = c.rate_changed {
        return Err(RefAudioError::Decode(format!(
            "the sample rate changed mid-stream ({from} Hz -> {to} Hz)"
        )));
    }
    if c.samples.is_empty() {
        return Err(RefAudioError::NoAudio(
            " (the audio stream is empty)".into(),
        ));
    }
    resample(&c.samples, c.rate, target_rate)
}

/// Converts mono `samples` at `rate` Hz to [`REF_AUDIO_RATE`] as the official reference does:
/// `librosa.resample(y, orig_sr=rate, target_sr=24000)` with its default `res_type="soxr_hq"`
/// (python-soxr: libsoxr, `SOXR_HQ` recipe, no flags, `f32` in and out, the whole signal then a
/// flush), then `librosa.util.fix_length` to ⌈len · (24000 / rate)⌉ samples, computed in f64
/// (zeros appended or the tail cut). `rate == 24000` returns the samples unchanged. Bit-identical
/// to the reference where libsoxr is the same release (0.1.3).
///
/// Errors: [`RefAudioError::Decode`] for a zero rate or when libsoxr reports an error.
pub fn resample_to_ref_rate(samples: &[f32], rate: u32) -> Result<Vec<f32>, RefAudioError> {
    resample(samples, rate, REF_AUDIO_RATE)
}

/// [`resample_to_ref_rate`] to `target` Hz (the same libsoxr recipe and length rule).
pub fn resample(samples: &[f32], rate: u32, target: u32) -> Result<Vec<f32>, RefAudioError> {
    if rate == target {
        return Ok(samples.to_vec());
    }
    if rate == 0 {
        return Err(RefAudioError::Decode(
            "the stream has no sample rate".into(),
        ));
    }
    let soxr_error =
        |e: soxr::Error| RefAudioError::Decode(format!("resampling from {rate} Hz: {e}"));
    let mut soxr = soxr::Soxr::<soxr::format::Mono<f32>>::new_with_params(
        rate as f64,
        target as f64,
        soxr::params::QualitySpec::new(soxr::params::QualityRecipe::high()),
        soxr::params::RuntimeSpec::default(),
    )
    .map_err(soxr_error)?;
    // Both lengths in f64 as the reference computes them: librosa's target is
    // `ceil(len * (24000 / rate))`, one more than the exact ratio when that product rounds up
    // (44.1 kHz: 110,250 samples -> 60,001); python-soxr's output buffer is
    // `(size_t)(len * 24000 / rate) + 1`.
    let len = samples.len() as f64;
    let target_len = (len * (target as f64 / rate as f64)).ceil() as usize;
    let capacity = (len * target as f64 / rate as f64) as usize + 1;
    let mut out = vec![0f32; capacity];
    let mut produced = 0;
    let mut consumed = 0;
    while consumed < samples.len() && produced < capacity {
        let step = soxr
            .process(&samples[consumed..], &mut out[produced..])
            .map_err(soxr_error)?;
        consumed += step.input_frames;
        produced += step.output_frames;
        if step.input_frames == 0 && step.output_frames == 0 {
            break;
        }
    }
    while produced < capacity {
        let n = soxr.drain(&mut out[produced..]).map_err(soxr_error)?;
        if n == 0 {
            break;
        }
        produced += n;
    }
    out.truncate(produced);
    out.resize(target_len, 0.0);
    Ok(out)
}

/// Plays the pipeline until EOS, an error, too much audio, no audio stream, or the timeout.
fn run_to_eos(
    pipeline: &gst::Pipeline,
    collected: &Mutex<Collected>,
    linked: &AtomicBool,
    no_more_pads: &AtomicBool,
    limit_s: f64,
) -> Result<(), RefAudioError> {
    let bus = pipeline
        .bus()
        .ok_or_else(|| RefAudioError::Pipeline("pipeline without a bus".into()))?;
    let error_text = |e: &gst::message::Error| {
        let debug = e.debug().map(|d| format!(" ({d})")).unwrap_or_default();
        format!("{}{debug}", e.error())
    };
    let too_long = || collected.lock().unwrap_or_else(|p| p.into_inner()).too_long;
    let started = pipeline.set_state(gst::State::Playing);
    let t0 = Instant::now();
    loop {
        if too_long() {
            return Err(RefAudioError::TooLong { limit_s });
        }
        if no_more_pads.load(Ordering::SeqCst) && !linked.load(Ordering::SeqCst) {
            return Err(RefAudioError::NoAudio(String::new()));
        }
        if t0.elapsed() > DECODE_TIMEOUT {
            return Err(RefAudioError::Timeout(DECODE_TIMEOUT));
        }
        let msg = bus.timed_pop_filtered(
            gst::ClockTime::from_mseconds(20),
            &[gst::MessageType::Eos, gst::MessageType::Error],
        );
        match msg.as_ref().map(|m| m.view()) {
            Some(gst::MessageView::Eos(_)) if too_long() => {
                return Err(RefAudioError::TooLong { limit_s });
            }
            Some(gst::MessageView::Eos(_)) => return Ok(()),
            Some(gst::MessageView::Error(e)) => {
                // Streams were found but none was audio (e.g. not-linked video).
                let no_audio =
                    no_more_pads.load(Ordering::SeqCst) && !linked.load(Ordering::SeqCst);
                return Err(if no_audio {
                    RefAudioError::NoAudio(String::new())
                } else {
                    RefAudioError::Decode(error_text(e))
                });
            }
            _ => {}
        }
        if started.is_err() && msg.is_none() {
            return Err(RefAudioError::Decode(
                "the decoding pipeline failed to start".into(),
            ));
        }
    }
}
