//! Reading a voice-clone reference recording with GStreamer: any file or URI GStreamer can decode
//! (WAV, FLAC, Ogg, MP3, … at any rate and channel count) becomes 24 kHz mono `f32` samples, the
//! input of [`Engine::voice_clone_prompt`](crate::engine::Engine::voice_clone_prompt).
//!
//! A private pipeline does the work, outside any application pipeline:
//!
//! ```text
//! uridecodebin uri=… ! audioconvert ! audioresample ! audio/x-raw,format=F32LE,rate=24000,channels=1,layout=interleaved ! fakesink
//! ```
//!
//! `audioconvert` mixes channels down to mono (the mean for stereo) and `audioresample` converts the
//! rate at its best quality (10; a reference is at most a minute long); a 24 kHz mono F32 file
//! passes through both unchanged, sample for sample.

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

/// The URI of `location`: a URI (`file:///…`, `https://…`) is kept as it is; anything else is a
/// file path (relative to the working directory), which must exist.
pub fn location_to_uri(location: &str) -> Result<String, RefAudioError> {
    let location = location.trim();
    if location.is_empty() {
        return Err(RefAudioError::NotFound("empty location".into()));
    }
    if glib::uri_parse_scheme(location).is_some() {
        return Ok(location.to_string());
    }
    let path = Path::new(location);
    if !path.is_file() {
        return Err(RefAudioError::NotFound(if path.exists() {
            "not a regular file".into()
        } else {
            "no such file".into()
        }));
    }
    let abs = std::path::absolute(path).map_err(|e| RefAudioError::NotFound(e.to_string()))?;
    glib::filename_to_uri(&abs, None)
        .map(|u| u.to_string())
        .map_err(|e| RefAudioError::NotFound(e.to_string()))
}

/// What the sink collected.
#[derive(Default)]
struct Collected {
    samples: Vec<f32>,
    /// A buffer would have passed `max_samples`.
    too_long: bool,
}

/// Decodes `location` (a file path or URI) to mono `f32` samples at 24 kHz, at most `max_samples`
/// of them (more is [`RefAudioError::TooLong`], found without decoding the rest). Calls
/// `gst::init()` (harmless when already initialised) and blocks until the end of the stream,
/// an error, or [`DECODE_TIMEOUT`].
pub fn decode_ref_audio(location: &str, max_samples: usize) -> Result<Vec<f32>, RefAudioError> {
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
    let resample = make("audioresample")?;
    resample.set_property("quality", 10i32);
    let filter = make("capsfilter")?;
    filter.set_property(
        "caps",
        gst_audio::AudioCapsBuilder::new_interleaved()
            .format(gst_audio::AudioFormat::F32le)
            .rate(REF_AUDIO_RATE as i32)
            .channels(1)
            .build(),
    );
    let sink = make("fakesink")?;
    sink.set_property("sync", false);
    sink.set_property("signal-handoffs", true);
    let chain = [&convert, &resample, &filter, &sink];
    let built = pipeline
        .add_many([&src, &convert, &resample, &filter, &sink])
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
            let map = buffer.map_readable().ok()?;
            let mut c = collected.lock().unwrap_or_else(|p| p.into_inner());
            let n = map.len() / 4;
            if c.too_long || c.samples.len() + n > max_samples {
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

    let limit_s = max_samples as f64 / REF_AUDIO_RATE as f64;
    let result = run_to_eos(&pipeline, &collected, &linked, &no_more_pads, limit_s);
    let _ = pipeline.set_state(gst::State::Null);
    result?;
    let c = std::mem::take(&mut *collected.lock().unwrap_or_else(|p| p.into_inner()));
    if c.samples.is_empty() {
        return Err(RefAudioError::NoAudio(
            " (the audio stream is empty)".into(),
        ));
    }
    Ok(c.samples)
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
