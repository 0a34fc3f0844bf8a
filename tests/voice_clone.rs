//! Base voice cloning parity with the official reference (tests/fixtures/README.md, `tiny-base`):
//! the 128-bin log-mel front end, the ECAPA speaker encoder (x-vector), the Mimi codec encoder
//! (reference codes), both clone modes of the prompt (x-vector only and ICL, streaming and
//! non-streaming: token ids, prefill `inputs_embeds`, `trailing_text_hidden`) and the greedy codes,
//! for every clone case of every `reference/*.json` of a Base checkpoint; plus the error paths of
//! `create_voice_clone_prompt` and of requests.

mod reference_util;

use candle_core::Device;
use gstomnitts::models::qwen3_tts::mel::{MelConfig, MelSpectrogram};
use gstomnitts::models::qwen3_tts::{
    ArModel, ArStep, Checkpoint, FinishReason, MAX_REF_AUDIO_SAMPLES, MIN_REF_AUDIO_SAMPLES,
    ModelError, PromptMode, SamplingParams, VoiceClonePrompt, VoiceRequest,
};
use reference_util::{
    Suite, code_rows, f32s, fixtures_dir, frames, ids, load_f32, max_abs, reference_suites, rel_l2,
};

/// Every reference of a Base checkpoint (the ones with a `clone` section).
fn base_suites() -> Vec<Suite> {
    let base: Vec<Suite> = reference_suites()
        .into_iter()
        .filter(|s| s.json.get("variant").and_then(Value::as_str) == Some("base"))
        .collect();
    assert!(!base.is_empty(), "no Base reference JSON");
    base
}
use serde_json::Value;

fn clone_audio(s: &Suite) -> Vec<f32> {
    f32s(&s.clone_tensor("audio"))
}

const TOL: f64 = 1e-4;

#[test]
fn mel_matches_reference() {
    for s in base_suites() {
        let audio = clone_audio(&s);
        assert_eq!(
            audio.len(),
            s.json["clone"]["ref_audio_samples"].as_u64().unwrap() as usize
        );
        let want = &s.clone_tensor("mel");
        let (frames, mels) = want.dims2().unwrap();
        let mel = MelSpectrogram::new(MelConfig::speaker_encoder());
        assert_eq!(mel.num_frames(audio.len()), frames);
        let got = mel.compute(&audio).unwrap();
        assert_eq!(got.len(), frames * mels);
        let want = f32s(want);
        let r = rel_l2(&got, &want);
        let d = max_abs(&got, &want);
        assert!(r <= TOL, "{}: mel rel L2 {r:e} (max abs {d:e})", s.name);
        eprintln!("{}: mel rel L2 {r:e}, max abs {d:e}", s.name);
    }
}

#[test]
fn xvector_matches_reference() {
    for s in base_suites() {
        let m = load_f32(&s.ckpt_dir);
        let se = m.speaker_encoder().expect("Base has a speaker encoder");
        let want = f32s(&s.clone_tensor("xvector"));
        assert_eq!(want.len(), s.json["hidden_size"].as_u64().unwrap() as usize);
        // From the reference mel (encoder alone) and from the audio (front end + encoder).
        let mel = &s.clone_tensor("mel");
        let from_mel = f32s(&se.forward(mel).unwrap());
        let r = rel_l2(&from_mel, &want);
        assert!(
            r <= TOL,
            "{}: x-vector (reference mel) rel L2 {r:e}",
            s.name
        );
        let from_audio = f32s(&se.embed_audio(&clone_audio(&s)).unwrap());
        let r2 = rel_l2(&from_audio, &want);
        assert!(r2 <= TOL, "{}: x-vector (audio) rel L2 {r2:e}", s.name);
        eprintln!("{}: x-vector rel L2 {r:e} (mel), {r2:e} (audio)", s.name);
    }
}

#[test]
fn codec_encoder_codes_match_reference() {
    for s in base_suites() {
        let m = load_f32(&s.ckpt_dir);
        let ce = m.codec_encoder().expect("Base has a codec encoder");
        let audio = clone_audio(&s);
        let want = frames(&s.json["clone"]["codes"]);
        assert_eq!(
            want.len(),
            s.json["clone"]["codes_frames"].as_u64().unwrap() as usize
        );
        assert_eq!(want.len(), audio.len().div_ceil(1920));
        let st = code_rows(&s.clone_tensor("codes"));
        assert_eq!(st, want, "{}: JSON and safetensors codes agree", s.name);
        let got = ce.encode(&audio).unwrap();
        assert_eq!(got.len(), want.len(), "{}: frames", s.name);
        for (f, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "{}: reference codes frame {f}", s.name);
        }
    }
}

fn is_clone(case: &Value) -> bool {
    case["api"] == "generate_voice_clone"
}

fn mode(case: &Value) -> PromptMode {
    match case["prompt_mode"].as_str().unwrap() {
        "streaming" => PromptMode::Streaming,
        "non_streaming" => PromptMode::NonStreaming,
        other => panic!("prompt_mode {other}"),
    }
}

/// The case's voice-clone prompt: from the reference audio through
/// `create_voice_clone_prompt` for the from-audio cases (checked against what the reference
/// derived), otherwise the recorded x-vector and codes.
fn clone_prompt(s: &Suite, m: &ArModel, case: &Value) -> VoiceClonePrompt {
    let id = case["id"].as_str().unwrap();
    let icl = case["icl_mode"].as_bool().unwrap();
    assert_eq!(icl, !case["x_vector_only_mode"].as_bool().unwrap());
    let want_x = f32s(&s.tensors[case["tensors"]["ref_spk_embedding"].as_str().unwrap()]);
    let ref_text = case.get("ref_text").and_then(Value::as_str);
    if let Some(key) = case.get("ref_audio").and_then(Value::as_str) {
        let audio = f32s(&s.tensors[key]);
        let vc = m
            .create_voice_clone_prompt(&audio, ref_text, !icl)
            .unwrap_or_else(|e| panic!("{}/{id}: {e}", s.name));
        assert_eq!(vc.icl, icl);
        let r = rel_l2(&vc.x_vector, &want_x);
        assert!(r <= TOL, "{}/{id}: x-vector rel L2 {r:e}", s.name);
        if icl {
            assert_eq!(
                vc.ref_codes.as_ref().unwrap(),
                &frames(&case["ref_code"]),
                "{}/{id}: ref codes",
                s.name
            );
            assert_eq!(vc.ref_text.as_deref(), ref_text);
        } else {
            assert!(vc.ref_codes.is_none() && vc.ref_text.is_none());
        }
        vc
    } else {
        VoiceClonePrompt {
            ref_codes: icl.then(|| frames(&case["ref_code"])),
            x_vector: want_x,
            ref_text: ref_text.filter(|_| icl).map(str::to_string),
            icl,
        }
    }
}

fn request(case: &Value, vc: VoiceClonePrompt) -> VoiceRequest {
    VoiceRequest {
        text: case["text"].as_str().unwrap().to_string(),
        speaker: None,
        language: case["language"].as_str().map(str::to_string),
        instruct: None,
        prompt_mode: Some(mode(case)),
        voice_clone: Some(vc),
    }
}

#[test]
fn clone_prompts_match_reference() {
    let mut checked = (0, 0);
    for s in base_suites() {
        let m = load_f32(&s.ckpt_dir);
        let ckpt = Checkpoint::open(&s.ckpt_dir).unwrap();
        for case in s.json["cases"].as_array().unwrap() {
            if !is_clone(case) {
                continue;
            }
            let id = case["id"].as_str().unwrap();
            let vc = clone_prompt(&s, &m, case);
            let icl = vc.icl;
            let req = request(case, vc);
            let p = m
                .plan(&req)
                .unwrap_or_else(|e| panic!("{}/{id}: {e}", s.name));
            assert_eq!(p.input_ids, ids(&case["input_ids"]), "{}/{id} ids", s.name);
            assert_eq!(p.mode, mode(case));
            if icl {
                assert_eq!(p.ref_ids, Some(ids(&case["ref_ids"])), "{}/{id}", s.name);
                let fr = case["ref_code"].as_array().unwrap().len();
                assert_eq!(p.ref_frames, fr, "{}/{id}", s.name);
                if let Some(n) = case.get("ref_frames").and_then(Value::as_u64) {
                    assert_eq!(fr, n as usize);
                }
                checked.1 += 1;
            } else {
                assert_eq!(p.ref_ids, None);
                assert_eq!(p.ref_frames, 0);
                checked.0 += 1;
            }
            assert_eq!(
                p.rows.len(),
                case["prefill_len"].as_u64().unwrap() as usize,
                "{}/{id} prefill rows",
                s.name
            );
            assert_eq!(
                p.trailing.len(),
                case["trailing_len"].as_u64().unwrap() as usize,
                "{}/{id} trailing rows",
                s.name
            );
            let sess = m.start(&req, &s.sampling(&ckpt, case)).unwrap();
            for (key, got) in [
                ("inputs_embeds", sess.prefill_embeds().squeeze(0).unwrap()),
                ("trailing_text_hidden", sess.trailing_embeds().clone()),
            ] {
                let want = &s.tensors[case["tensors"][key].as_str().unwrap()];
                assert_eq!(got.dims(), want.dims(), "{}/{id} {key}", s.name);
                let (g, w) = (f32s(&got), f32s(want));
                let r = rel_l2(&g, &w);
                let d = max_abs(&g, &w);
                assert!(
                    r <= TOL,
                    "{}/{id} {key}: rel L2 {r:e}, max abs {d:e}",
                    s.name
                );
            }
            assert_eq!(sess.ref_frames(), p.ref_frames);
        }
    }
    assert!(
        checked.0 > 0 && checked.1 > 0,
        "x-vector and ICL cases: {checked:?}"
    );
}

#[test]
fn clone_greedy_codes_match_reference() {
    let mut checked = 0;
    for s in base_suites() {
        let m = load_f32(&s.ckpt_dir);
        let ckpt = Checkpoint::open(&s.ckpt_dir).unwrap();
        for case in s.json["cases"].as_array().unwrap() {
            if !is_clone(case) {
                continue;
            }
            let id = case["id"].as_str().unwrap();
            let req = request(case, clone_prompt(&s, &m, case));
            let want = frames(&case["codes"]);
            let mut sess = m.start(&req, &s.sampling(&ckpt, case)).unwrap();
            let mut got = Vec::new();
            let reason = loop {
                match sess.next_frame().unwrap() {
                    ArStep::Frame(f) => {
                        let n = got.len();
                        assert_eq!(Some(&f), want.get(n), "{}/{id}: frame {n}", s.name);
                        got.push(f);
                    }
                    ArStep::Finished(r) => break r,
                }
            };
            assert_eq!(got.len(), case["num_frames"].as_u64().unwrap() as usize);
            let want_reason = match case["finish_reason"].as_str().unwrap() {
                "eos" => FinishReason::Eos,
                "length" => FinishReason::Length,
                r => panic!("{r}"),
            };
            assert_eq!(reason, want_reason, "{}/{id}", s.name);
            if case["icl_mode"].as_bool().unwrap() {
                assert_eq!(
                    sess.ref_codes().unwrap(),
                    frames(&case["ref_code"]).as_slice()
                );
                // The wrapper cut int(Fr / (Fr + F) · (Fr + F)·1920) = Fr·1920 samples.
                assert_eq!(
                    case["ref_cut_samples"].as_u64().unwrap() as usize,
                    sess.ref_frames() * 1920,
                    "{}/{id}",
                    s.name
                );
            } else {
                assert!(sess.ref_codes().is_none());
            }
            checked += 1;
        }
    }
    assert!(checked > 0);
}

fn bad_field(r: Result<impl Sized, ModelError>) -> (String, String) {
    match r {
        Err(ModelError::InvalidRequest { field, value, .. }) => (field, value),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("should be rejected"),
    }
}

#[test]
fn create_voice_clone_prompt_rejects_bad_references() {
    let s = &base_suites()[0];
    let m = load_f32(&s.ckpt_dir);
    let audio = clone_audio(s);
    let ok = m.create_voice_clone_prompt(&audio, Some("Hi there."), false);
    assert!(ok.is_ok());
    // ICL without transcript.
    assert_eq!(
        bad_field(m.create_voice_clone_prompt(&audio, None, false)).0,
        "ref_text"
    );
    assert_eq!(
        bad_field(m.create_voice_clone_prompt(&audio, Some("  "), false)).0,
        "ref_text"
    );
    // x-vector only needs no transcript and ignores one.
    let x = m
        .create_voice_clone_prompt(&audio, Some("ignored"), true)
        .unwrap();
    assert!(!x.icl && x.ref_codes.is_none() && x.ref_text.is_none());
    // Silent, too short, too long, non-finite.
    let silent = vec![0.0f32; 48_000];
    assert_eq!(
        bad_field(m.create_voice_clone_prompt(&silent, None, true)).0,
        "ref_audio"
    );
    let short = &audio[..MIN_REF_AUDIO_SAMPLES - 1];
    assert_eq!(
        bad_field(m.create_voice_clone_prompt(short, None, true)).0,
        "ref_audio"
    );
    let long: Vec<f32> = audio
        .iter()
        .cycle()
        .take(MAX_REF_AUDIO_SAMPLES + 1)
        .copied()
        .collect();
    assert_eq!(
        bad_field(m.create_voice_clone_prompt(&long, None, true)).0,
        "ref_audio"
    );
    let mut nan = audio.clone();
    nan[100] = f32::NAN;
    assert_eq!(
        bad_field(m.create_voice_clone_prompt(&nan, None, true)).0,
        "ref_audio"
    );

    // Non-Base checkpoints cannot clone, and refuse a clone prompt in a request.
    let cv = load_f32(&fixtures_dir().join("tiny-customvoice"));
    assert_eq!(
        bad_field(cv.create_voice_clone_prompt(&audio, None, true)).0,
        "model"
    );
    let ckpt = Checkpoint::open(&fixtures_dir().join("tiny-customvoice")).unwrap();
    let p = SamplingParams::from_generation_config(&ckpt.generation).greedy();
    let r = VoiceRequest {
        text: "Hello.".into(),
        speaker: Some("vivian".into()),
        voice_clone: Some(x.clone()),
        ..Default::default()
    };
    assert_eq!(bad_field(cv.start(&r, &p)).0, "voice_clone");
}

#[test]
fn invalid_clone_requests_name_the_field() {
    let s = &base_suites()[0];
    let m = load_f32(&s.ckpt_dir);
    let ckpt = Checkpoint::open(&s.ckpt_dir).unwrap();
    let p = SamplingParams::from_generation_config(&ckpt.generation).greedy();
    let d = s.json["hidden_size"].as_u64().unwrap() as usize;
    let good = VoiceClonePrompt {
        ref_codes: Some(vec![vec![1; 16]; 3]),
        x_vector: vec![0.1; d],
        ref_text: Some("Reference.".into()),
        icl: true,
    };
    let req = |vc: Option<VoiceClonePrompt>| VoiceRequest {
        text: "Hello.".into(),
        voice_clone: vc,
        ..Default::default()
    };
    assert!(m.start(&req(Some(good.clone())), &p).is_ok());
    assert_eq!(bad_field(m.start(&req(None), &p)).0, "voice_clone");
    let mut v = good.clone();
    v.x_vector.pop();
    assert_eq!(
        bad_field(m.start(&req(Some(v)), &p)).0,
        "voice_clone.x_vector"
    );
    let mut v = good.clone();
    v.ref_text = None;
    assert_eq!(
        bad_field(m.start(&req(Some(v)), &p)).0,
        "voice_clone.ref_text"
    );
    let mut v = good.clone();
    v.ref_codes = Some(vec![]);
    assert_eq!(
        bad_field(m.start(&req(Some(v)), &p)).0,
        "voice_clone.ref_codes"
    );
    let mut v = good.clone();
    v.ref_codes = Some(vec![vec![2048; 16]]);
    assert_eq!(
        bad_field(m.start(&req(Some(v)), &p)).0,
        "voice_clone.ref_codes"
    );
    let mut v = good.clone();
    v.ref_codes = Some(vec![vec![1; 15]]);
    assert_eq!(
        bad_field(m.start(&req(Some(v)), &p)).0,
        "voice_clone.ref_codes"
    );
    let mut v = good.clone();
    v.icl = false;
    assert_eq!(
        bad_field(m.start(&req(Some(v)), &p)).0,
        "voice_clone.ref_codes"
    );
    let mut r = req(Some(good));
    r.speaker = Some("vivian".into());
    assert_eq!(bad_field(m.start(&r, &p)).0, "speaker");
}

/// The clone cases' waveforms: x-vector cases decode their codes; ICL cases prime a Code2Wav
/// stream with the reference codes (decoder left context), drop that audio (exactly
/// `ref_frames × 1920` samples) and decode the generated codes. Compared with the wrapper's
/// output (`wav`, after its cut) and, for ICL, the decode of `ref_code ++ codes` (`wav_full`).
#[test]
fn clone_waveforms_match_reference() {
    use gstomnitts::models::qwen3_tts::code2wav::Code2Wav;
    let mut checked = 0;
    for s in base_suites() {
        let c2w = Code2Wav::load(&s.ckpt_dir, &Device::Cpu).unwrap();
        let spf = c2w.samples_per_frame();
        for case in s.json["cases"].as_array().unwrap() {
            if !is_clone(case) {
                continue;
            }
            let id = case["id"].as_str().unwrap();
            let codes = frames(&case["codes"]);
            let want = f32s(&s.tensors[case["tensors"]["wav"].as_str().unwrap()]);
            let got = if case["icl_mode"].as_bool().unwrap() {
                let refc = frames(&case["ref_code"]);
                let mut stream = c2w.stream();
                let primed = stream.decode_chunk(&refc).unwrap();
                assert_eq!(primed.len(), refc.len() * spf);
                assert_eq!(
                    primed.len(),
                    case["ref_cut_samples"].as_u64().unwrap() as usize,
                    "{}/{id}: cut",
                    s.name
                );
                let out = stream.decode_chunk(&codes).unwrap();
                let full: Vec<f32> = primed.iter().chain(&out).copied().collect();
                let want_full = f32s(&s.tensors[case["tensors"]["wav_full"].as_str().unwrap()]);
                let r = rel_l2(&full, &want_full);
                assert!(r <= TOL, "{}/{id}: wav_full rel L2 {r:e}", s.name);
                out
            } else {
                c2w.decode(&codes).unwrap()
            };
            assert_eq!(got.len(), codes.len() * spf);
            assert_eq!(got.len(), want.len(), "{}/{id}: samples", s.name);
            let r = rel_l2(&got, &want);
            let d = max_abs(&got, &want);
            assert!(r <= TOL, "{}/{id}: wav rel L2 {r:e}, max abs {d:e}", s.name);
            eprintln!("{}/{id}: wav rel L2 {r:e}, max abs {d:e}", s.name);
            checked += 1;
        }
    }
    assert!(checked > 0);
}

#[test]
fn clone_state_is_thread_safe() {
    // The engine moves the model into its stage thread and shares it.
    fn send_sync<T: Send + Sync>() {}
    send_sync::<ArModel>();
    send_sync::<VoiceClonePrompt>();
    send_sync::<gstomnitts::models::qwen3_tts::speaker_encoder::SpeakerEncoder>();
    send_sync::<gstomnitts::models::qwen3_tts::codec_encoder::CodecEncoder>();
}
