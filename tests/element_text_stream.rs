//! `omnittssrc`'s `append-text` / `end-text` (tiny CustomVoice fixture, CPU, greedy): text
//! streamed into an open utterance while the element plays is spoken as the same text given
//! whole in streaming prompt mode; `push-text` utterances queued behind it keep their order;
//! EOS ends the open text; refusals name the property.

mod element_util;
mod reference_util;

use element_util::*;
use gst::prelude::*;
use gst_check::Harness;
use gstomnitts::element_common::messages;
use std::time::Duration;

fn pull_samples(h: &mut Harness) -> usize {
    let mut n = 0;
    loop {
        match h.pull_until_eos() {
            Ok(Some(b)) => n += b.size() / 4,
            Ok(None) => return n,
            Err(e) => panic!("pull failed after {n} samples: {e}"),
        }
    }
}

fn dones(bus: &gst::Bus) -> Vec<gst::Structure> {
    let msgs = drain(bus);
    let errs = errors(&msgs);
    assert!(errs.is_empty(), "{errs:?}");
    element_messages(&msgs, messages::DONE)
}

const STREAMED: &str = "Streamed text arrives in pieces, as an LLM writes it.";

/// The samples of the done message of `STREAMED` spoken whole in streaming prompt mode.
fn whole_samples() -> u64 {
    let (mut h, bus) = harness(&[
        ("text", v(STREAMED)),
        ("speaker", v("vivian")),
        ("prompt-mode", v("streaming")),
        ("max-new-tokens", v(60u32)),
    ]);
    h.play();
    pull_samples(&mut h);
    let d = dones(&bus);
    assert_eq!(d.len(), 1);
    d[0].get::<u64>("samples").expect("samples")
}

#[test]
fn appended_text_is_spoken_in_order_with_the_queued_texts() {
    let want = whole_samples();
    let (mut h, bus) = harness(&[
        ("text", v("First.")),
        ("speaker", v("vivian")),
        ("max-new-tokens", v(60u32)),
    ]);
    let (pad, probe) = play_holding_first_buffer(&mut h);
    let e = h.element().expect("element");
    // Cut mid-word; `prompt-mode=auto` (non-streaming on CustomVoice) takes streaming here.
    let cuts = [0, 5, 13, 14, 30, STREAMED.len()];
    for w in cuts.windows(2).take(2) {
        assert!(e.emit_by_name::<bool>("append-text", &[&&STREAMED[w[0]..w[1]]]));
    }
    assert!(e.emit_by_name::<bool>("push-text", &[&"After it."]));
    for w in cuts.windows(2).skip(2) {
        assert!(e.emit_by_name::<bool>("append-text", &[&&STREAMED[w[0]..w[1]]]));
    }
    assert!(e.emit_by_name::<bool>("end-text", &[]));
    assert!(
        !e.emit_by_name::<bool>("end-text", &[]),
        "nothing open any more"
    );
    let modes = element_messages(&drain(&bus), messages::TEXT_STREAM_MODE);
    assert_eq!(modes.len(), 1, "{modes:?}");
    assert_eq!(modes[0].get::<u64>("id").unwrap(), 2);
    assert_eq!(modes[0].get::<String>("mode").unwrap(), "token");
    assert!(
        modes[0]
            .get::<String>("reason")
            .unwrap()
            .contains("prompt-mode=auto")
    );
    pad.remove_probe(probe);
    pull_samples(&mut h);
    let d = dones(&bus);
    let ids: Vec<u64> = d.iter().map(|s| s.get::<u64>("id").unwrap()).collect();
    assert_eq!(ids, [1, 2, 3]);
    let texts: Vec<String> = d.iter().map(|s| s.get::<String>("text").unwrap()).collect();
    assert_eq!(texts[2], "After it.");
    assert_eq!(
        texts[1], STREAMED,
        "the open utterance's done message has its whole text"
    );
    let reason = d[1].get::<String>("reason").unwrap();
    assert!(reason == "eos" || reason == "length", "{reason}");
    assert_eq!(
        d[1].get::<u64>("samples").unwrap(),
        want,
        "as the whole text"
    );
}

/// A string argument as a C caller passes it: any bytes (glib's Rust strings cannot hold them).
fn c_string(bytes: &[u8]) -> gst::glib::Value {
    use gst::glib::translate::ToGlibPtrMut;
    let c = std::ffi::CString::new(bytes).expect("no NUL");
    let mut v = gst::glib::Value::from_type(gst::glib::Type::STRING);
    // SAFETY: a string value; g_value_set_string copies the bytes.
    unsafe { gst::glib::gobject_ffi::g_value_set_string(v.to_glib_none_mut().0, c.as_ptr()) };
    v
}

fn emit_bytes(e: &gst::Element, signal: &str, bytes: &[u8]) -> bool {
    e.emit_by_name_with_values(signal, &[c_string(bytes)])
        .and_then(|v| v.get::<bool>().ok())
        .expect("a boolean")
}

/// From C, `append-text` may cut a UTF-8 character between two calls: it is joined; bytes that
/// are not UTF-8 (in `push-text` or `append-text`) are dropped with a warning naming the first,
/// and the rest is spoken (glib's conversion of such bytes to a Rust string used to abort the
/// process).
#[test]
fn a_c_callers_bytes_are_joined_and_bad_bytes_dropped() {
    let (mut h, bus) = harness(&[
        ("text", v("First.")),
        ("speaker", v("vivian")),
        ("max-new-tokens", v(30u32)),
    ]);
    let (pad, probe) = play_holding_first_buffer(&mut h);
    let e = h.element().expect("element");
    let text = "Café in pieces.".as_bytes();
    let cut = 4; // between the two bytes of é
    assert!(emit_bytes(&e, "append-text", &text[..cut]));
    assert!(emit_bytes(&e, "append-text", &text[cut..]));
    assert!(emit_bytes(&e, "append-text", b" And \xffmore."));
    assert!(e.emit_by_name::<bool>("end-text", &[]));
    assert!(emit_bytes(&e, "push-text", b"Caf\xff after."));
    pad.remove_probe(probe);
    pull_samples(&mut h);
    let msgs = drain(&bus);
    assert!(errors(&msgs).is_empty(), "{:?}", errors(&msgs));
    let d = element_messages(&msgs, messages::DONE);
    let texts: Vec<String> = d.iter().map(|s| s.get::<String>("text").unwrap()).collect();
    assert_eq!(texts, ["First.", "Café in pieces. And more.", "Caf after."]);
    let bad: Vec<String> = warnings(&msgs)
        .into_iter()
        .filter(|w| w.contains("not UTF-8"))
        .collect();
    assert_eq!(bad.len(), 2, "{bad:?}");
    assert!(
        bad.iter()
            .any(|w| w.starts_with("append-text") && w.contains("0xff"))
    );
    assert!(
        bad.iter()
            .any(|w| w.starts_with("push-text") && w.contains("0xff at offset 3"))
    );
}

/// A live omnittssrc with `props` on the system clock, playing: the harness, its bus and the
/// element.
fn play_live(props: &[(&str, gst::glib::SendValue)]) -> (Harness, gst::Bus, gst::Element) {
    let mut props = props.to_vec();
    props.push(("is-live", v(true)));
    let (mut h, bus) = harness(&props);
    h.use_systemclock();
    h.play();
    let e = h.element().expect("element");
    (h, bus, e)
}

/// [`play_live`] on the tiny fixture, speaker vivian, 20 frames at most an utterance.
fn playing_live() -> (Harness, gst::Bus, gst::Element) {
    play_live(&[("speaker", v("vivian")), ("max-new-tokens", v(20u32))])
}

/// Live, an open utterance whose text is still arriving when its start plus the latency passes
/// waits for its text: no bus warning for it (a voice agent's every reply would get one); the
/// silence is counted in its done message.
#[test]
fn waiting_for_appended_text_is_not_warned_about() {
    let (mut h, bus, e) = playing_live();
    assert!(e.emit_by_name::<bool>("append-text", &[&"Wai"]));
    // 0.4 s of the live stream (GAP silence, then the utterance's wait) with its text open.
    let mut n = 0;
    while n < 24_000 * 4 / 10 {
        n += h.pull().expect("a buffer").size() / 4;
    }
    assert!(e.emit_by_name::<bool>("append-text", &[&"ting for the rest."]));
    assert!(e.emit_by_name::<bool>("end-text", &[]));
    e.send_event(gst::event::Eos::new());
    pull_samples(&mut h);
    let msgs = drain(&bus);
    assert!(errors(&msgs).is_empty(), "{:?}", errors(&msgs));
    let late: Vec<String> = warnings(&msgs)
        .into_iter()
        .filter(|w| w.contains("no audio at its start"))
        .collect();
    assert!(late.is_empty(), "{late:?}");
    let d = element_messages(&msgs, messages::DONE);
    assert_eq!(d.len(), 1, "{d:?}");
    assert!(
        d[0].get::<u64>("silence-samples").unwrap() > 0,
        "the wait for the text is counted: {}",
        d[0]
    );
}

/// Live, an EOS event ends the stream at once: utterances still queued are dropped with one
/// warning naming how many and the first.
#[test]
fn a_live_eos_names_the_queued_utterances_it_drops() {
    let (mut h, bus, e) = playing_live();
    for t in ["The first one.", "The second one.", "The third one."] {
        assert!(e.emit_by_name::<bool>("push-text", &[&t]));
    }
    // The first is cut; the other two are not begun, whether still queued, being synthesised or
    // synthesised and waiting (the tiny fixture makes them faster than real time).
    eos_after_the_first_speech_drops(
        &mut h,
        &bus,
        &e,
        "'The first one.' is cut",
        "2 queued utterances not spoken (the first: 'The second one.')",
    );
}

/// Sends EOS to `e` after the first buffer of speech of `h` (live, GAP silence may come before
/// it: the first text's audio may be later than the latency on a busy machine, and the EOS would
/// then cut nothing); asserts that text pushed after it is refused, and that one warning, naming
/// `cut` and `not_begun`, says what the EOS dropped.
fn eos_after_the_first_speech_drops(
    h: &mut Harness,
    bus: &gst::Bus,
    e: &gst::Element,
    cut: &str,
    not_begun: &str,
) {
    while h
        .pull()
        .expect("a buffer")
        .flags()
        .contains(gst::BufferFlags::GAP)
    {}
    e.send_event(gst::event::Eos::new());
    assert!(
        !e.emit_by_name::<bool>("push-text", &[&"Too late."]),
        "text after EOS is refused"
    );
    pull_samples(h);
    let msgs = drain(bus);
    assert!(errors(&msgs).is_empty(), "{:?}", errors(&msgs));
    let dropped = one_eos_warning(&msgs, "a live EOS");
    assert!(
        dropped.contains(cut) && dropped.contains(not_begun),
        "{}",
        dropped
    );
}

/// Non-live, an EOS event sent by the application also ends the stream at once: the warning
/// names what it drops, and `push-text` after it returns false (it returned true and the text
/// was never spoken).
#[test]
fn a_non_live_eos_names_what_it_drops_and_refuses_later_text() {
    let (mut h, bus) = harness(&[("speaker", v("vivian")), ("max-new-tokens", v(20u32))]);
    let e = h.element().expect("element");
    // Non-live, text pushed before the start is the stream's.
    for t in ["One is spoken.", "Two is dropped.", "Three is dropped."] {
        assert!(e.emit_by_name::<bool>("push-text", &[&t]));
    }
    h.play();
    eos_after_the_first_speech_drops(
        &mut h,
        &bus,
        &e,
        "'One is spoken.' is cut",
        "2 queued utterances not spoken (the first: 'Two is dropped.')",
    );
}

/// An EOS event sent before the start (READY) is kept, as GstBaseSrc keeps it: the stream ends
/// at once when it starts, with no audio. What it drops (the `text` property's utterance, text
/// pushed before the start) is named in the same warning as an EOS while running (it was dropped
/// without a word), and `push-text` after it returns false.
#[test]
fn an_eos_before_the_start_ends_the_stream_at_once_and_names_what_it_drops() {
    let (mut h, bus) = harness(&[
        ("text", v("Set before the start.")),
        ("speaker", v("vivian")),
        ("max-new-tokens", v(20u32)),
    ]);
    let e = h.element().expect("element");
    assert!(e.emit_by_name::<bool>("push-text", &[&"Pushed before it."]));
    e.set_state(gst::State::Ready).expect("READY");
    assert!(e.send_event(gst::event::Eos::new()));
    assert!(
        !e.emit_by_name::<bool>("push-text", &[&"Too late."]),
        "text after EOS is refused"
    );
    h.play();
    assert_eq!(pull_samples(&mut h), 0, "audio after an EOS");
    let msgs = drain(&bus);
    assert!(errors(&msgs).is_empty(), "{:?}", errors(&msgs));
    assert!(element_messages(&msgs, messages::STARTED).is_empty());
    let dropped = one_eos_warning(&msgs, "an EOS before the start");
    assert!(
        dropped.contains("2 queued utterances not spoken (the first: 'Set before the start.')"),
        "{}",
        dropped
    );
}

/// With an EOS kept for the start, a non-live element needs no text: it starts and ends at
/// once, with no error.
#[test]
fn an_eos_kept_for_the_start_needs_no_text() {
    let (mut h, bus) = harness(&[("speaker", v("vivian")), ("max-new-tokens", v(20u32))]);
    let e = h.element().expect("element");
    e.set_state(gst::State::Ready).expect("READY");
    assert!(e.send_event(gst::event::Eos::new()));
    h.play();
    assert_eq!(pull_samples(&mut h), 0, "audio after an EOS");
    let msgs = drain(&bus);
    assert!(errors(&msgs).is_empty(), "{:?}", errors(&msgs));
}

/// A second EOS event posts no second warning: what the first dropped is named once.
#[test]
fn a_second_eos_names_nothing_again() {
    let (mut h, bus, e) = playing_live();
    assert!(e.emit_by_name::<bool>("push-text", &[&"Cut by the EOS, named once."]));
    assert!(e.emit_by_name::<bool>("push-text", &[&"Dropped by the EOS."]));
    let _ = h.pull().expect("a buffer");
    assert!(e.send_event(gst::event::Eos::new()));
    assert!(e.send_event(gst::event::Eos::new()));
    let _ = pull_samples(&mut h);
    let msgs = drain(&bus);
    one_eos_warning(&msgs, "two EOS events");
}

/// Live, an EOS event while the utterance `append-text` opened is unfinished lets it be spoken to
/// its end; the `push-text` queued behind it is dropped, and the same warning as for the other
/// EOS names it (it was dropped without a word).
#[test]
fn a_live_eos_behind_an_open_text_names_the_queued_utterances_it_drops() {
    let (mut h, bus, e) = playing_live();
    assert!(e.emit_by_name::<bool>("append-text", &[&"Spoken to its end, as"]));
    assert!(e.emit_by_name::<bool>("push-text", &[&"Queued behind it."]));
    assert!(e.emit_by_name::<bool>("append-text", &[&" the EOS ends its text."]));
    let _ = h.pull().expect("a buffer");
    e.send_event(gst::event::Eos::new());
    assert!(
        !e.emit_by_name::<bool>("push-text", &[&"Too late."]),
        "text after EOS is refused"
    );
    pull_samples(&mut h);
    let msgs = drain(&bus);
    assert!(errors(&msgs).is_empty(), "{:?}", errors(&msgs));
    let d = element_messages(&msgs, messages::DONE);
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(
        d[0].get::<String>("text").unwrap(),
        "Spoken to its end, as the EOS ends its text."
    );
    let dropped = one_eos_warning(&msgs, "a live EOS behind an open text");
    assert!(
        dropped.contains("1 queued utterance not spoken (the first: 'Queued behind it.')"),
        "{}",
        dropped
    );
}

/// Token mode: once the open utterance's speech has ended (here at max-new-tokens) the rest of
/// its text would never be spoken: `append-text` returns false (it returned true and the text
/// was dropped without a word), until `end-text`.
#[test]
fn append_text_after_the_speech_ended_is_refused() {
    let (mut h, bus, e) = play_live(&[
        ("speaker", v("vivian")),
        ("max-new-tokens", v(3u32)),
        ("prompt-mode", v("streaming")),
    ]);
    // More text tokens than the three frames take.
    assert!(e.emit_by_name::<bool>("append-text", &[&STREAMED]));
    let _ = h.pull().expect("a buffer");
    // Three frames of the tiny checkpoint take milliseconds.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(
        !e.emit_by_name::<bool>("append-text", &[&" Too late."]),
        "text after the speech ended was taken"
    );
    assert!(e.emit_by_name::<bool>("end-text", &[]));
    e.send_event(gst::event::Eos::new());
    pull_samples(&mut h);
    let msgs = drain(&bus);
    assert!(errors(&msgs).is_empty(), "{:?}", errors(&msgs));
}

/// omnittssrc is not seekable: a seek sent to the element itself is refused (BaseSrc flushed
/// downstream and started no new segment, so every element downstream warned of data before a
/// segment; a seek to 0 returned true and did nothing), and the stream goes on.
#[test]
fn a_seek_sent_to_the_element_is_refused() {
    let (mut h, bus) = harness(&[("text", v("Hello there.")), ("max-new-tokens", v(20u32))]);
    h.play();
    let e = h.element().expect("element");
    let _ = h.pull().expect("a buffer");
    for to in [0u64, 2] {
        let seek = gst::event::Seek::new(
            1.0,
            gst::SeekFlags::FLUSH,
            gst::SeekType::Set,
            gst::ClockTime::from_seconds(to),
            gst::SeekType::None,
            gst::ClockTime::NONE,
        );
        assert!(!e.send_event(seek), "a seek to {to} s was taken");
    }
    // No flush went downstream: the stream carries on to its end.
    let n = pull_samples(&mut h);
    assert!(n > 0, "the stream stopped after the refused seeks");
    let msgs = drain(&bus);
    assert!(errors(&msgs).is_empty(), "{:?}", errors(&msgs));
    let mut events = Vec::new();
    while let Some(ev) = h.try_pull_event() {
        events.push(ev.type_());
    }
    assert!(
        !events.contains(&gst::EventType::FlushStart),
        "a flush went downstream: {events:?}"
    );
}

/// Live, an EOS event ends the open text (`end-text` finds nothing open after it) and the rest
/// is spoken before the stream ends, in token mode (tiny fixture) and clause mode (the bundled
/// voice); the done message carries the whole text.
#[test]
fn live_eos_speaks_the_rest_of_the_open_text() {
    let voice = bundled_voice();
    for (props, text_parts, mode) in [
        (
            vec![("speaker", v("vivian")), ("max-new-tokens", v(40u32))],
            ["Spoken until the end of the st", "ream"],
            "token",
        ),
        (
            vec![("model", v(voice.as_str()))],
            [
                "It was a fine morning, and the rain had st",
                "opped at last",
            ],
            "clause",
        ),
    ] {
        let (mut h, bus, e) = play_live(&props);
        for part in text_parts {
            assert!(e.emit_by_name::<bool>("append-text", &[&part]));
        }
        let _ = h.pull().expect("a buffer");
        e.send_event(gst::event::Eos::new());
        assert!(
            !e.emit_by_name::<bool>("end-text", &[]),
            "EOS ended the open text"
        );
        let n = pull_samples(&mut h);
        let msgs = drain(&bus);
        assert!(errors(&msgs).is_empty(), "{:?}", errors(&msgs));
        let modes = element_messages(&msgs, messages::TEXT_STREAM_MODE);
        assert_eq!(modes[0].get::<String>("mode").unwrap(), mode);
        let d = element_messages(&msgs, messages::DONE);
        assert_eq!(d.len(), 1, "{mode}: {d:?}");
        let whole = text_parts.concat();
        assert_eq!(d[0].get::<String>("text").unwrap(), whole, "{mode}");
        let reason = d[0].get::<String>("reason").unwrap();
        assert!(reason == "eos" || reason == "length", "{mode}: {reason}");
        let samples = d[0].get::<u64>("samples").unwrap();
        assert!(samples > 24_000 / 2, "{mode}: {samples} samples");
        assert!(n as u64 >= samples, "{mode}: the audio came out before EOS");
        let started = element_messages(&msgs, messages::STARTED);
        assert!(
            !started[0].get::<String>("text").unwrap().is_empty(),
            "{mode}: started message without its text"
        );
    }
}

#[test]
fn append_text_refusals_name_the_property() {
    let (mut h, bus) = harness(&[("text", v("First.")), ("speaker", v("vivian"))]);
    let (pad, probe) = play_holding_first_buffer(&mut h);
    let e = h.element().expect("element");
    e.set_property("speaker", "nobody");
    assert!(!e.emit_by_name::<bool>("append-text", &[&"Never spoken."]));
    assert!(
        !e.emit_by_name::<bool>("end-text", &[]),
        "a refused text opens nothing"
    );
    pad.remove_probe(probe);
    pull_samples(&mut h);
    let msgs = drain(&bus);
    let errs = errors(&msgs);
    assert_names(&errs, &["speaker", "nobody"]);
    assert!(element_messages(&msgs, messages::TEXT_STREAM_MODE).is_empty());
}

/// The bundled voice, its streaming prompt mode poor (`streaming_prompt: false` in its
/// `omnitts.json`), speaks streamed text clause by clause.
fn bundled_voice() -> String {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("models/omnitts-en")
        .display()
        .to_string()
}

/// All the samples `h` outputs until EOS.
fn pull_all_samples(h: &mut Harness) -> Vec<f32> {
    let mut out = Vec::new();
    while let Some(b) = h.pull_until_eos().expect("pull") {
        let map = b.map_readable().expect("readable");
        out.extend(
            map.as_slice()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        );
    }
    out
}

const CLAUSES: [&str; 3] = [
    "It was a fine morning,",
    "and the rain had stopped at last.",
    "She walked down to the river.",
];

/// Clause mode: text streamed in random fragments (seeded) is spoken as its clauses each spoken
/// whole, back to back in one utterance: the same samples as the clauses queued one by one with
/// `push-text`, nothing between them; one utterance, its done message with the whole text.
#[test]
fn clause_mode_speaks_each_clause_whole_without_gaps() {
    let voice = bundled_voice();
    let props = |extra: Option<(&'static str, &'static str)>| {
        let mut p = vec![
            ("model", v(voice.as_str())),
            ("text", v("First.")),
            ("split-sentences", v("false")),
        ];
        if let Some((k, x)) = extra {
            p.push((k, v(x)));
        }
        p
    };
    // The clauses one by one.
    let (mut h, bus) = harness(&props(None));
    let (pad, probe) = play_holding_first_buffer(&mut h);
    let e = h.element().expect("element");
    for c in CLAUSES {
        assert!(e.emit_by_name::<bool>("push-text", &[&c]));
    }
    pad.remove_probe(probe);
    let want = pull_all_samples(&mut h);
    let d = dones(&bus);
    assert_eq!(d.len(), 4);
    let first: u64 = d[0].get("samples").unwrap();
    let clause_samples: u64 = d[1..]
        .iter()
        .map(|s| s.get::<u64>("samples").unwrap())
        .sum();
    assert!(clause_samples > 0);

    // The same text streamed in seeded random fragments.
    let whole = CLAUSES.join(" ");
    let mut seed = 0x36_c1a5e_u64;
    let mut cuts = vec![0];
    while *cuts.last().unwrap() < whole.len() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let next = (cuts.last().unwrap() + 1 + (seed % 9) as usize).min(whole.len());
        cuts.push(next);
    }
    let (mut h, bus) = harness(&props(None));
    let (pad, probe) = play_holding_first_buffer(&mut h);
    let e = h.element().expect("element");
    for w in cuts.windows(2) {
        assert!(e.emit_by_name::<bool>("append-text", &[&&whole[w[0]..w[1]]]));
    }
    assert!(e.emit_by_name::<bool>("end-text", &[]));
    pad.remove_probe(probe);
    let got = pull_all_samples(&mut h);
    let msgs = drain(&bus);
    assert!(errors(&msgs).is_empty(), "{:?}", errors(&msgs));
    element_util::assert_stream_mode(&msgs, "clause", "streaming_prompt=false");
    let d = element_messages(&msgs, messages::DONE);
    assert_eq!(d.len(), 2, "one utterance for the streamed text");
    assert_eq!(d[1].get::<String>("text").unwrap(), whole);
    assert_eq!(d[1].get::<String>("reason").unwrap(), "eos");
    assert_eq!(d[1].get::<u64>("samples").unwrap(), clause_samples);
    assert_eq!(d[0].get::<u64>("samples").unwrap(), first);
    assert_eq!(got.len(), want.len());
    let worst = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(
        worst < 1e-4,
        "clause mode differs from the clauses spoken one by one: {worst}"
    );
}

/// `prompt-mode` forces the mode: `streaming` gives token mode on the bundled voice,
/// `non-streaming` clause mode on the tiny fixture.
#[test]
fn prompt_mode_forces_the_text_stream_mode() {
    let voice = bundled_voice();
    for (props, want, why) in [
        (
            vec![
                ("model", v(voice.as_str())),
                ("prompt-mode", v("streaming")),
            ],
            "token",
            "prompt-mode=streaming",
        ),
        (
            vec![
                ("speaker", v("vivian")),
                ("prompt-mode", v("non-streaming")),
            ],
            "clause",
            "prompt-mode=non-streaming",
        ),
    ] {
        let mut props = props;
        props.push(("is-live", v(true)));
        let (mut h, bus) = harness(&props);
        h.play();
        let e = h.element().expect("element");
        assert!(e.emit_by_name::<bool>("append-text", &[&"Hello there, "]));
        element_util::assert_stream_mode(&drain(&bus), want, why);
        assert!(e.emit_by_name::<bool>("cancel", &[]));
    }
}

/// An open utterance cancelled while it speaks: its done message (`cancelled`) gives all the text
/// appended to it, not only what had come when it started, in token mode (the tiny fixture in
/// streaming prompt mode) and in clause mode (the bundled voice).
#[test]
fn a_cancelled_open_utterance_is_done_with_all_its_text() {
    let voice = bundled_voice();
    let first = "It was a fine morning, and the rain had stopped at last. ";
    let rest = ["She walked ", "down to the river."];
    for (props, mode) in [
        (
            vec![
                ("speaker", v("vivian")),
                ("prompt-mode", v("streaming")),
                ("max-new-tokens", v(200u32)),
            ],
            "token",
        ),
        (vec![("model", v(voice.as_str()))], "clause"),
    ] {
        let (mut h, bus, e) = play_live(&props);
        let mut seen = Vec::new();
        assert!(e.emit_by_name::<bool>("append-text", &[&first]));
        let started =
            wait_element_message(&bus, messages::STARTED, Duration::from_secs(30), &mut seen)
                .unwrap_or_else(|| panic!("{mode}: no utterance-started"));
        for fragment in rest {
            assert!(e.emit_by_name::<bool>("append-text", &[&fragment]));
        }
        assert!(e.emit_by_name::<bool>("end-text", &[]));
        let _ = h.pull().expect("a buffer");
        assert!(e.emit_by_name::<bool>("cancel", &[]));
        let done = wait_element_message(&bus, messages::DONE, Duration::from_secs(30), &mut seen)
            .unwrap_or_else(|| panic!("{mode}: no utterance-done"));
        assert_eq!(
            done.get::<String>("reason").as_deref(),
            Ok("cancelled"),
            "{mode}: {done:?} (started: {started:?})"
        );
        assert_eq!(
            done.get::<String>("text").expect("text"),
            format!("{first}{}", rest.concat()),
            "{mode}: {done:?}"
        );
    }
}

/// An open utterance cut at `max-new-tokens` gets the length warning without the advice to set
/// `split-sentences=true`, which does not apply to text streamed into one utterance (a text of
/// two sentences queued with `push-text` gets it).
#[test]
fn a_cut_open_utterance_is_not_told_to_split_sentences() {
    let two = "It was a fine morning at the lake. She walked down to the river.";
    for open in [true, false] {
        let (mut h, bus, e) = playing_live();
        if open {
            assert!(e.emit_by_name::<bool>("append-text", &[&two]));
            assert!(e.emit_by_name::<bool>("end-text", &[]));
        } else {
            e.set_property_from_str("split-sentences", "false");
            assert!(e.emit_by_name::<bool>("push-text", &[&two]));
        }
        let mut seen = Vec::new();
        let done = std::thread::scope(|s| {
            let puller = s.spawn(|| {
                for _ in 0..40 {
                    let _ = h.pull();
                }
            });
            let done =
                wait_element_message(&bus, messages::DONE, Duration::from_secs(30), &mut seen);
            let _ = puller.join();
            done
        })
        .unwrap_or_else(|| panic!("open={open}: no utterance-done"));
        assert_eq!(
            done.get::<String>("reason").as_deref(),
            Ok("length"),
            "{done:?}"
        );
        // The warning is posted right after the done message.
        let cut_warnings = |seen: &[gst::Message]| {
            warnings(seen)
                .into_iter()
                .filter(|w| w.contains("ended by length"))
                .collect::<Vec<_>>()
        };
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while cut_warnings(&seen).is_empty() && std::time::Instant::now() < until {
            seen.extend(drain(&bus));
            std::thread::sleep(Duration::from_millis(20));
        }
        let cut = cut_warnings(&seen);
        assert_eq!(cut.len(), 1, "open={open}: {cut:?}");
        assert_eq!(
            cut[0].contains("split-sentences"),
            !open,
            "open={open}: {}",
            cut[0]
        );
    }
}
