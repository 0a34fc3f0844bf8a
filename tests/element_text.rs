//! `omnittssrc` and the text it is given: `split-sentences` (`auto` by default, and its boolean
//! values from gst-launch and `g_object_set`), the one-utterance limit and a megabyte of text,
//! language codes, and text with nothing to speak.

mod element_util;
mod reference_util;

use std::time::{Duration, Instant};

use element_util::{
    assert_names, drain, element_messages, errors, harness, init, play_holding_first_buffer,
    rss_kib, serial, start_must_fail, v,
};
use gst::glib;
use gst::prelude::*;
use gst_check::Harness;
use gstomnitts::element_common::messages;

/// Pulls every buffer until EOS (panics on a failed pull) and returns the samples.
fn pull_samples(h: &mut Harness) -> Vec<f32> {
    let mut out = Vec::new();
    loop {
        match h.pull_until_eos() {
            Ok(Some(b)) => {
                let m = b.map_readable().unwrap();
                out.extend(
                    m.as_slice()
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                );
            }
            Ok(None) => return out,
            Err(e) => panic!("pull failed after {} samples: {e}", out.len()),
        }
    }
}

/// Speaks `props` to EOS: the samples and the texts of the utterances, in order (no errors).
fn speak(props: &[(&str, glib::SendValue)]) -> (Vec<f32>, Vec<String>) {
    let (mut h, bus) = harness(props);
    h.play();
    let samples = pull_samples(&mut h);
    let msgs = drain(&bus);
    assert!(errors(&msgs).is_empty(), "{:?}", errors(&msgs));
    let texts = element_messages(&msgs, messages::STARTED)
        .iter()
        .map(|s| s.get::<String>("text").unwrap())
        .collect();
    (samples, texts)
}

/// The nick of the `split-sentences` value of `e`.
fn split_nick(e: &gst::Element) -> String {
    let value = e.property_value("split-sentences");
    glib::EnumValue::from_value(&value)
        .expect("split-sentences is an enum")
        .1
        .nick()
        .to_string()
}

const SHORT: &str = "It was a fine morning. The rain had stopped at last.";
const LONG: &str = "It was a fine morning, and the rain had stopped at last. She walked down \
                    to the river before breakfast. Nobody else was awake yet.";

/// `auto`, the default, speaks the bundled voice's short texts whole, as the reference does, and
/// longer ones (over the 100 characters its omnitts.json names) sentence by sentence.
#[test]
fn auto_splits_long_text_and_keeps_short_text_whole() {
    let _serial = serial();
    init();
    let e = gst::ElementFactory::make("omnittssrc").build().unwrap();
    assert_eq!(split_nick(&e), "auto");
    let voice = e.property::<String>("model");
    let bundled = |text: &str, split: &str| {
        speak(&[
            ("model", v(voice.as_str())),
            ("text", v(text)),
            ("max-new-tokens", v(8u32)),
            ("split-sentences", v(split)),
        ])
    };
    let (short_auto, texts) = bundled(SHORT, "auto");
    assert_eq!(texts, [SHORT]);
    let (short_whole, _) = bundled(SHORT, "false");
    assert_eq!(short_auto, short_whole, "a short text is spoken as before");
    let (_, texts) = bundled(LONG, "auto");
    assert_eq!(
        texts,
        [
            "It was a fine morning, and the rain had stopped at last.",
            "She walked down to the river before breakfast.",
            "Nobody else was awake yet."
        ]
    );
    let (_, texts) = bundled(LONG, "false");
    assert_eq!(texts, [LONG]);
    let (_, texts) = bundled(SHORT, "true");
    assert_eq!(texts.len(), 2);

    // A checkpoint without omnitts.json: texts over a quarter of the default max-new-tokens
    // frames (4096 / 4 = 1024 characters) are split, whatever max-new-tokens is set to.
    let sentence = "One more sentence of some thirty-five characters. ";
    let (_, texts) = speak(&[
        ("text", v(sentence.repeat(20).as_str())),
        ("max-new-tokens", v(2u32)),
    ]);
    assert_eq!(texts.len(), 1, "1000 characters stay whole");
    let (_, texts) = speak(&[
        ("text", v(sentence.repeat(21).as_str())),
        ("max-new-tokens", v(2u32)),
    ]);
    assert_eq!(texts.len(), 21, "1050 characters are split");
}

/// The booleans of the property's first type still work: gst-launch's `split-sentences=true`
/// and `false`, and `g_object_set (src, "split-sentences", TRUE, NULL)` from C.
#[test]
fn split_sentences_takes_booleans_from_gst_launch_and_g_object_set() {
    let _serial = serial();
    init();
    for (value, nick) in [
        ("true", "true"),
        ("false", "false"),
        ("auto", "auto"),
        ("1", "true"),
        ("0", "false"),
    ] {
        let p = gst::parse::launch(&format!(
            "omnittssrc name=src split-sentences={value} ! fakesink"
        ))
        .unwrap_or_else(|e| panic!("split-sentences={value}: {e}"));
        let src = p
            .downcast_ref::<gst::Bin>()
            .unwrap()
            .by_name("src")
            .unwrap();
        assert_eq!(split_nick(&src), nick, "split-sentences={value}");
    }
    let e = gst::ElementFactory::make("omnittssrc").build().unwrap();
    for (flag, nick) in [(glib::ffi::GTRUE, "true"), (glib::ffi::GFALSE, "false")] {
        // SAFETY: a live GObject, a NUL-terminated property name, one gboolean value (C varargs
        // pass it as an int, as an enum value is read) and the NULL that ends the list.
        unsafe {
            glib::gobject_ffi::g_object_set(
                e.as_ptr() as *mut glib::gobject_ffi::GObject,
                c"split-sentences".as_ptr(),
                flag,
                std::ptr::null::<std::ffi::c_char>(),
            );
        }
        assert_eq!(split_nick(&e), nick);
    }
}

/// A megabyte of text, split (the default), streams sentence by sentence: the first audio comes
/// at once, memory stays bounded, and stopping is prompt. As one utterance it is refused, the
/// error naming the limit and split-sentences.
#[test]
fn a_megabyte_of_text_streams_sentence_by_sentence() {
    // Every test of this binary holds the lock: the memory bound reads the process's RSS, which
    // a test running beside it would grow.
    let _serial = serial();
    let sentence = "The quick brown fox jumps over the lazy dog by the river bank. ";
    let text = sentence.repeat((1 << 20) / sentence.len() + 1);
    assert!(text.len() >= 1 << 20);
    let (mut h, bus) = harness(&[("max-new-tokens", v(3u32))]);
    let e = h.element().unwrap();
    let rss0 = rss_kib();
    let t0 = Instant::now();
    e.set_property("text", text.as_str());
    h.play();
    let mut samples = 0usize;
    let mut done = 0;
    let mut first_audio = None;
    while done < 3 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no 3 utterances in 60 s"
        );
        let b = h.pull().expect("a buffer");
        first_audio.get_or_insert_with(|| t0.elapsed());
        samples += b.size() / 4;
        done += element_messages(&drain(&bus), messages::DONE).len();
    }
    let rss = rss_kib();
    eprintln!(
        "{} bytes of text: first audio after {:?}, {samples} samples of 3 utterances in {:?}, \
         RSS {} -> {} MiB",
        text.len(),
        first_audio.unwrap_or_default(),
        t0.elapsed(),
        rss0 / 1024,
        rss / 1024
    );
    assert!(samples > 0);
    assert!(
        rss < rss0 + 150 * 1024,
        "memory grew by {} MiB",
        (rss.saturating_sub(rss0)) / 1024
    );
    let t = Instant::now();
    e.set_state(gst::State::Null).unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "NULL took {:?}",
        t.elapsed()
    );

    // split-sentences=false: one utterance, refused where it is queued: the start fails, naming
    // the text (its start only), the limit and the setting.
    let (h, _) = harness(&[
        ("text", v(text.as_str())),
        ("split-sentences", v("false")),
        ("max-new-tokens", v(3u32)),
    ]);
    let t = Instant::now();
    let errs = start_must_fail(&h.element().unwrap(), "a megabyte as one utterance");
    eprintln!("as one utterance: refused after {:?}", t.elapsed());
    assert_names(
        &errs,
        &[
            "text 'The quick brown fox",
            "too long for one utterance",
            "at most",
            "split-sentences=false",
        ],
    );
    assert!(errs.iter().all(|e| e.len() < 2000), "{errs:?}");
}

/// A text too long for one utterance (its prompt and the `max-new-tokens` frames past the
/// talker's 32,768 positions) is refused where it is queued, with one error that names `text`
/// (its start quoted), the limit and the `split-sentences` setting: the `text` property's fails
/// the state change; a `push-text`'s returns false and its error comes in stream order, after the
/// audio of the text before it, and the stream goes on. (Before, both were accepted and stage 0
/// failed the utterance after its utterance-started message.)
#[test]
fn a_text_too_long_for_one_utterance_is_refused_where_it_is_queued() {
    let _serial = serial();
    // 32,000 frames leave about 760 positions for text: a thousand words do not fit.
    let words = "word ".repeat(1000);
    let (h, bus) = harness(&[
        ("text", v(words.as_str())),
        ("split-sentences", v("false")),
        ("max-new-tokens", v(32_000u32)),
    ]);
    let e = h.element().unwrap();
    let errs = start_must_fail(&e, "a thousand words as one utterance");
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_names(
        &errs,
        &[
            "text 'word word word",
            "…'",
            "too long for one utterance",
            "at most",
            "split-sentences=false the whole text is one utterance",
        ],
    );
    let msgs = drain(&bus);
    assert!(element_messages(&msgs, messages::STARTED).is_empty());

    // push-text while playing: split-sentences=auto splits off the first sentence, and the
    // rest, with no sentence boundary, is still one utterance too long: the whole text is
    // refused, none of it spoken.
    let (mut h, bus) = harness(&[("text", v("First one.")), ("max-new-tokens", v(3u32))]);
    let e = h.element().unwrap();
    let (pad, probe) = play_holding_first_buffer(&mut h);
    e.set_property("max-new-tokens", 32_000u32);
    let long = format!("A short sentence first. Then {words}");
    assert!(!e.emit_by_name::<bool>("push-text", &[&long.as_str()]));
    e.set_property("max-new-tokens", 3u32);
    assert!(e.emit_by_name::<bool>("push-text", &[&"Then 42."]));
    pad.remove_probe(probe);
    let samples = pull_samples(&mut h);
    assert!(!samples.is_empty());
    let msgs = drain(&bus);
    let errs = errors(&msgs);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_names(
        &errs,
        &[
            "refused",
            "text 'Then word word",
            "too long for one utterance",
            "split-sentences=auto this sentence of the text",
        ],
    );
    let started: Vec<String> = element_messages(&msgs, messages::STARTED)
        .iter()
        .map(|s| s.get::<String>("text").unwrap())
        .collect();
    assert_eq!(started, ["First one.", "Then 42."]);
    // The error comes after the first utterance's done message, before the next one starts.
    let error_at = msgs
        .iter()
        .position(|m| matches!(m.view(), gst::MessageView::Error(_)))
        .unwrap();
    let done_at: Vec<usize> = msgs
        .iter()
        .enumerate()
        .filter(|(_, m)| {
            matches!(m.view(), gst::MessageView::Element(el)
                if el.structure().is_some_and(|s| s.name() == messages::DONE))
        })
        .map(|(i, _)| i)
        .collect();
    assert_eq!(done_at.len(), 2, "{msgs:?}");
    assert!(done_at[0] < error_at && error_at < done_at[1], "{msgs:?}");
}

/// ISO 639-1 codes name the model's languages, in any case; an unknown one is refused with the
/// names and their codes.
#[test]
fn language_codes_are_aliases() {
    let _serial = serial();
    for code in ["en", "EN", "zh", "De"] {
        let (samples, texts) = speak(&[
            ("text", v("Hello.")),
            ("language", v(code)),
            ("max-new-tokens", v(3u32)),
        ]);
        assert_eq!(texts.len(), 1, "{code}");
        assert!(!samples.is_empty(), "{code}");
    }
    let (en, _) = speak(&[
        ("text", v("Hello.")),
        ("language", v("en")),
        ("max-new-tokens", v(3u32)),
    ]);
    let (english, _) = speak(&[
        ("text", v("Hello.")),
        ("language", v("English")),
        ("max-new-tokens", v(3u32)),
    ]);
    assert_eq!(en, english);
    let (h, _) = harness(&[("text", v("Hello.")), ("language", v("xx"))]);
    let errs = start_must_fail(&h.element().unwrap(), "language xx");
    assert_names(&errs, &["language", "'xx'", "english (en)", "chinese (zh)"]);
}

/// Text with no letter or digit, which the model would only turn into noise, is refused
/// naming the property and the value, before start and while playing.
#[test]
fn text_without_letters_or_digits_is_refused() {
    let _serial = serial();
    let (h, _) = harness(&[("text", v("?!... ***"))]);
    let errs = start_must_fail(&h.element().unwrap(), "punctuation only");
    assert_names(&errs, &["text", "'?!... ***'", "no letter or digit"]);

    let (mut h, bus) = harness(&[("text", v("First one.")), ("max-new-tokens", v(3u32))]);
    let e = h.element().unwrap();
    let (pad, probe) = play_holding_first_buffer(&mut h);
    assert!(!e.emit_by_name::<bool>("push-text", &[&"😀😀😀😀"]));
    assert!(e.emit_by_name::<bool>("push-text", &[&"Then 42."]));
    pad.remove_probe(probe);
    let _ = pull_samples(&mut h);
    let msgs = drain(&bus);
    assert_names(&errors(&msgs), &["text", "no letter or digit"]);
    let started: Vec<String> = element_messages(&msgs, messages::STARTED)
        .iter()
        .map(|s| s.get::<String>("text").unwrap())
        .collect();
    assert_eq!(started, ["First one.", "Then 42."]);
}

#[test]
fn ssml_is_stripped_and_uncovered_scripts_are_warned_once_per_text() {
    // SSML is not interpreted: its tags are removed (not read out), with a warning naming them.
    let (mut h, bus) = harness(&[
        (
            "text",
            v("<speak>Hello<break time='1s'/>there &amp; bye.</speak>"),
        ),
        ("max-new-tokens", v(4u32)),
    ]);
    h.play();
    pull_samples(&mut h);
    let msgs = drain(&bus);
    assert!(errors(&msgs).is_empty(), "{:?}", errors(&msgs));
    let texts: Vec<String> = element_messages(&msgs, messages::STARTED)
        .iter()
        .map(|s| s.get::<String>("text").unwrap())
        .collect();
    assert_eq!(texts, ["Hello there & bye."]);
    let w = element_util::warnings(&msgs);
    assert_eq!(w.iter().filter(|w| w.contains("SSML")).count(), 1, "{w:?}");
    assert!(w.iter().any(|w| w.contains("<speak>, <break>")), "{w:?}");
    // Markup alone is nothing to speak: refused, naming the text.
    assert_names(
        &element_util::start_error(
            &reference_util::fixture_model("tiny-customvoice"),
            &[("text", v("<speak><break time='1s'/></speak>"))],
        ),
        &["text"],
    );

    // Letters of a script none of the checkpoint's languages is written in (Arabic; the tiny
    // fixture lists the ten released languages): one warning per text, naming the script.
    let (mut h, bus) = harness(&[
        ("text", v("مرحبا بالعالم. مرحبا مرة أخرى.")),
        ("split-sentences", v("true")),
        ("max-new-tokens", v(4u32)),
    ]);
    h.play();
    pull_samples(&mut h);
    let msgs = drain(&bus);
    assert_eq!(element_messages(&msgs, messages::STARTED).len(), 2);
    let w = element_util::warnings(&msgs);
    let arabic: Vec<_> = w.iter().filter(|w| w.contains("Arabic")).collect();
    assert_eq!(arabic.len(), 1, "{w:?}");
    // English and Chinese are covered by the fixture: no warning.
    let (mut h, bus) = harness(&[("text", v("Hello, 你好.")), ("max-new-tokens", v(4u32))]);
    h.play();
    pull_samples(&mut h);
    let w = element_util::warnings(&drain(&bus));
    assert!(!w.iter().any(|w| w.contains("script")), "{w:?}");
}
