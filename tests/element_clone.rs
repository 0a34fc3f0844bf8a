//! Voice cloning through `omnittssrc` (tiny Base fixture, CPU): the reference recording is read by
//! GStreamer (`ref-audio`), encoded once by the engine, and every utterance speaks in its voice.
//!
//! - parity: the fixture's reference audio written as a 24 kHz mono F32 WAV gives the official
//!   waveform, ICL (`ref-text`) and x-vector only, so the decode path is exact at 24 kHz F32;
//! - another format and rate (16-bit 44.1 kHz stereo) decodes to 24 kHz mono of the right length,
//!   close to the original, and gives an encoding close to the official one; other rates resample
//!   as the official reference does (librosa / libsoxr HQ), to 1e-6;
//! - the engine's cache: two utterances with one reference encode it once;
//! - concurrent elements with different references (and a CustomVoice one) never mix;
//! - every misuse is a bus error naming the property and value with a failed state change, or a
//!   per-utterance error that keeps the audio already produced.

mod element_util;
mod engine_common;
mod reference_util;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::Tensor;
use element_util::{
    TempDir, assert_names, drain, element_messages, errors, init, play_holding_first_buffer, set,
    start_error, v, warnings,
};
use gst::glib;
use gst::prelude::*;
use gst_check::Harness;
use gstomnitts::element_common::messages;
use gstomnitts::element_common::ref_audio::{
    decode_ref_audio, location_to_uri, resample_to_ref_rate,
};
use gstomnitts::engine::{DeviceSpec, Engine, EngineOptions, StageConfig};
use reference_util::{
    Suite, code_rows, f32s, fixture, fixture_model, fixtures_dir, reference_suite, rel_l2,
};
use serde_json::Value;

const TOL: f64 = 1e-4;
const SPF: usize = 1920;

/// The tiny-base reference: the recording the official generator cloned, its x-vector and codes,
/// and the cases generated from that recording.
struct Reference {
    audio: Vec<f32>,
    xvector: Vec<f32>,
    codes: Vec<Vec<u32>>,
    cases: Vec<Value>,
    tensors: HashMap<String, Tensor>,
}

impl Reference {
    fn load() -> Reference {
        let suite = reference_suite("tiny-base");
        let codes = code_rows(&suite.clone_tensor("codes"));
        let audio = f32s(&suite.clone_tensor("audio"));
        let xvector = f32s(&suite.clone_tensor("xvector"));
        let Suite { json, tensors, .. } = suite;
        let cases: Vec<Value> = json["cases"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c.get("ref_audio").and_then(Value::as_str) == Some("clone/audio"))
            .cloned()
            .collect();
        assert!(
            cases.iter().any(|c| c["icl_mode"] == true)
                && cases.iter().any(|c| c["icl_mode"] == false),
            "the fixture needs an ICL and an x-vector case cloned from its reference audio"
        );
        Reference {
            audio,
            xvector,
            codes,
            cases,
            tensors,
        }
    }

    fn case(&self, icl: bool) -> &Value {
        self.cases.iter().find(|c| c["icl_mode"] == icl).unwrap()
    }

    fn case_wav(&self, case: &Value) -> Vec<f32> {
        self.tensors[case["tensors"]["wav"].as_str().unwrap()]
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
    }
}

/// Writes mono `samples` as a 32-bit float WAV at `rate`.
fn write_f32_wav(path: &Path, samples: &[f32], rate: u32) {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: rate,
        bits_per_sample: 32,
        sample_format: hound::SampleFormat::Float,
    };
    let mut w = hound::WavWriter::create(path, spec).unwrap();
    for s in samples {
        w.write_sample(*s).unwrap();
    }
    w.finalize().unwrap();
}

/// Band-limited interpolation of 24 kHz `samples` at time `t` (in 24 kHz samples): a Lanczos
/// kernel with 16 lobes.
fn interpolate(samples: &[f32], t: f64) -> f32 {
    const A: i64 = 16;
    let sinc = |x: f64| {
        if x.abs() < 1e-12 {
            1.0
        } else {
            (std::f64::consts::PI * x).sin() / (std::f64::consts::PI * x)
        }
    };
    let k0 = t.floor() as i64;
    let mut acc = 0.0f64;
    for k in (k0 - A + 1)..=(k0 + A) {
        if k < 0 || k >= samples.len() as i64 {
            continue;
        }
        let x = t - k as f64;
        acc += samples[k as usize] as f64 * sinc(x) * sinc(x / A as f64);
    }
    acc as f32
}

/// Writes `samples` (24 kHz mono) as a 16-bit 44.1 kHz stereo WAV (both channels equal).
fn write_s16_44k_stereo_wav(path: &Path, samples: &[f32]) -> usize {
    let spec = hound::WavSpec {
        channels: 2,
        sample_rate: 44_100,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let n = (samples.len() as u64 * 44_100 / 24_000) as usize;
    let mut w = hound::WavWriter::create(path, spec).unwrap();
    for i in 0..n {
        let x = interpolate(samples, i as f64 * 24_000.0 / 44_100.0);
        let v = (x.clamp(-1.0, 1.0) * 32767.0).round() as i16;
        w.write_sample(v).unwrap();
        w.write_sample(v).unwrap();
    }
    w.finalize().unwrap();
    n
}

/// Element properties of a fixture case: text, language, budget, prompt mode, greedy.
fn case_props(case: &Value) -> Vec<(&'static str, glib::SendValue)> {
    let mode = match case["prompt_mode"].as_str().unwrap() {
        "streaming" => "streaming",
        _ => "non-streaming",
    };
    vec![
        ("text", v(case["text"].as_str().unwrap())),
        ("language", v(case["language"].as_str().unwrap())),
        (
            "max-new-tokens",
            v(case["max_new_tokens"].as_u64().unwrap() as u32),
        ),
        ("prompt-mode", v(mode)),
    ]
}

/// What one element run produced.
struct Output {
    audio: Vec<f32>,
    msgs: Vec<gst::Message>,
    encodes: u64,
}

impl Output {
    fn done(&self) -> Vec<gst::Structure> {
        element_messages(&self.msgs, messages::DONE)
    }
}

/// Runs `omnittssrc` (greedy) with `props` to EOS through a Harness (F32LE), pushing `more` texts
/// before start; returns the samples, the bus messages and the encode counter before stopping.
fn run_element(model: &str, props: &[(&str, glib::SendValue)], more: &[&str]) -> Output {
    init();
    let mut h = Harness::new("omnittssrc");
    let e = h.element().expect("element");
    let bus = gst::Bus::new();
    e.set_bus(Some(&bus));
    e.set_property("model", model);
    e.set_property("do-sample", false);
    for (k, val) in props {
        set(&e, k, val);
    }
    for t in more {
        assert!(e.emit_by_name::<bool>("push-text", &[t]));
    }
    h.play();
    let mut audio = Vec::new();
    loop {
        match h.pull_until_eos() {
            Ok(Some(b)) => {
                let m = b.map_readable().unwrap();
                audio.extend(
                    m.as_slice()
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                );
            }
            Ok(None) => break,
            Err(err) => panic!(
                "pull failed after {} samples: {err}; errors: {:?}",
                audio.len(),
                errors(&drain(&bus))
            ),
        }
    }
    let encodes = e.property::<u64>("voice-clone-encodes");
    let msgs = drain(&bus);
    Output {
        audio,
        msgs,
        encodes,
    }
}

/// Both clone modes through the element, from a 24 kHz mono F32 WAV of the official reference
/// recording, equal the official waveforms.
#[test]
fn element_clone_equals_reference_icl_and_x_vector() {
    let r = Reference::load();
    let dir = TempDir::new("clone-parity");
    let wav = dir.path().join("ref.wav");
    write_f32_wav(&wav, &r.audio, 24_000);
    // The decode path alone: exact.
    let decoded = decode_ref_audio(wav.to_str().unwrap(), usize::MAX).unwrap();
    assert_eq!(
        decoded, r.audio,
        "24 kHz mono F32 must decode sample-exactly"
    );

    for icl in [true, false] {
        let case = r.case(icl);
        let want = r.case_wav(case);
        let mut props = case_props(case);
        props.push(("ref-audio", v(wav.to_str().unwrap())));
        if icl {
            props.push(("ref-text", v(case["ref_text"].as_str().unwrap())));
        } else {
            props.push(("x-vector-only", v(true)));
        }
        let out = run_element(&fixture_model("tiny-base"), &props, &[]);
        assert!(errors(&out.msgs).is_empty(), "{:?}", errors(&out.msgs));
        let frames = case["num_frames"].as_u64().unwrap() as usize;
        assert_eq!(out.audio.len(), frames * SPF, "{}", case["id"]);
        let e = rel_l2(&out.audio, &want);
        eprintln!("{}: element vs official rel L2 {e:e}", case["id"]);
        assert!(e < TOL, "{}: rel L2 {e:e}", case["id"]);
        let done = out.done();
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].get::<String>("reason").unwrap(), "length");
    }
}

/// Reference recordings at other rates are resampled as the official reference does
/// (`librosa.resample` → libsoxr HQ, then `fix_length` to ⌈n · (24000 / sr)⌉):
/// `tests/fixtures/reference/resample.safetensors` holds signals at 8, 16, 22.05, 44.1 and 48 kHz
/// and librosa's 24 kHz results. Each one through `resample_to_ref_rate`, and one read from a F32
/// WAV file through `decode_ref_audio` (GStreamer decodes at the file's rate), must match them in
/// length and to 1e-6 (bit-identical with the same libsoxr release).
#[test]
fn other_rates_resample_like_the_reference() {
    let path = fixtures_dir().join("reference/resample.safetensors");
    let tensors = candle_core::safetensors::load(&path, &candle_core::Device::Cpu).unwrap();
    let mut inputs: Vec<&String> = tensors.keys().filter(|k| k.starts_with("in_")).collect();
    inputs.sort();
    assert!(inputs.len() >= 5, "{inputs:?}");
    let dir = TempDir::new("resample");
    for key in inputs {
        let rate: u32 = key.split('_').nth(1).unwrap().parse().unwrap();
        let input = f32s(&tensors[key]);
        let want = f32s(&tensors[&key.replacen("in_", "out_", 1)]);
        let got = resample_to_ref_rate(&input, rate).unwrap();
        assert_eq!(got.len(), want.len(), "{key}: length");
        let max = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        eprintln!(
            "{key}: {} -> {} samples, max |diff| {max:e}",
            input.len(),
            got.len()
        );
        assert!(max < 1e-6, "{key}: max |diff| {max:e}");

        let wav = dir.path().join(format!("{key}.wav"));
        write_f32_wav(&wav, &input, rate);
        let decoded = decode_ref_audio(wav.to_str().unwrap(), usize::MAX).unwrap();
        assert_eq!(
            decoded, got,
            "{key}: decode_ref_audio differs from resample_to_ref_rate"
        );
    }
}

/// The same recording as 16-bit 44.1 kHz stereo: GStreamer turns it into 24 kHz mono close to the
/// original; its encoding is close to the official one; the element speaks with it.
#[test]
fn other_format_and_rate_is_resampled_to_24k_mono() {
    let r = Reference::load();
    let dir = TempDir::new("clone-44k");
    let wav = dir.path().join("ref-44k-stereo.wav");
    let n44 = write_s16_44k_stereo_wav(&wav, &r.audio);
    assert_eq!(n44, r.audio.len() * 44_100 / 24_000);

    let decoded = decode_ref_audio(wav.to_str().unwrap(), usize::MAX).unwrap();
    let d = decoded.len() as i64 - r.audio.len() as i64;
    assert!(
        d.abs() <= 48,
        "decoded {} samples, original {} (±2 ms)",
        decoded.len(),
        r.audio.len()
    );
    // Compare the overlap, skipping the resampler's edges.
    let n = decoded.len().min(r.audio.len());
    let e = rel_l2(&decoded[240..n - 240], &r.audio[240..n - 240]);
    eprintln!(
        "44.1 kHz stereo s16 -> 24 kHz mono: {} samples, rel L2 {e:e}",
        decoded.len()
    );
    assert!(e < 0.04, "resampled reference differs: rel L2 {e:e}");

    // The engine's encoding of the resampled reference: close to the official one.
    let engine = Engine::load(EngineOptions {
        model_dir: fixture("tiny-base"),
        stage_config: StageConfig::default_async(),
        ar_device: DeviceSpec::Cpu,
        decoder_device: DeviceSpec::Cpu,
    })
    .unwrap();
    let p = engine
        .voice_clone_prompt(&decoded, Some("This is the reference."), false)
        .unwrap();
    let xe = rel_l2(&p.x_vector, &r.xvector);
    let codes = p.ref_codes.as_ref().unwrap();
    assert_eq!(
        codes.len(),
        r.codes.len(),
        "reference frames = ceil(samples / 1920)"
    );
    let same0 = codes
        .iter()
        .zip(&r.codes)
        .filter(|(a, b)| a[0] == b[0])
        .count();
    eprintln!(
        "resampled reference: x-vector rel L2 {xe:e}, codebook-0 agreement {same0}/{}",
        codes.len()
    );
    assert!(xe < 0.05, "x-vector rel L2 {xe:e}");
    assert!(
        same0 * 4 >= codes.len() * 3,
        "codebook 0: {same0}/{} equal",
        codes.len()
    );

    // Through the element: audio of the full budget, finite and not silent.
    let case = r.case(false);
    let mut props = case_props(case);
    props.push((
        "ref-audio",
        v(location_to_uri(wav.to_str().unwrap()).unwrap()),
    ));
    props.push(("x-vector-only", v(true)));
    let out = run_element(&fixture_model("tiny-base"), &props, &[]);
    assert!(errors(&out.msgs).is_empty(), "{:?}", errors(&out.msgs));
    let done = out.done();
    assert_eq!(done[0].get::<String>("reason").unwrap(), "length");
    let frames = case["max_new_tokens"].as_u64().unwrap() as usize - 1;
    assert_eq!(out.audio.len(), frames * SPF);
    assert!(out.audio.iter().all(|x| x.is_finite()));
    let rms = (out.audio.iter().map(|x| x * x).sum::<f32>() / out.audio.len() as f32).sqrt();
    assert!(rms > 0.01, "rms {rms}");
}

/// Two utterances with one reference: the engine encodes it once (at start), the utterances take
/// it from the cache, and both are spoken in the same voice (the same text gives the same audio).
#[test]
fn repeated_utterances_encode_the_reference_once() {
    let r = Reference::load();
    let dir = TempDir::new("clone-cache");
    let wav = dir.path().join("ref.wav");
    write_f32_wav(&wav, &r.audio, 24_000);
    // An engine of its own: the encode count is the engine's, and other tests share theirs.
    let props = [
        ("shared-engine", v(false)),
        ("text", v("Same words.")),
        ("max-new-tokens", v(6u32)),
        ("ref-audio", v(wav.to_str().unwrap())),
        ("ref-text", v("This is the reference.")),
    ];
    let out = run_element(&fixture_model("tiny-base"), &props, &["Same words."]);
    assert!(errors(&out.msgs).is_empty(), "{:?}", errors(&out.msgs));
    assert_eq!(out.done().len(), 2);
    assert_eq!(out.encodes, 1, "the reference must be encoded once");
    let half = out.audio.len() / 2;
    assert_eq!(out.audio.len(), 2 * 5 * SPF);
    assert_eq!(
        out.audio[..half],
        out.audio[half..],
        "same text, same voice, same audio"
    );
}

/// Three elements in one process at once: Base ICL with reference A, Base x-vector with reference
/// B, CustomVoice. Each output equals the same element's output run alone.
#[test]
fn concurrent_elements_do_not_mix() {
    let r = Reference::load();
    let dir = TempDir::new("clone-concurrent");
    let a = dir.path().join("a.wav");
    let b = dir.path().join("b.wav");
    write_f32_wav(&a, &r.audio, 24_000);
    // Another voice: the reference played backwards, louder.
    let other: Vec<f32> = r
        .audio
        .iter()
        .rev()
        .map(|x| (x * 1.5).clamp(-1.0, 1.0))
        .collect();
    write_f32_wav(&b, &other, 24_000);
    let text = ("text", v("Hello world, this is a test."));
    let budget = ("max-new-tokens", v(12u32));
    let runs: Vec<(String, Vec<(&str, glib::SendValue)>)> = vec![
        (
            fixture_model("tiny-base"),
            vec![
                text.clone(),
                budget.clone(),
                ("ref-audio", v(a.to_str().unwrap())),
                ("ref-text", v("This is the reference.")),
            ],
        ),
        (
            fixture_model("tiny-base"),
            vec![
                text.clone(),
                budget.clone(),
                ("ref-audio", v(b.to_str().unwrap())),
                ("x-vector-only", v(true)),
            ],
        ),
        (
            fixture_model("tiny-customvoice"),
            vec![text.clone(), budget.clone()],
        ),
    ];
    let alone: Vec<Vec<f32>> = runs
        .iter()
        .map(|(m, p)| run_element(m, p, &[]).audio)
        .collect();
    for (i, x) in alone.iter().enumerate() {
        assert!(!x.is_empty(), "run {i} produced no audio");
        for (j, y) in alone.iter().enumerate().skip(i + 1) {
            if x.len() == y.len() {
                assert!(rel_l2(x, y) > 0.1, "runs {i} and {j} sound the same");
            }
        }
    }
    let together: Vec<Vec<f32>> = std::thread::scope(|s| {
        let hs: Vec<_> = runs
            .iter()
            .map(|(m, p)| {
                // Values are Send, not Sync: each thread gets its own copy.
                let p = p.clone();
                s.spawn(move || run_element(m, &p, &[]).audio)
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("element thread panicked"))
            .collect()
    });
    for (i, (x, y)) in together.iter().zip(&alone).enumerate() {
        let e = rel_l2(x, y);
        assert!(
            e < 1e-5,
            "run {i}: concurrent output differs from its run alone: rel L2 {e:e}"
        );
    }
}

/// A folder with reference files: good, silent, too short, too long, not a media file, video only.
struct Refs {
    _dir: TempDir,
    good: String,
    silent: String,
    short: String,
    long: String,
    text: String,
    video: String,
}

/// Writes a short video-only AVI file with GStreamer.
fn write_video_only(path: &Path) {
    init();
    let p = gst::parse::launch(&format!(
        "videotestsrc num-buffers=5 ! video/x-raw,width=32,height=24 ! avimux ! filesink location={}",
        path.display()
    ))
    .unwrap();
    p.set_state(gst::State::Playing).unwrap();
    let msg = p.bus().unwrap().timed_pop_filtered(
        gst::ClockTime::from_seconds(30),
        &[gst::MessageType::Eos, gst::MessageType::Error],
    );
    assert!(
        matches!(
            msg.as_ref().map(|m| m.view()),
            Some(gst::MessageView::Eos(_))
        ),
        "{msg:?}"
    );
    p.set_state(gst::State::Null).unwrap();
}

fn refs() -> Refs {
    let r = Reference::load();
    let dir = TempDir::new("clone-errors");
    let p = |n: &str| -> PathBuf { dir.path().join(n) };
    write_f32_wav(&p("good.wav"), &r.audio, 24_000);
    write_f32_wav(&p("silent.wav"), &vec![0.0; 24_000], 24_000);
    write_f32_wav(&p("short.wav"), &r.audio[..7_200], 24_000);
    let long: Vec<f32> = r.audio.iter().copied().cycle().take(61 * 24_000).collect();
    write_f32_wav(&p("long.wav"), &long, 24_000);
    std::fs::write(
        p("notes.txt"),
        "these are not the samples you are looking for\n",
    )
    .unwrap();
    write_video_only(&p("video.avi"));
    let s = |n: &str| p(n).display().to_string();
    Refs {
        good: s("good.wav"),
        silent: s("silent.wav"),
        short: s("short.wav"),
        long: s("long.wav"),
        text: s("notes.txt"),
        video: s("video.avi"),
        _dir: dir,
    }
}

#[test]
fn errors_bad_reference_fail_the_state_change() {
    let f = refs();
    let base = fixture_model("tiny-base");
    let icl = |path: &str| {
        vec![
            ("text", v("Hello.")),
            ("ref-audio", v(path)),
            ("ref-text", v("This is the reference.")),
        ]
    };
    assert_names(
        &start_error(&base, &icl("/nonexistent/voice.wav")),
        &["ref-audio", "'/nonexistent/voice.wav'", "no such file"],
    );
    assert_names(
        &start_error(&base, &icl("file:///nonexistent/voice.flac")),
        &[
            "ref-audio",
            "'file:///nonexistent/voice.flac'",
            "no such file",
        ],
    );
    // A FIFO, as a path or a file URI: refused before the decoder would block opening it.
    let fifo = f._dir.path().join("voice.fifo");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo failed");
    let fifo_uri = location_to_uri(f.good.as_str())
        .unwrap()
        .replace("good.wav", "voice.fifo");
    for location in [fifo.display().to_string(), fifo_uri] {
        // Checked before any pipeline exists, so a regression fails here instead of hanging.
        assert!(location_to_uri(&location).is_err(), "{location} accepted");
        assert_names(
            &start_error(&base, &icl(&location)),
            &["ref-audio", &location, "not a regular file"],
        );
    }
    assert_names(
        &start_error(&base, &icl(&f.text)),
        &["ref-audio", &f.text, "decode"],
    );
    assert_names(
        &start_error(&base, &icl(&f.video)),
        &["ref-audio", &f.video, "no audio"],
    );
    assert_names(
        &start_error(&base, &icl(&f.silent)),
        &["ref-audio", &f.silent, "silent"],
    );
    assert_names(
        &start_error(&base, &icl(&f.short)),
        &["ref-audio", &f.short, "too short", "0.5 s", "0.30 s"],
    );
    assert_names(
        &start_error(&base, &icl(&f.long)),
        &["ref-audio", &f.long, "60.0 s limit"],
    );
}

#[test]
fn errors_clone_properties_against_the_checkpoint() {
    let f = refs();
    let base = fixture_model("tiny-base");
    // Base without a reference.
    assert_names(
        &start_error(&base, &[("text", v("Hello."))]),
        &["ref-audio", &base, "Base"],
    );
    // A transcript without its recording.
    assert_names(
        &start_error(&base, &[("text", v("Hello.")), ("ref-text", v("Words."))]),
        &["ref-text", "'Words.'", "ref-audio"],
    );
    // ICL without a transcript.
    assert_names(
        &start_error(
            &base,
            &[("text", v("Hello.")), ("ref-audio", v(f.good.as_str()))],
        ),
        &["ref-text", "transcript", "x-vector-only"],
    );
    // Cloning properties on a CustomVoice checkpoint.
    let cv = fixture_model("tiny-customvoice");
    assert_names(
        &start_error(
            &cv,
            &[("text", v("Hello.")), ("ref-audio", v(f.good.as_str()))],
        ),
        &["ref-audio", &f.good, "Base"],
    );
    assert_names(
        &start_error(&cv, &[("text", v("Hello.")), ("ref-text", v("Words."))]),
        &["ref-text", "Base"],
    );
    assert_names(
        &start_error(&cv, &[("text", v("Hello.")), ("x-vector-only", v(true))]),
        &["x-vector-only", "Base"],
    );
}

/// x-vector-only with ref-text: ref-text is ignored (as in qwen-tts) with a warning naming it, and
/// the output equals x-vector-only without ref-text.
#[test]
fn x_vector_only_ignores_ref_text_with_a_warning() {
    let f = refs();
    let props = |text: Option<&str>| {
        let mut p = vec![
            ("text", v("Hello.")),
            ("max-new-tokens", v(5u32)),
            ("ref-audio", v(f.good.as_str())),
            ("x-vector-only", v(true)),
        ];
        if let Some(t) = text {
            p.push(("ref-text", v(t)));
        }
        p
    };
    let with = run_element(
        &fixture_model("tiny-base"),
        &props(Some("Ignored words.")),
        &[],
    );
    let without = run_element(&fixture_model("tiny-base"), &props(None), &[]);
    assert!(errors(&with.msgs).is_empty());
    assert_names(
        &warnings(&with.msgs),
        &["ref-text", "'Ignored words.'", "ignored"],
    );
    assert!(!with.audio.is_empty());
    assert_eq!(with.audio, without.audio);
}

/// A reference changed while playing applies to the next utterance. An unusable one (missing,
/// silent, too long, ICL without its transcript) is refused by push-text at once, and its error,
/// naming the property, is posted in stream order after the audio already produced; a good one
/// afterwards plays again.
#[test]
fn runtime_bad_reference_refuses_only_its_utterance() {
    let f = refs();
    init();
    let mut h = Harness::new("omnittssrc");
    let e = h.element().unwrap();
    let bus = gst::Bus::new();
    e.set_bus(Some(&bus));
    // An engine of its own: the encode count below is the engine's.
    for (k, val) in [
        ("model", v(fixture_model("tiny-base"))),
        ("shared-engine", v(false)),
        ("do-sample", v(false)),
        ("max-new-tokens", v(4u32)),
        ("text", v("First.")),
        ("ref-audio", v(f.good.as_str())),
        ("ref-text", v("This is the reference.")),
    ] {
        set(&e, k, &val);
    }
    // Hold the first buffer so that the texts below are queued before EOS.
    let (pad, probe) = play_holding_first_buffer(&mut h);
    for bad in [f.silent.as_str(), "/nonexistent/voice.wav", f.long.as_str()] {
        e.set_property("ref-audio", bad);
        assert!(
            !e.emit_by_name::<bool>("push-text", &[&"Refused."]),
            "{bad} accepted"
        );
    }
    // ICL without the transcript.
    e.set_property("ref-audio", f.good.as_str());
    e.set_property("ref-text", None::<String>);
    assert!(!e.emit_by_name::<bool>("push-text", &[&"Refused."]));
    e.set_property("ref-text", "This is the reference.");
    assert!(e.emit_by_name::<bool>("push-text", &[&"Sixth."]));
    // Nothing is posted before the audio queued ahead of the refusals.
    assert!(errors(&drain(&bus)).is_empty());
    pad.remove_probe(probe);
    let mut samples = 0usize;
    loop {
        match h.pull_until_eos() {
            Ok(Some(b)) => samples += b.size() / 4,
            Ok(None) => break,
            Err(err) => panic!("pull failed: {err}"),
        }
    }
    let msgs = drain(&bus);
    let errs = errors(&msgs);
    assert_eq!(errs.len(), 4, "{errs:?}");
    assert_names(&errs, &["utterance 2", "ref-audio", &f.silent, "silent"]);
    assert_names(
        &errs,
        &[
            "utterance 3",
            "ref-audio",
            "/nonexistent/voice.wav",
            "no such file",
        ],
    );
    assert_names(
        &errs,
        &["utterance 4", "ref-audio", &f.long, "60.0 s limit"],
    );
    assert_names(&errs, &["utterance 5", "ref-text", "transcript"]);
    let done = element_messages(&msgs, messages::DONE);
    let ids: Vec<u64> = done.iter().map(|s| s.get::<u64>("id").unwrap()).collect();
    assert_eq!(ids, [1, 6], "utterances 1 and 6 spoken");
    assert_eq!(samples, 2 * 3 * SPF, "both utterances complete");
    // The good reference was decoded again after the others, but encoded only once.
    assert_eq!(e.property::<u64>("voice-clone-encodes"), 1);
}
