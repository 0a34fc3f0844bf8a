//! Fish Audio S2 Pro through the engine (the model seam), on tests/fixtures/tiny-fish: the
//! engine's greedy codes and audio equal the direct model calls and the reference's codes (on
//! tiny-fish-alt too),
//! streamed = whole, batched = solo, a mixed batch with a request that makes no frame, the
//! first-chunk lane leaving the audio as it was, and the stage config's model_arch checked
//! against the checkpoint.

mod engine_common;
mod reference_util;

mod fish_fixture;

use fish_fixture::{expected, fixture, meta};
use std::collections::HashMap;
use std::path::Path;
use std::sync::mpsc::Receiver;

use candle_core::{DType, Device, Tensor};
use engine_common::{Run, check_protocol};
use gstomnitts::engine::{
    DeviceSpec, Engine, EngineError, EngineOptions, EngineRequest, FinishReason, FirstChunkLane,
    StageConfig,
};
use gstomnitts::models::fish_speech::codec::Codec;
use gstomnitts::models::fish_speech::{FishModel, GenerateOptions, SamplingParams, VoiceReference};
use gstomnitts::models::registry::{FISH_SPEECH, QWEN3_TTS};
use gstomnitts::models::tts::{VoiceClonePrompt, VoiceRequest};

const MAX_NEW_TOKENS: usize = 12;
const CASES: [&str; 4] = ["en_text", "zh_text", "en_clone", "zh_clone"];

/// `[a][b]` → `[b][a]`.
fn transpose(rows: &[Vec<u32>]) -> Vec<Vec<u32>> {
    let n = rows.first().map_or(0, Vec::len);
    (0..n)
        .map(|i| rows.iter().map(|r| r[i]).collect())
        .collect()
}

fn codes_of(t: &Tensor) -> Vec<Vec<u32>> {
    t.to_dtype(DType::U32).unwrap().to_vec2().unwrap()
}

/// Fish's built-in config (async `batch` false, batch true) on the CPU with `max_num_seqs`.
fn config(batch: bool, max_num_seqs: usize) -> StageConfig {
    let mut c = StageConfig::builtin(&FISH_SPEECH, batch).unwrap();
    c.ar.max_num_seqs = max_num_seqs;
    c.decoder.max_num_seqs = max_num_seqs;
    c
}

fn load(cfg: StageConfig) -> Engine {
    load_at(&fixture(), cfg)
}

fn load_at(dir: &Path, cfg: StageConfig) -> Engine {
    Engine::load(EngineOptions {
        model_dir: dir.to_path_buf(),
        stage_config: cfg,
        ar_device: DeviceSpec::Cpu,
        decoder_device: DeviceSpec::Cpu,
    })
    .unwrap_or_else(|e| panic!("loading {}: {e}", dir.display()))
}

/// The request of fixture case `case`: its text, and for a clone case the reference's codes
/// (`[frames][10]`) and transcript.
fn voice(case: &str, exp: &HashMap<String, Tensor>, meta: &serde_json::Value) -> VoiceRequest {
    let c = &meta["cases"][case];
    VoiceRequest {
        text: c["text"].as_str().unwrap().to_string(),
        voice_clone: c["ref_text"].as_str().map(|t| VoiceClonePrompt {
            ref_codes: Some(transpose(&codes_of(&exp["ref_codes"]))),
            x_vector: Vec::new(),
            ref_text: Some(t.to_string()),
            icl: true,
        }),
        ..VoiceRequest::default()
    }
}

fn greedy(engine: &Engine, voice: VoiceRequest, max_new_tokens: usize) -> EngineRequest {
    let mut s = engine.default_sampling_params().greedy();
    s.max_new_tokens = max_new_tokens;
    EngineRequest::new(voice, s)
}

/// Drains a tapped request: its run and its codes `[frames][10]`.
fn drain(h: gstomnitts::engine::RequestHandle, codes: Receiver<Vec<u32>>) -> (Run, Vec<Vec<u32>>) {
    let mut events = Vec::new();
    while let Some(ev) = h.recv() {
        events.push(ev);
    }
    (check_protocol(&events), codes.try_iter().collect())
}

fn run(engine: &Engine, req: EngineRequest) -> (Run, Vec<Vec<u32>>) {
    let (h, codes) = engine.submit_tapped(req).expect("submit");
    drain(h, codes)
}

/// ‖a − b‖ / ‖b‖ (streamed and whole decodes differ by float rounding only: the chunks' convs
/// and attention run on other shapes).
fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    reference_util::rel_l2(a, b)
}

#[test]
fn engine_describes_fish_and_runs_its_built_in_config() {
    let e = load(config(false, 1));
    let d = e.description();
    assert_eq!(d.model_type, "fish_qwen3_omni");
    assert_eq!((e.sample_rate(), e.samples_per_frame()), (44_100, 2048));
    assert_eq!(d.num_codebooks, 10);
    assert!(d.speakers.is_empty() && d.languages.is_empty());
    assert!((d.frame_rate() - 44_100.0 / 2048.0).abs() < 1e-9);
}

#[test]
fn greedy_codes_and_audio_equal_the_direct_model_calls() {
    for f in fish_fixture::all() {
        let (exp, meta, fx) = (&f.expected, &f.meta, f.name);
        let engine = load_at(&f.dir, config(false, 1));
        let m = FishModel::load(&f.dir, &Device::Cpu, DType::F32).unwrap();
        let codec = Codec::load(&f.dir, &Device::Cpu).unwrap();
        let opts = GenerateOptions {
            sampling: SamplingParams::GREEDY,
            max_new_tokens: MAX_NEW_TOKENS,
            seed: 0,
        };
        // The four cases, and speaker-tagged text (its batch: the text before the first tag
        // dropped, each turn trimmed).
        for case in CASES.into_iter().chain(["speakers"]) {
            let c = &meta["cases"][case];
            let v = voice(case, exp, meta);
            let (r, codes) = run(&engine, greedy(&engine, v, MAX_NEW_TOKENS));
            let reference = c["ref_text"].as_str().map(|t| VoiceReference {
                codes: codes_of(&exp["ref_codes"]),
                transcript: t.to_string(),
            });
            let batches = m.prompts.batches(c["text"].as_str().unwrap(), 512).unwrap();
            assert_eq!(batches.len(), 1, "{fx}/{case}");
            let prompt = m.prompt(&batches[0], reference.as_ref()).unwrap();
            let direct = m.generate(&prompt, &opts, None).unwrap();
            assert_eq!(
                transpose(&codes),
                direct.codes,
                "{fx}/{case}: codes = direct"
            );
            assert_eq!(
                transpose(&codes),
                codes_of(&exp[&format!("{case}.codes")]),
                "{fx}/{case}: codes = the reference's"
            );
            let want_reason = if direct.stopped {
                FinishReason::Eos
            } else {
                FinishReason::Length
            };
            assert_eq!(r.reason, want_reason, "{fx}/{case}");
            assert_eq!(
                r.audio.len(),
                codes.len() * 2048,
                "{fx}/{case}: frames × 2048"
            );
            let whole = codec.decode(&direct.codes).unwrap();
            let dev = rel_l2(&r.audio, &whole);
            assert!(
                dev < 1e-5,
                "{fx}/{case}: streamed audio vs the direct decode: {dev}"
            );
        }
    }
}

#[test]
fn streamed_equals_whole_and_batched_equals_solo() {
    let (exp, meta) = (expected(), meta());
    let whole = load(config(true, 1));
    let solo: Vec<(Run, Vec<Vec<u32>>)> = CASES
        .iter()
        .map(|c| {
            run(
                &whole,
                greedy(&whole, voice(c, &exp, &meta), MAX_NEW_TOKENS),
            )
        })
        .collect();
    drop(whole);
    let streamed = load(config(false, 4));
    // All four at once, plus one that makes no frame (max_new_tokens 1: its only frame is the
    // dropped last one) and an empty text, refused at submit.
    let empty = VoiceRequest {
        text: "  ".into(),
        ..VoiceRequest::default()
    };
    match streamed.submit(greedy(&streamed, empty, 4)) {
        Err(EngineError::InvalidRequest { field, .. }) => assert_eq!(field, "voice.text"),
        other => panic!("empty text: {other:?}"),
    }
    let handles: Vec<_> = CASES
        .iter()
        .map(|c| {
            streamed
                .submit_tapped(greedy(&streamed, voice(c, &exp, &meta), MAX_NEW_TOKENS))
                .unwrap()
        })
        .collect();
    let none = streamed
        .submit_tapped(greedy(&streamed, voice("en_text", &exp, &meta), 1))
        .unwrap();
    let together: Vec<(Run, Vec<Vec<u32>>)> =
        handles.into_iter().map(|(h, c)| drain(h, c)).collect();
    let (nothing, no_codes) = drain(none.0, none.1);
    assert!(no_codes.is_empty() && nothing.audio.is_empty());
    assert_eq!(nothing.reason, FinishReason::Length);
    for ((case, (a, ac)), (b, bc)) in CASES.iter().zip(&together).zip(&solo) {
        assert_eq!(ac, bc, "{case}: batched codes = solo");
        assert_eq!(a.reason, b.reason, "{case}");
        assert_eq!(a.audio.len(), b.audio.len(), "{case}");
        let dev = rel_l2(&a.audio, &b.audio);
        assert!(dev < 1e-5, "{case}: streamed (chunks) vs whole: {dev}");
        // Streamed in chunks of 4 then 25 frames (the built-in schedule).
        assert_eq!(a.chunk_frames(2048)[0], 4.min(ac.len()), "{case}");
    }
    let stats = streamed.batch_stats();
    assert!(
        stats[0].max_rows >= 2,
        "stage 0 ran rows together: {stats:?}"
    );
}

/// The reference's dialogue of two generation batches (`expected/prompts.json`): through the
/// engine, alone and in one batch with two other requests, its codes are the reference's (the
/// second batch generated with the first and its codes in its prompt, prefilled afresh inside
/// the batched step) and its audio is both batches' frames, on every fixture.
#[test]
fn a_dialogue_of_several_batches_is_one_utterance() {
    for f in fish_fixture::all() {
        let (exp, meta, fx) = (&f.expected, &f.meta, f.name);
        let text = std::fs::read_to_string(f.dir.join("expected/prompts.json")).unwrap();
        let d: serde_json::Value = serde_json::from_str(&text).unwrap();
        let d = &d["dialogue"];
        let max_new = d["max_new_tokens"].as_u64().unwrap() as usize;
        let mut want: Vec<Vec<u32>> = vec![Vec::new(); 10];
        let batches = d["batches"].as_array().unwrap();
        assert!(batches.len() > 1, "{fx}");
        for b in batches {
            for (w, row) in want.iter_mut().zip(b["codes"].as_array().unwrap()) {
                w.extend(
                    row.as_array()
                        .unwrap()
                        .iter()
                        .map(|c| c.as_u64().unwrap() as u32),
                );
            }
        }
        let dialogue = VoiceRequest {
            text: d["text"].as_str().unwrap().to_string(),
            ..VoiceRequest::default()
        };
        let engine = load_at(&f.dir, config(false, 3));
        let (alone, codes) = run(&engine, greedy(&engine, dialogue.clone(), max_new));
        assert_eq!(transpose(&codes), want, "{fx}: the dialogue's codes, alone");
        assert_eq!(alone.audio.len(), codes.len() * 2048, "{fx}");
        let others: Vec<_> = ["en_text", "zh_clone"]
            .iter()
            .map(|c| {
                let v = voice(c, exp, meta);
                engine
                    .submit_tapped(greedy(&engine, v, MAX_NEW_TOKENS))
                    .unwrap()
            })
            .collect();
        let (h, c) = engine
            .submit_tapped(greedy(&engine, dialogue, max_new))
            .unwrap();
        let (together, codes) = drain(h, c);
        assert_eq!(
            transpose(&codes),
            want,
            "{fx}: the dialogue's codes, batched"
        );
        assert_eq!(together.reason, alone.reason, "{fx}");
        assert!(
            rel_l2(&together.audio, &alone.audio) < 1e-5,
            "{fx}: batched audio = alone"
        );
        // A cap of one step: every batch gives no frame (its only frame is the dropped last one),
        // and the utterance ends by its length, without an error.
        let mut one = greedy(&engine, VoiceRequest::default(), 1);
        one.voice.text = d["text"].as_str().unwrap().to_string();
        let (none, no_codes) = run(&engine, one);
        assert!(no_codes.is_empty() && none.audio.is_empty(), "{fx}");
        assert_eq!(none.reason, FinishReason::Length, "{fx}");
        for ((h, c), case) in others.into_iter().zip(["en_text", "zh_clone"]) {
            let (_, codes) = drain(h, c);
            let want = codes_of(&exp[&format!("{case}.codes")]);
            assert_eq!(transpose(&codes), want, "{fx}/{case} beside the dialogue");
        }
    }
}

/// A dialogue whose first batch ends at its cap and whose last ends on `<|im_end|>` ends by its
/// length, so that the cut in its middle is reported; one whose batches all end on `<|im_end|>`
/// ends by its EOS. (Greedy on tiny-fish, two batches of 5 + 2 turns: the first text's first
/// batch reaches the cap of 8, its second stops after 1 frame; the second text's batches both stop.)
#[test]
fn a_dialogue_cut_in_the_middle_ends_by_its_length() {
    let engine = load(config(false, 1));
    let dialogue = |lines: &[&str]| -> String {
        (0..7)
            .map(|i| format!("<|speaker:{}|>{}", i % 3, lines[i % lines.len()]))
            .collect()
    };
    for (lines, reason, frames) in [
        (
            &["How are you today?", "Yes.", "Why not?"][..],
            FinishReason::Length,
            7 + 1,
        ),
        (
            &["Let's go to the park.", "Why not?"][..],
            FinishReason::Eos,
            7,
        ),
    ] {
        let text = dialogue(lines);
        let req = greedy(
            &engine,
            VoiceRequest {
                text: text.clone(),
                ..VoiceRequest::default()
            },
            8,
        );
        let (r, codes) = run(&engine, req);
        assert_eq!((r.reason.clone(), codes.len()), (reason, frames), "{text}");
        assert_eq!(r.audio.len(), frames * 2048, "{text}");
    }
}

/// A dialogue whose next batch no longer fits the slow AR's length with the whole history in
/// its prompt (tiny-fish-alt's `max_seq_len` 2560 leaves 512 positions): the oldest batches leave
/// the history and the utterance goes on (the reference stops with an error there); a batch too
/// long even alone ends the request before its first frame.
#[test]
fn a_dialogue_past_the_length_drops_its_oldest_history() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-fish-alt");
    let engine = load_at(&dir, config(false, 1));
    let long_turn = "abcdefghij ".repeat(42);
    let text = format!(
        "<|speaker:0|>{long_turn} <|speaker:1|>A. <|speaker:0|>B. <|speaker:1|>C. \
         <|speaker:0|>D. <|speaker:1|>E."
    );
    let m = FishModel::load(&dir, &Device::Cpu, DType::F32).unwrap();
    let batches = m.prompts.batches(&text, 512).unwrap();
    assert_eq!(batches.len(), 2);
    let first = m.prompt(&batches[0], None).unwrap();
    let opts = GenerateOptions {
        sampling: SamplingParams::GREEDY,
        max_new_tokens: 300,
        seed: 0,
    };
    let first_codes = m.generate(&first, &opts, None).unwrap().codes;
    let history = [(batches[0].clone(), first_codes.clone())];
    let second = m.prompts.build(&batches[1], None, &history).unwrap();
    assert!(
        second.len() > 2560 - 2048,
        "the history does not fit: {}",
        second.len()
    );
    let voice = VoiceRequest {
        text: text.clone(),
        ..VoiceRequest::default()
    };
    let (r, codes) = run(&engine, greedy(&engine, voice, 300));
    assert!(
        matches!(r.reason, FinishReason::Eos | FinishReason::Length),
        "{:?}",
        r.reason
    );
    // The first batch's frames, then the second batch's, generated without the history.
    let alone = m.prompt(&batches[1], None).unwrap();
    let mut want = first_codes;
    for (w, c) in want
        .iter_mut()
        .zip(m.generate(&alone, &opts, None).unwrap().codes)
    {
        w.extend(c);
    }
    assert_eq!(transpose(&codes), want);
    // The direct calls leave the same history out.
    assert_eq!(m.synthesize_codes(&text, None, &opts).unwrap(), want);
    // A later batch too long even alone: the request is refused when it is submitted (and by
    // `validate`), naming the text, with an error that says so.
    let too_long = VoiceRequest {
        text: format!(
            "<|speaker:0|>Hi. <|speaker:1|>{}",
            "abcdefghij ".repeat(300)
        ),
        ..VoiceRequest::default()
    };
    let req = greedy(&engine, too_long, 12);
    for err in [
        engine.validate(&req).unwrap_err(),
        engine.submit(req).map(|_| ()).unwrap_err(),
    ] {
        match err {
            EngineError::InvalidRequest { field, msg, .. } => {
                assert_eq!(field, "voice.text");
                assert!(msg.contains("too long for one utterance"), "{msg}");
            }
            other => panic!("a batch too long alone: {other:?}"),
        }
    }
}

#[test]
fn a_stage_config_of_another_family_is_refused_naming_the_key() {
    let mut cfg = StageConfig::builtin(&QWEN3_TTS, false).unwrap();
    cfg.ar.device = DeviceSpec::Cpu;
    cfg.decoder.device = DeviceSpec::Cpu;
    let err = Engine::load(EngineOptions::new(fixture(), cfg)).unwrap_err();
    let msg = err.to_string();
    for part in [
        "stage_args[0].engine_args.model_stage",
        "\"qwen3_tts\"",
        "fish_speech",
        "fish_qwen3_omni",
    ] {
        assert!(msg.contains(part), "{part} in {msg}");
    }
    // A model_arch of another family: refused when the file is read (the stage name says the
    // family), and when a config built in code reaches the engine.
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/fish_speech.yaml"),
    )
    .unwrap()
    .replace(
        "model_arch: FishSpeechDACDecoder",
        "model_arch: Qwen3TTSCode2Wav",
    );
    let msg = StageConfig::from_yaml_str(&text).unwrap_err().to_string();
    assert!(
        msg.contains(
            "stage_args[1].engine_args.model_arch: expected \"FishSpeechDACDecoder\", got \"Qwen3TTSCode2Wav\""
        ),
        "{msg}"
    );
    let mut cfg = config(false, 1);
    cfg.decoder.model.arch = Some("Qwen3TTSCode2Wav".into());
    let err = Engine::load(EngineOptions::new(fixture(), cfg)).unwrap_err();
    let msg = err.to_string();
    for part in [
        "stage_args[1].engine_args.model_arch",
        "\"Qwen3TTSCode2Wav\"",
        "\"FishSpeechDACDecoder\"",
        "Qwen3-TTS (model_type qwen3_tts)",
    ] {
        assert!(msg.contains(part), "{part} in {msg}");
    }
}

#[test]
fn qwen_only_request_fields_are_refused_naming_the_field() {
    let (exp, meta) = (expected(), meta());
    let engine = load(config(false, 1));
    for (field, edit) in [
        (
            "voice.speaker",
            Box::new(|v: &mut VoiceRequest| v.speaker = Some("vivian".into()))
                as Box<dyn Fn(&mut VoiceRequest)>,
        ),
        (
            "voice.instruct",
            Box::new(|v: &mut VoiceRequest| v.instruct = Some("whisper".into())),
        ),
        (
            "voice.language",
            Box::new(|v: &mut VoiceRequest| v.language = Some("german".into())),
        ),
    ] {
        let mut v = voice("en_text", &exp, &meta);
        edit(&mut v);
        match engine.submit(greedy(&engine, v, 4)) {
            Err(EngineError::InvalidRequest { field: f, msg, .. }) => {
                assert_eq!(f, field);
                assert!(msg.contains("Fish S2 Pro"), "{msg}");
            }
            other => panic!("{field}: {other:?}"),
        }
    }
    match engine.submit_open(greedy(&engine, voice("en_text", &exp, &meta), 4)) {
        Err(EngineError::InvalidRequest { field, .. }) => assert_eq!(field, "voice.model"),
        Err(other) => panic!("open text: {other}"),
        Ok(_) => panic!("open text accepted"),
    }
}

#[test]
fn voice_clone_prompt_encodes_the_reference_with_the_fish_codec() {
    let exp = expected();
    let engine = load(config(false, 1));
    let codec = Codec::load(&fixture(), &Device::Cpu).unwrap();
    // A 44.1 kHz recording: the decoded reference codes, scaled to a clear level.
    let mut audio = codec.decode(&codes_of(&exp["ref_codes"])).unwrap();
    let peak = audio.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-9);
    audio.iter_mut().for_each(|x| *x *= 0.5 / peak);
    if audio.len() < 22_050 {
        let reps = 22_050usize.div_ceil(audio.len());
        audio = audio.repeat(reps);
    }
    let p = engine
        .voice_clone_prompt(&audio, Some("The quick brown fox."), false)
        .unwrap();
    assert!(p.icl && p.x_vector.is_empty());
    assert_eq!(p.ref_text.as_deref(), Some("The quick brown fox."));
    let codes = p.ref_codes.clone().unwrap();
    assert_eq!(codes.len(), audio.len().div_ceil(2048));
    assert_eq!(transpose(&codes), codec.encode(&audio).unwrap());
    // The prompt clones: a request with it runs to its frames.
    let v = VoiceRequest {
        text: "Good morning, how are you today?".into(),
        voice_clone: Some((*p).clone()),
        ..VoiceRequest::default()
    };
    let (r, frames) = run(&engine, greedy(&engine, v, 6));
    assert_eq!(r.audio.len(), frames.len() * 2048);
    for (ref_text, speaker_only, field) in [
        (None, false, "ref_text"),
        (Some("The quick brown fox."), true, "x_vector_only"),
    ] {
        match engine.voice_clone_prompt(&audio, ref_text, speaker_only) {
            Err(EngineError::InvalidRequest { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: {other:?}"),
        }
    }
    // Too short for a reference: named.
    match engine.voice_clone_prompt(&audio[..1000], Some("x"), false) {
        Err(EngineError::InvalidRequest { field, msg, .. }) => {
            assert_eq!(field, "ref_audio");
            assert!(msg.contains("44.1 kHz"), "{msg}");
        }
        other => panic!("short reference: {other:?}"),
    }
}

/// Sampled rows (each with its own seed) batched in one step give each row's solo codes: every
/// row draws from its own stream in the order it draws alone, and the fast AR's batched rows
/// equal each row alone.
#[test]
fn sampled_rows_together_equal_each_alone() {
    let (exp, meta) = (expected(), meta());
    let sampled = |engine: &Engine, case: &str, seed: u64| {
        let mut s = engine.default_sampling_params();
        s.do_sample = true;
        s.seed = seed;
        s.max_new_tokens = 10;
        EngineRequest::new(voice(case, &exp, &meta), s)
    };
    let cases = [("en_text", 1u64), ("zh_clone", 2), ("zh_text", 3)];
    let alone = load(config(false, 1));
    let solo: Vec<Vec<Vec<u32>>> = cases
        .iter()
        .map(|(c, seed)| run(&alone, sampled(&alone, c, *seed)).1)
        .collect();
    drop(alone);
    let together = load(config(false, 3));
    let handles: Vec<_> = cases
        .iter()
        .map(|(c, seed)| {
            together
                .submit_tapped(sampled(&together, c, *seed))
                .unwrap()
        })
        .collect();
    for ((case, _), ((h, codes), want)) in cases.iter().zip(handles.into_iter().zip(&solo)) {
        let (_, got) = drain(h, codes);
        assert_eq!(&got, want, "{case}: sampled codes batched = alone");
    }
    assert!(together.batch_stats()[0].max_rows >= 2);
}

#[test]
fn the_first_chunk_lane_leaves_every_streams_audio_as_it_was() {
    // Long enough that the lane hands each request on mid-utterance: it keeps a request for its
    // first 0.5 s (the 4-frame first chunk, then 25 frames), stage 1's thread decodes the rest
    // after those carried frames.
    const FRAMES: usize = 40;
    let (exp, meta) = (expected(), meta());
    let run_all = |lane: bool| -> Vec<(Run, Vec<Vec<u32>>)> {
        let mut cfg = config(false, 4);
        cfg.decoder.first_chunk_lane = Some(lane);
        let engine = load(cfg);
        let want = if lane {
            FirstChunkLane::On
        } else {
            FirstChunkLane::Off
        };
        assert_eq!(engine.first_chunk_lane(), &want);
        let handles: Vec<_> = CASES
            .iter()
            .map(|c| {
                engine
                    .submit_tapped(greedy(&engine, voice(c, &exp, &meta), FRAMES + 1))
                    .unwrap()
            })
            .collect();
        handles.into_iter().map(|(h, c)| drain(h, c)).collect()
    };
    let with = run_all(true);
    let without = run_all(false);
    let longest = with.iter().map(|(_, codes)| codes.len()).max().unwrap_or(0);
    assert!(
        longest > 29,
        "every request ended within the lane ({longest} frames)"
    );
    for ((case, (a, ac)), (b, bc)) in CASES.iter().zip(&with).zip(&without) {
        assert_eq!(ac, bc, "{case}: codes");
        assert_eq!(a.reason, b.reason, "{case}");
        assert_eq!(a.chunk_frames(2048), b.chunk_frames(2048), "{case}: chunks");
        let dev = rel_l2(&a.audio, &b.audio);
        assert!(dev < 1e-5, "{case}: lane vs none: {dev}");
    }
}
