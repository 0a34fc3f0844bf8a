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
    pad.remove_probe(probe);
    pull_samples(&mut h);
    let d = dones(&bus);
    let ids: Vec<u64> = d.iter().map(|s| s.get::<u64>("id").unwrap()).collect();
    assert_eq!(ids, [1, 2, 3]);
    let texts: Vec<String> = d.iter().map(|s| s.get::<String>("text").unwrap()).collect();
    assert_eq!(texts[2], "After it.");
    let reason = d[1].get::<String>("reason").unwrap();
    assert!(reason == "eos" || reason == "length", "{reason}");
    assert_eq!(
        d[1].get::<u64>("samples").unwrap(),
        want,
        "as the whole text"
    );
}

/// An EOS event ends the open text (`end-text` finds nothing open after it).
#[test]
fn eos_ends_the_open_text() {
    let (mut h, _bus) = harness(&[
        ("is-live", v(true)),
        ("speaker", v("vivian")),
        ("max-new-tokens", v(40u32)),
    ]);
    h.play();
    let e = h.element().expect("element");
    assert!(e.emit_by_name::<bool>("append-text", &[&"Spoken until the end of the st"]));
    assert!(e.emit_by_name::<bool>("append-text", &[&"ream"]));
    let _ = h.pull().expect("a buffer");
    e.send_event(gst::event::Eos::new());
    assert!(
        !e.emit_by_name::<bool>("end-text", &[]),
        "EOS ended the open text"
    );
}

#[test]
fn append_text_refusals_name_the_property() {
    let (mut h, bus) = harness(&[
        ("text", v("First.")),
        ("speaker", v("vivian")),
        ("prompt-mode", v("non-streaming")),
    ]);
    let (pad, probe) = play_holding_first_buffer(&mut h);
    let e = h.element().expect("element");
    assert!(!e.emit_by_name::<bool>("append-text", &[&"Never spoken."]));
    pad.remove_probe(probe);
    pull_samples(&mut h);
    let msgs = drain(&bus);
    let errs = errors(&msgs);
    assert_names(&errs, &["prompt-mode", "non-streaming", "append-text"]);
}
