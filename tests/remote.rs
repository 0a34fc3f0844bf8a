//! The remote backend against a loopback vLLM-Omni speech server (tests/speech_server) that
//! synthesises with omnitts' own engine on the tiny CustomVoice fixture: first the client
//! ([`SpeechClient`]) — the samples, frames and finish reasons of both stream forms, and every
//! fault the server can inject — then `omnittssrc server=...`, which must give what the element
//! gives synthesising locally with the same checkpoint: the same samples (S16 quantisation
//! aside), frames, timestamps and messages, and for each fault the error or finish reason.

mod element_util;
mod engine_common;
mod reference_util;
mod speech_server;

use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use gstomnitts::engine::{Engine, FinishReason};
use gstomnitts::remote::{
    ApiKey, RemoteError, ServerOptions, ServerUrl, SpeechClient, SpeechRequest, StreamProtocol,
    s16_to_f32,
};
use speech_server::{Fault, SpeechServer, engine_request, pcm16};

/// The served model name.
const MODEL: &str = "Qwen/Qwen3-TTS-12Hz-tiny-CustomVoice";

static ENGINE: LazyLock<Arc<Engine>> = LazyLock::new(|| {
    Arc::new(engine_common::load(
        "tiny-customvoice",
        engine_common::config(|_| {}),
    ))
});

fn server() -> SpeechServer {
    SpeechServer::start(ENGINE.clone(), MODEL)
}

fn client(url: &str, f: impl FnOnce(&mut ServerOptions)) -> SpeechClient {
    let mut o = ServerOptions::new(ServerUrl::parse(url).expect("url"));
    o.api_key = None;
    f(&mut o);
    SpeechClient::new(o)
}

fn request(text: &str, protocol: StreamProtocol) -> SpeechRequest {
    let mut r = SpeechRequest::new(text, protocol);
    r.voice = Some("ryan".into());
    r.language = Some("English".into());
    r.seed = Some(7);
    r.max_new_tokens = Some(40);
    r
}

fn run(c: &SpeechClient, r: SpeechRequest) -> (Vec<f32>, FinishReason, usize) {
    let h = c.submit(r).expect("submit");
    let (audio, reason, metrics) = h.collect().expect("contiguous audio");
    (audio, reason, metrics.frames)
}

fn error_of(reason: &FinishReason) -> &str {
    match reason {
        FinishReason::Error(e) => e,
        other => panic!("expected an error, got {other:?}"),
    }
}

/// A loopback URL nothing listens on (a port bound, then released).
fn dead_endpoint() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}", l.local_addr().unwrap())
}

/// The tiny CustomVoice checkpoint the server synthesises with, for the element's local runs.
fn tiny_model() -> String {
    reference_util::fixture_model("tiny-customvoice")
}

fn assert_completed(reason: &FinishReason) {
    assert!(
        matches!(reason, FinishReason::Eos | FinishReason::Length),
        "{reason:?}"
    );
}

/// What the engine itself gives for the request, as the server quantises it.
fn local(r: &SpeechRequest) -> (Vec<f32>, FinishReason, usize) {
    let body: serde_json::Value = serde_json::from_slice(&r.to_json()).unwrap();
    let req = engine_request(&ENGINE, &body).unwrap();
    let run = engine_common::run(&ENGINE, req);
    let quantised = pcm16(&run.audio)
        .chunks_exact(2)
        .map(|b| s16_to_f32(i16::from_le_bytes([b[0], b[1]])))
        .collect();
    (quantised, run.reason, run.metrics.frames)
}

#[test]
fn both_stream_forms_give_the_engine_samples_frames_and_reason() {
    let s = server();
    let c = client(&s.url, |_| {});
    for protocol in [StreamProtocol::Pcm, StreamProtocol::Sse] {
        let r = request("Hello from the server.", protocol);
        let want = local(&r);
        let got = run(&c, r);
        assert!(!want.0.is_empty());
        assert_eq!(got.0, want.0, "{protocol:?} samples");
        assert_eq!(got.2, want.2, "{protocol:?} frames");
        assert_eq!(got.1, want.1, "{protocol:?} reason");
    }
    let sent = s.speech_requests();
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0].body.as_ref().unwrap()["stream_format"], "audio");
    assert_eq!(sent[1].body.as_ref().unwrap()["stream_format"], "sse");
    assert_eq!(sent[0].body.as_ref().unwrap()["response_format"], "pcm");
}

#[test]
fn a_full_frame_budget_is_reported_as_length() {
    let s = server();
    let c = client(&s.url, |_| {});
    let mut r = request(
        "A longer sentence that needs more than a few frames.",
        StreamProtocol::Pcm,
    );
    r.max_new_tokens = Some(4);
    let want = local(&r);
    assert_eq!(want.1, FinishReason::Length);
    let (audio, reason, frames) = run(&c, r);
    // The last of max_new_tokens tokens has no frame.
    assert_eq!(frames, 3);
    assert_eq!(audio.len(), 3 * 1920);
    assert_eq!(audio, want.0);
    assert_eq!(reason, FinishReason::Length);
}

#[test]
fn probe_lists_models_and_voices_and_checks_the_model_name() {
    let s = server();
    let info = client(&s.url, |_| {}).probe().expect("probe");
    assert_eq!(info.models, vec![MODEL.to_string()]);
    assert!(info.voices.unwrap().contains(&"ryan".to_string()));
    let e = client(&s.url, |o| o.model = Some("other".into()))
        .probe()
        .unwrap_err()
        .to_string();
    assert!(e.contains("'other'") && e.contains(MODEL), "{e}");
}

#[test]
fn connection_refused_and_dns_failures_name_the_server() {
    let dead = dead_endpoint();
    let c = client(&dead, |_| {});
    let e = c.probe().unwrap_err();
    assert!(matches!(e, RemoteError::Connect { .. }), "{e:?}");
    assert!(e.to_string().contains(&dead), "{e}");
    let (audio, reason, _) = run(&c, request("x", StreamProtocol::Pcm));
    assert!(audio.is_empty());
    assert!(error_of(&reason).contains("cannot connect"), "{reason:?}");

    let c = client("http://omnitts-no-such-host.invalid:8091", |_| {});
    let e = c.probe().unwrap_err();
    assert!(matches!(e, RemoteError::Dns { .. }), "{e:?}");
    assert!(
        e.to_string().contains("omnitts-no-such-host.invalid"),
        "{e}"
    );
}

#[test]
fn http_errors_carry_the_server_message() {
    let s = server();
    let c = client(&s.url, |_| {});
    s.fault(Fault::Status {
        status: 400,
        body: r#"{"error":{"message":"Invalid voice 'zz'. Supported: aiden, ryan","type":"BadRequestError","param":null,"code":400}}"#.into(),
    });
    let (_, reason, _) = run(&c, request("x", StreamProtocol::Pcm));
    let e = error_of(&reason);
    assert!(
        e.contains("HTTP 400") && e.contains("Invalid voice 'zz'"),
        "{e}"
    );
    s.fault(Fault::Status {
        status: 500,
        body: "engine exploded".into(),
    });
    let (_, reason, _) = run(&c, request("x", StreamProtocol::Pcm));
    let e = error_of(&reason);
    assert!(
        e.contains("HTTP 500") && e.contains("engine exploded"),
        "{e}"
    );
}

#[test]
fn a_busy_server_is_retried_then_reported() {
    let s = server();
    let c = client(&s.url, |o| o.retries = 2);
    s.fault(Fault::Busy);
    let (audio, reason, _) = run(&c, request("Retry me.", StreamProtocol::Pcm));
    assert_completed(&reason);
    assert!(!audio.is_empty());
    assert_eq!(s.speech_requests().len(), 2);

    for _ in 0..3 {
        s.fault(Fault::Busy);
    }
    let (audio, reason, _) = run(&c, request("Retry me.", StreamProtocol::Pcm));
    assert!(audio.is_empty());
    let e = error_of(&reason);
    assert!(e.contains("HTTP 503") && e.contains("queue is full"), "{e}");
    assert!(e.contains("after 2 retries"), "{e}");
    assert_eq!(s.speech_requests().len(), 5);
}

#[test]
fn a_stream_cut_off_keeps_its_audio_and_says_so() {
    let s = server();
    let c = client(&s.url, |_| {});
    for protocol in [StreamProtocol::Pcm, StreamProtocol::Sse] {
        s.fault(Fault::CutOff { chunks: 1 });
        let (audio, reason, frames) = run(&c, request("Cut me off.", protocol));
        let e = error_of(&reason);
        assert!(
            e.contains("cut off") || e.contains("ended without"),
            "{protocol:?}: {e}"
        );
        // The first chunk of the built-in schedule: one frame.
        assert_eq!(audio.len(), 1920, "{protocol:?}");
        assert_eq!(frames, 1);
    }
    s.fault(Fault::SseError {
        chunks: 1,
        message: "CUDA out of memory".into(),
    });
    let (audio, reason, _) = run(&c, request("Fail me.", StreamProtocol::Sse));
    assert!(
        error_of(&reason).contains("CUDA out of memory"),
        "{reason:?}"
    );
    assert_eq!(audio.len(), 1920);
}

#[test]
fn a_stalled_server_times_out_and_a_cancel_closes_the_connection() {
    let s = server();
    let c = client(&s.url, |o| o.timeout = Duration::from_secs(1));
    s.fault(Fault::Stall { chunks: 1 });
    let t0 = Instant::now();
    let (audio, reason, _) = run(&c, request("Stall.", StreamProtocol::Pcm));
    let took = t0.elapsed();
    let e = error_of(&reason);
    assert!(e.contains("sent nothing for 1.0 s"), "{e}");
    assert_eq!(audio.len(), 1920);
    assert!(took < Duration::from_secs(20), "{took:?}");

    let c = client(&s.url, |o| o.timeout = Duration::from_secs(60));
    s.fault(Fault::Stall { chunks: 1 });
    let h = c.submit(request("Stall.", StreamProtocol::Pcm)).unwrap();
    // Wait for the first audio, then cancel the stalled request.
    loop {
        match h.recv().expect("events") {
            gstomnitts::engine::EngineEvent::Audio(_) => break,
            gstomnitts::engine::EngineEvent::Finished { reason, .. } => panic!("{reason:?}"),
            _ => {}
        }
    }
    let closed_before = s.closed().len();
    let t0 = Instant::now();
    h.cancel();
    let (_, reason, _) = h.collect().unwrap();
    assert_eq!(reason, FinishReason::Cancelled);
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    // The server sees the connection closed.
    while s.closed().len() == closed_before {
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "connection still open"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn wrong_content_types_and_rates_are_refused() {
    let s = server();
    let c = client(&s.url, |_| {});
    for (ct, words) in [
        (
            "application/json",
            vec!["unexpected content type", "application/json"],
        ),
        ("audio/pcm; rate=16000", vec!["16000 Hz", "24000 Hz"]),
        ("audio/wav", vec!["audio/wav"]),
    ] {
        s.fault(Fault::ContentType(ct.into()));
        let (audio, reason, _) = run(&c, request("x", StreamProtocol::Pcm));
        let e = error_of(&reason);
        assert!(words.iter().all(|w| e.contains(w)), "{ct}: {e}");
        assert!(audio.is_empty());
    }
}

#[test]
fn https_to_a_plain_server_is_a_tls_error() {
    let s = server();
    let url = s.url.replace("http://", "https://");
    let c = client(&url, |_| {});
    let e = c.probe().unwrap_err();
    assert!(matches!(e, RemoteError::Tls { .. }), "{e:?}");
    assert!(e.to_string().contains("TLS error"), "{e}");
    let (_, reason, _) = run(&c, request("x", StreamProtocol::Pcm));
    assert!(error_of(&reason).contains("TLS error"), "{reason:?}");
}

#[test]
fn the_api_key_goes_in_the_authorization_header_only() {
    let key = "sk-omnitts-test-0123456789";
    let s = server();
    s.require_key(key);
    let c = client(&s.url, |o| o.api_key = ApiKey::new(key));
    c.probe().expect("probe with the key");
    let (audio, reason, _) = run(&c, request("With a key.", StreamProtocol::Pcm));
    assert_completed(&reason);
    assert!(!audio.is_empty());
    for r in s.received() {
        assert_eq!(
            r.header("authorization"),
            Some(format!("Bearer {key}").as_str())
        );
        let body = r.body.map(|b| b.to_string()).unwrap_or_default();
        assert!(!body.contains(key), "key in the body: {body}");
    }
    assert!(!format!("{:?}", c.options()).contains(key));

    let c = client(&s.url, |_| {});
    let e = c.probe().unwrap_err().to_string();
    assert!(
        e.contains("HTTP 401") && e.contains("invalid API key"),
        "{e}"
    );
    let (_, reason, _) = run(&c, request("x", StreamProtocol::Pcm));
    assert!(error_of(&reason).contains("HTTP 401"));
    assert!(!error_of(&reason).contains(key));
}

// ---------------------------------------------------------------------------------------------
// omnittssrc server=...

use element_util::{
    assert_names, drain, element_messages, errors, init, pts_of, serial, start_must_fail,
    wait_element_message, warnings,
};
use gst::prelude::*;
use gst_check::Harness;
use gstomnitts::element_common::messages;

/// The voice settings both paths get: the same utterance locally and on the server.
fn voice_props() -> Vec<(&'static str, gst::glib::Value)> {
    vec![
        ("speaker", "ryan".to_value()),
        ("language", "english".to_value()),
        ("seed", 7u64.to_value()),
        ("max-new-tokens", 40u32.to_value()),
    ]
}

/// A harness on `omnittssrc` with a bus and `props`; `caps` the sink caps (`None`: F32LE).
fn harness(props: &[(&str, gst::glib::Value)], caps: Option<&str>) -> (Harness, gst::Bus) {
    init();
    let mut h = Harness::new("omnittssrc");
    let e = h.element().expect("element");
    let bus = gst::Bus::new();
    e.set_bus(Some(&bus));
    for (k, v) in props {
        let pspec = e
            .find_property(k)
            .unwrap_or_else(|| panic!("no property {k}"));
        match v.get::<&str>() {
            // Enums by their nick.
            Ok(nick) if pspec.value_type() != String::static_type() => {
                e.set_property_from_str(k, nick)
            }
            _ => e.set_property_from_value(k, v),
        }
    }
    if let Some(c) = caps {
        h.set_sink_caps_str(c);
    }
    (h, bus)
}

fn pull_all(h: &mut Harness) -> Vec<gst::Buffer> {
    let mut out = Vec::new();
    loop {
        match h.pull_until_eos() {
            Ok(Some(b)) => out.push(b),
            Ok(None) => return out,
            Err(e) => panic!("pull failed after {} buffers: {e}", out.len()),
        }
    }
}

/// Checks offsets, PTS and durations of `bufs` (contiguous from 0, DISCONT first) with `bytes`
/// per sample; returns the raw bytes.
fn timeline(bufs: &[gst::Buffer], bytes: usize) -> Vec<u8> {
    let mut n = 0u64;
    let mut data = Vec::new();
    for (i, b) in bufs.iter().enumerate() {
        let len = (b.size() / bytes) as u64;
        assert!(
            len > 0 && b.size() % bytes == 0,
            "buffer {i}: size {}",
            b.size()
        );
        assert_eq!(b.offset(), n, "buffer {i}: offset");
        assert_eq!(b.offset_end(), n + len, "buffer {i}: offset_end");
        assert_eq!(b.pts(), Some(pts_of(n)), "buffer {i}: pts");
        assert_eq!(
            b.duration(),
            Some(pts_of(n + len) - pts_of(n)),
            "buffer {i}"
        );
        assert_eq!(
            b.flags().contains(gst::BufferFlags::DISCONT),
            i == 0,
            "buffer {i}"
        );
        data.extend_from_slice(&b.map_readable().unwrap());
        n += len;
    }
    data
}

/// The failures on the bus: error messages, and the warnings of failed utterances (`synthesis of
/// utterance N failed`, a warning as the stream goes on), as "text | debug" strings.
fn failures(msgs: &[gst::Message]) -> Vec<String> {
    let mut out = errors(msgs);
    out.extend(
        warnings(msgs)
            .into_iter()
            .filter(|w| w.starts_with("synthesis of utterance")),
    );
    out
}

/// Runs `props` to EOS: the output bytes (timeline checked), the done messages, the bus failures
/// ([`failures`]).
fn run_element(
    props: &[(&str, gst::glib::Value)],
    caps: Option<&str>,
    bytes: usize,
) -> (Vec<u8>, Vec<gst::Structure>, Vec<String>) {
    let (mut h, bus) = harness(props, caps);
    h.play();
    let data = timeline(&pull_all(&mut h), bytes);
    let msgs = drain(&bus);
    (
        data,
        element_messages(&msgs, messages::DONE),
        failures(&msgs),
    )
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn field<'a, T: gst::glib::value::FromValue<'a>>(s: &'a gst::Structure, f: &str) -> T {
    s.get::<T>(f)
        .unwrap_or_else(|e| panic!("{}: field {f}: {e}", s.name()))
}

const S16_CAPS: &str = "audio/x-raw,format=S16LE,rate=24000,channels=1,layout=interleaved";

#[test]
fn the_element_gives_the_local_samples_frames_and_timestamps_through_the_server() {
    let s = server();
    let text = ("text", "Hello there. This is the second one.".to_value());
    let split = ("split-sentences", "true".to_value());
    let mut local = voice_props();
    local.extend([
        ("model", tiny_model().to_value()),
        text.clone(),
        split.clone(),
    ]);
    let (want_f32, want_done, errs) = run_element(&local, None, 4);
    assert!(errs.is_empty(), "{errs:?}");
    assert_eq!(want_done.len(), 2, "two sentences, two utterances");
    let (want_s16, _, _) = run_element(&local, Some(S16_CAPS), 2);
    let want = f32s(&want_f32);
    for protocol in ["pcm", "sse"] {
        let mut remote = voice_props();
        remote.extend([("server", s.url.to_value()), text.clone(), split.clone()]);
        let (mut h, bus) = harness(&remote, None);
        h.element()
            .unwrap()
            .set_property_from_str("server-protocol", protocol);
        h.play();
        let got = f32s(&timeline(&pull_all(&mut h), 4));
        let msgs = drain(&bus);
        assert!(errors(&msgs).is_empty(), "{protocol}: {:?}", errors(&msgs));
        assert_eq!(got.len(), want.len(), "{protocol}: samples");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            // The server's 16-bit samples: within half a step of the engine's floats.
            assert!(
                (g - w).abs() <= 0.5 / 32767.0 + 1e-6,
                "{protocol}: sample {i}: {g} vs {w}"
            );
        }
        let done = element_messages(&msgs, messages::DONE);
        assert_eq!(done.len(), 2, "{protocol}");
        for (d, w) in done.iter().zip(&want_done) {
            for f in ["frames", "samples", "pts", "duration"] {
                assert_eq!(field::<u64>(d, f), field::<u64>(w, f), "{protocol}: {f}");
            }
            assert_eq!(
                field::<&str>(d, "reason"),
                field::<&str>(w, "reason"),
                "{protocol}"
            );
            assert!(field::<f64>(d, "ttfa-ms") > 0.0 && field::<f64>(d, "rtf") > 0.0);
        }
        assert_eq!(element_messages(&msgs, messages::STARTED).len(), 2);
        assert_eq!(element_messages(&msgs, messages::FIRST_AUDIO).len(), 2);
        // S16LE: the server's integers, which are the local element's S16 output.
        let (mut h, _) = harness(&remote, Some(S16_CAPS));
        h.element()
            .unwrap()
            .set_property_from_str("server-protocol", protocol);
        h.play();
        let got_s16 = timeline(&pull_all(&mut h), 2);
        assert!(got_s16 == want_s16, "{protocol}: S16LE output differs");
    }
    let sent = s.speech_requests();
    assert_eq!(sent.len(), 8);
    let body = sent[0].body.as_ref().unwrap();
    assert_eq!(body["input"], "Hello there.");
    assert_eq!(body["voice"], "ryan");
    assert_eq!(body["language"], "English");
    assert_eq!(body["seed"], 7);
    assert_eq!(body["max_new_tokens"], 40);
    assert_eq!(sent[4].body.as_ref().unwrap()["stream_format"], "sse");
}

/// A second served model: the tiny Base checkpoint, for voice cloning.
const BASE_MODEL: &str = "Qwen/Qwen3-TTS-12Hz-tiny-Base";

static BASE_ENGINE: LazyLock<Arc<Engine>> = LazyLock::new(|| {
    Arc::new(engine_common::load(
        "tiny-base",
        engine_common::config(|_| {}),
    ))
});

/// Writes a voice-like 24 kHz 16-bit WAV of `secs` seconds (a 140 Hz tone and its harmonics,
/// swelling) as `name`.
fn tone_wav(dir: &element_util::TempDir, name: &str, secs: f32) -> String {
    let path = dir.path().join(name);
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 24_000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(&path, spec).unwrap();
    for i in 0..(secs * 24_000.0) as usize {
        let t = i as f32 / 24_000.0;
        let env = (std::f32::consts::PI * t / secs).sin();
        let x: f32 = (1..=4)
            .map(|k| (2.0 * std::f32::consts::PI * 140.0 * k as f32 * t).sin() / k as f32)
            .sum();
        w.write_sample((0.3 * env * x * 32768.0).round() as i16)
            .unwrap();
    }
    w.finalize().unwrap();
    path.to_str().unwrap().to_string()
}

/// Writes a 1.5 s voice-like 24 kHz float WAV (a 140 Hz tone and its harmonics, swelling).
fn reference_wav(dir: &element_util::TempDir) -> String {
    let path = dir.path().join("ref.wav");
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 24_000,
        bits_per_sample: 32,
        sample_format: hound::SampleFormat::Float,
    };
    let mut w = hound::WavWriter::create(&path, spec).unwrap();
    for x in speech_server::uploaded_reference() {
        w.write_sample(x).unwrap();
    }
    w.finalize().unwrap();
    path.to_str().unwrap().to_string()
}

/// The 16-bit samples of the `ref_audio` WAV data URL of the last speech request, checked to be
/// 24 kHz mono 16-bit PCM of 2 bytes a sample.
fn sent_reference(s: &SpeechServer) -> Vec<i16> {
    use base64::Engine as _;
    let body = s.speech_requests().last().unwrap().body.clone().unwrap();
    let url = body["ref_audio"].as_str().unwrap_or_default().to_string();
    let b64 = url
        .strip_prefix("data:audio/wav;base64,")
        .unwrap_or_else(|| panic!("not a WAV data URL: {:.80}", url));
    let wav = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap();
    let len = wav.len();
    let mut r = hound::WavReader::new(std::io::Cursor::new(wav)).unwrap();
    let spec = r.spec();
    assert_eq!(
        (
            spec.sample_rate,
            spec.channels,
            spec.bits_per_sample,
            spec.sample_format
        ),
        (24_000, 1, 16, hound::SampleFormat::Int),
        "{spec:?}"
    );
    let samples: Vec<i16> = r.samples::<i16>().map(Result::unwrap).collect();
    assert_eq!(
        len,
        44 + 2 * samples.len(),
        "a 44-byte header, 2 bytes a sample"
    );
    samples
}

/// A local `ref-audio` travels as a 16-bit PCM WAV (half a float WAV's size): a float recording
/// within half a 16-bit step of its samples, a 16-bit one sample for sample.
#[test]
fn a_local_reference_is_sent_as_a_16_bit_pcm_wav() {
    let _serial = serial();
    let s = SpeechServer::start(BASE_ENGINE.clone(), BASE_MODEL);
    let dir = element_util::TempDir::new("remote-ref16");
    let reference = speech_server::uploaded_reference();
    let float_wav = reference_wav(&dir);
    let ints: Vec<i16> = reference
        .iter()
        .map(|x| (x * 32768.0).round() as i16)
        .collect();
    let int_wav = dir.path().join("ref16.wav");
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 24_000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(&int_wav, spec).unwrap();
    for &v in &ints {
        w.write_sample(v).unwrap();
    }
    w.finalize().unwrap();
    for (wav, sixteen) in [(float_wav, false), (int_wav.to_str().unwrap().into(), true)] {
        let props = [
            ("server", s.url.to_value()),
            ("ref-audio", wav.to_value()),
            ("ref-text", "A reference recording.".to_value()),
            ("seed", 7u64.to_value()),
            ("max-new-tokens", 8u32.to_value()),
            ("text", "Hello.".to_value()),
        ];
        let (data, done, errs) = run_element(&props, None, 4);
        assert!(errs.is_empty(), "{wav}: {errs:?}");
        assert!(!data.is_empty() && done.len() == 1, "{wav}");
        let sent = sent_reference(&s);
        assert_eq!(sent.len(), reference.len(), "{wav}: 1.5 s at 24 kHz");
        if sixteen {
            assert!(sent == ints, "{wav}: the recording's own 16-bit samples");
        } else {
            for (i, (v, x)) in sent.iter().zip(&reference).enumerate() {
                assert!(
                    (*v as f32 / 32768.0 - x).abs() <= 0.5 / 32768.0 + 1e-7,
                    "{wav}: sample {i}: {v} for {x}"
                );
            }
        }
    }
}

#[test]
fn voice_cloning_through_the_server_speaks_as_the_local_element() {
    let _serial = serial();
    let s = SpeechServer::start(BASE_ENGINE.clone(), BASE_MODEL);
    let dir = element_util::TempDir::new("remote-clone");
    let wav = reference_wav(&dir);
    for x_vector_only in [false, true] {
        let mut props = vec![
            ("ref-audio", wav.to_value()),
            ("ref-text", "A reference recording.".to_value()),
            ("x-vector-only", x_vector_only.to_value()),
            ("seed", 7u64.to_value()),
            ("max-new-tokens", 30u32.to_value()),
            ("text", "Hello in that voice.".to_value()),
        ];
        let mut local = props.clone();
        local.push((
            "model",
            reference_util::fixture_model("tiny-base").to_value(),
        ));
        let (want, want_done, errs) = run_element(&local, None, 4);
        assert!(errs.is_empty(), "{errs:?}");
        props.push(("server", s.url.to_value()));
        let (got, done, errs) = run_element(&props, None, 4);
        assert!(errs.is_empty(), "x-vector-only={x_vector_only}: {errs:?}");
        let (got, want) = (f32s(&got), f32s(&want));
        assert!(!want.is_empty());
        assert_eq!(got.len(), want.len(), "x-vector-only={x_vector_only}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 0.5 / 32767.0 + 1e-6,
                "x-vector-only={x_vector_only}: sample {i}: {g} vs {w}"
            );
        }
        assert_eq!(
            field::<u64>(&done[0], "frames"),
            field::<u64>(&want_done[0], "frames")
        );
    }
    let sent = s.speech_requests();
    assert_eq!(sent.len(), 2);
    let body = sent[0].body.as_ref().unwrap();
    assert_eq!(body["task_type"], "Base");
    assert_eq!(body["ref_text"], "A reference recording.");
    assert_eq!(body["x_vector_only_mode"], false);
    assert!(
        body["ref_audio"]
            .as_str()
            .is_some_and(|u| u.starts_with("data:audio/wav;base64,")),
        "{body}"
    );
    assert_eq!(sent[1].body.as_ref().unwrap()["x_vector_only_mode"], true);
    // A reference the server could not use is refused at start, naming ref-audio.
    let silent = dir.path().join("silent.wav");
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 24_000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(&silent, spec).unwrap();
    for _ in 0..24_000 {
        w.write_sample(0i16).unwrap();
    }
    w.finalize().unwrap();
    let e = gst::ElementFactory::make("omnittssrc").build().unwrap();
    e.set_property("server", &s.url);
    e.set_property("ref-audio", silent.to_str().unwrap());
    e.set_property("x-vector-only", true);
    e.set_property("text", "Hello.");
    assert_names(&start_must_fail(&e, "silent"), &["ref-audio", "silent"]);
}

#[test]
fn the_server_voices_are_the_available_speakers() {
    let s = server();
    let (mut h, _) = harness(
        &[("server", s.url.to_value()), ("text", "Hi.".to_value())],
        None,
    );
    h.play();
    let e = h.element().unwrap();
    let speakers: String = e.property("available-speakers");
    assert!(speakers.split(',').any(|v| v == "ryan"), "{speakers}");
    assert_eq!(e.property::<u64>("voice-clone-encodes"), 0);
    pull_all(&mut h);
}

#[test]
fn properties_without_a_request_field_are_refused() {
    let s = server();
    init();
    for (property, value) in [
        ("repetition-penalty", 1.1f64.to_value()),
        ("do-sample", false.to_value()),
        ("chunk-frames", 4u32.to_value()),
        ("model", tiny_model().to_value()),
        ("ar-device", "cpu".to_value()),
        ("stage-config", "configs/qwen3_tts.yaml".to_value()),
    ] {
        let e = gst::ElementFactory::make("omnittssrc").build().unwrap();
        e.set_property("server", &s.url);
        e.set_property("text", "Hello.");
        e.set_property_from_value(property, &value);
        let errs = start_must_fail(&e, property);
        assert_names(&errs, &[property, "server"]);
    }
    // Set while playing: the next text is refused in stream order, naming the property.
    let (mut h, bus) = harness(
        &[("server", s.url.to_value()), ("text", "First.".to_value())],
        None,
    );
    let (pad, probe) = element_util::play_holding_first_buffer(&mut h);
    let e = h.element().unwrap();
    e.set_property("repetition-penalty", 1.2f64);
    assert!(!e.emit_by_name::<bool>("push-text", &[&"Second."]));
    pad.remove_probe(probe);
    pull_all(&mut h);
    let errs = errors(&drain(&bus));
    assert_names(&errs, &["repetition-penalty", "server"]);
}

#[test]
fn an_unusable_server_fails_the_state_change() {
    init();
    let dead = dead_endpoint();
    let plain = server();
    let https = plain.url.replace("http://", "https://");
    for (url, words) in [
        (dead.as_str(), vec!["cannot connect", dead.as_str()]),
        (
            "http://omnitts-no-such-host.invalid:8091",
            vec!["cannot resolve", "omnitts-no-such-host.invalid"],
        ),
        (https.as_str(), vec!["TLS error"]),
        ("gpu-host:8091", vec!["server", "gpu-host:8091", "scheme"]),
    ] {
        let e = gst::ElementFactory::make("omnittssrc").build().unwrap();
        e.set_property("server", url);
        e.set_property("text", "Hello.");
        let errs = start_must_fail(&e, url);
        assert_names(&errs, &words);
        if url == "gpu-host:8091" {
            // The property and its value named once, then the reason.
            let msg = errs[0].split(" | ").next().unwrap_or_default();
            assert_eq!(msg.matches("gpu-host:8091").count(), 1, "{msg}");
        }
    }
    let e = gst::ElementFactory::make("omnittssrc").build().unwrap();
    e.set_property("server", &plain.url);
    e.set_property("server-model", "not-served");
    e.set_property("text", "Hello.");
    assert_names(&start_must_fail(&e, "server-model"), &["not-served", MODEL]);
    let e = gst::ElementFactory::make("omnittssrc").build().unwrap();
    e.set_property("server", &plain.url);
    e.set_property("speaker", "zoe");
    e.set_property("text", "Hello.");
    assert_names(&start_must_fail(&e, "speaker"), &["speaker", "zoe", "ryan"]);
}

/// Plays `texts` (one utterance each, pushed before start) through the server with `props`;
/// returns the done messages, the warnings of the failed utterances (no error message may come:
/// the stream goes on) and the samples output (timeline checked).
fn run_texts(
    s: &SpeechServer,
    props: &[(&str, gst::glib::Value)],
    texts: &[&str],
) -> (Vec<gst::Structure>, Vec<String>, u64) {
    let mut all = voice_props();
    all.push(("server", s.url.to_value()));
    all.extend(props.iter().cloned());
    let (mut h, bus) = harness(&all, None);
    let e = h.element().unwrap();
    // Queued before start: an utterance that fails without audio must not end the stream.
    for t in texts {
        assert!(e.emit_by_name::<bool>("push-text", &[t]));
    }
    h.play();
    let data = timeline(&pull_all(&mut h), 4);
    let msgs = drain(&bus);
    assert!(errors(&msgs).is_empty(), "{:?}", errors(&msgs));
    (
        element_messages(&msgs, messages::DONE),
        failures(&msgs),
        (data.len() / 4) as u64,
    )
}

fn reason(d: &gst::Structure) -> &str {
    field::<&str>(d, "reason")
}

#[test]
fn a_server_error_ends_the_utterance_and_the_next_one_is_tried() {
    let _serial = serial();
    let s = server();
    s.fault(Fault::Status {
        status: 400,
        body: r#"{"error":{"message":"Invalid voice 'zz'","type":"BadRequestError","param":null,"code":400}}"#.into(),
    });
    s.fault(Fault::Status {
        status: 500,
        body: "out of memory".into(),
    });
    let (done, errs, samples) = run_texts(&s, &[], &["One.", "Two.", "Three."]);
    assert_eq!(done.len(), 3);
    assert_eq!(reason(&done[0]), "error");
    assert!(field::<&str>(&done[0], "error").contains("Invalid voice 'zz'"));
    assert_eq!(reason(&done[1]), "error");
    assert_names(&errs, &["utterance 1", "HTTP 400", "Invalid voice 'zz'"]);
    assert_names(&errs, &["utterance 2", "HTTP 500", "out of memory"]);
    assert!(
        matches!(reason(&done[2]), "eos" | "length"),
        "{:?}",
        done[2]
    );
    assert_eq!(samples, field::<u64>(&done[2], "samples"));
    assert!(samples > 0);
}

#[test]
fn a_server_gone_after_start_fails_the_next_utterance_and_keeps_the_audio() {
    let _serial = serial();
    let s = server();
    let url = s.url.clone();
    let mut props = voice_props();
    props.extend([("server", url.to_value()), ("text", "First.".to_value())]);
    let (mut h, bus) = harness(&props, None);
    let (pad, probe) = element_util::play_holding_first_buffer(&mut h);
    // The first utterance streams on its open connection; nothing listens for the second.
    drop(s);
    let e = h.element().unwrap();
    assert!(e.emit_by_name::<bool>("push-text", &[&"Second."]));
    pad.remove_probe(probe);
    let t0 = Instant::now();
    let samples = (timeline(&pull_all(&mut h), 4).len() / 4) as u64;
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    let msgs = drain(&bus);
    let done = element_messages(&msgs, messages::DONE);
    assert_eq!(done.len(), 2, "{done:?}");
    assert!(
        matches!(reason(&done[0]), "eos" | "length"),
        "{:?}",
        done[0]
    );
    assert_eq!(reason(&done[1]), "error");
    assert_eq!(field::<u64>(&done[1], "samples"), 0);
    assert!(
        field::<&str>(&done[1], "error").contains("cannot connect"),
        "{:?}",
        done[1]
    );
    // Every sample of the first utterance came out before the second failed.
    assert_eq!(samples, field::<u64>(&done[0], "samples"));
    assert!(samples > 0);
    assert_names(
        &failures(&msgs),
        &["utterance 2", "cannot connect", url.as_str()],
    );
}

#[test]
fn a_busy_server_is_retried_up_to_server_retries() {
    let _serial = serial();
    let s = server();
    s.fault(Fault::Busy);
    s.fault(Fault::Busy);
    s.fault(Fault::Busy);
    let (done, errs, _) = run_texts(
        &s,
        &[("server-retries", 1u32.to_value())],
        &["One.", "Two."],
    );
    assert_eq!(reason(&done[0]), "error");
    assert_names(&errs, &["HTTP 503", "queue is full", "after 1 retry"]);
    // The third 503 is retried once more, then the second utterance speaks.
    assert!(
        matches!(reason(&done[1]), "eos" | "length"),
        "{:?}",
        done[1]
    );
    assert_eq!(s.speech_requests().len(), 4);
}

#[test]
fn a_stream_cut_off_keeps_its_audio_and_the_next_utterance_is_tried() {
    let _serial = serial();
    let s = server();
    for protocol in ["pcm", "sse"] {
        s.fault(Fault::CutOff { chunks: 1 });
        let (done, errs, samples) = run_texts(
            &s,
            &[("server-protocol", protocol.to_value())],
            &["Cut off.", "Whole."],
        );
        assert_eq!(reason(&done[0]), "error", "{protocol}");
        // The first chunk (one frame) was received and output.
        assert_eq!(field::<u64>(&done[0], "samples"), 1920, "{protocol}");
        assert_eq!(field::<u64>(&done[0], "frames"), 1, "{protocol}");
        assert_names(&errs, &["utterance 1"]);
        assert!(matches!(reason(&done[1]), "eos" | "length"), "{protocol}");
        assert_eq!(
            samples,
            1920 + field::<u64>(&done[1], "samples"),
            "{protocol}: both utterances' audio, back to back"
        );
    }
    s.fault(Fault::SseError {
        chunks: 1,
        message: "CUDA out of memory".into(),
    });
    let (done, errs, _) = run_texts(&s, &[("server-protocol", "sse".to_value())], &["Fail."]);
    assert_eq!(reason(&done[0]), "error");
    assert_eq!(field::<u64>(&done[0], "samples"), 1920);
    assert_names(&errs, &["CUDA out of memory"]);
}

#[test]
fn a_wrong_content_type_or_rate_fails_the_utterance() {
    let _serial = serial();
    let s = server();
    s.fault(Fault::ContentType("audio/pcm; rate=16000".into()));
    s.fault(Fault::ContentType("audio/mpeg".into()));
    let (done, errs, _) = run_texts(&s, &[], &["One.", "Two.", "Three."]);
    assert_eq!(reason(&done[0]), "error");
    assert_eq!(field::<u64>(&done[0], "samples"), 0);
    assert_names(&errs, &["16000 Hz", "24000 Hz"]);
    assert_names(&errs, &["unexpected content type", "audio/mpeg"]);
    assert!(matches!(reason(&done[2]), "eos" | "length"));
}

#[test]
fn a_stalled_server_times_out_and_null_during_a_stall_returns_within_a_second() {
    let _serial = serial();
    let s = server();
    s.fault(Fault::Stall { chunks: 1 });
    let (done, errs, _) = run_texts(&s, &[("server-timeout", 1u32.to_value())], &["Stall."]);
    assert_eq!(reason(&done[0]), "error");
    assert_eq!(field::<u64>(&done[0], "samples"), 1920);
    assert_names(&errs, &["sent nothing for 1.0 s", "server-timeout"]);

    for how in ["null", "cancel"] {
        s.fault(Fault::Stall { chunks: 1 });
        let mut props = voice_props();
        props.push(("server", s.url.to_value()));
        props.push(("text", "Stall.".to_value()));
        let (mut h, bus) = harness(&props, None);
        h.play();
        h.pull().expect("the first chunk's audio");
        let closed = s.closed().len();
        let t0 = Instant::now();
        if how == "null" {
            h.element().unwrap().set_state(gst::State::Null).unwrap();
        } else {
            assert!(h.element().unwrap().emit_by_name::<bool>("cancel", &[]));
            let mut seen = Vec::new();
            let d = wait_element_message(&bus, messages::DONE, Duration::from_secs(1), &mut seen)
                .expect("done message within a second of cancel");
            assert_eq!(reason(&d), "cancelled");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "{how} took {:?}",
            t0.elapsed()
        );
        while s.closed().len() == closed {
            assert!(
                t0.elapsed() < Duration::from_secs(1),
                "{how}: connection still open"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(h);
    }
}

#[test]
fn the_api_key_is_sent_and_never_shown() {
    let _serial = serial();
    let key = "sk-omnitts-element-0123456789";
    let s = server();
    s.require_key(key);
    // The element's debug category exists once an element has logged (a property set).
    init();
    let e = gst::ElementFactory::make("omnittssrc").build().unwrap();
    e.set_property("text", "x");
    drop(e);
    // Everything the element logs, at every level.
    let log = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let sink = log.clone();
    let cat = gst::DebugCategory::get("omnittssrc").expect("category");
    let before = cat.threshold();
    cat.set_threshold(gst::DebugLevel::Memdump);
    let f = gst::log::add_log_function(move |cat, _level, _file, _func, _line, _obj, msg| {
        if cat.name() == "omnittssrc" {
            sink.lock()
                .unwrap()
                .push(msg.get().map(|m| m.to_string()).unwrap_or_default());
        }
    });
    gst::log::set_active(true);
    let (done, errs, samples) = run_texts(&s, &[("server-api-key", key.to_value())], &["Secret."]);
    gst::log::remove_log_function(f);
    cat.set_threshold(before);
    assert!(errs.is_empty(), "{errs:?}");
    assert!(samples > 0 && matches!(reason(&done[0]), "eos" | "length"));
    for r in s.received() {
        assert_eq!(
            r.header("authorization"),
            Some(format!("Bearer {key}").as_str())
        );
    }
    let log = log.lock().unwrap();
    assert!(
        log.iter().any(|l| l.contains("server-api-key")),
        "the setter logs its name"
    );
    assert!(!log.iter().any(|l| l.contains(key)), "key in the log");
    for d in &done {
        assert!(!d.to_string().contains(key));
    }
    // Set while playing: refused (NULL/READY only) with a warning that shows no key.
    let mut props = voice_props();
    props.extend([
        ("server", s.url.to_value()),
        ("server-api-key", key.to_value()),
        ("text", "Secret.".to_value()),
    ]);
    let (mut h, bus) = harness(&props, None);
    let (pad, probe) = element_util::play_holding_first_buffer(&mut h);
    let other = "sk-omnitts-other-9876543210";
    h.element().unwrap().set_property("server-api-key", other);
    pad.remove_probe(probe);
    pull_all(&mut h);
    let warned = element_util::warnings(&drain(&bus));
    assert_names(&warned, &["server-api-key", "NULL or READY"]);
    assert!(!warned.iter().any(|w| w.contains(other) || w.contains(key)));
    drop(h);
    // Without it the server's refusal fails the start, without showing a key.
    let e = gst::ElementFactory::make("omnittssrc").build().unwrap();
    e.set_property("server", &s.url);
    e.set_property("text", "Hello.");
    let errs = start_must_fail(&e, "no key");
    assert_names(&errs, &["HTTP 401", "invalid API key"]);
    assert!(!errs.iter().any(|m| m.contains(key)));
    // Write-only: it cannot be read back.
    let pspec = e.find_property("server-api-key").unwrap();
    assert!(!pspec.flags().contains(gst::glib::ParamFlags::READABLE));
}

#[test]
fn live_mode_keeps_its_latency_gap_silence_and_audio() {
    let _serial = serial();
    let s = server();
    let mut props = voice_props();
    props.extend([
        ("server", s.url.to_value()),
        ("text", "Live.".to_value()),
        ("is-live", true.to_value()),
    ]);
    let (mut h, bus) = harness(&props, None);
    h.use_systemclock();
    h.play();
    assert_eq!(h.query_latency(), Some(gst::ClockTime::from_mseconds(80)));
    let mut audio = Vec::new();
    let mut n = 0u64;
    let mut seen = Vec::new();
    let t0 = Instant::now();
    let mut base = None;
    let mut take = |b: gst::Buffer, audio: &mut Vec<f32>| {
        assert_eq!(b.offset(), n);
        // Live: the PTS runs from the running time of the first buffer.
        let base = *base.get_or_insert(b.pts().unwrap());
        assert_eq!(b.pts(), Some(base + pts_of(n)));
        n = b.offset_end();
        if !b.flags().contains(gst::BufferFlags::GAP) {
            audio.extend(f32s(&b.map_readable().unwrap()));
        }
    };
    while element_messages(&seen, messages::DONE).is_empty() {
        take(h.pull().expect("live buffer"), &mut audio);
        while let Some(m) = bus.pop() {
            seen.push(m);
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "no done message");
    }
    // The done message is posted by the create() after the last audio: everything before is queued.
    while h.buffers_in_queue() > 0 {
        take(h.pull().expect("live buffer"), &mut audio);
    }
    let done = &element_messages(&seen, messages::DONE)[0];
    assert!(matches!(reason(done), "eos" | "length"), "{done:?}");
    assert_eq!(audio.len() as u64, field::<u64>(done, "samples"));
    // The audio is the non-live run's (underruns only insert GAP silence).
    let mut local = voice_props();
    local.extend([
        ("model", tiny_model().to_value()),
        ("text", "Live.".to_value()),
    ]);
    let (want, _, _) = run_element(&local, None, 4);
    let want = f32s(&want);
    assert_eq!(audio.len(), want.len());
    for (i, (g, w)) in audio.iter().zip(&want).enumerate() {
        assert!((g - w).abs() <= 0.5 / 32767.0 + 1e-6, "sample {i}");
    }
    // Then GAP silence keeps the clock going.
    let b = h.pull().expect("live buffer");
    assert!(b.flags().contains(gst::BufferFlags::GAP));
}

// ---------------------------------------------------------------------------------------------
// vLLM-Omni's current speech server: base URLs, task types, limits, voices, errors.

/// The checkpoint path of the tiny fixtures as a server would be started with them.
const VOICE_DESIGN_ROOT: &str = "/models/Qwen3-TTS-12Hz-tiny-VoiceDesign";

/// An utterance that fails before any audio (an HTTP 400 with vLLM-Omni's JSON error body, a WAV
/// instead of PCM) must not stop the ones after it, in a pipeline, live or not: the later
/// utterance's audio reaches the sink, its done message comes, and (non-live) EOS. The failure
/// is a warning: GStreamer treats an error message as fatal, and a bin fails the state change in
/// progress on one, so an error posted before the first buffer reached the sink (the pipeline
/// still on its way to PLAYING) left the pipeline short of PLAYING, with the sink holding the
/// first buffer and nothing after it. A Harness (no bin) never showed it.
#[test]
fn a_failure_before_any_audio_does_not_stop_the_utterances_after_it() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let _serial = serial();
    let s = server();
    init();
    for live in [false, true] {
        for fault in [
            Fault::Status {
                status: 400,
                body: r#"{"error":{"message":"Invalid voice 'zz'. Supported: aiden, ryan","type":"BadRequestError","param":null,"code":400}}"#.into(),
            },
            Fault::ContentType("audio/wav".into()),
        ] {
            let what = format!("live={live} {fault:?}");
            s.fault(fault);
            let pipeline = gst::parse::launch(&format!(
                "omnittssrc name=src server={} speaker=ryan language=english seed=7 \
                 max-new-tokens=40 is-live={live} text=First. ! fakesink name=sink sync=false",
                s.url
            ))
            .unwrap()
            .downcast::<gst::Pipeline>()
            .unwrap();
            let src = pipeline.by_name("src").unwrap();
            // Queued behind the one that fails.
            assert!(src.emit_by_name::<bool>("push-text", &[&"Second."]));
            // The samples of audio (F32LE, not GAP) that reach the sink.
            let samples = Arc::new(AtomicU64::new(0));
            let counted = samples.clone();
            let sink = pipeline.by_name("sink").unwrap().static_pad("sink").unwrap();
            sink.add_probe(gst::PadProbeType::BUFFER, move |_, info| {
                if let Some(b) = info.buffer()
                    && !b.flags().contains(gst::BufferFlags::GAP)
                {
                    counted.fetch_add(b.size() as u64 / 4, Ordering::SeqCst);
                }
                gst::PadProbeReturn::Ok
            });
            let bus = pipeline.bus().unwrap();
            pipeline.set_state(gst::State::Playing).unwrap();
            let t0 = Instant::now();
            let mut seen = Vec::new();
            loop {
                let done = element_messages(&seen, messages::DONE).len();
                let eos = seen.iter().any(|m| m.type_() == gst::MessageType::Eos);
                // Live never ends by itself: the second done message is the end.
                if (live && done == 2) || eos {
                    break;
                }
                assert!(
                    t0.elapsed() < Duration::from_secs(30),
                    "{what}: {done} done messages, {} samples at the sink, state {:?}, errors {:?}",
                    samples.load(Ordering::SeqCst),
                    pipeline.state(gst::ClockTime::ZERO),
                    errors(&seen)
                );
                if let Some(m) = bus.timed_pop(gst::ClockTime::from_mseconds(50)) {
                    seen.push(m);
                }
            }
            assert_eq!(
                pipeline.state(gst::ClockTime::ZERO).1,
                gst::State::Playing,
                "{what}"
            );
            pipeline.set_state(gst::State::Null).unwrap();
            seen.extend(drain(&bus));
            assert!(errors(&seen).is_empty(), "{what}: {:?}", errors(&seen));
            assert_names(&warnings(&seen), &["synthesis of utterance 1 failed"]);
            let done = element_messages(&seen, messages::DONE);
            assert_eq!(done.len(), 2, "{what}: {done:?}");
            assert_eq!(reason(&done[0]), "error", "{what}");
            assert_eq!(field::<u64>(&done[0], "samples"), 0, "{what}");
            assert!(
                matches!(reason(&done[1]), "eos" | "length"),
                "{what}: {:?}",
                done[1]
            );
            let second = field::<u64>(&done[1], "samples");
            assert!(second > 0, "{what}");
            assert_eq!(samples.load(Ordering::SeqCst), second, "{what}");
        }
    }
}

#[test]
fn a_v1_base_url_is_accepted_and_a_server_without_a_model_list_fails_the_start() {
    let _serial = serial();
    let s = server();
    for url in [format!("{}/v1", s.url), format!("{}/v1/", s.url)] {
        let mut props = voice_props();
        props.extend([("server", url.to_value()), ("text", "Hello.".to_value())]);
        let (data, done, errs) = run_element(&props, None, 4);
        assert!(errs.is_empty(), "{url}: {errs:?}");
        assert!(matches!(reason(&done[0]), "eos" | "length"), "{url}");
        assert!(!data.is_empty());
    }
    let paths: Vec<String> = s.received().into_iter().map(|r| r.path).collect();
    assert!(paths.iter().all(|p| !p.starts_with("/v1/v1")), "{paths:?}");
    assert!(paths.iter().any(|p| p == "/v1/audio/speech"), "{paths:?}");
    // A URL where nothing answers the model list fails the start, naming the URL tried.
    init();
    let e = gst::ElementFactory::make("omnittssrc").build().unwrap();
    let wrong = format!("{}/api", s.url);
    e.set_property("server", &wrong);
    e.set_property("text", "Hello.");
    let errs = start_must_fail(&e, &wrong);
    assert_names(
        &errs,
        &["HTTP 404", &format!("{wrong}/v1/models"), "base URL"],
    );
}

#[test]
fn a_voice_design_model_under_an_alias_gets_its_task_type() {
    let _serial = serial();
    // Served as "my-tts": only the root (the checkpoint) tells the variant.
    let s = SpeechServer::start_as(ENGINE.clone(), "my-tts", VOICE_DESIGN_ROOT);
    let props = [
        ("server", s.url.to_value()),
        ("instruct", "A calm, low voice.".to_value()),
        ("max-new-tokens", 20u32.to_value()),
        ("text", "Hello.".to_value()),
    ];
    let (data, done, errs) = run_element(&props, None, 4);
    assert!(errs.is_empty(), "{errs:?}");
    assert!(matches!(reason(&done[0]), "eos" | "length"));
    assert!(!data.is_empty());
    let body = s.speech_requests()[0].body.clone().unwrap();
    assert_eq!(body["task_type"], "VoiceDesign");
    assert_eq!(body["instructions"], "A calm, low voice.");
    // VoiceDesign without instruct is refused at start, as the server would.
    init();
    let e = gst::ElementFactory::make("omnittssrc").build().unwrap();
    e.set_property("server", &s.url);
    e.set_property("text", "Hello.");
    assert_names(
        &start_must_fail(&e, "instruct"),
        &["instruct", "VoiceDesign"],
    );

    // Neither name nor root tells: server-task-type does.
    let s = SpeechServer::start_as(ENGINE.clone(), "my-tts", "/models/tts-checkpoint");
    let mut props = props.to_vec();
    props[0] = ("server", s.url.to_value());
    props.push(("server-task-type", "voice-design".to_value()));
    let (_, done, errs) = run_element(&props, None, 4);
    assert!(errs.is_empty(), "{errs:?}");
    assert!(matches!(reason(&done[0]), "eos" | "length"));
    assert_eq!(
        s.speech_requests()[0].body.as_ref().unwrap()["task_type"],
        "VoiceDesign"
    );
}

#[test]
fn sampling_travels_in_extra_params_and_the_server_limits_are_refused_at_push() {
    let _serial = serial();
    let s = server();
    let mut props = voice_props();
    props.extend([
        ("server", s.url.to_value()),
        ("temperature", 0.7f64.to_value()),
        ("top-p", 0.9f64.to_value()),
        ("top-k", 20u32.to_value()),
        ("text", "First.".to_value()),
    ]);
    let (mut h, bus) = harness(&props, None);
    let (pad, probe) = element_util::play_holding_first_buffer(&mut h);
    let e = h.element().unwrap();
    e.set_property("max-new-tokens", 5000u32);
    assert!(!e.emit_by_name::<bool>("push-text", &[&"Too many tokens."]));
    e.set_property("max-new-tokens", 40u32);
    e.set_property("instruct", "x".repeat(501));
    assert!(!e.emit_by_name::<bool>("push-text", &[&"Too long an instruction."]));
    e.set_property("instruct", "Cheerful.");
    assert!(e.emit_by_name::<bool>("push-text", &[&"Fine."]));
    pad.remove_probe(probe);
    pull_all(&mut h);
    let msgs = drain(&bus);
    let errs = errors(&msgs);
    assert_names(&errs, &["max-new-tokens", "5000", "4096"]);
    assert_names(&errs, &["instruct", "501 characters", "500"]);
    let done = element_messages(&msgs, messages::DONE);
    assert_eq!(done.len(), 2, "{done:?}");
    assert!(done.iter().all(|d| matches!(reason(d), "eos" | "length")));
    let sent = s.speech_requests();
    assert_eq!(sent.len(), 2);
    for r in &sent {
        let extra = &r.body.as_ref().unwrap()["extra_params"];
        assert_eq!(
            *extra,
            serde_json::json!({"temperature": 0.7, "top_p": 0.9, "top_k": 20})
        );
    }
}

#[test]
fn references_outside_the_server_bounds_fail_the_start() {
    let _serial = serial();
    init();
    let s = SpeechServer::start(BASE_ENGINE.clone(), BASE_MODEL);
    let dir = element_util::TempDir::new("remote-ref-bounds");
    for (name, secs, length) in [("short.wav", 0.7, "0.70 s"), ("long.wav", 40.0, "40.00 s")] {
        let wav = tone_wav(&dir, name, secs);
        let e = gst::ElementFactory::make("omnittssrc").build().unwrap();
        e.set_property("server", &s.url);
        e.set_property("ref-audio", &wav);
        e.set_property("x-vector-only", true);
        e.set_property("text", "Hello.");
        let errs = start_must_fail(&e, name);
        assert_names(&errs, &["ref-audio", name, length, "1 to 30 s"]);
    }
    assert!(s.speech_requests().is_empty());
}

#[test]
fn an_uploaded_voice_speaks_by_name_and_a_base_budget_ends_as_length() {
    let _serial = serial();
    let s = SpeechServer::start(BASE_ENGINE.clone(), BASE_MODEL);
    s.upload_voice("Narrator");
    for protocol in ["sse", "pcm"] {
        let props = [
            ("server", s.url.to_value()),
            ("server-protocol", protocol.to_value()),
            ("speaker", "narrator".to_value()),
            ("seed", 7u64.to_value()),
            ("max-new-tokens", 4u32.to_value()),
            (
                "text",
                "A longer sentence that needs more than a few frames.".to_value(),
            ),
        ];
        let (data, done, errs) = run_element(&props, None, 4);
        let body = s.speech_requests().last().unwrap().body.clone().unwrap();
        assert!(
            body["voice"]
                .as_str()
                .is_some_and(|v| v.eq_ignore_ascii_case("narrator")),
            "{protocol}: {body}"
        );
        assert_eq!(body["task_type"], "Base");
        assert!(body.get("ref_audio").is_none());
        assert_eq!(data.len() / 4, 3 * 1920, "{protocol}");
        if protocol == "sse" {
            // The server's "token budget" error after the audio is the utterance's length end.
            assert!(errs.is_empty(), "{errs:?}");
            assert_eq!(reason(&done[0]), "length");
        } else {
            // Raw PCM: only a connection closed early, the reason lost (the README says so).
            assert_eq!(reason(&done[0]), "error");
            assert_names(&errs, &["cut off"]);
        }
    }
    // A name the server does not list is refused at start, with the list.
    init();
    let e = gst::ElementFactory::make("omnittssrc").build().unwrap();
    e.set_property("server", &s.url);
    e.set_property("speaker", "zoe");
    e.set_property("text", "Hello.");
    assert_names(&start_must_fail(&e, "zoe"), &["speaker", "zoe", "narrator"]);
}

#[test]
fn sse_is_the_default_and_a_slow_first_chunk_is_named() {
    let s = server();
    let c = client(&s.url, |o| o.timeout = Duration::from_secs(1));
    assert_eq!(c.options().protocol, StreamProtocol::Sse);
    s.fault(Fault::Stall { chunks: 0 });
    let (audio, reason, _) = run(&c, request("Slow.", StreamProtocol::Sse));
    assert!(audio.is_empty());
    let e = error_of(&reason);
    assert!(e.contains("no first audio within 1.0 s"), "{e}");
    // After the first audio it is a stall.
    s.fault(Fault::Stall { chunks: 1 });
    let (_, reason, _) = run(&c, request("Slow.", StreamProtocol::Sse));
    assert!(error_of(&reason).contains("sent nothing for 1.0 s"));
}
