//! The elements on a Fish Audio S2 Pro checkpoint (tests/fixtures/tiny-fish): `model=` the
//! directory just works; output caps at 44,100 Hz; buffer offsets, timestamps, durations and
//! the bus messages counted at 44,100 Hz, 2048 samples a frame; a cue of omnittssynth placed at
//! its PTS in 44.1 kHz samples; voice cloning with `ref-audio` / `ref-text`; the Qwen3-TTS-only
//! properties refused, naming the property and the model; streamed text (`append-text`,
//! `omnittssynth` fragments) in clause mode; and through gst-launch syntax, the official
//! reference's waveforms.

mod element_util;
mod fish_fixture;
mod reference_util;

use std::path::Path;
use std::time::{Duration, Instant};

use element_util::{
    TempDir, assert_names, drain, element_messages, errors, init, start_error, start_must_fail, v,
};
use gst::prelude::*;
use gst_check::Harness;
use gstomnitts::element_common::messages;
use reference_util::fixture_model;

const RATE: u64 = 44_100;
const SPF: u64 = 2048;

fn model() -> String {
    fixture_model("tiny-fish")
}

/// An `omnittssrc` harness on the Fish fixture, greedy, at most 12 frames an utterance, with a
/// bus of its own and `props` set in order after those.
fn fish_src(props: &[(&str, gst::glib::SendValue)]) -> (Harness, gst::Element, gst::Bus) {
    let mut all = vec![("model", v(model())), ("max-new-tokens", v(12u32))];
    all.extend(props.iter().cloned());
    let (h, bus) = element_util::harness(&all);
    let e = h.element().unwrap();
    (h, e, bus)
}

/// An `omnittssynth` harness on the Fish fixture (greedy, at most 12 frames an utterance,
/// `input-mode` as given; [`element_util::synth_harness`]).
fn fish_synth(input_mode: &str) -> (Harness, gst::Bus) {
    element_util::synth_harness(&model(), 12, &[("input-mode", input_mode)])
}

/// `n * SECOND / 44100`, rounded down.
fn pts_of(n: u64) -> gst::ClockTime {
    gst::ClockTime::from_nseconds((n as u128 * 1_000_000_000 / RATE as u128) as u64)
}

fn f32_of(b: &gst::BufferRef) -> Vec<f32> {
    let m = b.map_readable().unwrap();
    m.as_slice()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Checks that buffer `b` starts at sample `n` on the 44.1 kHz timeline shifted by `t0`.
fn check_buffer(b: &gst::BufferRef, n: u64) {
    let len = (b.size() / 4) as u64;
    assert!(len > 0);
    assert_eq!(b.offset(), n, "offset");
    assert_eq!(b.offset_end(), n + len, "offset_end");
    assert_eq!(b.pts(), Some(pts_of(n)), "pts of sample {n}");
    assert_eq!(b.duration(), Some(pts_of(n + len) - pts_of(n)), "duration");
}

/// Every buffer of `h` up to EOS (each checked to continue the 44.1 kHz timeline), as samples.
fn pull_to_eos(h: &mut Harness) -> Vec<f32> {
    let t0 = Instant::now();
    let mut out: Vec<f32> = Vec::new();
    loop {
        assert!(t0.elapsed() < Duration::from_secs(120), "no EOS");
        if let Some(ev) = h.try_pull_event()
            && ev.type_() == gst::EventType::Eos
        {
            while let Some(b) = h.try_pull() {
                check_buffer(&b, out.len() as u64);
                out.extend(f32_of(&b));
            }
            return out;
        }
        match h.try_pull() {
            Some(b) => {
                check_buffer(&b, out.len() as u64);
                out.extend(f32_of(&b));
            }
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Writes `samples` as a mono 44.1 kHz f32 WAV at `path`.
fn write_wav(path: &std::path::Path, samples: &[f32]) {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 44_100,
        bits_per_sample: 32,
        sample_format: hound::SampleFormat::Float,
    };
    let mut w = hound::WavWriter::create(path, spec).unwrap();
    for &x in samples {
        w.write_sample(x).unwrap();
    }
    w.finalize().unwrap();
}

fn rate_of(caps: &gst::Caps) -> i32 {
    caps.structure(0).unwrap().get::<i32>("rate").unwrap()
}

#[test]
fn omnittssrc_speaks_fish_at_44100_hz() {
    let (mut h, _e, bus) = fish_src(&[("text", v("Hello world. This is a small test of speech."))]);
    h.play();
    let mut bufs = Vec::new();
    loop {
        match h.pull_until_eos() {
            Ok(Some(b)) => bufs.push(b),
            Ok(None) => break,
            Err(e) => panic!("pull: {e}"),
        }
    }
    let caps = h.sinkpad().unwrap().current_caps().expect("caps");
    assert_eq!(rate_of(&caps), 44_100, "{caps}");
    let mut n = 0u64;
    for b in &bufs {
        check_buffer(b, n);
        n += (b.size() / 4) as u64;
    }
    let msgs = drain(&bus);
    assert!(errors(&msgs).is_empty(), "{:?}", errors(&msgs));
    let done = element_messages(&msgs, messages::DONE);
    assert_eq!(done.len(), 1);
    let d = &done[0];
    let frames = d.get::<u64>("frames").unwrap();
    assert_eq!(frames, 11, "the fixture's en_text case: 11 frames");
    assert_eq!(n, frames * SPF, "samples = frames × 2048");
    assert_eq!(d.get::<u64>("samples").unwrap(), n);
    assert_eq!(d.get::<u64>("duration").unwrap(), pts_of(n).nseconds());
    let audio_ms = d.get::<f64>("audio-ms").unwrap();
    assert!(
        (audio_ms - n as f64 * 1000.0 / RATE as f64).abs() < 1e-6,
        "audio-ms {audio_ms} at 44.1 kHz"
    );
    let samples: Vec<f32> = bufs.iter().flat_map(|b| f32_of(b)).collect();
    assert!(samples.iter().all(|x| x.is_finite() && x.abs() <= 1.0));
}

/// An unset sampling property reads as the loaded checkpoint's default (S2 Pro's: temperature
/// 1.0, top-k 30, top-p 0.9, no repetition penalty), the value its utterances use, so that an
/// application that reads the properties and writes them back changes nothing; before the model
/// is loaded it reads as the released Qwen3-TTS checkpoints' default.
#[test]
fn unset_sampling_properties_read_as_the_loaded_models_defaults() {
    init();
    let e = gst::ElementFactory::make("omnittssrc")
        .property("model", model())
        .property("text", "Hello.")
        .property("max-new-tokens", 4u32)
        .build()
        .unwrap();
    let read = |e: &gst::Element| {
        (
            e.property::<f64>("temperature"),
            e.property::<u32>("top-k"),
            e.property::<f64>("top-p"),
            e.property::<f64>("repetition-penalty"),
        )
    };
    assert_eq!(read(&e), (0.9, 50, 1.0, 1.05), "before start");
    e.set_state(gst::State::Paused).unwrap();
    assert_eq!(
        read(&e),
        (1.0, 30, 0.9, 1.0),
        "S2 Pro's defaults once loaded"
    );
    assert_eq!(
        e.property::<u32>("max-new-tokens"),
        4,
        "a set property keeps its value"
    );
    e.set_property("top-k", 7u32);
    assert_eq!(read(&e).1, 7);
    e.set_state(gst::State::Null).unwrap();
}

/// A dialogue longer than `split-sentences=auto`'s threshold (594 characters with Fish's
/// built-in 4096 frames) and of several generation batches (9 turns): spoken whole, as one
/// utterance, its turns batched by the model with each batch's prompt holding the earlier ones;
/// its frames are the direct model calls' (`FishModel::synthesize_codes`).
#[test]
fn a_long_dialogue_is_one_utterance_in_auto_mode() {
    use gstomnitts::models::fish_speech::{FishModel, GenerateOptions, SamplingParams};
    let lines = [
        "Hello world, this is a small test of speech synthesis with numbers like 42.",
        "Good morning, how are you today? I am fine, thank you very much for asking.",
        "The quick brown fox jumps over the lazy dog, and she said it's fine.",
        "你好，世界。今天天气很好，我们一起去公园吧。这是一个语音合成的小测试。",
        "Let's go to the park. We will see the harbour and the morning train.",
        "谢谢你的帮助，我们明天见。请把文本转换成语音。",
        "It was a fine morning, and the rain had stopped before the station.",
        "Goodbye for now, and see you tomorrow at the station by the harbour.",
        "One more line, so that the text is well past the threshold of the auto rule.",
    ];
    let text: String = lines
        .iter()
        .enumerate()
        .map(|(i, l)| format!("<|speaker:{}|>{l} ", i % 3))
        .collect();
    assert!(
        text.chars().count() > 594,
        "{} characters",
        text.chars().count()
    );
    let (mut h, _e, bus) = fish_src(&[("text", v(text.as_str())), ("do-sample", v(false))]);
    h.play();
    let n = pull_to_eos(&mut h).len() as u64;
    let msgs = drain(&bus);
    assert!(errors(&msgs).is_empty(), "{:?}", errors(&msgs));
    let done = element_messages(&msgs, messages::DONE);
    assert_eq!(done.len(), 1, "one utterance");
    let m = FishModel::load(
        std::path::Path::new(&model()),
        &candle_core::Device::Cpu,
        candle_core::DType::F32,
    )
    .unwrap();
    assert!(m.prompts.batches(&text, 512).unwrap().len() > 1);
    let opts = GenerateOptions {
        sampling: SamplingParams::GREEDY,
        max_new_tokens: 12,
        seed: 0,
    };
    let direct = m.synthesize_codes(&text, None, &opts).unwrap();
    let frames = done[0].get::<u64>("frames").unwrap();
    assert_eq!(frames, direct[0].len() as u64, "the direct calls' frames");
    assert_eq!(n, frames * SPF);
}

#[test]
fn omnittssynth_places_a_fish_cue_at_its_pts_in_44100_hz_samples() {
    let (mut h, bus) = fish_synth("cues");
    let mut b = gst::Buffer::from_slice(b"Hello world. This is a small test of speech.".to_vec());
    {
        let b = b.get_mut().unwrap();
        b.set_pts(gst::ClockTime::from_mseconds(500));
        b.set_duration(gst::ClockTime::from_seconds(2));
    }
    h.push(b).unwrap();
    h.push_event(gst::event::Eos::new());
    let out = pull_to_eos(&mut h);
    let caps = h.sinkpad().unwrap().current_caps().expect("caps");
    assert_eq!(rate_of(&caps), 44_100, "{caps}");
    let start = (RATE / 2) as usize; // 500 ms
    assert!(
        out[..start].iter().all(|&x| x == 0.0),
        "silence before the cue"
    );
    assert!(
        out[start..].iter().any(|&x| x != 0.0),
        "speech from the cue on"
    );
    let msgs = drain(&bus);
    assert!(errors(&msgs).is_empty(), "{:?}", errors(&msgs));
    let done = element_messages(&msgs, messages::DONE);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].get::<u64>("pts").unwrap(), 500_000_000);
    assert_eq!(done[0].get::<u64>("samples").unwrap(), 11 * SPF);
}

#[test]
fn qwen_only_properties_are_refused_naming_the_property_and_the_model() {
    for (prop, value, words) in [
        (
            "instruct",
            v("Whisper."),
            &["instruct", "Fish Audio S2 Pro"][..],
        ),
        (
            "speaker",
            v("vivian"),
            &["speaker", "Fish Audio S2 Pro", "no preset"][..],
        ),
        (
            "language",
            v("german"),
            &["language", "Fish Audio S2 Pro"][..],
        ),
        (
            "x-vector-only",
            v(true),
            &["x-vector-only", "Fish Audio S2 Pro"][..],
        ),
        (
            "prompt-mode",
            v("streaming"),
            &["prompt-mode 'streaming'", "Fish Audio S2 Pro"][..],
        ),
        (
            "quantization",
            v("q8-0"),
            &[
                "quantization 'q8-0'",
                "Fish Audio S2 Pro",
                "dense weights only",
            ][..],
        ),
    ] {
        let errs = start_error(&model(), &[("text", v("Hello.")), (prop, value.clone())]);
        assert_names(&errs, words);
        init();
        let synth = gst::ElementFactory::make("omnittssynth").build().unwrap();
        synth.set_property("model", model());
        element_util::set(&synth, prop, &value);
        let errs = start_must_fail(&synth, prop);
        assert_names(&errs, words);
    }
}

/// A speaker-map entry that clones from a reference the checkpoint cannot use (missing, too
/// short, without its transcript) fails the state change as the same `ref-audio` / `ref-text`
/// properties do, naming the entry and the property; a good one starts.
#[test]
fn speaker_map_clone_entries_are_checked_at_start() {
    init();
    let dir = TempDir::new("fish-map");
    // A tone of `n` samples at 44.1 kHz.
    let tone = |n: usize| -> Vec<f32> { (0..n).map(|i| 0.2 * (i as f32 * 0.05).sin()).collect() };
    let good = dir.path().join("good.wav");
    write_wav(&good, &tone(44_100));
    let short = dir.path().join("short.wav");
    write_wav(&short, &tone(4_410));
    let entry = |audio: &Path, text: Option<&str>| {
        let text = text
            .map(|t| format!(", ref-text=\"{t}\""))
            .unwrap_or_default();
        format!(
            "map, spk_0=[voice, ref-audio=\"{}\"{text}]",
            audio.display()
        )
    };
    let synth = |map: &str| {
        let e = gst::ElementFactory::make("omnittssynth").build().unwrap();
        e.set_property("model", model());
        e.set_property_from_str("speaker-map", map);
        e
    };
    let missing = dir.path().join("missing.wav");
    for (map, words) in [
        (
            entry(&missing, Some("Hello.")),
            vec![
                "speaker-map 'spk_0'".to_string(),
                format!("ref-audio '{}'", missing.display()),
            ],
        ),
        (
            entry(&short, Some("Hello.")),
            vec!["speaker-map 'spk_0'".to_string(), "too short".to_string()],
        ),
        (
            entry(&good, None),
            vec!["speaker-map 'spk_0'".to_string(), "ref-text".to_string()],
        ),
    ] {
        let errs = element_util::start_must_fail(&synth(&map), &map);
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        assert_names(&errs, &words);
    }
    let e = synth(&entry(&good, Some("Hello there.")));
    let res = e.set_state(gst::State::Paused);
    let _ = e.set_state(gst::State::Null);
    assert!(res.is_ok(), "a good clone entry starts");
}

/// Words before a dialogue's first speaker tag are not spoken (the model speaks turns only, as
/// the reference does): the element warns, naming them, whether the text is split or not; under
/// `split-sentences=true` every sentence keeps its turn's tag.
#[test]
fn words_before_the_first_speaker_tag_are_warned_about() {
    let text = "Intro words. <|speaker:0|>Hello there. How are you? <|speaker:1|>Fine.";
    for split in ["false", "true"] {
        let (mut h, _e, bus) = fish_src(&[
            ("split-sentences", v(split)),
            ("text", v(text)),
            ("do-sample", v(false)),
        ]);
        h.play();
        pull_to_eos(&mut h);
        let msgs = drain(&bus);
        assert!(errors(&msgs).is_empty(), "{:?}", errors(&msgs));
        let w: Vec<String> = element_util::warnings(&msgs)
            .into_iter()
            .filter(|w| w.contains("before its first speaker tag"))
            .collect();
        assert_eq!(w.len(), 1, "split-sentences={split}: {w:?}");
        assert!(w[0].contains("('Intro words.') are not spoken"), "{}", w[0]);
        let texts: Vec<String> = element_messages(&msgs, messages::DONE)
            .iter()
            .map(|d| d.get::<String>("text").unwrap())
            .collect();
        if split == "true" {
            assert_eq!(
                texts,
                [
                    "<|speaker:0|>Hello there.",
                    "<|speaker:0|>How are you?",
                    "<|speaker:1|>Fine."
                ]
            );
        } else {
            assert_eq!(texts, [text]);
        }
    }
}

/// Another family's stage config is refused at start, naming the property, its file and the key.
#[test]
fn a_stage_config_of_another_family_is_refused_naming_the_file() {
    let yaml = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/qwen3_tts.yaml");
    let yaml = yaml.to_str().unwrap().to_string();
    let errs = start_error(
        &model(),
        &[("text", v("Hello.")), ("stage-config", v(yaml.clone()))],
    );
    assert_names(
        &errs,
        &[
            &format!("stage-config '{yaml}'"),
            "stage_args[0].engine_args.model_stage",
            "Fish Audio S2 Pro",
        ],
    );
}

/// A 1 s reference recording (a 44.1 kHz WAV with a falling tone): cloned through `ref-audio`
/// and `ref-text`, the utterance is spoken (the codes of the reference are in its prompt).
#[test]
fn ref_audio_and_ref_text_clone_with_fish() {
    let dir = TempDir::new("fish-clone");
    let wav = dir.path().join("ref.wav");
    let tone: Vec<f32> = (0..44_100)
        .map(|i| {
            let t = i as f32 / 44_100.0;
            0.3 * (std::f32::consts::TAU * (300.0 - 100.0 * t) * t).sin()
        })
        .collect();
    write_wav(&wav, &tone);
    let run = |ref_text: Option<&str>| {
        let mut props = vec![("ref-audio", v(wav.to_str().unwrap().to_string()))];
        if let Some(t) = ref_text {
            props.push(("ref-text", v(t)));
        }
        props.push(("text", v("Good morning, how are you today?")));
        let (mut h, _e, bus) = fish_src(&props);
        h.play();
        let mut n = 0u64;
        loop {
            match h.pull_until_eos() {
                Ok(Some(b)) => {
                    check_buffer(&b, n);
                    n += (b.size() / 4) as u64;
                }
                Ok(None) => break,
                Err(_) => break,
            }
        }
        (n, drain(&bus))
    };
    let (n, msgs) = run(Some("The quick brown fox."));
    assert!(errors(&msgs).is_empty(), "{:?}", errors(&msgs));
    let done = element_messages(&msgs, messages::DONE);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].get::<u64>("samples").unwrap(), n);
    assert_eq!(n % SPF, 0);
    // Without the transcript: refused, naming ref-text.
    let errs = start_error(
        &model(),
        &[
            ("text", v("Hello.")),
            ("ref-audio", v(wav.to_str().unwrap().to_string())),
        ],
    );
    assert_names(&errs, &["ref-text"]);
}

/// Through gst-launch syntax, greedy, each case of each reference fixture (English and Chinese,
/// text only and cloned from the reference recording through `ref-audio` / `ref-text`; S2 Pro's
/// configuration and the other options): the WAV written by `wavenc` holds the official
/// reference's waveform for the case (relative L2 < 1e-4), sample for sample in length.
#[test]
fn gst_launch_speaks_the_references_waveforms() {
    init();
    for f in fish_fixture::all() {
        let (exp, meta, fx) = (&f.expected, &f.meta, f.name);
        let dir = TempDir::new("fish-launch");
        // The reference recording the clone cases' codes were encoded from (44.1 kHz, f32).
        let ref_wav = dir.path().join("ref.wav");
        write_wav(&ref_wav, &reference_util::f32s(&exp["ref_audio"]));
        let max_new = meta["generation"]["max_new_tokens"].as_u64().unwrap();
        for case in ["en_text", "zh_text", "en_clone", "zh_clone"] {
            let c = &meta["cases"][case];
            let out = dir.path().join(format!("{case}.wav"));
            let clone = c["ref_text"]
                .as_str()
                .map(|t| format!("ref-audio=\"{}\" ref-text=\"{t}\"", ref_wav.display()))
                .unwrap_or_default();
            let pipeline = gst::parse::launch(&format!(
                "omnittssrc model=\"{}\" do-sample=false max-new-tokens={max_new} \
                 split-sentences=false {clone} text=\"{}\" ! audio/x-raw,format=F32LE ! wavenc ! \
                 filesink location=\"{}\"",
                fixture_model(fx),
                c["text"].as_str().unwrap(),
                out.display()
            ))
            .unwrap();
            let dones = element_util::play_to_eos(&pipeline);
            assert_eq!(dones.len(), 1, "{fx}/{case}");
            let mut r = hound::WavReader::open(&out).unwrap();
            assert_eq!(r.spec().sample_rate, 44_100, "{fx}/{case}");
            let got: Vec<f32> = r.samples::<f32>().map(Result::unwrap).collect();
            let want = reference_util::f32s(&exp[&format!("{case}.wav")]);
            assert!(
                !want.is_empty(),
                "{fx}/{case}: the fixture holds a waveform"
            );
            assert_eq!(got.len(), want.len(), "{fx}/{case}: samples");
            let e = reference_util::rel_l2(&got, &want);
            assert!(e < 1e-4, "{fx}/{case}: waveform relative L2 {e:.2e}");
        }
    }
}

/// `append-text` on a Fish checkpoint (a model that takes whole texts only): the fragments are
/// spoken clause by clause as each completes (clause mode, said in the text-stream-mode
/// message), the utterance ends with `end-text`, and its done message holds the whole text.
#[test]
fn appended_text_is_spoken_clause_by_clause() {
    let (mut h, e, bus) = fish_src(&[("is-live", v(true))]);
    h.use_systemclock();
    let started = e.set_state(gst::State::Playing);
    assert!(started.is_ok(), "{:?}", drain(&bus));
    assert!(e.emit_by_name::<bool>("append-text", &[&"Hello world, this is"]));
    assert!(e.emit_by_name::<bool>("append-text", &[&" a small test of speech."]));
    assert!(e.emit_by_name::<bool>("end-text", &[]));
    let mut seen = Vec::new();
    let done = element_util::wait_element_message(
        &bus,
        messages::DONE,
        Duration::from_secs(60),
        &mut seen,
    )
    .unwrap_or_else(|| panic!("no done message; errors {:?}", errors(&seen)));
    assert!(errors(&seen).is_empty(), "{:?}", errors(&seen));
    element_util::assert_stream_mode(&seen, "clause", "whole texts");
    assert_eq!(
        done.get::<String>("text").unwrap(),
        "Hello world, this is a small test of speech."
    );
    assert!(done.get::<u64>("samples").unwrap() > 0);
    assert_eq!(done.get::<u64>("samples").unwrap() % SPF, 0);
    let _ = e.set_state(gst::State::Null);
}

/// `omnittssynth input-mode=fragments` on a Fish checkpoint: clause mode (the model takes whole
/// texts only), the fragments up to the MARKER spoken as one utterance whose cue is at its first
/// fragment's PTS, silence before it.
#[test]
fn omnittssynth_fragments_speak_fish_in_clause_mode() {
    let (mut h, bus) = fish_synth("fragments");
    for (text, ms, end) in [
        ("Hello world, this is", 300, false),
        (" a small test of speech.", 350, true),
    ] {
        let mut b = gst::Buffer::from_slice(text.as_bytes().to_vec());
        {
            let b = b.get_mut().unwrap();
            b.set_pts(gst::ClockTime::from_mseconds(ms));
            if end {
                b.set_flags(gst::BufferFlags::MARKER);
            }
        }
        h.push(b).unwrap();
    }
    h.push_event(gst::event::Eos::new());
    let out = pull_to_eos(&mut h);
    let msgs = drain(&bus);
    assert!(errors(&msgs).is_empty(), "{:?}", errors(&msgs));
    element_util::assert_stream_mode(&msgs, "clause", "whole texts");
    let cues = element_messages(&msgs, gstomnitts::omnittssynth::cue_message::CUE);
    assert_eq!(cues.len(), 1, "{cues:?}");
    assert_eq!(
        cues[0].get::<String>("text").unwrap(),
        "Hello world, this is a small test of speech."
    );
    assert_eq!(
        cues[0].get::<Option<gst::ClockTime>>("pts").unwrap(),
        Some(gst::ClockTime::from_mseconds(300))
    );
    let start = (RATE * 3 / 10) as usize; // 300 ms
    assert!(out.len() > start, "{} samples", out.len());
    assert!(
        out[..start].iter().all(|&x| x == 0.0),
        "silence before the cue"
    );
    assert!(
        out[start..].iter().any(|&x| x != 0.0),
        "speech after the cue"
    );
}
