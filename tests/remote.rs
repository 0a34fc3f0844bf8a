//! The remote backend against a loopback vLLM-Omni speech server (tests/speech_server) that
//! synthesises with omnitts' own engine on the tiny CustomVoice fixture: the samples, frames and
//! finish reasons of both stream forms, and every fault the server can inject.

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
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
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
