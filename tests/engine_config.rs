//! Stage-config YAML: the shipped files, defaults, unknown-key warnings and errors that name the
//! key path and the value.

use gstomnitts::engine::{
    DTypeSpec, DecoderStreamingMode, DeviceSpec, EngineError, GuardConfig, SamplingOverrides,
    StageConfig,
};

const BASE: &str = r#"
async_chunk: true
stage_args:
  - stage_id: 0
    runtime: {devices: cpu}
    engine_args: {model_stage: qwen3_tts}
  - stage_id: 1
    runtime: {devices: cpu}
    engine_args:
      model_stage: code2wav
      codec_chunk_frames: 10
    engine_input_source: [0]
"#;

fn err_of(yaml: &str) -> String {
    match StageConfig::from_yaml_str(yaml) {
        Ok(_) => panic!("expected an error for:\n{yaml}"),
        Err(e) => {
            assert!(matches!(e, EngineError::Config { .. }), "{e:?}");
            e.to_string()
        }
    }
}

/// BASE with `from` replaced by `to` (which must occur).
fn edit(from: &str, to: &str) -> String {
    assert!(BASE.contains(from), "{from}");
    BASE.replacen(from, to, 1)
}

#[test]
fn shipped_files_on_disk_parse_cleanly() {
    let root = env!("CARGO_MANIFEST_DIR");
    let (a, wa) = StageConfig::from_yaml_file(format!("{root}/configs/qwen3_tts.yaml")).unwrap();
    let (b, wb) =
        StageConfig::from_yaml_file(format!("{root}/configs/qwen3_tts_batch.yaml")).unwrap();
    assert!(wa.is_empty() && wb.is_empty(), "{wa:?} {wb:?}");
    assert!(a.async_chunk && !b.async_chunk);
    assert_eq!(a, StageConfig::default_async());
    assert_eq!(b, StageConfig::default_batch());
    assert_eq!(a.ar.device, DeviceSpec::Auto);
    assert_eq!(a.decoder.initial_codec_chunk_frames, 1);
    assert_eq!(a.decoder.codec_chunk_frames, 25);
    assert_eq!(a.decoder.codec_left_context_frames, 72);
    assert!(a.ar.guard.enabled);
}

#[test]
fn minimal_config_takes_defaults() {
    let (c, w) = StageConfig::from_yaml_str(BASE).unwrap();
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(c.ar.device, DeviceSpec::Cpu);
    assert_eq!(c.decoder.codec_chunk_frames, 10);
    assert_eq!(c.decoder.initial_codec_chunk_frames, 1);
    assert_eq!(c.decoder.streaming_mode, DecoderStreamingMode::Exact);
    assert_eq!(c.ar.max_num_seqs, 1);
    assert_eq!(c.decoder.dtype, DTypeSpec::F32);
    assert!(!c.decoder.allow_tf32);
    let reduced = edit(
        "codec_chunk_frames: 10",
        "codec_chunk_frames: 10\n      dtype: bfloat16\n      allow_tf32: true",
    );
    let (r, _) = StageConfig::from_yaml_str(&reduced).unwrap();
    assert_eq!(r.decoder.dtype, DTypeSpec::Bf16);
    assert!(r.decoder.allow_tf32);
    // Stage order in the list does not matter.
    let swapped = r#"
stage_args:
  - stage_id: 1
    engine_args: {model_stage: code2wav, decoder_streaming_mode: windowed}
    engine_input_source: [0]
  - stage_id: 0
    engine_args: {model_stage: qwen3_tts}
"#;
    let (c, _) = StageConfig::from_yaml_str(swapped).unwrap();
    assert!(c.async_chunk);
    assert_eq!(c.decoder.streaming_mode, DecoderStreamingMode::Windowed);
}

#[test]
fn unknown_keys_warn_with_their_path() {
    let y = edit(
        "codec_chunk_frames: 10",
        "codec_chunk_frames: 10\n      bogus_knob: 3",
    )
    .replace("async_chunk: true", "async_chunk: true\nconnectors: {}");
    let (_, w) = StageConfig::from_yaml_str(&y).unwrap();
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(
        w.iter()
            .any(|m| m.contains("stage_args[1].engine_args.bogus_knob: unknown key"))
    );
    assert!(w.iter().any(|m| m.contains("connectors: unknown key")));
    let y = edit(
        "runtime: {devices: cpu}",
        "runtime: {devices: cpu, max_batch_size: 1}",
    );
    let (_, w) = StageConfig::from_yaml_str(&y).unwrap();
    assert_eq!(w.len(), 1);
    assert!(
        w[0].contains("stage_args[0].runtime.max_batch_size"),
        "{w:?}"
    );
}

#[test]
fn errors_name_key_path_and_value() {
    let cases: &[(String, &str)] = &[
        (
            edit("codec_chunk_frames: 10", "codec_chunk_frames: -3"),
            "stage_args[1].engine_args.codec_chunk_frames: expected a positive integer, got -3",
        ),
        (
            edit("codec_chunk_frames: 10", "codec_chunk_frames: 0"),
            "stage_args[1].engine_args.codec_chunk_frames: expected a positive integer, got 0",
        ),
        (
            edit("codec_chunk_frames: 10", "codec_chunk_frames: 2.5"),
            "stage_args[1].engine_args.codec_chunk_frames: expected a positive integer, got 2.5",
        ),
        (
            edit("codec_chunk_frames: 10", "codec_chunk_frames: \"25\""),
            "stage_args[1].engine_args.codec_chunk_frames: expected a positive integer, got \"25\"",
        ),
        (
            edit("codec_chunk_frames: 10", "initial_codec_chunk_frames: -1"),
            "stage_args[1].engine_args.initial_codec_chunk_frames: expected a non-negative integer, got -1",
        ),
        (
            edit("codec_chunk_frames: 10", "codec_left_context_frames: x"),
            "stage_args[1].engine_args.codec_left_context_frames: expected a non-negative integer, got \"x\"",
        ),
        (
            edit("codec_chunk_frames: 10", "decoder_streaming_mode: sloppy"),
            "stage_args[1].engine_args.decoder_streaming_mode: expected \"exact\" or \"windowed\", got \"sloppy\"",
        ),
        (
            edit("codec_chunk_frames: 10", "dtype: float16"),
            "stage_args[1].engine_args.dtype: expected float32 (exact) or bfloat16",
        ),
        (
            edit("codec_chunk_frames: 10", "allow_tf32: maybe"),
            "stage_args[1].engine_args.allow_tf32: expected",
        ),
        (
            edit("codec_chunk_frames: 10", "codec_buffer_frames: 0"),
            "stage_args[1].engine_args.codec_buffer_frames: expected a positive integer, got 0",
        ),
        (
            edit("codec_chunk_frames: 10", "max_num_batched_tokens: -8"),
            "stage_args[1].engine_args.max_num_batched_tokens: expected a non-negative integer, got -8",
        ),
        (
            edit("runtime: {devices: cpu}", "runtime: {devices: gpu0}"),
            "stage_args[0].runtime.devices: expected \"cpu\", \"cuda:N\", a GPU index or \"auto\", got \"gpu0\"",
        ),
        (
            edit("{model_stage: qwen3_tts}", "{model_stage: talker}"),
            "stage_args[0].engine_args.model_stage: expected \"qwen3_tts\" or \"fish_speech\", got \"talker\"",
        ),
        (
            edit(
                "{model_stage: qwen3_tts}",
                "{model_stage: qwen3_tts, max_num_seqs: 0}",
            ),
            "stage_args[0].engine_args.max_num_seqs: expected a positive integer, got 0",
        ),
        (
            edit(
                "{model_stage: qwen3_tts}",
                "{model_stage: qwen3_tts, dtype: int4}",
            ),
            "stage_args[0].engine_args.dtype: expected auto, float32, bfloat16 or float16, got \"int4\"",
        ),
        (
            edit(
                "{model_stage: qwen3_tts}",
                "{model_stage: qwen3_tts}\n    default_sampling_params: {top_p: 1.5}",
            ),
            "stage_args[0].default_sampling_params.top_p: expected a number in (0, 1], got 1.5",
        ),
        (
            edit(
                "{model_stage: qwen3_tts}",
                "{model_stage: qwen3_tts}\n    default_sampling_params: {temperature: -0.1}",
            ),
            "stage_args[0].default_sampling_params.temperature: expected a number ≥ 0 (0 = greedy), got -0.1",
        ),
        (
            edit(
                "{model_stage: qwen3_tts}",
                "{model_stage: qwen3_tts}\n    default_sampling_params: {top_k: -2}",
            ),
            "stage_args[0].default_sampling_params.top_k: expected a non-negative integer or -1 (disabled), got -2",
        ),
        (
            edit(
                "{model_stage: qwen3_tts}",
                "{model_stage: qwen3_tts}\n    subtalker_sampling_params: {do_sample: yes please}",
            ),
            "stage_args[0].subtalker_sampling_params.do_sample: expected true or false, got \"yes please\"",
        ),
        (
            edit(
                "{model_stage: qwen3_tts}",
                "{model_stage: qwen3_tts}\n    runaway_guard: {floor_frames: -5}",
            ),
            "stage_args[0].runaway_guard.floor_frames: expected a positive integer, got -5",
        ),
        (
            edit(
                "{model_stage: qwen3_tts}",
                "{model_stage: qwen3_tts}\n    runaway_guard: {frames_per_text_token: 0}",
            ),
            "stage_args[0].runaway_guard.frames_per_text_token: expected a number > 0, got 0",
        ),
        (
            edit("engine_input_source: [0]", "engine_input_source: [1]"),
            "stage_args[1].engine_input_source: expected [0], got a list",
        ),
        (
            edit("engine_input_source: [0]", "final_output: false"),
            "stage_args[1].final_output: expected true",
        ),
        (
            edit(
                "engine_input_source: [0]",
                "engine_input_source: [0]\n    final_output_type: text",
            ),
            "stage_args[1].final_output_type: expected \"audio\", got \"text\"",
        ),
        (
            BASE.replace("async_chunk: true", "async_chunk: maybe"),
            "async_chunk: expected true or false, got \"maybe\"",
        ),
        (
            edit("  - stage_id: 1", "  - stage_id: 0"),
            "stage_args[1].stage_id: stage_id 0 appears twice",
        ),
        (
            edit("  - stage_id: 1", "  - stage_id: 2"),
            "stage_args[1].stage_id: expected 0 or 1, got 2",
        ),
        (
            edit("engine_args: {model_stage: qwen3_tts}", "engine_args: {}"),
            "stage_args[0].engine_args.model_stage: missing",
        ),
        (
            edit("    engine_input_source: [0]\n", ""),
            "stage_args[1].engine_input_source: missing",
        ),
        ("async_chunk: true\n".to_string(), "stage_args: missing"),
        (
            "stage_args: []".to_string(),
            "stage_args: expected 2 stages",
        ),
        (
            "stage_args: [1, 2]".to_string(),
            "stage_args[0]: expected a mapping (one stage), got 1",
        ),
        (
            "stage_args: {a: 1}".to_string(),
            "stage_args: expected a list of 2 stages",
        ),
        ("{{{".to_string(), "<document>: not valid YAML"),
        ("".to_string(), "<document>: empty document"),
    ];
    for (yaml, want) in cases {
        let got = err_of(yaml);
        assert!(got.contains(want), "want {want:?}\n got {got:?}");
    }
}

#[test]
fn more_errors_name_key_path_and_value() {
    let cases: &[(String, &str)] = &[
        (
            edit("runtime: {devices: cpu}", "runtime: {devices: cpu, 3: x}"),
            "stage_args[0].runtime: keys must be strings, got 3",
        ),
        (
            edit("runtime: {devices: cpu}", "runtime: [cpu]"),
            "stage_args[0].runtime: invalid type: sequence, expected a mapping",
        ),
        (
            edit(
                "engine_args: {model_stage: qwen3_tts}",
                "engine_args: qwen3_tts",
            ),
            "stage_args[0].engine_args: expected a mapping, got \"qwen3_tts\"",
        ),
        (
            "[1, 2]".to_string(),
            "<document>: invalid type: sequence, expected a mapping with stage_args",
        ),
        (
            edit(
                "  - stage_id: 1\n    runtime: {devices: cpu}",
                "  - runtime: {devices: cpu}",
            ),
            "stage_args[1].stage_id: missing (0 or 1)",
        ),
        (
            edit(
                "  - stage_id: 0\n",
                "  - stage_id: 0\n    stage_type: diffusion\n",
            ),
            "stage_args[0].stage_type: expected \"llm\", got \"diffusion\"",
        ),
        (
            edit(
                "  - stage_id: 0\n",
                "  - stage_id: 0\n    final_output: true\n",
            ),
            "stage_args[0].final_output: expected false (stage 0 emits codec frames, not the final output), got true",
        ),
        (
            edit(
                "  - stage_id: 0\n",
                "  - stage_id: 0\n    engine_input_source: [0]\n",
            ),
            "stage_args[0].engine_input_source: expected [] (stage 0 takes the request), got a list (- 0)",
        ),
        (
            edit("    engine_args: {model_stage: qwen3_tts}\n", ""),
            "stage_args[0].engine_args: missing (needs model_stage: qwen3_tts | fish_speech)",
        ),
        (
            edit("{model_stage: qwen3_tts}", "{model_stage: 3}"),
            "stage_args[0].engine_args.model_stage: expected a string, got 3",
        ),
        (
            edit(
                "{model_stage: qwen3_tts}",
                "{model_stage: qwen3_tts, model_arch: Qwen3ForCausalLM}",
            ),
            "stage_args[0].engine_args.model_arch: expected \"Qwen3TTSTalkerForConditionalGeneration\", got \"Qwen3ForCausalLM\"",
        ),
        (
            edit(
                "model_stage: code2wav",
                "model_stage: code2wav\n      engine_output_type: latent",
            ),
            "stage_args[1].engine_args.engine_output_type: expected \"audio\", got \"latent\"",
        ),
        (
            edit(
                "{model_stage: qwen3_tts}",
                "{model_stage: qwen3_tts}\n    default_sampling_params: {repetition_penalty: 0}",
            ),
            "stage_args[0].default_sampling_params.repetition_penalty: expected a number > 0, got 0",
        ),
        (
            edit(
                "{model_stage: qwen3_tts}",
                "{model_stage: qwen3_tts}\n    default_sampling_params: {max_tokens: 0}",
            ),
            "stage_args[0].default_sampling_params.max_tokens: expected an integer from 2 to 65536 (at most N - 1 codec frames, as max-new-tokens), got 0",
        ),
        (
            edit(
                "{model_stage: qwen3_tts}",
                "{model_stage: qwen3_tts}\n    default_sampling_params: {max_tokens: 1}",
            ),
            "stage_args[0].default_sampling_params.max_tokens: expected an integer from 2 to 65536 (at most N - 1 codec frames, as max-new-tokens), got 1",
        ),
        (
            edit(
                "{model_stage: qwen3_tts}",
                "{model_stage: qwen3_tts}\n    default_sampling_params: {max_tokens: 100000}",
            ),
            "stage_args[0].default_sampling_params.max_tokens: expected an integer from 2 to 65536 (at most N - 1 codec frames, as max-new-tokens), got 100000",
        ),
        (
            edit(
                "{model_stage: qwen3_tts}",
                "{model_stage: qwen3_tts}\n    default_sampling_params: {seed: -1}",
            ),
            "stage_args[0].default_sampling_params.seed: expected a non-negative integer, got -1",
        ),
        (
            edit(
                "{model_stage: qwen3_tts}",
                "{model_stage: qwen3_tts}\n    subtalker_sampling_params: {temperature: hot}",
            ),
            "stage_args[0].subtalker_sampling_params.temperature: expected a number ≥ 0 (0 = greedy), got \"hot\"",
        ),
        (
            edit(
                "{model_stage: qwen3_tts}",
                "{model_stage: qwen3_tts}\n    runaway_guard: {enabled: 1}",
            ),
            "stage_args[0].runaway_guard.enabled: expected true or false, got 1",
        ),
    ];
    for (yaml, want) in cases {
        let got = err_of(yaml);
        assert!(got.contains(want), "want {want:?}\n got {got:?}");
    }
}

#[test]
fn keys_of_the_other_stage_warn() {
    let y = edit(
        "engine_input_source: [0]",
        "engine_input_source: [0]\n    default_sampling_params: {temperature: 0.5}\n    runaway_guard: {enabled: false}",
    )
    .replace(
        "{model_stage: qwen3_tts}",
        "{model_stage: qwen3_tts, codec_chunk_frames: 4}",
    );
    let (c, w) = StageConfig::from_yaml_str(&y).unwrap();
    assert_eq!(w.len(), 3, "{w:?}");
    for want in [
        "stage config <string>: stage_args[1].default_sampling_params: ignored (the decoder is deterministic)",
        "stage config <string>: stage_args[1].runaway_guard: unknown key, ignored",
        "stage config <string>: stage_args[0].engine_args.codec_chunk_frames: unknown key, ignored",
    ] {
        assert!(w.iter().any(|m| m == want), "{want:?} not in {w:?}");
    }
    // Neither reached a stage.
    assert_eq!(c.decoder.codec_chunk_frames, 10);
    assert_eq!(c.ar.sampling.temperature, None);
    assert!(c.ar.guard.enabled);
}

#[test]
fn an_empty_section_takes_its_defaults() {
    let y = edit(
        "{model_stage: qwen3_tts}",
        "{model_stage: qwen3_tts}\n    runaway_guard:\n    default_sampling_params:",
    );
    let (c, w) = StageConfig::from_yaml_str(&y).unwrap();
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(c.ar.guard, GuardConfig::default());
    assert_eq!(c.ar.sampling, SamplingOverrides::default());
}

#[test]
fn cuda_device_needs_the_cuda_feature() {
    let y = edit("runtime: {devices: cpu}", "runtime: {devices: \"cuda:1\"}");
    let r = StageConfig::from_yaml_str(&y);
    if DeviceSpec::CUDA_COMPILED {
        assert_eq!(r.unwrap().0.ar.device, DeviceSpec::Cuda(1));
    } else {
        let e = r.unwrap_err().to_string();
        assert!(
            e.contains("stage_args[0].runtime.devices") && e.contains("--features cuda"),
            "{e}"
        );
    }
    // A bare GPU index, as vLLM-Omni writes it.
    let y = edit("runtime: {devices: cpu}", "runtime: {devices: \"0\"}");
    if DeviceSpec::CUDA_COMPILED {
        assert_eq!(
            StageConfig::from_yaml_str(&y).unwrap().0.ar.device,
            DeviceSpec::Cuda(0)
        );
    } else {
        assert!(StageConfig::from_yaml_str(&y).is_err());
    }
}

#[test]
fn sampling_overrides_are_parsed() {
    let y = edit(
        "{model_stage: qwen3_tts}",
        "{model_stage: qwen3_tts}\n    default_sampling_params: {temperature: 0.0, top_k: -1, max_tokens: 300, seed: 7}\n    subtalker_sampling_params: {do_sample: false}",
    );
    let (c, w) = StageConfig::from_yaml_str(&y).unwrap();
    assert!(w.is_empty(), "{w:?}");
    let s = &c.ar.sampling;
    assert_eq!(s.temperature, Some(0.0));
    assert_eq!(s.top_k, Some(0));
    assert_eq!(s.max_tokens, Some(300));
    assert_eq!(s.seed, Some(7));
    assert_eq!(s.subtalker_do_sample, Some(false));
}

#[test]
fn missing_file_names_the_path() {
    let e = StageConfig::from_yaml_file("/nonexistent/omnitts.yaml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("/nonexistent/omnitts.yaml"), "{e}");
}
