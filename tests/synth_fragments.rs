//! `omnittssynth input-mode=fragments` speaks while the text is still arriving (tiny CustomVoice
//! fixture, CPU, greedy): audio comes out before the utterance's end is sent (token mode, and
//! clause mode on a checkpoint whose `omnitts.json` says `streaming_prompt: false`); fragments
//! cut at random points (mid-word, mid-UTF-8 character) and fed on a random schedule give the
//! samples of the same text in one fragment, from the first fragment's PTS, on a contiguous
//! timeline; two end markers give two utterances, in order, each at its first fragment's PTS.

mod element_util;
mod reference_util;

use std::time::{Duration, Instant};

use element_util::{TempDir, element_messages, errors, v};
use gst_check::Harness;
use gstomnitts::element_common::messages;
use gstomnitts::omnittssynth::cue_message::CUE;
use gstomnitts::omnittssynth::fragments::END_TEXT_EVENT;
use reference_util::{fixture, fixture_model};

const RATE: u64 = 24_000;
/// How long a test waits for audio or EOS.
const PATIENCE: Duration = Duration::from_secs(30);

fn at_ms(ms: u64) -> usize {
    (ms * RATE / 1000) as usize
}

fn f32_of(buffer: &gst::BufferRef) -> Vec<f32> {
    let map = buffer.map_readable().expect("readable buffer");
    map.as_slice()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// An `omnittssynth` in fragments mode on `model`, greedy, at most `max_tokens` codec frames per
/// utterance ([`element_util::synth_harness`]).
fn synth(model: &str, max_tokens: u32) -> (Harness, gst::Bus) {
    element_util::synth_harness(model, max_tokens, &[("input-mode", "fragments")])
}

/// Pushes one fragment at `pts_ms` (MARKER-flagged when `end`).
fn push(h: &mut Harness, bytes: &[u8], pts_ms: u64, end: bool) {
    let mut b = gst::Buffer::from_slice(bytes.to_vec());
    {
        let b = b.get_mut().unwrap();
        b.set_pts(gst::ClockTime::from_mseconds(pts_ms));
        if end {
            b.set_flags(gst::BufferFlags::MARKER);
        }
    }
    assert_eq!(h.push(b), Ok(gst::FlowSuccess::Ok));
}

/// Checks that buffer `b` continues the timeline at sample `n`: offsets contiguous, PTS and
/// duration from the sample count, DISCONT on the first only.
fn check_buffer(b: &gst::BufferRef, n: u64) {
    let len = (b.size() / 4) as u64;
    assert_eq!(b.offset(), n, "offsets are contiguous");
    assert_eq!(b.offset_end(), n + len);
    let pts = |p: u64| gst::ClockTime::from_nseconds(p * 1_000_000_000 / RATE);
    assert_eq!(b.pts(), Some(pts(n)), "PTS of sample {n}");
    assert_eq!(b.duration(), Some(pts(n + len) - pts(n)));
    assert_eq!(b.flags().contains(gst::BufferFlags::DISCONT), n == 0);
}

/// Pulls what has come out into `out` (checking the timeline) until a buffer with speech has
/// arrived; panics after [`PATIENCE`].
fn pull_until_speech(h: &mut Harness, out: &mut Vec<f32>) {
    let t0 = Instant::now();
    loop {
        assert!(
            t0.elapsed() < PATIENCE,
            "no speech within {PATIENCE:?} while the utterance's end was held back"
        );
        match h.try_pull() {
            Some(b) => {
                check_buffer(&b, out.len() as u64);
                let s = f32_of(&b);
                out.extend(&s);
                if !b.flags().contains(gst::BufferFlags::GAP) && s.iter().any(|&x| x != 0.0) {
                    return;
                }
            }
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Pulls the rest, up to EOS, into `out` (checking the timeline).
fn pull_to_eos(h: &mut Harness, out: &mut Vec<f32>) {
    let t0 = Instant::now();
    loop {
        assert!(t0.elapsed() < PATIENCE, "no EOS within {PATIENCE:?}");
        if let Some(ev) = h.try_pull_event()
            && ev.type_() == gst::EventType::Eos
        {
            while let Some(b) = h.try_pull() {
                check_buffer(&b, out.len() as u64);
                out.extend(f32_of(&b));
            }
            return;
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

/// The (text, PTS) of each cue message, in order.
fn cues(msgs: &[gst::Message]) -> Vec<(String, gst::ClockTime)> {
    element_messages(msgs, CUE)
        .iter()
        .map(|c| {
            (
                c.get::<String>("text").unwrap(),
                c.get::<Option<gst::ClockTime>>("pts").unwrap().unwrap(),
            )
        })
        .collect()
}

/// The bus messages so far; none may be an error.
fn no_errors(bus: &gst::Bus) -> Vec<gst::Message> {
    let msgs = element_util::drain(bus);
    assert!(errors(&msgs).is_empty(), "{:?}", errors(&msgs));
    msgs
}

const LONG: &str = "Streamed text arrives in pieces, as a language model writes it, word by word \
                    and clause by clause, and the speech";

/// (a) Token mode: speech comes out while the end of the utterance is held back; the end comes
/// after it.
#[test]
fn token_mode_speaks_before_the_end_arrives() {
    let (mut h, bus) = synth(&fixture_model("tiny-customvoice"), 30);
    for (i, word) in LONG.split_inclusive(' ').enumerate() {
        push(&mut h, word.as_bytes(), 100 + 10 * i as u64, false);
    }
    let mut out = Vec::new();
    pull_until_speech(&mut h, &mut out);
    let msgs = no_errors(&bus);
    let modes = element_messages(&msgs, messages::TEXT_STREAM_MODE);
    assert_eq!(modes.len(), 1, "{modes:?}");
    assert_eq!(modes[0].get::<String>("mode").unwrap(), "token");
    assert!(cues(&msgs).is_empty(), "the utterance is still open");
    // Its audio starts at its first fragment's PTS.
    let first = out.iter().position(|&x| x != 0.0).unwrap();
    assert!(first >= at_ms(100), "speech at sample {first}");
    push(&mut h, b" goes on.", 1_000, true);
    h.push_event(gst::event::Eos::new());
    pull_to_eos(&mut h, &mut out);
    let msgs = no_errors(&bus);
    let got = cues(&msgs);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, format!("{LONG} goes on."));
    assert_eq!(got[0].1, gst::ClockTime::from_mseconds(100));
}

/// Token mode: when the synthesis ends (here at max-new-tokens) before the text does, the
/// fragments after it are not spoken; one warning names where the unspoken text starts (they
/// were dropped without a word).
#[test]
fn text_after_the_synthesis_ended_is_named_in_a_warning() {
    let (mut h, bus) = synth(&fixture_model("tiny-customvoice"), 3);
    // More text tokens than the three frames take (a frame waits for its token in token mode).
    push(&mut h, LONG.as_bytes(), 100, false);
    // Three frames of the tiny checkpoint take milliseconds: the synthesis has ended long
    // before the next fragments arrive.
    std::thread::sleep(Duration::from_millis(1500));
    push(&mut h, b", and more words", 600, false);
    push(&mut h, b" that come too late.", 700, true);
    h.push_event(gst::event::Eos::new());
    let mut out = Vec::new();
    pull_to_eos(&mut h, &mut out);
    let msgs = element_util::drain(&bus);
    assert!(errors(&msgs).is_empty(), "{:?}", errors(&msgs));
    let unspoken: Vec<String> = element_util::warnings(&msgs)
        .into_iter()
        .filter(|w| w.contains("is not spoken"))
        .collect();
    assert_eq!(unspoken.len(), 1, "{unspoken:?}");
    assert!(
        unspoken[0].contains("the text from ', and more words' on is not spoken"),
        "{}",
        unspoken[0]
    );
}

/// xorshift64: the test's seeded randomness.
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

const MIXED: &str = "Café au lait, naïve señor! 你好，世界。 Then it ends.";

/// Speaks `fragments` (each pushed after a pause of its ms) from 200 ms, the last with MARKER,
/// then EOS: the samples, and the cue messages.
fn speak(fragments: &[(&[u8], u64)]) -> (Vec<f32>, Vec<(String, gst::ClockTime)>) {
    let (mut h, bus) = synth(&fixture_model("tiny-customvoice"), 20);
    let n = fragments.len();
    for (i, (bytes, pause_ms)) in fragments.iter().enumerate() {
        std::thread::sleep(Duration::from_millis(*pause_ms));
        push(&mut h, bytes, 200 + 3 * i as u64, i + 1 == n);
    }
    h.push_event(gst::event::Eos::new());
    let mut out = Vec::new();
    pull_to_eos(&mut h, &mut out);
    (out, cues(&no_errors(&bus)))
}

/// (b) Fragments cut at random points (mid-word, mid-UTF-8 character, one byte at a time),
/// pushed on a random schedule: the same samples as the text in one fragment, from the first
/// fragment's PTS.
#[test]
fn random_cuts_speak_as_one_fragment() {
    let (want, want_cues) = speak(&[(MIXED.as_bytes(), 0)]);
    assert_eq!(
        want_cues,
        [(MIXED.to_string(), gst::ClockTime::from_mseconds(200))]
    );
    assert!(want[..at_ms(200)].iter().all(|&x| x == 0.0));
    assert!(
        want[at_ms(200)..].iter().any(|&x| x != 0.0),
        "speech from the first fragment's PTS"
    );
    let bytes = MIXED.as_bytes();
    for (seed, max) in [(0x36_f7a9u64, 1u64), (0x1234_5678, 6), (0xfeed_beef, 13)] {
        let mut seed = seed;
        let mut cuts = vec![0];
        while *cuts.last().unwrap() < bytes.len() {
            let step = 1 + (next(&mut seed) % max) as usize;
            cuts.push((cuts.last().unwrap() + step).min(bytes.len()));
        }
        assert!(
            cuts.iter()
                .any(|&c| c < bytes.len() && (bytes[c] & 0xc0) == 0x80),
            "a cut inside a UTF-8 character"
        );
        let fragments: Vec<(&[u8], u64)> = cuts
            .windows(2)
            .map(|w| (&bytes[w[0]..w[1]], next(&mut seed) % 15))
            .collect();
        let (got, got_cues) = speak(&fragments);
        // One cue at the first fragment's PTS; its text is what had arrived when its speech
        // ended (the model may end it, at max-new-tokens, before the text does).
        assert_eq!(got_cues.len(), 1, "cuts {cuts:?}");
        assert_eq!(got_cues[0].1, want_cues[0].1, "cuts {cuts:?}");
        assert!(MIXED.starts_with(&got_cues[0].0), "{got_cues:?}");
        assert_eq!(got.len(), want.len(), "cuts {cuts:?}");
        assert!(
            got == want,
            "cuts {cuts:?}: other samples than one fragment"
        );
    }
}

/// A checkpoint folder with the tiny CustomVoice fixture's files and an `omnitts.json` that
/// says its streaming prompt mode is poor (`streaming_prompt: false`): clause mode.
fn clause_checkpoint() -> TempDir {
    let dir = TempDir::new("clause-ckpt");
    for entry in std::fs::read_dir(fixture("tiny-customvoice")).expect("fixture") {
        let entry = entry.expect("fixture entry");
        std::os::unix::fs::symlink(entry.path(), dir.path().join(entry.file_name()))
            .expect("link the fixture");
    }
    std::fs::write(
        dir.path().join("omnitts.json"),
        r#"{ "streaming_prompt": false }"#,
    )
    .expect("omnitts.json");
    dir
}

/// (c) Clause mode: the first clause is spoken once it is complete, before the end arrives.
#[test]
fn clause_mode_speaks_the_first_clause_before_the_end() {
    let ckpt = clause_checkpoint();
    let (mut h, bus) = synth(&ckpt.path().display().to_string(), 20);
    push(&mut h, b"It was a fine mor", 50, false);
    push(&mut h, b"ning, and the rain", 60, false);
    push(&mut h, b" had st", 70, false);
    let mut out = Vec::new();
    pull_until_speech(&mut h, &mut out);
    let msgs = no_errors(&bus);
    element_util::assert_stream_mode(&msgs, "clause", "streaming_prompt=false");
    assert!(cues(&msgs).is_empty(), "the utterance is still open");
    push(&mut h, b"opped.", 80, false);
    h.push_event(gst::event::CustomDownstream::new(
        gst::Structure::new_empty(END_TEXT_EVENT),
    ));
    h.push_event(gst::event::Eos::new());
    pull_to_eos(&mut h, &mut out);
    let got = cues(&no_errors(&bus));
    assert_eq!(
        got,
        [(
            "It was a fine morning, and the rain had stopped.".to_string(),
            gst::ClockTime::from_mseconds(50)
        )]
    );
}

/// What `omnittssrc` speaks for `text` with the tiny model, greedy, at most `max_tokens`
/// frames, in the streaming prompt mode as one utterance (what token mode speaks).
fn reference(text: &str, max_tokens: u32) -> Vec<f32> {
    let (mut h, _bus) = element_util::harness(&[
        ("model", v(fixture_model("tiny-customvoice"))),
        ("do-sample", v(false)),
        ("max-new-tokens", v(max_tokens)),
        ("prompt-mode", v("streaming")),
        ("split-sentences", v("false")),
        ("text", v(text)),
    ]);
    h.play();
    let mut out = Vec::new();
    while let Some(b) = h.pull_until_eos().expect("pull") {
        out.extend(f32_of(&b));
    }
    assert!(!out.is_empty(), "reference for {text:?} is empty");
    out
}

/// (d) Two MARKER-ended utterances: two utterances, in order, each spoken whole from its first
/// fragment's PTS.
#[test]
fn two_markers_give_two_utterances_in_order() {
    let (mut h, bus) = synth(&fixture_model("tiny-customvoice"), 12);
    push(&mut h, b"First one ", 100, false);
    push(&mut h, b"here", 120, true);
    push(&mut h, b"And the sec", 2_000, false);
    push(&mut h, b"ond.", 2_030, true);
    h.push_event(gst::event::Eos::new());
    let mut got = Vec::new();
    pull_to_eos(&mut h, &mut got);
    let msgs = no_errors(&bus);
    let ms = gst::ClockTime::from_mseconds;
    assert_eq!(
        cues(&msgs),
        [
            ("First one here".to_string(), ms(100)),
            ("And the second.".to_string(), ms(2_000)),
        ]
    );
    let texts: Vec<String> = element_messages(&msgs, messages::DONE)
        .iter()
        .map(|d| d.get::<String>("text").unwrap())
        .collect();
    assert_eq!(texts, ["First one here", "And the second."]);
    let mut want = vec![0.0f32; at_ms(100)];
    want.extend(reference("First one here", 12));
    assert!(
        want.len() <= at_ms(2_000),
        "the first ends before the second"
    );
    want.resize(at_ms(2_000), 0.0);
    want.extend(reference("And the second.", 12));
    assert_eq!(got.len(), want.len());
    assert!(got == want, "each utterance at its first fragment's PTS");
}

/// A flush while a fragments utterance is open drops it: whether or not its first sample was
/// out, every utterance-done has its utterance-started (an utterance that never started gets
/// neither, only its cue message, `flushed`), and the next utterance after the flush speaks.
#[test]
fn a_flush_of_an_open_utterance_keeps_started_and_done_in_pairs() {
    for wait_for_speech in [false, true] {
        let (mut h, bus) = synth(&fixture_model("tiny-customvoice"), 30);
        for (i, word) in LONG.split_inclusive(' ').take(6).enumerate() {
            push(&mut h, word.as_bytes(), 100 + 10 * i as u64, false);
        }
        let mut out = Vec::new();
        if wait_for_speech {
            pull_until_speech(&mut h, &mut out);
        }
        assert!(h.push_event(gst::event::FlushStart::new()));
        assert!(h.push_event(gst::event::FlushStop::new(true)));
        while h.try_pull().is_some() {}
        let seg = gst::FormattedSegment::<gst::ClockTime>::new();
        assert!(h.push_event(gst::event::Segment::new(&seg)));
        push(&mut h, b"After the flush.", 200, true);
        h.push_event(gst::event::Eos::new());
        let mut after = Vec::new();
        pull_to_eos(&mut h, &mut after);
        assert!(after.iter().any(|&x| x != 0.0), "no speech after the flush");
        let msgs = no_errors(&bus);
        let ids = |name: &str| -> Vec<u64> {
            element_messages(&msgs, name)
                .iter()
                .map(|m| m.get::<u64>("id").unwrap())
                .collect()
        };
        let (started, done) = (ids(messages::STARTED), ids(messages::DONE));
        assert_eq!(started, done, "wait_for_speech={wait_for_speech}");
        let actions: Vec<String> = element_messages(&msgs, CUE)
            .iter()
            .map(|c| c.get::<String>("action").unwrap())
            .collect();
        assert_eq!(actions.len(), 2, "{actions:?}");
        assert_eq!(actions[0], "flushed", "{actions:?}");
        // With its speech out before the flush, the flushed utterance had started (without
        // waiting, its first sample may or may not have been out: the pairs above hold either way).
        if wait_for_speech {
            assert_eq!(started.len(), 2, "{started:?}");
        }
    }
}
