//! Stage-0 (talker + code predictor) parity with the official reference, driven by the fixtures
//! in `tests/fixtures/` (see its README): every `reference/<name>.json` and every case in it.
//!
//! Checks, per checkpoint and case: tokenized prompt ids, prefill `inputs_embeds` and
//! `trailing_text_hidden` (f32, close), greedy codes frame for frame incl. the finish reason and the
//! number of sampled codebook-0 tokens; plus the error paths (missing tensor, wrong shape, bad
//! config, unknown speaker/language, empty text, Base without a voice-clone prompt).

mod reference_util;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use gstomnitts::models::qwen3_tts::{
    ArModel, ArStep, Checkpoint, FinishReason, ModelError, ModelVariant, PromptMode,
    SamplingParams, VoiceRequest,
};
use reference_util::{fixtures_dir, ids, load_f32, reference_suites as suites};
use serde_json::Value;

fn is_voice_clone(case: &Value) -> bool {
    case["api"] == "generate_voice_clone"
}

fn request(case: &Value) -> VoiceRequest {
    let s = |k: &str| case.get(k).and_then(Value::as_str).map(str::to_string);
    VoiceRequest {
        text: s("text").unwrap(),
        speaker: s("speaker"),
        language: s("language"),
        instruct: s("instruct"),
        prompt_mode: Some(match case["prompt_mode"].as_str().unwrap() {
            "streaming" => PromptMode::Streaming,
            "non_streaming" => PromptMode::NonStreaming,
            other => panic!("prompt_mode {other}"),
        }),
        voice_clone: None,
    }
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

#[test]
fn checkpoints_load_and_report_variant() {
    for s in suites() {
        let m = load_f32(&s.ckpt_dir);
        let variant = match s.json["variant"].as_str().unwrap() {
            "custom_voice" => ModelVariant::CustomVoice,
            "voice_design" => ModelVariant::VoiceDesign,
            "base" => ModelVariant::Base,
            v => panic!("variant {v}"),
        };
        assert_eq!(m.variant(), variant, "{}", s.name);
        assert_eq!(m.num_code_groups(), 16);
        assert!(m.languages().contains(&"auto".to_string()));
        assert!(!m.languages().iter().any(|l| l.contains("dialect")));
        if variant == ModelVariant::CustomVoice {
            assert!(m.speakers().contains(&"vivian".to_string()), "{}", s.name);
        } else {
            assert!(m.speakers().is_empty());
        }
    }
}

#[test]
fn prompt_ids_match_reference() {
    let mut checked = 0;
    for s in suites() {
        let m = load_f32(&s.ckpt_dir);
        assert_eq!(
            m.tokenizer().encode("<|im_start|>assistant\n").unwrap(),
            ids(&s.json["role_ids"]),
            "{}",
            s.name
        );
        for case in s.json["cases"].as_array().unwrap() {
            let id = case["id"].as_str().unwrap();
            if is_voice_clone(case) {
                continue;
            }
            let p = m
                .plan(&request(case))
                .unwrap_or_else(|e| panic!("{}/{id}: {e}", s.name));
            assert_eq!(p.input_ids, ids(&case["input_ids"]), "{}/{id}", s.name);
            let want_instruct = case.get("instruct_ids").filter(|v| !v.is_null()).map(ids);
            assert_eq!(p.instruct_ids, want_instruct, "{}/{id}", s.name);
            assert_eq!(
                p.rows.len(),
                case["prefill_len"].as_u64().unwrap() as usize,
                "{}/{id}",
                s.name
            );
            assert_eq!(
                p.trailing.len(),
                case["trailing_len"].as_u64().unwrap() as usize,
                "{}/{id}",
                s.name
            );
            // The wrapper's default mode for this variant is non-streaming.
            if case["non_streaming_mode"].as_bool() == Some(true) {
                let mut r = request(case);
                r.prompt_mode = None;
                assert_eq!(m.plan(&r).unwrap(), p, "{}/{id} default mode", s.name);
            }
            checked += 1;
        }
    }
    assert!(checked > 0);
}

#[test]
fn prefill_embeds_match_reference() {
    for s in suites() {
        let m = load_f32(&s.ckpt_dir);
        let ckpt = Checkpoint::open(&s.ckpt_dir).unwrap();
        for case in s.json["cases"].as_array().unwrap() {
            let id = case["id"].as_str().unwrap();
            if is_voice_clone(case) {
                continue;
            }
            let sess = m
                .start(&request(case), &s.sampling(&ckpt, case))
                .unwrap_or_else(|e| panic!("{}/{id}: {e}", s.name));
            let want = &s.tensors[case["tensors"]["inputs_embeds"].as_str().unwrap()];
            let got = sess.prefill_embeds().squeeze(0).unwrap();
            let d = max_abs_diff(&got, want);
            assert!(d <= 2e-5, "{}/{id}: inputs_embeds max abs diff {d}", s.name);
            let want = &s.tensors[case["tensors"]["trailing_text_hidden"].as_str().unwrap()];
            let d = max_abs_diff(sess.trailing_embeds(), want);
            assert!(d <= 2e-5, "{}/{id}: trailing max abs diff {d}", s.name);
        }
    }
}

#[test]
fn greedy_codes_match_reference() {
    let mut checked = 0;
    for s in suites() {
        let m = load_f32(&s.ckpt_dir);
        let ckpt = Checkpoint::open(&s.ckpt_dir).unwrap();
        for case in s.json["cases"].as_array().unwrap() {
            let id = case["id"].as_str().unwrap();
            if is_voice_clone(case) {
                continue;
            }
            let want: Vec<Vec<u32>> = case["codes"].as_array().unwrap().iter().map(ids).collect();
            let params = s.sampling(&ckpt, case);
            let mut sess = m.start(&request(case), &params).unwrap();
            let mut got = Vec::new();
            let reason = loop {
                match sess.next_frame().unwrap() {
                    ArStep::Frame(f) => {
                        assert_eq!(f.len(), 16);
                        assert!(f.iter().all(|&c| c < 2048), "{}/{id}: {f:?}", s.name);
                        let n = got.len();
                        assert_eq!(Some(&f), want.get(n), "{}/{id}: frame {n} differs", s.name);
                        got.push(f);
                    }
                    ArStep::Finished(r) => break r,
                }
            };
            // Finished is sticky.
            assert_eq!(sess.next_frame().unwrap(), ArStep::Finished(reason));
            assert_eq!(got.len(), want.len(), "{}/{id}", s.name);
            assert_eq!(got.len(), case["num_frames"].as_u64().unwrap() as usize);
            assert_eq!(sess.frames_generated(), got.len());
            let want_reason = match case["finish_reason"].as_str().unwrap() {
                "eos" => FinishReason::Eos,
                "length" => FinishReason::Length,
                r => panic!("{r}"),
            };
            assert_eq!(reason, want_reason, "{}/{id}", s.name);
            assert_eq!(
                sess.tokens_sampled(),
                case["sampled_code0"].as_array().unwrap().len(),
                "{}/{id}",
                s.name
            );
            checked += 1;
        }
    }
    assert!(checked > 0);
}

#[test]
fn greedy_is_deterministic_and_sampling_is_seeded() {
    let all = suites();
    let s = all
        .iter()
        .find(|s| {
            s.json["cases"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| !is_voice_clone(c))
        })
        .expect("a fixture with a non-clone case");
    let m = load_f32(&s.ckpt_dir);
    let ckpt = Checkpoint::open(&s.ckpt_dir).unwrap();
    let case = s.json["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| !is_voice_clone(c))
        .unwrap();
    let mut p = SamplingParams::from_generation_config(&ckpt.generation);
    p.max_new_tokens = 8;
    let run = |p: &SamplingParams| m.start(&request(case), p).unwrap().run_to_end().unwrap();
    p.seed = 11;
    let a = run(&p);
    let b = run(&p);
    assert_eq!(a, b, "same seed, same codes");
    p.seed = 12;
    let c = run(&p);
    assert_ne!(a.0, c.0, "another seed should sample differently");
    assert_eq!(a.0.len(), 7, "max_new_tokens 8 without EOS gives 7 frames");
}

#[test]
fn tokenizer_json_is_preferred_and_equivalent() {
    use gstomnitts::models::qwen3_tts::tokenizer::TextTokenizer;
    for s in suites() {
        let vm = TextTokenizer::from_vocab_merges(&s.ckpt_dir).unwrap();
        let tmp = broken_checkpoint(&s.ckpt_dir, &format!("tokjson-{}", s.name), |_| {});
        std::fs::write(tmp.0.join("tokenizer.json"), vm.to_json().unwrap()).unwrap();
        // Without vocab/merges, only tokenizer.json can serve.
        std::fs::remove_file(tmp.0.join("vocab.json")).unwrap();
        std::fs::remove_file(tmp.0.join("merges.txt")).unwrap();
        let tj = TextTokenizer::from_dir(&tmp.0).unwrap();
        assert!(TextTokenizer::from_vocab_merges(&tmp.0).is_err());
        for case in s.json["cases"].as_array().unwrap() {
            let text = case["target_text"].as_str().unwrap();
            assert_eq!(tj.encode(text).unwrap(), ids(&case["input_ids"]));
            assert_eq!(vm.encode(text).unwrap(), ids(&case["input_ids"]));
        }
    }
}

#[test]
fn tokenizer_matches_reference_strings() {
    use gstomnitts::models::qwen3_tts::tokenizer::TextTokenizer;
    let path = fixtures_dir().join("reference/tokenizer.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let dir = fixtures_dir().join(v["tokenizer_dir"].as_str().unwrap());
    let tk = TextTokenizer::from_vocab_merges(&dir).unwrap();
    let cases = v["cases"].as_array().unwrap();
    assert!(!cases.is_empty());
    for c in cases {
        let text = c["text"].as_str().unwrap();
        assert_eq!(tk.encode(text).unwrap(), ids(&c["ids"]), "{text:?}");
    }
    for t in v["added_tokens"].as_array().unwrap() {
        let content = t["content"].as_str().unwrap();
        assert_eq!(
            tk.token_to_id(content),
            Some(t["id"].as_u64().unwrap() as u32),
            "{content}"
        );
    }
}

#[test]
fn bf16_weights_run() {
    let dir = customvoice_dir();
    let ckpt = Checkpoint::open(&dir).unwrap();
    let m = ArModel::load(&ckpt, &Device::Cpu, DType::BF16).unwrap();
    let mut p = SamplingParams::from_generation_config(&ckpt.generation).greedy();
    p.max_new_tokens = 6;
    let r = VoiceRequest {
        text: "Hello world.".into(),
        speaker: Some("serena".into()),
        language: Some("english".into()),
        ..Default::default()
    };
    let mut sess = m.start(&r, &p).unwrap();
    assert_eq!(sess.prefill_embeds().dtype(), DType::BF16);
    let (frames, reason) = sess.run_to_end().unwrap();
    assert!(frames.len() >= 2 || reason == FinishReason::Length);
    assert!(
        frames
            .iter()
            .all(|f| f.len() == 16 && f.iter().all(|&c| c < 2048))
    );
}

// ---------- error paths ----------

struct TempCkpt(PathBuf);

impl Drop for TempCkpt {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Copies a checkpoint's JSON/tokenizer files into a fresh temp dir and writes `tensors` as its
/// `model.safetensors`.
fn broken_checkpoint(
    src: &Path,
    tag: &str,
    edit: impl FnOnce(&mut HashMap<String, Tensor>),
) -> TempCkpt {
    let dir = std::env::temp_dir().join(format!("omnitts-ar-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in [
        "config.json",
        "generation_config.json",
        "vocab.json",
        "merges.txt",
        "tokenizer_config.json",
    ] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let mut t =
        candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu).unwrap();
    edit(&mut t);
    candle_core::safetensors::save(&t, dir.join("model.safetensors")).unwrap();
    TempCkpt(dir)
}

fn customvoice_dir() -> PathBuf {
    suites()
        .into_iter()
        .find(|s| s.json["variant"] == "custom_voice")
        .expect("a custom_voice fixture")
        .ckpt_dir
}

fn load_err(dir: &Path) -> ModelError {
    let ckpt = Checkpoint::open(dir).unwrap();
    match ArModel::load(&ckpt, &Device::Cpu, DType::F32) {
        Ok(_) => panic!("loading {} should fail", dir.display()),
        Err(e) => e,
    }
}

#[test]
fn missing_tensor_is_named() {
    let src = customvoice_dir();
    let name = "talker.model.layers.1.self_attn.k_norm.weight";
    let tmp = broken_checkpoint(&src, "missing", |t| {
        assert!(t.remove(name).is_some());
    });
    match load_err(&tmp.0) {
        ModelError::MissingTensor { file, name: n } => {
            assert_eq!(n, name);
            assert_eq!(file, tmp.0.join("model.safetensors"));
        }
        e => panic!("unexpected {e}"),
    }
    let name = "talker.code_predictor.lm_head.14.weight";
    let tmp = broken_checkpoint(&src, "missing-head", |t| {
        assert!(t.remove(name).is_some());
    });
    let e = load_err(&tmp.0);
    assert!(e.to_string().contains(name), "{e}");
}

#[test]
fn wrong_shape_is_named() {
    let src = customvoice_dir();
    let name = "talker.model.layers.0.mlp.up_proj.weight";
    let tmp = broken_checkpoint(&src, "shape", |t| {
        let w = t[name].clone();
        let (o, i) = w.dims2().unwrap();
        t.insert(name.to_string(), w.narrow(0, 0, o - 1).unwrap());
        let _ = i;
    });
    match load_err(&tmp.0) {
        ModelError::Shape {
            name: n,
            expected,
            got,
            ..
        } => {
            assert_eq!(n, name);
            assert_eq!(expected[0], got[0] + 1);
        }
        e => panic!("unexpected {e}"),
    }
}

#[test]
fn unknown_tensors_are_ignored() {
    let src = customvoice_dir();
    let tmp = broken_checkpoint(&src, "extra", |t| {
        t.insert(
            "speaker_encoder.fc.weight".into(),
            Tensor::zeros((4, 4), DType::BF16, &Device::Cpu).unwrap(),
        );
    });
    let ckpt = Checkpoint::open(&tmp.0).unwrap();
    ArModel::load(&ckpt, &Device::Cpu, DType::F32).unwrap();
}

#[test]
fn bad_config_field_is_named() {
    let src = customvoice_dir();
    let tmp = broken_checkpoint(&src, "config", |_| {});
    let path = tmp.0.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    v["talker_config"]
        .as_object_mut()
        .unwrap()
        .remove("head_dim");
    std::fs::write(&path, serde_json::to_string(&v).unwrap()).unwrap();
    match Checkpoint::open(&tmp.0) {
        Err(ModelError::Config { file, field, .. }) => {
            assert_eq!(file, path);
            assert_eq!(field, "talker_config.head_dim");
        }
        Err(e) => panic!("unexpected {e}"),
        Ok(_) => panic!("should fail"),
    }
    std::fs::remove_file(tmp.0.join("generation_config.json")).unwrap();
    std::fs::write(&path, "{}").unwrap();
    assert!(Checkpoint::open(&tmp.0).is_err());
}

#[test]
fn invalid_requests_name_the_field() {
    let src = customvoice_dir();
    let m = load_f32(&src);
    let ckpt = Checkpoint::open(&src).unwrap();
    let p = SamplingParams::from_generation_config(&ckpt.generation).greedy();
    let ok = VoiceRequest {
        text: "Hello.".into(),
        speaker: Some("Vivian".into()),
        language: Some("English".into()),
        ..Default::default()
    };
    assert!(m.start(&ok, &p).is_ok());
    let field_of = |r: &VoiceRequest| match m.start(r, &p) {
        Err(ModelError::InvalidRequest { field, value, .. }) => (field, value),
        Err(e) => panic!("unexpected {e}"),
        Ok(_) => panic!("{r:?} should be rejected"),
    };
    let mut r = ok.clone();
    r.speaker = Some("nobody".into());
    assert_eq!(field_of(&r), ("speaker".into(), "nobody".into()));
    let mut r = ok.clone();
    r.language = Some("klingon".into());
    assert_eq!(field_of(&r), ("language".into(), "klingon".into()));
    let mut r = ok.clone();
    r.language = Some("sichuan_dialect".into());
    assert_eq!(field_of(&r).0, "language");
    let mut r = ok.clone();
    r.text = "  ".into();
    assert_eq!(field_of(&r).0, "text");
    let mut p0 = p.clone();
    p0.max_new_tokens = 0;
    assert!(matches!(
        m.start(&ok, &p0),
        Err(ModelError::InvalidRequest { field, .. }) if field == "max_new_tokens"
    ));
}

#[test]
fn base_without_voice_clone_prompt_is_rejected() {
    for s in suites() {
        if s.json["variant"] != "base" {
            continue;
        }
        let m = load_f32(&s.ckpt_dir);
        assert_eq!(m.variant(), ModelVariant::Base);
        let ckpt = Checkpoint::open(&s.ckpt_dir).unwrap();
        let p = SamplingParams::from_generation_config(&ckpt.generation);
        let r = VoiceRequest {
            text: "Hello.".into(),
            ..Default::default()
        };
        assert!(matches!(
            m.start(&r, &p),
            Err(ModelError::InvalidRequest { .. })
        ));
    }
}
