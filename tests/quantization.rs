//! Quantized stage-0 weights (`engine_args.quantization`, the elements' `quantization`;
//! docs/cpu.md) on the tiny fixtures, CPU: which layers each form quantizes, that the output
//! heads stay dense, that `auto` keeps a small checkpoint exactly dense, that the quantized model
//! stays close to the dense one, and that the engine runs it and refuses it where it cannot run.
//! (The quantized kernels themselves, on widths of the released checkpoints: `nn::linear` unit
//! tests.)

mod engine_common;
mod reference_util;

use candle_core::{DType, Device};
use engine_common::*;
use gstomnitts::engine::{Engine, EngineOptions, StageConfig};
use gstomnitts::models::qwen3_tts::{ArModel, Checkpoint, SamplingParams, WeightForm};
use gstomnitts::nn::{Quantization, QuantizationSpec};
use reference_util::{fixture, rel_l2};

const Q8: QuantizationSpec = QuantizationSpec::Form(Quantization::Q8_0);
const Q4: QuantizationSpec = QuantizationSpec::Form(Quantization::Q4K);

fn load(name: &str, spec: QuantizationSpec) -> (ArModel, Checkpoint) {
    let ckpt = Checkpoint::open(&fixture(name)).expect("fixture");
    let m = ArModel::load_with(&ckpt, &Device::Cpu, DType::F32, spec)
        .unwrap_or_else(|e| panic!("{name} {spec}: {e}"));
    (m, ckpt)
}

fn greedy(ckpt: &Checkpoint, frames: usize) -> SamplingParams {
    let mut s = SamplingParams::from_generation_config(&ckpt.generation).greedy();
    s.max_new_tokens = frames + 1;
    s
}

/// The prefill logits and the greedy frames of one utterance.
fn generate(m: &ArModel, ckpt: &Checkpoint, text: &str) -> (Vec<f32>, Vec<Vec<u32>>) {
    let mut s = m
        .start(&voice(text, Some("vivian")), &greedy(ckpt, 24))
        .expect("start");
    let logits = s.pending_logits().to_vec();
    let (frames, _) = s.run_to_end().expect("generate");
    (logits, frames)
}

fn form(forms: &[WeightForm], q: Quantization) -> Option<&WeightForm> {
    forms.iter().find(|f| f.form == q)
}

/// The quantized layers are exactly those whose input width is a whole number of the form's
/// blocks (32 weights for q8_0), counted from the checkpoint's own config; the 1 + 15 output heads
/// and the layers of other widths stay dense; the quantized ones take about a quarter of their
/// f32 bytes.
#[test]
fn q8_0_quantizes_the_block_sized_layers_and_keeps_the_heads_dense() {
    let (dense, _) = load("tiny-customvoice", QuantizationSpec::DENSE);
    let (q8, ckpt) = load("tiny-customvoice", Q8);
    let t = &ckpt.config.talker_config;
    let cp = &t.code_predictor_config;
    let fits = |w: usize| usize::from(w.is_multiple_of(32));
    let per_layer = |c: &gstomnitts::nn::TransformerConfig| {
        let attn = c.num_attention_heads * c.head_dim;
        // q, k, v, gate and up read the hidden state, o the heads, down the MLP.
        5 * fits(c.hidden_size) + fits(attn) + fits(c.intermediate_size)
    };
    let projection = 2 * fits(t.text_hidden_size)
        + usize::from(cp.transformer.hidden_size != t.transformer.hidden_size)
            * fits(t.transformer.hidden_size);
    let want = t.transformer.num_hidden_layers * per_layer(&t.transformer)
        + cp.transformer.num_hidden_layers * per_layer(&cp.transformer)
        + projection;
    assert!(want > 0, "the fixture has block-sized layers");
    let dense_forms = dense.weight_forms();
    assert_eq!(dense_forms.len(), 1, "{dense_forms:?}");
    let all = dense_forms[0].layers;
    let forms = q8.weight_forms();
    let quantized = form(&forms, Quantization::Q8_0).expect("q8_0 layers");
    let kept = form(&forms, Quantization::None).expect("dense layers");
    assert_eq!(quantized.layers, want, "{forms:?}");
    assert_eq!(kept.layers, all - want, "{forms:?}");
    assert!(
        kept.layers >= cp.num_code_groups,
        "the heads stay dense: {forms:?}"
    );
    // 34 bytes per block of 32 f32 weights (128 bytes).
    let f32_bytes = dense_forms[0].bytes - kept.bytes;
    let ratio = quantized.bytes as f64 / f32_bytes as f64;
    assert!(
        (ratio - 34.0 / 128.0).abs() < 1e-9,
        "q8_0 bytes / f32 bytes = {ratio}"
    );
}

/// `auto` quantizes only layers that candle's repacked int8 kernels take (widths of 256 and
/// more): the tiny fixtures, like the bundled voice, stay dense and give exactly the dense codes.
#[test]
fn auto_keeps_a_small_checkpoint_dense_and_exact() {
    let (dense, ckpt) = load("tiny-customvoice", QuantizationSpec::DENSE);
    let (auto, _) = load("tiny-customvoice", QuantizationSpec::Auto);
    let forms = auto.weight_forms();
    assert!(
        forms.iter().all(|f| f.form == Quantization::None),
        "{forms:?}"
    );
    let text = "Hello there, this is a test.";
    assert_eq!(generate(&auto, &ckpt, text), generate(&dense, &ckpt, text));
}

/// The int8 model stays close to the dense one: prefill logits within 5 % relative L2 (and not
/// equal: the weights did change), and it generates whole frames. (A tiny random-weight model is
/// chaotic: one code that differs sends the rest of the utterance its own way, so the codes are
/// not compared here; docs/cpu.md has the measured first differing frames and match rates.)
#[test]
fn q8_0_stays_close_to_dense() {
    let (dense, ckpt) = load("tiny-customvoice", QuantizationSpec::DENSE);
    let (q8, _) = load("tiny-customvoice", Q8);
    for text in ["Hello there, this is a test.", "The weather is fine today."] {
        let (want_logits, want) = generate(&dense, &ckpt, text);
        let (got_logits, got) = generate(&q8, &ckpt, text);
        let err = rel_l2(&got_logits, &want_logits);
        assert!(
            err > 0.0 && err < 0.05,
            "{text}: prefill logits rel L2 {err}"
        );
        assert!(!got.is_empty() && got.iter().all(|f| f.len() == want[0].len()));
    }
}

/// q4_k's block is 256 weights: below that width every layer falls back to q8_0, so on the tiny
/// fixture q4_k is q8_0 bit for bit.
#[test]
fn q4_k_falls_back_to_q8_0_below_its_block() {
    let (q8, ckpt) = load("tiny-customvoice", Q8);
    let (q4, _) = load("tiny-customvoice", Q4);
    assert_eq!(q4.weight_forms(), q8.weight_forms());
    assert!(form(&q4.weight_forms(), Quantization::Q4K).is_none());
    let text = "Hello there.";
    assert_eq!(generate(&q4, &ckpt, text), generate(&q8, &ckpt, text));
}

/// The engine loads the form of `engine_args.quantization`, reports it, and speaks; a quantized
/// form with bf16 activations is refused at load with the reason.
#[test]
fn engine_runs_quantized_and_refuses_it_with_bf16() {
    let engine = engine_common::load("tiny-customvoice", config(|c| c.ar.quantization = Q8));
    assert!(
        form(engine.weight_forms(), Quantization::Q8_0).is_some(),
        "{:?}",
        engine.weight_forms()
    );
    let run = run(
        &engine,
        engine_common::greedy(&engine, voice("Hello there.", Some("vivian")), 12),
    );
    assert!(run.metrics.frames > 0 && !run.audio.is_empty());
    assert_eq!(
        run.audio.len(),
        run.metrics.frames * engine.samples_per_frame()
    );

    let loaded = Engine::load(EngineOptions::new(
        fixture("tiny-customvoice"),
        config(|c| {
            c.ar.quantization = Q8;
            c.ar.dtype = gstomnitts::engine::DTypeSpec::Bf16;
        }),
    ));
    let Err(err) = loaded else {
        panic!("q8_0 with bf16 activations must be refused");
    };
    let msg = err.to_string();
    assert!(
        msg.contains("quantization q8_0") && msg.contains("float32"),
        "{msg}"
    );
}

/// The stage config's key: the forms by name (and vLLM's `null` for none), anything else an
/// error naming the key path and the value.
#[test]
fn stage_config_reads_the_quantization_key() {
    let yaml = |v: &str| {
        format!(
            "stage_args:\n  - stage_id: 0\n    engine_args:\n      model_stage: qwen3_tts\n      \
             quantization: {v}\n  - stage_id: 1\n    engine_args:\n      model_stage: code2wav\n    \
             engine_input_source: [0]\n"
        )
    };
    for (v, want) in [
        ("q4_k", Q4),
        ("Q8_0", Q8),
        ("none", QuantizationSpec::DENSE),
        ("null", QuantizationSpec::DENSE),
        ("auto", QuantizationSpec::Auto),
    ] {
        let (cfg, warnings) =
            StageConfig::from_yaml_str(&yaml(v)).unwrap_or_else(|e| panic!("{v}: {e}"));
        assert_eq!(cfg.ar.quantization, want, "{v}");
        assert!(warnings.is_empty(), "{warnings:?}");
    }
    assert_eq!(
        StageConfig::default_async().ar.quantization,
        QuantizationSpec::Auto
    );
    let err = StageConfig::from_yaml_str(&yaml("fp8"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("stage_args[0].engine_args.quantization") && err.contains("fp8"),
        "{err}"
    );
}
