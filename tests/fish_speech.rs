//! Fish Audio S2 Pro against the official reference (tests/fixtures/tiny-fish: a tiny
//! random-weight checkpoint in the real layout and the reference's float32 outputs on it; its
//! README has the reference commit and licence).

mod fish_fixture;

use fish_fixture::{all, expected, fixture, meta};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use gstomnitts::models::fish_speech::generate::FirstFrame;
use gstomnitts::models::fish_speech::{
    Codes, FishModel, GenerateOptions, SamplingParams, VoiceReference,
};

fn model() -> FishModel {
    model_at(&fixture())
}

fn model_at(dir: &Path) -> FishModel {
    FishModel::load(dir, &Device::Cpu, DType::F32).unwrap()
}

fn codes_of(t: &Tensor) -> Codes {
    t.to_dtype(DType::U32).unwrap().to_vec2().unwrap()
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// max |a − b| / max |b|.
fn rel_max(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

const CASES: [&str; 5] = ["en_text", "zh_text", "en_clone", "zh_clone", "speakers"];
const MAX_NEW_TOKENS: usize = 12;

fn greedy() -> GenerateOptions {
    GenerateOptions {
        sampling: SamplingParams::GREEDY,
        max_new_tokens: MAX_NEW_TOKENS,
        seed: 0,
    }
}

fn voice(exp: &HashMap<String, Tensor>, transcript: &str) -> VoiceReference {
    VoiceReference {
        codes: codes_of(&exp["ref_codes"]),
        transcript: transcript.to_string(),
    }
}

#[test]
fn prompts_match_the_reference() {
    for f in all() {
        let (m, exp, meta, fx) = (model_at(&f.dir), &f.expected, &f.meta, f.name);
        for case in CASES {
            let c = &meta["cases"][case];
            let text = c["text"].as_str().unwrap();
            let v = c["ref_text"].as_str().map(|t| voice(exp, t));
            let batches = m.prompts.batches(text, 512).unwrap();
            assert_eq!(batches.len(), 1, "{fx}/{case}");
            let p = m.prompts.build(&batches[0], v.as_ref(), &[]).unwrap();
            assert_eq!(
                p.rows,
                codes_of(&exp[&format!("{case}.prompt")]),
                "{fx}/{case}"
            );
        }
    }
}

/// The stand-in generation's codes of batch `b` in `scripts/fish/prompt_cases.py` (`fake_codes`):
/// `[10][3 + b % 3]`.
fn fake_codes(b: usize) -> Codes {
    let frames = 3 + b % 3;
    (0..10)
        .map(|i| {
            (0..frames)
                .map(|t| match i {
                    0 => (37 * b + 11 * t + 5) % 4096,
                    _ => (13 * i + 7 * t + 3 * b) % 1024,
                } as u32)
                .collect()
        })
        .collect()
}

/// Σ (position + 1) · (row + 1) · value over a prompt's rows, mod 2^61 − 1 (`checksum` there).
fn checksum(rows: &[Vec<u32>]) -> u128 {
    let m = (1u128 << 61) - 1;
    let mut total = 0u128;
    for (r, row) in rows.iter().enumerate() {
        for (p, &v) in row.iter().enumerate() {
            total = (total + (p as u128 + 1) * (r as u128 + 1) * u128::from(v)) % m;
        }
    }
    total
}

/// The reference's prompts for 160 seeded texts beyond the five cases
/// (`expected/prompts.json`, scripts/fish/prompt_cases.py): English, Chinese, Japanese,
/// Korean, digits, punctuation, emoji, odd whitespace, well-formed and malformed speaker tags,
/// texts of several generation batches, some with a clone transcript. The batches are the
/// reference's, and each batch's prompt (earlier batches' codes in it) is the reference's,
/// token for token and code for code.
#[test]
fn prompts_of_seeded_texts_match_the_reference() {
    let f = fish_fixture::Fixture::load("tiny-fish");
    let m = model_at(&f.dir);
    let text = std::fs::read_to_string(f.dir.join("expected/prompts.json")).unwrap();
    let cases: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cases = cases["texts"].as_array().unwrap();
    assert!(cases.len() >= 100, "{} texts", cases.len());
    let several = cases
        .iter()
        .filter(|c| c["batches"].as_array().unwrap().len() > 1);
    assert!(several.count() >= 10, "texts of several batches");
    for (i, c) in cases.iter().enumerate() {
        let text = c["text"].as_str().unwrap();
        let want: Vec<&str> = c["batches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_str().unwrap())
            .collect();
        let batches = m.prompts.batches(text, 512).unwrap();
        assert_eq!(batches, want, "text {i} {text:?}: batches");
        let v = c["ref_text"].as_str().map(|t| voice(&f.expected, t));
        let mut history: Vec<(String, Codes)> = Vec::new();
        for (b, batch) in batches.iter().enumerate() {
            let p = m.prompts.build(batch, v.as_ref(), &history).unwrap();
            let tokens: Vec<u32> = c["tokens"][b]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap() as u32)
                .collect();
            assert_eq!(p.rows[0], tokens, "text {i} {text:?}, batch {b}: tokens");
            let sum: u128 = c["checksums"][b].as_str().unwrap().parse().unwrap();
            assert_eq!(checksum(&p.rows), sum, "text {i}, batch {b}: codes");
            history.push((batch.clone(), fake_codes(b)));
        }
    }
}

/// A dialogue of more turns than one generation batch holds, greedy, on every fixture: each
/// batch is generated with the earlier batches and their codes in its prompt, as the reference
/// does, and the codes are the reference's, batch after batch.
#[test]
fn a_dialogue_of_several_batches_matches_the_reference() {
    for f in all() {
        let (m, fx) = (model_at(&f.dir), f.name);
        let text = std::fs::read_to_string(f.dir.join("expected/prompts.json")).unwrap();
        let d: serde_json::Value = serde_json::from_str(&text).unwrap();
        let d = &d["dialogue"];
        let want = d["batches"].as_array().unwrap();
        assert!(want.len() > 1, "{fx}: several batches");
        let opts = GenerateOptions {
            max_new_tokens: d["max_new_tokens"].as_u64().unwrap() as usize,
            ..greedy()
        };
        let text = d["text"].as_str().unwrap();
        let batches = m.prompts.batches(text, 512).unwrap();
        let mut all_codes: Codes = vec![Vec::new(); 10];
        for (b, w) in batches.iter().zip(want) {
            assert_eq!(b, w["text"].as_str().unwrap(), "{fx}");
            let codes: Codes = w["codes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| {
                    r.as_array()
                        .unwrap()
                        .iter()
                        .map(|c| c.as_u64().unwrap() as u32)
                        .collect()
                })
                .collect();
            for (a, c) in all_codes.iter_mut().zip(&codes) {
                a.extend_from_slice(c);
            }
        }
        assert_eq!(batches.len(), want.len(), "{fx}");
        let got = m.synthesize_codes(text, None, &opts).unwrap();
        assert_eq!(got, all_codes, "{fx}: the dialogue's codes");
        // The history matters: without the first batch in its prompt, the second batch's codes
        // differ from the reference's (on tiny-fish; tiny-fish-alt's second batch barely depends
        // on its prompt, see its README).
        if fx == "tiny-fish" {
            let alone = m.prompts.build(&batches[1], None, &[]).unwrap();
            let second = m.generate(&alone, &opts, None).unwrap().codes;
            let want_second: Vec<u32> = want[1]["codes"][0]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c.as_u64().unwrap() as u32)
                .collect();
            assert_ne!(
                second[0], want_second,
                "{fx}: the second batch without its history"
            );
        }
    }
}

#[test]
fn greedy_codes_match_the_reference() {
    for f in all() {
        let (m, exp, meta, fx) = (model_at(&f.dir), &f.expected, &f.meta, f.name);
        for case in CASES {
            let c = &meta["cases"][case];
            let text = c["text"].as_str().unwrap();
            let v = c["ref_text"].as_str().map(|t| voice(exp, t));
            let prompt = m
                .prompts
                .build(&m.prompts.batches(text, 512).unwrap()[0], v.as_ref(), &[])
                .unwrap();
            let mut dbg = FirstFrame::default();
            let g = m.generate(&prompt, &greedy(), Some(&mut dbg)).unwrap();
            // intermediate values first: they say where a divergence starts
            let want_logits = f32s(&exp[&format!("{case}.prefill_logits")]);
            let tok = &meta["tokenizer"];
            let (s0, s1) = (
                tok["semantic_start"].as_u64().unwrap() as usize,
                tok["semantic_end"].as_u64().unwrap() as usize,
            );
            let im_end = tok["ids"]["<|im_end|>"].as_u64().unwrap() as usize;
            let mut allowed: Vec<f32> = want_logits[s0..=s1].to_vec();
            allowed.push(want_logits[im_end]);
            let got = f32s(dbg.prefill_logits.as_ref().unwrap());
            assert!(
                rel_max(&got, &allowed) < 1e-4,
                "{fx}/{case}: prefill logits {}",
                rel_max(&got, &allowed)
            );
            let hid = f32s(dbg.prefill_fast_input.as_ref().unwrap());
            assert!(
                rel_max(&hid, &f32s(&exp[&format!("{case}.prefill_hidden")])) < 1e-4,
                "{fx}/{case}"
            );
            if case == "en_clone" {
                let want = exp["en_clone.fast_logits"].clone();
                for (k, l) in dbg.fast_logits.iter().enumerate() {
                    let w = f32s(&want.get(k).unwrap());
                    assert!(rel_max(&f32s(l), &w) < 1e-4, "fast step {}", k + 1);
                }
            }
            let want = codes_of(&exp[&format!("{case}.codes")]);
            assert_eq!(g.codes, want, "{fx}/{case}: greedy codes");
            assert_eq!(
                g.stopped,
                c["stopped_on_im_end"].as_bool().unwrap(),
                "{fx}/{case}"
            );
            assert_eq!(
                g.frames_generated,
                want[0].len() + 1,
                "{fx}/{case}: the last frame is dropped"
            );
        }
    }
}

#[test]
fn clone_prefill_embeds_all_codebooks_scaled_by_sqrt_11() {
    for f in all() {
        let (m, exp, meta, fx) = (model_at(&f.dir), &f.expected, &f.meta, f.name);
        for case in ["en_clone", "zh_clone", "en_text"] {
            let c = &meta["cases"][case];
            let v = c["ref_text"].as_str().map(|t| voice(exp, t));
            let p = m.prompt(c["text"].as_str().unwrap(), v.as_ref()).unwrap();
            let x = m.slow.embed(&[&p.rows]).unwrap().squeeze(0).unwrap();
            let probe = c["embed_probe_position"].as_u64().unwrap() as usize;
            let got = f32s(&x.get(probe).unwrap());
            let want = f32s(&exp[&format!("{case}.embed_probe")]);
            assert!(
                rel_max(&got, &want) < 1e-6,
                "{fx}/{case}: {got:?} vs {want:?}"
            );
            let last = f32s(&x.get(p.len() - 1).unwrap());
            assert!(rel_max(&last, &f32s(&exp[&format!("{case}.embed_last")])) < 1e-6);
        }
        // Without the codebook sum or without the scale, the probe would differ: guard the fixture.
        let c = &meta["cases"]["en_clone"];
        let p = m
            .prompt(
                c["text"].as_str().unwrap(),
                Some(&voice(exp, c["ref_text"].as_str().unwrap())),
            )
            .unwrap();
        let probe = c["embed_probe_position"].as_u64().unwrap() as usize;
        let mut rows = p.rows.clone();
        for r in rows.iter_mut().skip(2) {
            r[probe] = 0; // drop codebooks 1..9's own codes
        }
        let x = m.slow.embed(&[&rows]).unwrap().squeeze(0).unwrap();
        let got = f32s(&x.get(probe).unwrap());
        assert!(rel_max(&got, &f32s(&exp["en_clone.embed_probe"])) > 1e-3);
    }
}

#[test]
fn rope_tables_are_the_references_bf16_interleaved_tables() {
    use gstomnitts::models::fish_speech::rope::rope_values;
    for f in all() {
        let (exp, cfg, fx) = (&f.expected, model_at(&f.dir).config, f.name);
        for (key, d, n) in [
            ("slow_freqs_cis", cfg.slow(), 64),
            ("fast_freqs_cis", cfg.fast(), cfg.num_codebooks()),
        ] {
            let (cos, sin) = rope_values(n, d.head_dim, d.rope_base);
            let want = f32s(&exp[key]); // [n, half, 2] = (cos, sin) pairs
            let got: Vec<f32> = cos.iter().zip(&sin).flat_map(|(&c, &s)| [c, s]).collect();
            assert_eq!(got, want, "{fx}: {key}");
        }
    }
}

#[test]
fn fast_ar_batched_rows_equal_single_rows() {
    for f in all() {
        let (m, exp, meta, fx) = (model_at(&f.dir), &f.expected, &f.meta, f.name);
        let mut hiddens = Vec::new();
        let mut code0 = Vec::new();
        for case in ["en_text", "zh_clone", "speakers"] {
            let c = &meta["cases"][case];
            let v = c["ref_text"].as_str().map(|t| voice(exp, t));
            let text = c["text"].as_str().unwrap();
            let p = m
                .prompts
                .build(&m.prompts.batches(text, 512).unwrap()[0], v.as_ref(), &[])
                .unwrap();
            let mut cache = m.slow.new_cache();
            let (_, h) = m
                .slow
                .forward(&m.slow.embed(&[&p.rows]).unwrap(), &mut cache)
                .unwrap();
            hiddens.push(h);
            code0.push(codes_of(&exp[&format!("{case}.codes")])[0][0]);
        }
        let greedy = |_: usize, l: &Tensor| -> gstomnitts::models::fish_speech::Result<Vec<u32>> {
            Ok(l.argmax(1)?.to_vec1::<u32>()?)
        };
        let batch = Tensor::cat(&hiddens, 0).unwrap();
        let mut bl = Vec::new();
        let together = m.fast.frame(&batch, &code0, greedy, Some(&mut bl)).unwrap();
        for (i, h) in hiddens.iter().enumerate() {
            let mut sl = Vec::new();
            let alone = m
                .fast
                .frame(h, &code0[i..i + 1], greedy, Some(&mut sl))
                .unwrap();
            assert_eq!(alone[0], together[i], "{fx}: row {i}");
            for (a, b) in sl.iter().zip(&bl) {
                let b = b.get(i).unwrap();
                assert!(rel_max(&f32s(a), &f32s(&b)) < 1e-5, "{fx}: row {i}");
            }
        }
    }
}

#[test]
fn stop_on_im_end_only_drops_its_frame_and_residuals_reach_past_1024() {
    for f in all() {
        let (exp, meta, fx) = (&f.expected, &f.meta, f.name);
        let stopped = |c: &str| meta["cases"][c]["stopped_on_im_end"].as_bool().unwrap();
        let frames = |c: &str| codes_of(&exp[&format!("{c}.codes")])[0].len();
        let cap = MAX_NEW_TOKENS - 1;
        // the stop before the cap, and the cap, each seen by the greedy test on this fixture
        assert!(
            CASES.iter().any(|c| stopped(c) && frames(c) < cap),
            "{fx}: a case stops on <|im_end|> before the cap"
        );
        assert!(
            CASES.iter().any(|c| !stopped(c)),
            "{fx}: a case hits the cap"
        );
        for case in CASES {
            let codes = codes_of(&exp[&format!("{case}.codes")]);
            assert!(
                codes[1..].iter().flatten().any(|&c| c >= 1024),
                "{fx}/{case}"
            );
            assert!(codes[0].len() <= cap, "{fx}/{case}");
        }
    }
}

#[test]
fn sampler_filters_like_the_reference() {
    use gstomnitts::models::fish_speech::sampler::logits_to_probs;
    let (exp, meta) = (expected(), meta());
    for (i, s) in meta["sampler"].as_array().unwrap().iter().enumerate() {
        let p = SamplingParams {
            temperature: s["temperature"].as_f64().unwrap() as f32,
            top_p: s["top_p"].as_f64().unwrap() as f32,
            top_k: s["top_k"].as_u64().unwrap() as usize,
        };
        let logits = f32s(&exp[&format!("sampler.{i}.logits")]);
        let want = f32s(&exp[&format!("sampler.{i}.probs")]);
        let got = logits_to_probs(&logits, p);
        for (g, w) in got.iter().zip(&want) {
            // The kept set must agree except for a token of negligible probability at the top_p
            // boundary (top_p 1.0: whether the cumulative sum rounds past 1.0 at the tail).
            if g.max(*w) > 1e-5 {
                assert_eq!(*g == 0.0, *w == 0.0, "case {i}: the kept set differs");
            } else if (*g == 0.0) != (*w == 0.0) {
                continue;
            }
            assert!((g - w).abs() < 1e-6, "case {i}: {g} vs {w}");
        }
    }
}

#[test]
fn control_tokens_in_user_text_are_refused() {
    let m = model();
    for bad in ["hi <|im_end|> there", "<|semantic:5|>", "a<|voice|>"] {
        assert!(m.prompt(bad, None).is_err(), "{bad}");
        let v = VoiceReference {
            codes: vec![vec![1]; 10],
            transcript: bad.into(),
        };
        assert!(m.prompt("fine", Some(&v)).is_err(), "ref_text {bad}");
    }
    assert!(m.prompt("<|speaker:3|>fine <|notatoken|>", None).is_ok());
}

// ---- codec ---------------------------------------------------------------------------------

use gstomnitts::models::fish_speech::codec::{Codec, DecodeState};

fn codec_at(dir: &Path) -> Codec {
    Codec::load(dir, &Device::Cpu).unwrap()
}

/// ‖a − b‖ / ‖b‖.
fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let (mut num, mut den) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        num += ((x - y) as f64).powi(2);
        den += (*y as f64).powi(2);
    }
    (num / den.max(1e-30)).sqrt()
}

#[test]
fn decoded_waveforms_match_the_reference() {
    for f in all() {
        let (c, exp, fx) = (codec_at(&f.dir), &f.expected, f.name);
        assert_eq!((c.sample_rate(), c.samples_per_frame()), (44_100, 2048));
        for case in CASES {
            let codes = codes_of(&exp[&format!("{case}.codes")]);
            let wav = c.decode(&codes).unwrap();
            let want = f32s(&exp[&format!("{case}.wav")]);
            assert_eq!(wav.len(), codes[0].len() * 2048, "{fx}/{case}");
            let e = rel_l2(&wav, &want);
            eprintln!(
                "{fx}/{case}: {} frames, waveform relative L2 {e:.2e}",
                codes[0].len()
            );
            assert!(e < 1e-4, "{fx}/{case}: relative L2 {e}");
        }
    }
}

#[test]
fn decode_across_the_window_matches_the_reference() {
    for f in all() {
        let (c, exp, fx) = (codec_at(&f.dir), &f.expected, f.name);
        let codes = codes_of(&exp["window.codes"]);
        assert!(codes[0].len() > 128, "longer than the codec's window");
        let wav = c.decode(&codes).unwrap();
        let tail = f32s(&exp["window.wav_tail"]);
        let e = rel_l2(&wav[wav.len() - tail.len()..], &tail);
        assert!(e < 1e-4, "{fx}: relative L2 of the tail {e}");
        let sumsq: f64 = wav.iter().map(|&x| (x as f64).powi(2)).sum();
        let want = f32s(&exp["window.wav_sumsq"])[0] as f64;
        assert!(
            ((sumsq - want) / want).abs() < 1e-4,
            "{fx}: {sumsq} vs {want}"
        );
    }
}

#[test]
fn streamed_decode_equals_whole_and_is_frames_times_2048() {
    for f in all() {
        let (c, exp, fx) = (codec_at(&f.dir), &f.expected, f.name);
        let codes = codes_of(&exp["window.codes"]);
        let whole = c.decode(&codes).unwrap();
        let mut state = DecodeState::default();
        let mut streamed = Vec::new();
        let n = codes[0].len();
        let mut start = 0;
        for chunk in [4usize, 25, 1, 60, 25].iter().cycle() {
            if start >= n {
                break;
            }
            let end = (start + chunk).min(n);
            let part: Codes = codes.iter().map(|r| r[start..end].to_vec()).collect();
            let samples = c.decode_chunk(&part, &mut state).unwrap();
            assert_eq!(samples.len(), (end - start) * 2048);
            streamed.extend(samples);
            start = end;
        }
        assert_eq!(state.frames(), n);
        assert_eq!(streamed.len(), n * 2048);
        let e = rel_l2(&streamed, &whole);
        eprintln!("{fx}: streamed vs whole over {n} frames: relative L2 {e:.2e}");
        assert!(e < 1e-5, "{fx}: streamed vs whole: relative L2 {e}");
    }
}

/// Several streams decoded together (`Codec::decode_chunks`: the waveform decoder over the
/// streams whose chunks have the same length, states stacked) give, round after round, each
/// stream's samples alone to the bit — streams at different points of their utterances, chunks of
/// different lengths in one call (so several passes), one stream idle in a round, passes capped
/// by `max_batch_frames` — and a chunk with bad codes fails its stream only.
#[test]
fn streams_decoded_together_equal_each_alone() {
    for f in all() {
        let (c, exp, fx) = (codec_at(&f.dir), &f.expected, f.name);
        let sources: Vec<Codes> = ["window.codes", "en_text.codes", "zh_clone.codes"]
            .iter()
            .map(|k| codes_of(&exp[*k]))
            .collect();
        let part = |codes: &Codes, start: usize, len: usize| -> Codes {
            let n = codes[0].len();
            codes
                .iter()
                .map(|r| r[start.min(n)..(start + len).min(n)].to_vec())
                .collect()
        };
        // Chunk lengths per round and stream (0: the stream sends nothing that round).
        let rounds: [[usize; 3]; 4] = [[4, 4, 1], [25, 4, 0], [25, 3, 6], [1, 4, 4]];
        for max_batch_frames in [512, 4] {
            let mut alone = vec![DecodeState::default(); 3];
            let mut together = vec![DecodeState::default(); 3];
            let mut at = [0usize; 3];
            for lens in rounds {
                let chunks: Vec<Codes> =
                    (0..3).map(|i| part(&sources[i], at[i], lens[i])).collect();
                let want: Vec<Vec<f32>> = (0..3)
                    .map(|i| c.decode_chunk(&chunks[i], &mut alone[i]).unwrap())
                    .collect();
                let refs: Vec<&Codes> = chunks.iter().collect();
                let mut states: Vec<&mut DecodeState> = together.iter_mut().collect();
                let got = c.decode_chunks(&refs, &mut states, max_batch_frames);
                for (i, (g, w)) in got.into_iter().zip(&want).enumerate() {
                    let g = g.unwrap();
                    assert_eq!(g.len(), chunks[i][0].len() * 2048, "stream {i}");
                    assert!(
                        g == *w,
                        "{fx}: stream {i}, round {lens:?}: batched differs from alone"
                    );
                }
                for i in 0..3 {
                    at[i] += lens[i];
                    assert_eq!(together[i].frames(), alone[i].frames());
                }
            }
            assert!(at.iter().all(|&a| a > 0));
        }
        // Bad codes (nine codebooks) fail that stream; the other decodes.
        let good = part(&sources[1], 0, 3);
        let bad: Codes = good[..9].to_vec();
        let mut states = [DecodeState::default(), DecodeState::default()];
        let mut refs: Vec<&mut DecodeState> = states.iter_mut().collect();
        let got = c.decode_chunks(&[&bad, &good], &mut refs, 512);
        assert!(got[0].is_err());
        assert_eq!(got[1].as_ref().unwrap().len(), 3 * 2048);
        assert_eq!(states[0].frames(), 0);
    }
}

/// Streams past the codec's window (128 frames), at different positions but the same window
/// fill, share the quantizer's pass (each row at its own RoPE positions) and still give each
/// stream's samples alone to the bit; so do two fresh streams starting together.
#[test]
fn streams_past_the_window_decoded_together_equal_each_alone() {
    for f in all() {
        let (c, exp, fx) = (codec_at(&f.dir), &f.expected, f.name);
        let once = codes_of(&exp["window.codes"]);
        // Twice over, so both streams have frames to spare past the window.
        let source: Codes = once.iter().map(|r| [r.as_slice(), r].concat()).collect();
        let n = source[0].len();
        assert!(n >= 160, "{n} frames");
        let part = |start: usize, len: usize| -> Codes {
            source
                .iter()
                .map(|r| r[start..start + len].to_vec())
                .collect()
        };
        // Stream 0 at 130 frames, stream 1 at 141 (both past the window), stream 2 fresh.
        let starts = [130usize, 141, 0];
        let mut alone = vec![DecodeState::default(); 3];
        for (s, &at) in alone.iter_mut().zip(&starts) {
            let mut done = 0;
            while done < at {
                let k = (at - done).min(25);
                c.decode_chunk(&part(done, k), s).unwrap();
                done += k;
            }
        }
        let mut together = alone.clone();
        for round in 0..3 {
            let len = [3usize, 1, 6][round];
            let chunks: Vec<Codes> = (0..3).map(|i| part(starts[i] + 10 * round, len)).collect();
            let want: Vec<Vec<f32>> = (0..3)
                .map(|i| c.decode_chunk(&chunks[i], &mut alone[i]).unwrap())
                .collect();
            let refs: Vec<&Codes> = chunks.iter().collect();
            let mut states: Vec<&mut DecodeState> = together.iter_mut().collect();
            let got = c.decode_chunks(&refs, &mut states, 512);
            for (i, (g, w)) in got.into_iter().zip(&want).enumerate() {
                assert!(
                    g.unwrap() == *w,
                    "{fx}: round {round}, stream {i}: batched differs from alone"
                );
            }
        }
        // Two fresh streams of different codes, together from their first frame.
        let mut fresh = vec![DecodeState::default(), DecodeState::default()];
        let mut lone = fresh.clone();
        for round in 0..2 {
            let chunks = [part(round * 4, 4), part(50 + round * 4, 4)];
            let want: Vec<Vec<f32>> = (0..2)
                .map(|i| c.decode_chunk(&chunks[i], &mut lone[i]).unwrap())
                .collect();
            let mut states: Vec<&mut DecodeState> = fresh.iter_mut().collect();
            let got = c.decode_chunks(&[&chunks[0], &chunks[1]], &mut states, 512);
            for (i, (g, w)) in got.into_iter().zip(&want).enumerate() {
                assert!(g.unwrap() == *w, "fresh round {round}, stream {i}");
            }
        }
    }
}

#[test]
fn residual_codes_past_the_codebook_are_clamped() {
    for f in all() {
        let (c, exp, fx) = (codec_at(&f.dir), &f.expected, f.name);
        let codes = codes_of(&exp["en_clone.codes"]);
        assert!(codes[1..].iter().flatten().any(|&x| x >= 1024));
        let clamped: Codes = codes
            .iter()
            .enumerate()
            .map(|(i, r)| {
                r.iter()
                    .map(|&x| if i == 0 { x.min(4095) } else { x.min(1023) })
                    .collect()
            })
            .collect();
        assert_eq!(
            c.decode(&codes).unwrap(),
            c.decode(&clamped).unwrap(),
            "{fx}"
        );
    }
}

#[test]
fn encoder_codes_match_the_reference() {
    for f in all() {
        let (c, exp, fx) = (codec_at(&f.dir), &f.expected, f.name);
        let audio = f32s(&exp["ref_audio"]);
        let codes = c.encode(&audio).unwrap();
        assert_eq!(codes[0].len(), audio.len().div_ceil(2048));
        assert_eq!(codes, codes_of(&exp["ref_codes"]), "{fx}");
    }
}

// ---- loading and sampled generation ---------------------------------------------------------

/// A copy of the fixture's small files in a fresh directory (the weights are chosen per test).
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("omnitts-fish-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ] {
        std::fs::copy(fixture().join(f), dir.join(f)).unwrap();
    }
    dir
}

/// A tiny codec.pth without its codec_config.yaml is read with S2 Pro's dimensions: the shape
/// error names the file and says why.
#[test]
fn a_codec_without_its_config_names_the_missing_file() {
    let dir = scratch("codec-config");
    std::fs::copy(fixture().join("codec.pth"), dir.join("codec.pth")).unwrap();
    let e = match Codec::load(&dir, &Device::Cpu) {
        Ok(_) => panic!("the tiny codec loaded with S2 Pro's dimensions"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("codec.pth"), "{e}");
    assert!(
        e.contains("no codec_config.yaml beside it, so S2 Pro's codec dimensions were assumed"),
        "{e}"
    );
    std::fs::copy(
        fixture().join("codec_config.yaml"),
        dir.join("codec_config.yaml"),
    )
    .unwrap();
    assert!(Codec::load(&dir, &Device::Cpu).is_ok());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_single_safetensors_file_loads_like_the_shards() {
    let dir = scratch("single");
    let mut all: HashMap<String, Tensor> = HashMap::new();
    for shard in [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ] {
        all.extend(candle_core::safetensors::load(fixture().join(shard), &Device::Cpu).unwrap());
    }
    candle_core::safetensors::save(&all, dir.join("model.safetensors")).unwrap();
    let single = FishModel::load(&dir, &Device::Cpu, DType::F32).unwrap();
    let (m, meta) = (model(), meta());
    let text = meta["cases"]["zh_text"]["text"].as_str().unwrap();
    let p = m.prompt(text, None).unwrap();
    let a = m.generate(&p, &greedy(), None).unwrap();
    let b = single.generate(&p, &greedy(), None).unwrap();
    assert_eq!(a, b);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_missing_shard_is_named() {
    let dir = scratch("missing");
    std::fs::copy(
        fixture().join("model.safetensors.index.json"),
        dir.join("model.safetensors.index.json"),
    )
    .unwrap();
    let err = FishModel::load(&dir, &Device::Cpu, DType::F32)
        .unwrap_err()
        .to_string();
    assert!(err.contains("model-00001-of-00002.safetensors"), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn seeded_sampling_repeats_and_respects_the_cap() {
    let (m, meta) = (model(), meta());
    let text = meta["cases"]["en_clone"]["text"].as_str().unwrap();
    let p = m.prompt(text, None).unwrap();
    let opts = |seed| GenerateOptions {
        sampling: SamplingParams::REFERENCE_DEFAULT,
        max_new_tokens: 20,
        seed,
    };
    let a = m.generate(&p, &opts(7), None).unwrap();
    assert_eq!(a, m.generate(&p, &opts(7), None).unwrap());
    assert!(a.frames_generated <= 20 && a.codes[0].len() + 1 == a.frames_generated);
    assert!(a.codes.iter().all(|r| r.len() == a.codes[0].len()));
    assert!(a.codes[0].iter().all(|&c| c < 4096));
}

#[test]
fn too_long_prompts_are_refused() {
    let m = model();
    let mut p = m.prompt("hi", None).unwrap();
    let n = m.slow.max_seq_len() - 2048 + 1;
    for r in p.rows.iter_mut() {
        let v = r[0];
        r.resize(n, v);
    }
    assert!(m.generate(&p, &greedy(), None).is_err());
}
