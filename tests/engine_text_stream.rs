//! Text streamed into a running utterance (`Engine::submit_open`; tiny fixtures, CPU): fragments
//! cut anywhere (mid-word, mid UTF-8 character, one character at a time, one fragment; English
//! and Chinese) and fed on random schedules give the codes (exactly) and audio of the same text
//! given whole in streaming prompt mode, greedy and sampled with a seed; a stream that starves for
//! text waits without changing the codes of the streams batched with it, and resumes.

mod engine_common;
mod reference_util;

use std::sync::mpsc::Receiver;
use std::thread;
use std::time::Duration;

use engine_common::*;
use gstomnitts::engine::{Engine, EngineError, EngineRequest, FinishReason, RequestHandle};
use gstomnitts::models::qwen3_tts::PromptMode;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use reference_util::rel_l2;

const WAVE_TOL: f64 = 1e-5;

#[derive(Debug)]
struct Outcome {
    codes: Vec<Vec<u32>>,
    audio: Vec<f32>,
    reason: FinishReason,
}

fn drain(handle: RequestHandle, codes: Receiver<Vec<u32>>) -> Outcome {
    let mut events = Vec::new();
    while let Some(ev) = handle.recv() {
        events.push(ev);
    }
    // Checks the event order and that the chunks' offsets are contiguous from 0.
    let run = check_protocol(&events);
    Outcome {
        codes: codes.try_iter().collect(),
        audio: run.audio,
        reason: run.reason,
    }
}

fn assert_same(label: &str, got: &Outcome, want: &Outcome) {
    assert_eq!(got.reason, want.reason, "{label}: finish reason");
    assert_eq!(got.codes.len(), want.codes.len(), "{label}: frames");
    for (f, (g, w)) in got.codes.iter().zip(&want.codes).enumerate() {
        assert_eq!(g, w, "{label}: codes of frame {f}");
    }
    assert_eq!(got.audio.len(), want.audio.len(), "{label}: samples");
    let e = rel_l2(&got.audio, &want.audio);
    assert!(e <= WAVE_TOL, "{label}: audio rel L2 {e:e} > {WAVE_TOL:e}");
}

fn request(engine: &Engine, text: &str, seed: Option<u64>) -> EngineRequest {
    let mut v = voice(text, Some("vivian"));
    v.language = None;
    v.prompt_mode = Some(PromptMode::Streaming);
    let mut r = greedy(engine, v, 60);
    if let Some(seed) = seed {
        let s = &mut r.sampling;
        s.do_sample = true;
        s.temperature = 0.9;
        s.top_k = 50;
        s.top_p = 0.95;
        s.subtalker_do_sample = true;
        s.subtalker_temperature = 0.8;
        s.subtalker_top_k = 30;
        s.seed = seed;
    }
    r
}

/// Byte offsets at which `text` is cut, by schedule kind.
fn cuts(text: &str, kind: usize, rng: &mut ChaCha8Rng) -> Vec<usize> {
    let n = text.len();
    match kind {
        0 => vec![],
        1 => text
            .char_indices()
            .map(|(i, _)| i)
            .filter(|&i| i > 0)
            .collect(),
        _ => {
            // Random bytes: mid-word and mid UTF-8 character.
            let mut c: Vec<usize> = (0..rng.random_range(2..12))
                .map(|_| rng.random_range(1..n))
                .collect();
            c.sort_unstable();
            c.dedup();
            c
        }
    }
}

/// Feeds `text` cut at `cuts` on a thread, sleeping a random 0-`max_ms` ms before each fragment.
fn feed(
    sender: gstomnitts::engine::TextSender,
    text: &str,
    cuts: Vec<usize>,
    seed: u64,
    max_ms: u64,
) -> thread::JoinHandle<()> {
    let bytes = text.as_bytes().to_vec();
    thread::spawn(move || {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut at = 0;
        for c in cuts.into_iter().chain(std::iter::once(bytes.len())) {
            thread::sleep(Duration::from_millis(rng.random_range(0..=max_ms)));
            sender.append_bytes(&bytes[at..c]).expect("append");
            at = c;
        }
        thread::sleep(Duration::from_millis(rng.random_range(0..=max_ms)));
        assert!(sender.end());
    })
}

#[test]
fn fragments_on_random_schedules_equal_the_whole_text() {
    let engine = load("tiny-customvoice", config(|_| {}));
    let mut rng = ChaCha8Rng::seed_from_u64(3600);
    let texts = [
        "Hello there, it's a lovely day. We'll speak while the words arrive!",
        "今天天气很好，我们去公园散步吧。",
    ];
    for text in texts {
        for seed in [None, Some(7)] {
            let (h, codes) = engine
                .submit_tapped(request(&engine, text, seed))
                .expect("whole");
            let whole = drain(h, codes);
            assert!(
                whole.codes.len() > 3,
                "{text:?}: {} frames",
                whole.codes.len()
            );
            for kind in [0, 1, 2, 2] {
                let cut = cuts(text, kind, &mut rng);
                let label = format!("{text:?} seed {seed:?} cut at {cut:?}");
                let (h, sender, codes) = engine
                    .submit_open_tapped(request(&engine, "", seed))
                    .expect("open");
                let feeder = feed(sender, text, cut, rng.random(), 8);
                let got = drain(h, codes);
                feeder.join().expect("feeder");
                assert_same(&label, &got, &whole);
            }
        }
    }
}

/// One stream starves for text half-way while five others run in its batch: theirs are the
/// codes they have alone, and it resumes when the rest of its text comes, with the codes of its
/// whole text.
#[test]
fn a_starving_stream_waits_and_the_batch_goes_on() {
    let texts = [
        "The first stream speaks this sentence.",
        "A second voice reads another line here.",
        "Three streams are running at once now.",
        "The fourth one talks about the weather.",
        "And the fifth says something else again.",
    ];
    let starving = "This stream waits for its text half way, then it goes on to the end.";
    let solo_engine = load("tiny-customvoice", config(|c| c.ar.max_num_seqs = 1));
    let solo: Vec<Outcome> = texts
        .iter()
        .chain(std::iter::once(&starving))
        .map(|t| {
            let (h, c) = solo_engine
                .submit_tapped(request(&solo_engine, t, None))
                .expect("solo");
            drain(h, c)
        })
        .collect();
    drop(solo_engine);
    let engine = load(
        "tiny-customvoice",
        config(|c| {
            c.ar.max_num_seqs = 8;
            c.decoder.max_num_seqs = 8;
        }),
    );
    let (h, sender, codes) = engine
        .submit_open_tapped(request(&engine, "", None))
        .expect("open");
    let half = starving.find("half").expect("half");
    sender.append(&starving[..half]).expect("first half");
    let others: Vec<_> = texts
        .iter()
        .map(|t| {
            engine
                .submit_tapped(request(&engine, t, None))
                .expect("submit")
        })
        .collect();
    let others: Vec<Outcome> = others.into_iter().map(|(h, c)| drain(h, c)).collect();
    // The others are done; the starving stream has spoken what it had and waits.
    let before = codes.try_iter().collect::<Vec<_>>();
    assert!(
        !before.is_empty(),
        "the starving stream started before its text ended"
    );
    assert!(!h.is_finished(), "the starving stream waits for its text");
    thread::sleep(Duration::from_millis(100));
    assert_eq!(codes.try_iter().count(), 0, "no frame without its text");
    sender.append(&starving[half..]).expect("rest");
    assert!(sender.end());
    let mut got = drain(h, codes);
    got.codes.splice(0..0, before);
    for (i, (g, w)) in others.iter().zip(&solo).enumerate() {
        assert_same(&format!("stream {i}"), g, w);
    }
    assert_same("the starving stream", &got, &solo[5]);
}

#[test]
fn open_text_refusals_name_the_field() {
    let engine = load("tiny-customvoice", config(|_| {}));
    let mut r = request(&engine, "", None);
    r.voice.prompt_mode = Some(PromptMode::NonStreaming);
    match engine.submit_open(r) {
        Err(EngineError::InvalidRequest { field, .. }) => assert_eq!(field, "voice.prompt_mode"),
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    }
    // Text after the end is refused; bad bytes and an empty text fail the request.
    let (h, sender) = engine
        .submit_open(request(&engine, "Hi", None))
        .expect("open");
    sender.append(" there.").expect("append");
    sender.end();
    assert!(sender.append("more").is_err());
    assert_eq!(drain_reason(h), "eos-or-length");
    let (h, sender) = engine
        .submit_open(request(&engine, "Bad ", None))
        .expect("open");
    sender.append_bytes(b"\xff bytes").expect("append");
    sender.end();
    let r = drain_reason(h);
    assert!(r.contains("0xff at offset 4") && r.contains("UTF-8"), "{r}");
    let (h, sender) = engine
        .submit_open(request(&engine, "", None))
        .expect("open");
    sender.append("  ").expect("append");
    drop(sender);
    let r = drain_reason(h);
    assert!(r.contains("nothing to speak"), "{r}");
}

/// An open text's speech waits for its first letter or digit: punctuation alone makes no frame
/// while it arrives and is refused whole when it ends (an invalid request, as the same text given
/// whole is), and punctuation before the words is spoken with them.
#[test]
fn an_open_text_starts_with_its_first_word() {
    let engine = load("tiny-customvoice", config(|_| {}));
    let lead = ["!!! ", "... ", "??? ", "--- ", "*** ", ";;; ", "!?! "];
    for words in [None, Some("Hello there, this is spoken.")] {
        let (h, sender, codes) = engine
            .submit_open_tapped(request(&engine, "", None))
            .expect("open");
        for piece in lead {
            sender.append(piece).expect("append");
            thread::sleep(Duration::from_millis(40));
        }
        assert_eq!(
            codes.try_iter().count(),
            0,
            "a frame before the text had a word"
        );
        assert!(!h.is_finished(), "the open text waits for more");
        if let Some(w) = words {
            sender.append(w).expect("append the words");
        }
        assert!(sender.end());
        let got = drain(h, codes);
        match words {
            None => {
                let FinishReason::Error(e) = &got.reason else {
                    panic!("punctuation alone: {:?}", got.reason);
                };
                assert!(e.contains("invalid request: text"), "{e}");
                assert!(e.contains("nothing the tokenizer can speak"), "{e}");
                assert!(got.codes.is_empty() && got.audio.is_empty());
            }
            Some(_) => {
                assert!(
                    matches!(got.reason, FinishReason::Eos | FinishReason::Length),
                    "{:?}",
                    got.reason
                );
                assert!(!got.codes.is_empty(), "the words are spoken");
            }
        }
    }
}

fn drain_reason(h: RequestHandle) -> String {
    let mut events = Vec::new();
    while let Some(ev) = h.recv() {
        events.push(ev);
    }
    match check_protocol(&events).reason {
        FinishReason::Eos | FinishReason::Length => "eos-or-length".into(),
        FinishReason::Error(e) => e,
        other => format!("{other:?}"),
    }
}
