//! `omnittssrc` with gstreamer-check's Harness and parsed pipelines, non-live: caps, timestamps,
//! offsets, EOS, properties, push-text, bus messages, errors, flush, and a WAV file whose length
//! matches the done messages. Runs on the tiny random-weight checkpoint in tests/fixtures.

mod element_util;
mod reference_util;

use element_util::{
    TempDir, assert_names, drain, element_messages, errors, harness, init,
    play_holding_first_buffer, play_to_eos, pts_of, start_error, v, wait_element_message, warnings,
};
use gst::prelude::*;
use gst_check::Harness;
use gstomnitts::element_common::messages;
use reference_util::fixture_model;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const SPF: u64 = 1920;

use gst::glib;

/// Every message on `bus` so far, asserting that none is an error.
fn drain_ok(bus: &gst::Bus) -> Vec<gst::Message> {
    let msgs = drain(bus);
    assert!(errors(&msgs).is_empty(), "{:?}", errors(&msgs));
    msgs
}

/// Pulls to EOS, checks the f32 timeline and drains the bus (no errors): the samples pushed and
/// the `started` and `done` messages of the utterances, in order.
fn run_utterances(
    h: &mut Harness,
    bus: &gst::Bus,
) -> (u64, Vec<gst::Structure>, Vec<gst::Structure>) {
    let bufs = pull_all(h);
    let n = check_timeline(&bufs, 4);
    let msgs = drain_ok(bus);
    (
        n,
        element_messages(&msgs, messages::STARTED),
        element_messages(&msgs, messages::DONE),
    )
}

/// The `text` fields of utterance messages, in order.
fn texts_of(msgs: &[gst::Structure]) -> Vec<&str> {
    msgs.iter()
        .map(|s| s.get::<&str>("text").expect("text field"))
        .collect()
}

/// Pulls every buffer until EOS.
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

fn f32_samples(bufs: &[gst::Buffer]) -> Vec<f32> {
    let mut out = Vec::new();
    for b in bufs {
        let m = b.map_readable().unwrap();
        out.extend(
            m.as_slice()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        );
    }
    out
}

const LONG_TEXT: &str = "This is a long utterance that keeps going, sentence after sentence, so that \
     there is plenty of audio still to come when the test interrupts it; the engine must notice \
     the interruption between two frames and stop working on it right away.";

/// The value of enum type `type_name` whose nick is `nick`.
fn enum_value(type_name: &str, nick: &str) -> glib::Value {
    let t = glib::Type::from_name(type_name).unwrap_or_else(|| panic!("no type {type_name}"));
    glib::EnumClass::with_type(t)
        .and_then(|c| c.to_value_by_nick(nick))
        .unwrap_or_else(|| panic!("{type_name} has no value {nick}"))
}

fn u64_field(s: &gst::Structure, f: &str) -> u64 {
    s.get::<u64>(f)
        .unwrap_or_else(|e| panic!("{}: field {f}: {e}", s.name()))
}

/// Checks the timestamp/offset rules on `bufs` (`bytes` per sample); returns the sample count.
fn check_timeline(bufs: &[gst::Buffer], bytes: usize) -> u64 {
    check_timeline_from(bufs, bytes, 0)
}

/// [`check_timeline`] for buffers from sample `n0` on; returns the sample counter after them.
fn check_timeline_from(bufs: &[gst::Buffer], bytes: usize, n0: u64) -> u64 {
    assert!(!bufs.is_empty(), "no buffers");
    let mut n = n0;
    for (i, b) in bufs.iter().enumerate() {
        assert_eq!(b.size() % bytes, 0, "buffer {i}: partial sample");
        let len = (b.size() / bytes) as u64;
        assert!(len > 0, "buffer {i} is empty");
        assert_eq!(b.offset(), n, "buffer {i}: offset");
        assert_eq!(b.offset_end(), n + len, "buffer {i}: offset_end");
        assert_eq!(b.pts(), Some(pts_of(n)), "buffer {i}: pts");
        assert_eq!(
            b.duration(),
            Some(pts_of(n + len) - pts_of(n)),
            "buffer {i}: duration"
        );
        assert_eq!(
            b.flags().contains(gst::BufferFlags::DISCONT),
            i == 0,
            "buffer {i}: DISCONT must be on the first buffer only"
        );
        assert!(
            !b.flags().contains(gst::BufferFlags::GAP),
            "buffer {i}: GAP in non-live"
        );
        n += len;
    }
    n
}

/// Language bindings print an enum value with its name: PyGObject 3.42 formats
/// `<enum NAME of type TYPE>` into a 256-byte buffer and aborts the process past it (a 225-character
/// `split-sentences` name did). Every enum value of both elements keeps its name short; the
/// property's blurb holds the details.
#[test]
fn enum_value_names_are_short_enough_for_bindings() {
    init();
    let mut checked = 0;
    for factory in ["omnittssrc", "omnittssynth"] {
        let e = gst::ElementFactory::make(factory).build().unwrap();
        for pspec in e.list_properties() {
            let Some(p) = pspec.downcast_ref::<glib::ParamSpecEnum>() else {
                continue;
            };
            let class = p.enum_class();
            let type_name = pspec.value_type().name();
            for v in class.values() {
                let shown = format!("<enum {} of type {type_name}>", v.name());
                assert!(
                    v.name().len() <= 100 && shown.len() < 160,
                    "{factory}.{}: value {} has a {}-character name: {}",
                    pspec.name(),
                    v.nick(),
                    v.name().len(),
                    v.name()
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 20, "only {checked} enum values found");
}

#[test]
fn non_live_caps_events_timestamps_and_eos() {
    let (mut h, bus) = harness(&[("text", v("Hello world.")), ("max-new-tokens", v(12u32))]);
    h.play();
    let bufs = pull_all(&mut h);

    let caps = h.sinkpad().unwrap().current_caps().expect("caps");
    let s = caps.structure(0).unwrap();
    assert_eq!(s.name(), "audio/x-raw");
    assert_eq!(s.get::<&str>("format").unwrap(), "F32LE");
    assert_eq!(s.get::<i32>("rate").unwrap(), 24000);
    assert_eq!(s.get::<i32>("channels").unwrap(), 1);
    assert_eq!(s.get::<&str>("layout").unwrap(), "interleaved");

    // Events: stream-start, caps, a TIME segment (EOS was consumed by pull_until_eos()
    // returning None).
    let mut kinds = Vec::new();
    while let Some(ev) = h.try_pull_event() {
        if let gst::EventView::Segment(seg) = ev.view() {
            assert_eq!(seg.segment().format(), gst::Format::Time);
        }
        kinds.push(ev.type_());
    }
    assert_eq!(
        &kinds[..3],
        &[
            gst::EventType::StreamStart,
            gst::EventType::Caps,
            gst::EventType::Segment
        ]
    );

    let n = check_timeline(&bufs, 4);
    // Buffers are at most samples-per-buffer (480) long.
    assert!(bufs.iter().all(|b| b.size() <= 480 * 4));

    let msgs = drain_ok(&bus);
    let started = element_messages(&msgs, messages::STARTED);
    let first = element_messages(&msgs, messages::FIRST_AUDIO);
    let done = element_messages(&msgs, messages::DONE);
    assert_eq!((started.len(), first.len(), done.len()), (1, 1, 1));
    assert_eq!(started[0].get::<&str>("text").unwrap(), "Hello world.");
    assert_eq!(u64_field(&started[0], "pts"), 0);
    assert!(first[0].get::<f64>("ttfa-ms").unwrap() > 0.0);
    let d = &done[0];
    let frames = u64_field(d, "frames");
    assert!((2..=12).contains(&frames), "frames {frames}");
    assert_eq!(
        n,
        frames * SPF,
        "samples output vs frames in the done message"
    );
    assert_eq!(u64_field(d, "samples"), n);
    assert_eq!(u64_field(d, "duration"), pts_of(n).nseconds());
    let reason = d.get::<&str>("reason").unwrap();
    assert!(reason == "eos" || reason == "length", "reason {reason}");
    assert!((d.get::<f64>("audio-ms").unwrap() - frames as f64 * 80.0).abs() < 1e-6);
    assert!(d.get::<f64>("rtf").unwrap() > 0.0);

    // Random weights still make sound.
    let samples = f32_samples(&bufs);
    let rms = (samples.iter().map(|x| x * x).sum::<f32>() / samples.len() as f32).sqrt();
    assert!(rms > 1e-3, "silent output, rms {rms}");
    assert!(samples.iter().all(|x| x.is_finite() && x.abs() <= 1.0));
}

/// With no `model` set the element uses the bundled voice (models/omnitts-en, speaker joe) and speaks
/// with nothing downloaded: a checkpoint of the real layout, loaded through the same code path.
#[test]
fn default_model_is_the_bundled_voice() {
    init();
    let mut h = Harness::new("omnittssrc");
    let e = h.element().expect("element");
    let bus = gst::Bus::new();
    e.set_bus(Some(&bus));
    let model = e.property::<String>("model");
    let dir = std::path::Path::new(&model);
    assert!(dir.ends_with("models/omnitts-en"), "default model {model}");
    for f in [
        "config.json",
        "model.safetensors",
        "speech_tokenizer/model.safetensors",
        "vocab.json",
    ] {
        assert!(dir.join(f).is_file(), "{model}: no {f}");
    }
    e.set_property("text", "Good morning.");
    e.set_property("do-sample", false);
    e.set_property("max-new-tokens", 40u32);
    h.play();
    let bufs = pull_all(&mut h);
    drain_ok(&bus);
    assert_eq!(e.property::<Option<String>>("speaker"), None);
    let speakers = e.property::<Option<String>>("available-speakers");
    assert_eq!(speakers.as_deref(), Some("joe"));
    let n = check_timeline(&bufs, 4);
    assert_eq!(n % SPF, 0, "{n} samples");
    let x = f32_samples(&bufs);
    let rms = (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32).sqrt();
    assert!(rms > 1e-3, "silent: rms {rms}");
}

/// `model` set back to NULL, "" or blank is unset again, as for the other string properties:
/// it reads back as the property's default (the bundled voice found) and the element speaks with
/// the bundled voice (before, the start failed with "no model given" and no place searched).
#[test]
fn a_null_or_empty_model_is_the_bundled_voice() {
    init();
    for unset in [None, Some(""), Some(" \t")] {
        let mut h = Harness::new("omnittssrc");
        let e = h.element().expect("element");
        let bus = gst::Bus::new();
        e.set_bus(Some(&bus));
        let default = element_util::model_default(&e);
        assert!(default.ends_with("models/omnitts-en"), "default {default}");
        e.set_property("model", fixture_model("tiny-customvoice"));
        e.set_property("model", unset);
        assert_eq!(e.property::<String>("model"), default, "{unset:?}");
        e.set_property("text", "Hi.");
        e.set_property("do-sample", false);
        e.set_property("max-new-tokens", 3u32);
        h.play();
        let bufs = pull_all(&mut h);
        drain_ok(&bus);
        assert!(!bufs.is_empty(), "{unset:?}: no audio");
        let speakers = e.property::<Option<String>>("available-speakers");
        assert_eq!(speakers.as_deref(), Some("joe"), "{unset:?}");
    }
}

#[test]
fn s16le_is_negotiated_and_matches_f32() {
    let props = [
        ("text", v("Same text, both formats.")),
        ("max-new-tokens", v(6u32)),
    ];
    let (mut h, _) = harness(&props);
    h.play();
    let f = f32_samples(&pull_all(&mut h));

    let (mut h, _) = harness(&props);
    h.set_sink_caps_str("audio/x-raw,format=S16LE,rate=24000,channels=1,layout=interleaved");
    h.play();
    let bufs = pull_all(&mut h);
    let caps = h.sinkpad().unwrap().current_caps().unwrap();
    assert_eq!(
        caps.structure(0).unwrap().get::<&str>("format").unwrap(),
        "S16LE"
    );
    let n = check_timeline(&bufs, 2);
    assert_eq!(n as usize, f.len(), "greedy runs differ in length");
    let mut i = 0;
    for b in &bufs {
        let m = b.map_readable().unwrap();
        for c in m.as_slice().chunks_exact(2) {
            let s = i16::from_le_bytes([c[0], c[1]]);
            let want = (f[i].clamp(-1.0, 1.0) * 32767.0).round() as i16;
            assert_eq!(s, want, "sample {i}");
            i += 1;
        }
    }
}

#[test]
fn push_text_queues_utterances_in_order() {
    let (mut h, bus) = harness(&[("text", v("First one.")), ("max-new-tokens", v(5u32))]);
    let e = h.element().unwrap();
    // Before start: kept for start().
    assert!(e.emit_by_name::<bool>("push-text", &[&"Second one."]));
    // Empty and whitespace text is refused with an error naming it.
    assert!(!e.emit_by_name::<bool>("push-text", &[&"   "]));
    let errs = errors(&drain(&bus));
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0].contains("text") && errs[0].contains("'   '"),
        "{}",
        errs[0]
    );

    // Queue a third utterance while running (streaming thread held at its first buffer), and a
    // fourth through the text property.
    let (pad, probe) = play_holding_first_buffer(&mut h);
    assert!(e.emit_by_name::<bool>("push-text", &[&"Third one."]));
    e.set_property("text", "Fourth one.");
    pad.remove_probe(probe);
    let (n, started, done) = run_utterances(&mut h, &bus);
    assert_eq!(
        texts_of(&started),
        ["First one.", "Second one.", "Third one.", "Fourth one."]
    );
    assert_eq!(done.len(), 4);
    let ids: Vec<u64> = done.iter().map(|d| u64_field(d, "id")).collect();
    assert_eq!(ids, [1, 2, 3, 4]);
    // Utterances follow each other without gaps: each starts where the previous ended.
    let mut pos = 0;
    for (s, d) in started.iter().zip(&done) {
        assert_eq!(u64_field(s, "pts"), pts_of(pos).nseconds());
        pos += u64_field(d, "samples");
        assert_eq!(u64_field(d, "samples"), u64_field(d, "frames") * SPF);
    }
    assert_eq!(pos, n);

    // After EOS no more text is accepted.
    assert!(!e.emit_by_name::<bool>("push-text", &[&"Too late."]));
}

#[test]
fn split_sentences_queues_one_utterance_per_sentence() {
    let (mut h, bus) = harness(&[
        ("text", v("First one. Mr. Smith said hi! ")),
        ("max-new-tokens", v(5u32)),
    ]);
    let e = h.element().unwrap();
    e.set_property_from_str("split-sentences", "true");
    assert!(e.emit_by_name::<bool>("push-text", &[&"Is it late? \"No,\" she said."]));
    h.play();
    let (n, started, done) = run_utterances(&mut h, &bus);
    assert_eq!(
        texts_of(&started),
        [
            "First one.",
            "Mr. Smith said hi!",
            "Is it late?",
            "\"No,\" she said."
        ]
    );
    let samples: u64 = done.iter().map(|d| u64_field(d, "samples")).sum();
    assert_eq!(done.len(), 4);
    assert_eq!(samples, n);

    // Auto (the default): the same text, being short, is one utterance.
    let (mut h, bus) = harness(&[
        ("text", v("First one. Mr. Smith said hi!")),
        ("max-new-tokens", v(5u32)),
    ]);
    h.play();
    let (_, started, _) = run_utterances(&mut h, &bus);
    assert_eq!(texts_of(&started), ["First one. Mr. Smith said hi!"]);
}

#[test]
fn num_buffers_limits_output() {
    let (mut h, _) = harness(&[("text", v("Counting buffers.")), ("num-buffers", v(3i32))]);
    h.play();
    assert_eq!(pull_all(&mut h).len(), 3);
}

#[test]
fn samples_per_buffer_bounds_buffer_size() {
    let (mut h, _) = harness(&[
        ("text", v("Bigger buffers.")),
        ("samples-per-buffer", v(1000u32)),
        ("max-new-tokens", v(8u32)),
    ]);
    h.play();
    let bufs = pull_all(&mut h);
    check_timeline(&bufs, 4);
    assert!(bufs.iter().all(|b| b.size() <= 4000));
    assert!(bufs.iter().any(|b| b.size() == 4000), "no full-size buffer");
}

/// Every writable property: set a non-default value, read it back.
#[test]
fn property_round_trip() {
    init();
    let e = gst::ElementFactory::make("omnittssrc").build().unwrap();
    let cases: Vec<(&str, glib::Value)> = vec![
        ("text", "round trip".to_value()),
        ("model", "/some/dir".to_value()),
        ("stage-config", "/some/stage.yaml".to_value()),
        ("ar-device", "cpu".to_value()),
        ("decoder-device", "cuda:1".to_value()),
        ("speaker", "ryan".to_value()),
        ("language", "english".to_value()),
        ("instruct", "calm".to_value()),
        (
            "prompt-mode",
            enum_value("GstOmniTtsPromptMode", "non-streaming"),
        ),
        ("quantization", enum_value("GstOmniTtsQuantization", "q4-k")),
        ("ref-audio", "/some/voice.flac".to_value()),
        ("ref-text", "what the voice says".to_value()),
        ("x-vector-only", true.to_value()),
        ("do-sample", false.to_value()),
        ("temperature", 0.5f64.to_value()),
        ("top-k", 7u32.to_value()),
        ("top-p", 0.8f64.to_value()),
        ("repetition-penalty", 1.3f64.to_value()),
        ("max-new-tokens", 123u32.to_value()),
        ("seed", 7u64.to_value()),
        ("initial-chunk-frames", 3u32.to_value()),
        ("chunk-frames", 9u32.to_value()),
        ("samples-per-buffer", 960u32.to_value()),
        ("is-live", true.to_value()),
        ("split-sentences", {
            let t = glib::Type::from_name("GstOmniTtsSplitSentences").unwrap();
            glib::EnumClass::with_type(t)
                .unwrap()
                .to_value_by_nick("true")
                .unwrap()
        }),
        ("shared-engine", false.to_value()),
        ("server", "http://gpu-host:8091".to_value()),
        (
            "server-model",
            "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice".to_value(),
        ),
        ("server-protocol", {
            let t = glib::Type::from_name("GstOmniTtsServerProtocol").unwrap();
            glib::EnumClass::with_type(t)
                .unwrap()
                .to_value_by_nick("pcm")
                .unwrap()
        }),
        ("server-retries", 5u32.to_value()),
        ("server-task-type", {
            let t = glib::Type::from_name("GstOmniTtsServerTaskType").unwrap();
            glib::EnumClass::with_type(t)
                .unwrap()
                .to_value_by_nick("voice-design")
                .unwrap()
        }),
        ("server-timeout", 7u32.to_value()),
    ];
    // Write-only: the API key is set, never read back.
    let write_only = ["server-api-key"];
    for name in write_only {
        let pspec = e.find_property(name).unwrap();
        assert!(pspec.flags().contains(glib::ParamFlags::WRITABLE), "{name}");
        assert!(
            !pspec.flags().contains(glib::ParamFlags::READABLE),
            "{name}"
        );
        e.set_property(name, "sk-test");
    }
    let read_only = [
        "available-speakers",
        "available-languages",
        "voice-clone-encodes",
    ];
    // Every property of GstOmniTtsSrc itself is covered (a new one needs a case here).
    let own: Vec<String> = e
        .list_properties()
        .iter()
        .filter(|p| p.owner_type() == e.type_())
        .map(|p| p.name().to_string())
        .collect();
    let mut covered: Vec<String> = cases.iter().map(|(k, _)| k.to_string()).collect();
    covered.extend(read_only.iter().map(|s| s.to_string()));
    covered.extend(write_only.iter().map(|s| s.to_string()));
    let mut a = own.clone();
    a.sort();
    covered.sort();
    assert_eq!(a, covered);

    for (name, value) in &cases {
        let pspec = e.find_property(name).unwrap();
        let default = pspec.default_value().clone();
        assert_ne!(
            format!("{default:?}"),
            format!("{value:?}"),
            "{name}: the test value must differ from the default"
        );
        // Before: the default.
        assert_eq!(
            format!("{:?}", e.property_value(name)),
            format!("{default:?}"),
            "{name}: initial value is not the default"
        );
        e.set_property_from_value(name, value);
        assert_eq!(
            format!("{:?}", e.property_value(name)),
            format!("{value:?}"),
            "{name}: set/get round trip"
        );
    }
    for name in ["available-speakers", "available-languages"] {
        assert!(
            e.property::<Option<String>>(name).is_none(),
            "{name} before start"
        );
    }
    assert_eq!(e.property::<u64>("voice-clone-encodes"), 0);
}

#[test]
fn available_speakers_and_languages_after_start() {
    let (mut h, _) = harness(&[("text", v("hi")), ("max-new-tokens", v(3u32))]);
    h.play();
    let e = h.element().unwrap();
    let speakers = e.property::<Option<String>>("available-speakers").unwrap();
    let languages = e.property::<Option<String>>("available-languages").unwrap();
    assert!(speakers.split(',').any(|s| s == "ryan"), "{speakers}");
    assert!(languages.split(',').any(|s| s == "english"), "{languages}");
    pull_all(&mut h);
}

/// A `max-new-tokens` within the property's range that the talker's positions cannot hold beside
/// any prompt (`max_position_embeddings`, 32,768 in the fixture as in the released checkpoints)
/// fails the start, naming the property, the value and the limit, with a text or without one
/// (live, waiting for push-text); one below it starts.
#[test]
fn a_frame_cap_past_the_talkers_positions_fails_the_start() {
    let model = fixture_model("tiny-customvoice");
    for cap in [32_768u32, 65_536] {
        for first in [("text", v("Hello there.")), ("is-live", v(true))] {
            let errs = start_error(&model, &[first, ("max-new-tokens", v(cap))]);
            assert_names(
                &errs,
                &[
                    "max-new-tokens",
                    &cap.to_string(),
                    "max_position_embeddings",
                ],
            );
        }
    }
    let (mut h, bus) = harness(&[
        ("text", v("Hello there.")),
        ("max-new-tokens", v(30_000u32)),
    ]);
    h.play();
    assert!(h.pull().is_ok(), "a cap below the positions speaks");
    assert!(errors(&drain(&bus)).is_empty());
}

#[test]
fn errors_missing_or_unreadable_model() {
    assert_names(
        &start_error("/nonexistent/omnitts-model", &[("text", v("x"))]),
        &["model", "/nonexistent/omnitts-model"],
    );
    // A directory whose config.json is not JSON.
    let bad = TempDir::new("badmodel");
    std::fs::write(bad.path().join("config.json"), b"this is not json").unwrap();
    let dir = bad.path().display().to_string();
    assert_names(&start_error(&dir, &[("text", v("x"))]), &["model", &dir]);
    // A directory that is not a checkpoint at all.
    let empty = TempDir::new("emptymodel");
    let dir = empty.path().display().to_string();
    assert_names(&start_error(&dir, &[("text", v("x"))]), &["model", &dir]);
    // A Base (voice-clone) checkpoint without a reference recording (tests/element_clone.rs
    // covers voice cloning).
    let base = fixture_model("tiny-base");
    assert_names(
        &start_error(&base, &[("text", v("x"))]),
        &["ref-audio", &base, "Base"],
    );
    // A repo id that is neither cached nor downloadable: tests/element_hub.rs (it needs its own
    // HF_* environment, so it runs in a child process there).
    // A huge value is quoted cut, however often the reason repeats it.
    let huge = format!("/nonexistent/{}", "m".repeat(100_000));
    let errs = start_error(&huge, &[("text", v("x"))]);
    assert_names(&errs, &["model", "/nonexistent/mmm"]);
    assert!(
        errs.iter().all(|e| e.len() < 4_000),
        "{} bytes",
        errs[0].len()
    );
    let errs = start_error(
        &fixture_model("tiny-customvoice"),
        &[("text", v("x")), ("ar-device", v("9".repeat(100_000)))],
    );
    assert_names(&errs, &["ar-device"]);
    assert!(
        errs.iter().all(|e| e.len() < 4_000),
        "{} bytes",
        errs[0].len()
    );
}

/// Text that is only markup is refused naming the value as it was set, not the empty text left
/// once the markup is removed.
#[test]
fn markup_only_text_is_named_as_set() {
    let errs = start_error(
        &fixture_model("tiny-customvoice"),
        &[("text", v("<speak></speak>"))],
    );
    assert_names(
        &errs,
        &[
            "text '<speak></speak>'",
            "nothing to speak once its markup is removed",
        ],
    );
}

#[test]
fn errors_unknown_speaker_language_bad_device_bad_stage_config() {
    assert_names(
        &start_error(
            &fixture_model("tiny-customvoice"),
            &[("text", v("x")), ("speaker", v("nobody"))],
        ),
        &["speaker", "nobody"],
    );
    assert_names(
        &start_error(
            &fixture_model("tiny-customvoice"),
            &[("text", v("x")), ("language", v("klingon"))],
        ),
        &["language", "klingon"],
    );
    assert_names(
        &start_error(
            &fixture_model("tiny-customvoice"),
            &[("text", v("x")), ("ar-device", v("gpu7"))],
        ),
        &["ar-device", "gpu7"],
    );
    assert_names(
        &start_error(
            &fixture_model("tiny-customvoice"),
            &[("text", v("x")), ("decoder-device", v("cuda:x"))],
        ),
        &["decoder-device", "cuda:x"],
    );
    let dir = TempDir::new("stagecfg");
    let yaml = dir.path().join("broken.yaml");
    std::fs::write(&yaml, "stages: [unclosed\n  - : :").unwrap();
    let p = yaml.display().to_string();
    assert_names(
        &start_error(
            &fixture_model("tiny-customvoice"),
            &[("text", v("x")), ("stage-config", v(&p))],
        ),
        &["stage-config", &p],
    );
    assert_names(
        &start_error(
            &fixture_model("tiny-customvoice"),
            &[("text", v("x")), ("stage-config", v("/no/such/stage.yaml"))],
        ),
        &["stage-config", "/no/such/stage.yaml"],
    );
}

/// `quantization` reaches the engine: `q8-0` on the tiny fixture (whose 32-wide layers take int8)
/// speaks through the element, and a quantized form that cannot run (bf16 activations from the
/// stage config) fails the state change with the reason.
#[test]
fn quantization_property_selects_the_weight_form() {
    let (mut h, bus) = harness(&[
        ("text", v("Hello world.")),
        ("max-new-tokens", v(12u32)),
        ("quantization", v("q8-0")),
    ]);
    h.play();
    let bufs = pull_all(&mut h);
    let n = check_timeline(&bufs, 4);
    let msgs = drain_ok(&bus);
    let done = element_messages(&msgs, messages::DONE);
    assert_eq!(done.len(), 1);
    assert_eq!(n, u64_field(&done[0], "frames") * SPF);
    assert!(n > 0);
    let e = h.element().unwrap();
    let shown = e
        .property_value("quantization")
        .serialize()
        .map(|s| s.to_string());
    assert_eq!(shown.ok().as_deref(), Some("q8-0"));

    let dir = TempDir::new("quant");
    let yaml = dir.path().join("bf16.yaml");
    std::fs::write(
        &yaml,
        gstomnitts::engine::DEFAULT_ASYNC_YAML.replace("dtype: auto", "dtype: bfloat16"),
    )
    .unwrap();
    assert_names(
        &start_error(
            &fixture_model("tiny-customvoice"),
            &[
                ("text", v("x")),
                ("stage-config", v(yaml.display().to_string().as_str())),
                ("quantization", v("q4-k")),
            ],
        ),
        &["quantization q4_k", "float32"],
    );
}

#[test]
fn error_messages_quote_long_values_shortened() {
    let long = "y".repeat(200);
    let errs = start_error(
        &fixture_model("tiny-customvoice"),
        &[("text", v("x")), ("speaker", v(long.as_str()))],
    );
    let shortened = format!("'{}…'", "y".repeat(80));
    assert_names(&errs, &["speaker", &shortened]);
    assert!(
        errs.iter()
            .all(|e| !e.split(" | ").next().unwrap_or(e).contains(&long))
    );
}

#[test]
fn errors_empty_or_whitespace_text() {
    // The value is quoted escaped (the tab as `\t`).
    assert_names(
        &start_error(&fixture_model("tiny-customvoice"), &[("text", v("  \t "))]),
        &["text", "'  \\t '"],
    );
    // Only invisible format or control characters: nothing to speak either.
    for t in ["\u{200b}\u{feff}\u{2060}", "\u{1}\u{2}\u{1b}\u{7f}"] {
        assert_names(
            &start_error(&fixture_model("tiny-customvoice"), &[("text", v(t))]),
            &["text", "nothing to speak"],
        );
    }
    // Non-live without any text has nothing to do.
    assert_names(
        &start_error(&fixture_model("tiny-customvoice"), &[]),
        &["text"],
    );
}

#[test]
fn runtime_bad_speaker_refuses_the_utterance() {
    let (mut h, bus) = harness(&[("text", v("Good one.")), ("max-new-tokens", v(4u32))]);
    let e = h.element().unwrap();
    let (pad, probe) = play_holding_first_buffer(&mut h);
    e.set_property("speaker", "nobody");
    assert!(!e.emit_by_name::<bool>("push-text", &[&"Refused one."]));
    e.set_property("speaker", "Ryan"); // case-insensitive
    assert!(e.emit_by_name::<bool>("push-text", &[&"Accepted one."]));
    // Refused at once (push-text returned false), but the error keeps its place in the stream:
    // nothing on the bus while the first utterance's audio is still held back.
    let early = drain(&bus);
    assert!(errors(&early).is_empty(), "{:?}", errors(&early));
    pad.remove_probe(probe);
    let bufs = pull_all(&mut h);
    check_timeline(&bufs, 4);
    let msgs = [early, drain(&bus)].concat();
    assert_names(&errors(&msgs), &["speaker", "nobody"]);
    assert_eq!(element_messages(&msgs, messages::DONE).len(), 2);
    // ... and comes after the first utterance is done, so none of its audio is lost.
    let is_done = |m: &gst::Message| m.structure().is_some_and(|s| s.name() == messages::DONE);
    let first_done = msgs.iter().position(is_done).unwrap();
    let error = msgs
        .iter()
        .position(|m| matches!(m.view(), gst::MessageView::Error(_)))
        .unwrap();
    assert!(
        first_done < error,
        "error at {error}, first done at {first_done}"
    );
}

/// Clearing `text` while running (NULL, empty, blank) queues nothing: no refusal, so no error
/// that would stop the pipeline (an application that clears the property lost its stream).
#[test]
fn clearing_text_while_running_queues_nothing() {
    let (mut h, bus) = harness(&[("text", v("Good one.")), ("max-new-tokens", v(4u32))]);
    let e = h.element().unwrap();
    let (pad, probe) = play_holding_first_buffer(&mut h);
    e.set_property("text", "");
    e.set_property("text", "   ");
    e.set_property("text", None::<&str>);
    e.set_property("text", "Second one.");
    pad.remove_probe(probe);
    let bufs = pull_all(&mut h);
    check_timeline(&bufs, 4);
    let msgs = drain(&bus);
    assert!(errors(&msgs).is_empty(), "{:?}", errors(&msgs));
    assert_eq!(element_messages(&msgs, messages::DONE).len(), 2);
}

/// Blank `ar-device` / `decoder-device` are unset (the stage config's devices), as a blank
/// `speaker` or `stage-config` is; and server properties set without `server` get a warning
/// naming them instead of doing nothing silently.
#[test]
fn blank_devices_are_unset_and_server_properties_without_server_are_named() {
    let (mut h, bus) = harness(&[
        ("text", v("Good one.")),
        ("max-new-tokens", v(4u32)),
        ("ar-device", v("")),
        ("decoder-device", v(" ")),
        ("server-model", v("foo")),
        ("server-task-type", v("base")),
    ]);
    h.play();
    let bufs = pull_all(&mut h);
    check_timeline(&bufs, 4);
    let msgs = drain(&bus);
    assert!(errors(&msgs).is_empty(), "{:?}", errors(&msgs));
    let w = warnings(&msgs);
    assert!(
        w.iter().any(|w| w.starts_with(
            "server-model, server-task-type set without server: ignored, the element \
             synthesises locally"
        )),
        "{w:?}"
    );
}

/// Properties the model load and the caps depend on keep their value once started: a warning
/// names the property, and the change is ignored (not applied silently, not an error).
#[test]
fn ready_only_properties_keep_their_value_while_running() {
    let (mut h, bus) = harness(&[("text", v("Good one.")), ("max-new-tokens", v(4u32))]);
    let e = h.element().unwrap();
    let model = e.property::<String>("model");
    let (pad, probe) = play_holding_first_buffer(&mut h);
    e.set_property("model", "/nonexistent/model");
    e.set_property("samples-per-buffer", 7u32);
    e.set_property("is-live", true);
    e.set_property_from_str("quantization", "q8-0");
    // A voice property still applies to text queued after it.
    e.set_property("speaker", "vivian");
    assert_eq!(e.property::<String>("model"), model);
    assert_eq!(e.property::<u32>("samples-per-buffer"), 480);
    assert!(!e.property::<bool>("is-live"));
    assert_eq!(
        e.property::<Option<String>>("speaker").as_deref(),
        Some("vivian")
    );
    pad.remove_probe(probe);
    let bufs = pull_all(&mut h);
    check_timeline(&bufs, 4);
    let msgs = drain(&bus);
    // The utterance itself ends by length (4 frames at most), with its own warning.
    let (warns, limits): (Vec<String>, Vec<String>) = warnings(&msgs)
        .into_iter()
        .partition(|w| !w.contains("ended by length"));
    assert!(limits.len() <= 1, "{limits:?}");
    assert_eq!(warns.len(), 4, "{warns:?}");
    // Each names the property and the refused value as it was set: a string quoted, an enum by
    // its nick.
    let refused = [
        ("model", "'/nonexistent/model'"),
        ("samples-per-buffer", "7"),
        ("is-live", "true"),
        ("quantization", "'q8-0' ignored"),
    ];
    for (w, (name, value)) in warns.iter().zip(refused) {
        assert!(
            w.contains(&format!("'{name}'")) && w.contains("NULL or READY") && w.contains(value),
            "{w}"
        );
    }
    assert!(errors(&msgs).is_empty(), "{:?}", errors(&msgs));
}

#[test]
fn flush_stops_the_utterance_promptly() {
    let (mut h, bus) = harness(&[("text", v(LONG_TEXT)), ("max-new-tokens", v(4000u32))]);
    h.play();
    let e = h.element().unwrap();
    h.pull().unwrap();
    let t0 = Instant::now();
    assert!(e.send_event(gst::event::FlushStart::new()));
    assert!(e.send_event(gst::event::FlushStop::new(true)));
    let mut seen = Vec::new();
    let done = wait_element_message(&bus, messages::DONE, Duration::from_secs(5), &mut seen)
        .expect("done message after flush");
    assert_eq!(done.get::<&str>("reason").unwrap(), "cancelled");
    // Nothing else queued: EOS follows, long before 4000 frames (320 s of audio) could be made.
    loop {
        match h.pull_until_eos() {
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "flush took {:?}",
        t0.elapsed()
    );
    assert!(errors(&drain(&bus)).is_empty());
}

/// Non-live, a FLUSH_START / FLUSH_STOP pair sent to the source pad itself (not to the element)
/// cancels the utterance, and text pushed while it flushes is spoken after it, then EOS: the
/// streaming task that the flushed `create()` paused is restarted (BaseSrc leaves it paused for
/// a flush that reaches the pad). The timeline goes on across the flush: the first buffer after
/// it is DISCONT (the one on its way when the flush began was dropped at the pad, leaving a hole
/// in the offsets), and a segment is sent again (the FLUSH_STOP removed the pad's).
#[test]
fn a_flush_pair_on_the_src_pad_keeps_the_stream_going() {
    let (mut h, bus) = harness(&[("text", v(LONG_TEXT)), ("max-new-tokens", v(4000u32))]);
    h.play();
    let e = h.element().unwrap();
    let pad = e.static_pad("src").unwrap();
    let mut bufs = vec![h.pull().unwrap()];
    assert!(pad.send_event(gst::event::FlushStart::new()));
    e.set_property("max-new-tokens", 20u32);
    assert!(e.emit_by_name::<bool>("push-text", &[&"After the flush."]));
    assert!(pad.send_event(gst::event::FlushStop::new(true)));
    bufs.extend(pull_all(&mut h));
    let flushed = (1..bufs.len())
        .find(|&i| bufs[i].flags().contains(gst::BufferFlags::DISCONT))
        .expect("a DISCONT buffer after the flush");
    let before = check_timeline(&bufs[..flushed], 4);
    let resumed = bufs[flushed].offset();
    assert!(resumed >= before, "offset {resumed} after {before}");
    let n = check_timeline_from(&bufs[flushed..], 4, resumed);
    let msgs = drain_ok(&bus);
    let dones = element_messages(&msgs, messages::DONE);
    assert_eq!(dones.len(), 2, "{dones:?}");
    assert_eq!(dones[0].get::<&str>("reason").unwrap(), "cancelled");
    let after = &dones[1];
    assert_eq!(after.get::<&str>("text").unwrap(), "After the flush.");
    let reason = after.get::<&str>("reason").unwrap();
    assert!(reason == "eos" || reason == "length", "{reason}");
    // All of its audio came out, after the flushed utterance's.
    let samples = u64_field(after, "samples");
    assert!(samples > 0);
    assert_eq!(u64_field(after, "pts"), pts_of(n - samples).nseconds());
    let mut segments = 0;
    while let Some(ev) = h.try_pull_event() {
        if let gst::EventView::Segment(s) = ev.view() {
            segments += 1;
            let s = s.segment().downcast_ref::<gst::ClockTime>().unwrap();
            assert_eq!(
                (s.start(), s.base()),
                (Some(gst::ClockTime::ZERO), Some(gst::ClockTime::ZERO))
            );
        }
    }
    assert_eq!(segments, 2);
}

/// A flush sent to the element (as a pipeline sends it) unlocks `create()` before it drops the
/// queue: the stream never ends (non-live EOS) between the two, so text pushed before the
/// FLUSH_STOP is spoken after it.
#[test]
fn text_pushed_during_an_element_flush_is_spoken_after_it() {
    for round in 0..5 {
        let (mut h, bus) = harness(&[("text", v(LONG_TEXT)), ("max-new-tokens", v(4000u32))]);
        h.play();
        let e = h.element().unwrap();
        h.pull().unwrap();
        assert!(e.send_event(gst::event::FlushStart::new()));
        e.set_property("max-new-tokens", 20u32);
        assert!(
            e.emit_by_name::<bool>("push-text", &[&"After the flush."]),
            "round {round}: refused"
        );
        assert!(e.send_event(gst::event::FlushStop::new(true)));
        let samples: usize = pull_all(&mut h).iter().map(|b| b.size() / 4).sum();
        let msgs = drain_ok(&bus);
        let dones = element_messages(&msgs, messages::DONE);
        assert!(
            dones
                .iter()
                .any(|d| d.get::<&str>("text").unwrap() == "After the flush."),
            "round {round}: {dones:?}"
        );
        assert!(samples > 0, "round {round}");
    }
}

/// Text pushed while the model loads (after the start has taken the text queued before it) is
/// spoken in this stream, behind that text.
#[test]
fn text_pushed_while_the_model_loads_is_spoken() {
    let (mut h, bus) = harness(&[
        ("text", v("Queued before the start.")),
        ("max-new-tokens", v(20u32)),
    ]);
    let e = h.element().unwrap();
    let pushed = Arc::new(AtomicBool::new(false));
    let (e2, p2) = (e.clone(), pushed.clone());
    bus.set_sync_handler(move |_, msg| {
        if let gst::MessageView::Progress(p) = msg.view()
            && p.get().0 == gst::ProgressType::Start
            && !p2.swap(true, Ordering::SeqCst)
        {
            assert!(e2.emit_by_name::<bool>("push-text", &[&"Pushed while it loads."]));
        }
        gst::BusSyncReply::Pass
    });
    h.play();
    pull_all(&mut h);
    assert!(
        pushed.load(Ordering::SeqCst),
        "no progress message at the load"
    );
    bus.unset_sync_handler();
    let msgs = drain_ok(&bus);
    let texts: Vec<String> = element_messages(&msgs, messages::DONE)
        .iter()
        .map(|d| d.get::<&str>("text").unwrap().to_string())
        .collect();
    assert_eq!(
        texts,
        ["Queued before the start.", "Pushed while it loads."]
    );
}

#[test]
fn cancel_action_stops_the_utterance() {
    let (mut h, bus) = harness(&[("text", v(LONG_TEXT)), ("max-new-tokens", v(4000u32))]);
    h.play();
    let e = h.element().unwrap();
    h.pull().unwrap();
    assert!(e.emit_by_name::<bool>("cancel", &[]));
    let mut seen = Vec::new();
    let done = wait_element_message(&bus, messages::DONE, Duration::from_secs(5), &mut seen)
        .expect("done message after cancel");
    assert_eq!(done.get::<&str>("reason").unwrap(), "cancelled");
    // Its figures are what the element saw: the first audio's TTFA and the time since its start.
    let first = element_messages(&seen, messages::FIRST_AUDIO);
    assert_eq!(first.len(), 1);
    assert_eq!(
        done.get::<f64>("ttfa-ms").unwrap(),
        first[0].get::<f64>("ttfa-ms").unwrap()
    );
    assert!(done.get::<f64>("wall-ms").unwrap() > 0.0);
    assert!(done.get::<f64>("audio-ms").unwrap() > 0.0);
    assert!(done.get::<f64>("rtf").unwrap() > 0.0);
    let rest = pull_all(&mut h);
    // Whatever was already in flight is bounded, then EOS.
    assert!(rest.len() < 4000 * 4, "{} buffers after cancel", rest.len());
}

/// gst-launch syntax → WAV file whose sample count is frames × 1920 from the done messages.
#[test]
fn parse_launch_to_wav_has_expected_length() {
    init();
    let dir = TempDir::new("wav");
    let wav = dir.path().join("out.wav");
    let pipeline = gst::parse::launch(&format!(
        "omnittssrc name=src model=\"{}\" do-sample=false max-new-tokens=10 \
         text=\"Hello from omnitts.\" ! audioconvert ! wavenc ! filesink location=\"{}\"",
        fixture_model("tiny-customvoice"),
        wav.display()
    ))
    .unwrap()
    .downcast::<gst::Pipeline>()
    .unwrap();
    let src = pipeline.by_name("src").unwrap();
    src.emit_by_name::<bool>("push-text", &[&"And a second sentence."]);
    let dones = play_to_eos(pipeline.upcast_ref());
    assert_eq!(dones.len(), 2);
    let frames: u64 = dones
        .iter()
        .map(|s| s.get::<u64>("frames").expect("frames"))
        .sum();
    let reader = hound::WavReader::open(&wav).unwrap();
    let spec = reader.spec();
    assert_eq!((spec.sample_rate, spec.channels), (24000, 1));
    assert_eq!(reader.duration() as u64, frames * SPF);
}

/// Downstream that takes none of the model's caps (another rate) gets an error that names the
/// caps and says what to put in between, first on the bus.
#[test]
fn caps_downstream_refuses_are_named() {
    init();
    let pipeline = gst::parse::launch(&format!(
        "omnittssrc model=\"{}\" text=\"Hello.\" max-new-tokens=4 ! \
         audio/x-raw,rate=44100 ! fakesink",
        fixture_model("tiny-customvoice"),
    ))
    .unwrap();
    let bus = pipeline.bus().unwrap();
    pipeline.set_state(gst::State::Playing).unwrap();
    let msg = bus
        .timed_pop_filtered(
            gst::ClockTime::from_seconds(60),
            &[gst::MessageType::Error, gst::MessageType::Eos],
        )
        .expect("an error within 60 s");
    pipeline.set_state(gst::State::Null).unwrap();
    let gst::MessageView::Error(e) = msg.view() else {
        panic!("expected an error, got {msg:?}");
    };
    let text = e.error().to_string();
    for word in ["downstream takes none", "rate=(int)24000", "audioresample"] {
        assert!(text.contains(word), "{word}: {text}");
    }
}

/// The warnings among `msgs` that contain `word`.
fn warnings_with(msgs: &[gst::Message], word: &str) -> Vec<String> {
    warnings(msgs)
        .into_iter()
        .filter(|w| w.contains(word))
        .collect()
}

/// An utterance that ends at max-new-tokens or at the runaway guard (not at the model's end of
/// speech) is reported with a warning naming the reason, its frames and what to change.
#[test]
fn length_and_guard_limits_post_a_warning() {
    let (mut h, bus) = harness(&[("text", v(LONG_TEXT)), ("max-new-tokens", v(4u32))]);
    h.play();
    pull_all(&mut h);
    let msgs = drain_ok(&bus);
    let done = element_messages(&msgs, messages::DONE);
    assert_eq!(done[0].get::<&str>("reason").unwrap(), "length");
    let frames = u64_field(&done[0], "frames");
    let w = warnings_with(&msgs, "ended by length");
    assert_eq!(w.len(), 1, "{:?}", warnings(&msgs));
    for word in [
        "utterance 1",
        &format!("{frames} frames"),
        "max-new-tokens",
        "shorter text",
    ] {
        assert!(w[0].contains(word), "{word}: {}", w[0]);
    }
    // One sentence: splitting would not help, so it is not suggested.
    assert!(!w[0].contains("split-sentences"), "{}", w[0]);

    // The runaway guard: a budget of 3 frames for any text.
    let dir = TempDir::new("guard");
    let yaml = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/configs/qwen3_tts.yaml"
    ))
    .unwrap()
    .replace("floor_frames: 75", "floor_frames: 3")
    .replace("frames_per_text_token: 6.0", "frames_per_text_token: 0.01");
    let config = dir.path().join("guard.yaml");
    std::fs::write(&config, yaml).unwrap();
    // Two sentences spoken as one utterance (shorter than auto's threshold): splitting helps.
    let (mut h, bus) = harness(&[
        (
            "text",
            v("Hello there, this goes on. And a second sentence follows it."),
        ),
        ("max-new-tokens", v(200u32)),
        ("stage-config", v(config.display().to_string())),
    ]);
    h.play();
    pull_all(&mut h);
    let msgs = drain_ok(&bus);
    let done = element_messages(&msgs, messages::DONE);
    assert_eq!(done[0].get::<&str>("reason").unwrap(), "guard");
    assert_eq!(u64_field(&done[0], "frames"), 3);
    let w = warnings_with(&msgs, "ended by guard");
    assert_eq!(w.len(), 1, "{:?}", warnings(&msgs));
    for word in [
        "3 frames",
        "split-sentences=true",
        "shorter",
        "runaway_guard",
    ] {
        assert!(w[0].contains(word), "{word}: {}", w[0]);
    }
    assert!(warnings_with(&msgs, "ended by length").is_empty());
}

/// `instruct` on a checkpoint that drops it (the tiny CustomVoice is 0.6B), and a VoiceDesign
/// checkpoint without one, are warned about once, naming the property.
#[test]
fn ignored_or_missing_instruct_is_warned_once() {
    let instruct_warnings = |model: &str, instruct: Option<&str>| {
        let (mut h, bus) = harness(&[("text", v("First one.")), ("max-new-tokens", v(3u32))]);
        let e = h.element().unwrap();
        e.set_property("model", model);
        if let Some(i) = instruct {
            e.set_property("instruct", i);
        }
        let (pad, probe) = play_holding_first_buffer(&mut h);
        assert!(e.emit_by_name::<bool>("push-text", &[&"Second one."]));
        pad.remove_probe(probe);
        pull_all(&mut h);
        let msgs = drain_ok(&bus);
        assert_eq!(element_messages(&msgs, messages::DONE).len(), 2);
        warnings_with(&msgs, "instruct ")
            .into_iter()
            .filter(|w| w.starts_with("instruct "))
            .collect::<Vec<_>>()
    };
    let w = instruct_warnings(&fixture_model("tiny-customvoice"), Some("Speak calmly."));
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].starts_with("instruct 'Speak calmly.': ignored"),
        "{}",
        w[0]
    );
    assert!(instruct_warnings(&fixture_model("tiny-customvoice"), None).is_empty());

    let design = fixture_model("tiny-voicedesign");
    let w = instruct_warnings(&design, None);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains("VoiceDesign") && w[0].contains("set instruct"),
        "{}",
        w[0]
    );
    assert!(instruct_warnings(&design, Some("A calm, low voice.")).is_empty());
}
