//! Sixteen omnittssrc elements in one process on one checkpoint share one engine: one model load,
//! every element's audio equal to its solo run (an engine of its own, `shared-engine=false`), and
//! peak resident memory below 1.75× that of one element. Memory is measured in child processes
//! (this test binary run again for the `scenario` test), so each figure starts from a fresh heap.

mod element_util;
mod reference_util;

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use element_util::*;
use gst::prelude::*;
use gstomnitts::engine::Engine;

/// The bundled voice: a model big enough (46 MB) for its memory to matter against per-element
/// overheads.
fn voice_dir() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("models/omnitts-en")
        .display()
        .to_string()
}

const TEXTS: [&str; 16] = [
    "The rain stopped at last.",
    "Bring two cups to the table.",
    "We walked to the station.",
    "She read the letter twice.",
    "The boats came home slowly.",
    "Turn left at the old mill.",
    "He painted the fence blue.",
    "The fire burned low tonight.",
    "A small bird sang outside.",
    "The train was late again.",
    "Close the window, please.",
    "The garden looked green.",
    "They laughed at the joke.",
    "Her coat was on the chair.",
    "The river ran past the town.",
    "It was a fine morning.",
];

/// An omnittssrc pipeline speaking `text` into a fakesink whose buffers are collected as f32.
fn pipeline(text: &str, shared: bool) -> (gst::Pipeline, Arc<Mutex<Vec<f32>>>) {
    let p = gst::Pipeline::new();
    let src = gst::ElementFactory::make("omnittssrc")
        .property("model", voice_dir())
        .property("text", text)
        .property("max-new-tokens", 40u32)
        .property("shared-engine", shared)
        // Dense weights: on CPUs with int8 dot-product instructions `auto` stores the talker's
        // o_proj as q8_0, whose kernel rounds a batch of rows differently from one row, and a
        // greedy near-tie of this voice then goes another way in the shared run (README,
        // "Many streams, one model"); with dense weights a batched row equals its solo run.
        .property_from_str("quantization", "none")
        .build()
        .expect("omnittssrc");
    let sink = gst::ElementFactory::make("fakesink")
        .property("signal-handoffs", true)
        .property("sync", false)
        .build()
        .expect("fakesink");
    let audio = Arc::new(Mutex::new(Vec::new()));
    let a = audio.clone();
    sink.connect("handoff", false, move |args| {
        let buf = args[1].get::<gst::Buffer>().expect("buffer");
        let map = buf.map_readable().expect("readable");
        let mut a = a.lock().unwrap_or_else(|p| p.into_inner());
        a.extend(
            map.chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        );
        None
    });
    let caps = gst::Caps::builder("audio/x-raw")
        .field("format", "F32LE")
        .build();
    p.add_many([&src, &sink]).expect("add");
    src.link_filtered(&sink, &caps).expect("link");
    (p, audio)
}

/// Plays all `pipelines` at once to EOS; returns each one's model-ready info texts.
fn play_all(pipelines: &[gst::Pipeline]) -> Vec<String> {
    for p in pipelines {
        p.set_state(gst::State::Playing).expect("PLAYING");
    }
    let mut ready = Vec::new();
    for p in pipelines {
        let bus = p.bus().expect("bus");
        loop {
            let msg = bus
                .timed_pop(gst::ClockTime::from_seconds(120))
                .expect("pipeline stalled");
            match msg.view() {
                gst::MessageView::Eos(_) => break,
                gst::MessageView::Error(e) => panic!("{} {:?}", e.error(), e.debug()),
                gst::MessageView::Info(i) => ready.push(i.error().to_string()),
                _ => {}
            }
        }
    }
    ready
}

fn stop_all(pipelines: &[gst::Pipeline]) {
    for p in pipelines {
        p.set_state(gst::State::Null).expect("NULL");
    }
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

#[test]
fn sixteen_elements_share_one_engine_and_equal_their_solo_runs() {
    init();
    let before = Engine::loads_in_process();
    let (pipes, audios): (Vec<_>, Vec<_>) = TEXTS.iter().map(|t| pipeline(t, true)).unzip();
    let ready = play_all(&pipes);
    assert_eq!(
        Engine::loads_in_process() - before,
        1,
        "one model load for 16 elements"
    );
    let loaded = ready.iter().filter(|m| m.contains("engine loaded")).count();
    let joined = ready
        .iter()
        .filter(|m| m.contains("joined the loaded engine"))
        .count();
    assert_eq!(
        (loaded, joined),
        (1, 15),
        "model-ready messages: {ready:#?}"
    );
    stop_all(&pipes);
    for (i, text) in TEXTS.iter().enumerate() {
        let (solo, solo_audio) = pipeline(text, false);
        let ready = play_all(std::slice::from_ref(&solo));
        assert!(
            ready.iter().any(|m| m.contains("engine of its own")),
            "{ready:?}"
        );
        stop_all(std::slice::from_ref(&solo));
        let shared = audios[i].lock().unwrap_or_else(|p| p.into_inner());
        let alone = solo_audio.lock().unwrap_or_else(|p| p.into_inner());
        assert!(!alone.is_empty(), "element {i}: no audio");
        assert_eq!(shared.len(), alone.len(), "element {i}: samples");
        let e = rel_l2(&shared, &alone);
        assert!(e <= 1e-5, "element {i}: rel L2 {e:e}");
    }
}

/// Peak resident memory (VmHWM) of a child process running `n` elements, less its baseline.
fn child_peak_kib(n: usize) -> usize {
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "scenario",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("OMNITTS_SCENARIO_ELEMENTS", n.to_string())
        // glibc gives each of the 16 elements' threads a malloc arena of its own, whose unused
        // slack would be counted as ours and varies from run to run; two arenas measure the
        // memory the elements use.
        .env("MALLOC_ARENA_MAX", "2")
        .output()
        .expect("run the scenario");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "scenario {n} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .find_map(|l| l.split("PEAK_DELTA_KIB ").nth(1))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("scenario {n} printed no figure:\n{stdout}"))
}

#[test]
fn sixteen_shared_elements_take_less_than_1_75x_the_memory_of_one() {
    // The least of three runs each: the peak moves with how many streams decode in the same
    // batched Code2Wav pass (the 16 start together, their prefills share a step), which the
    // decoder bounds by its frames per pass (`DEFAULT_MAX_BATCH_FRAMES`), not by the stream count.
    let least = |n: usize| {
        (0..3)
            .map(|_| child_peak_kib(n))
            .min()
            .unwrap_or(usize::MAX)
    };
    // The bound is 1.75×: with the shipped ramped chunks (1, 1, 2, 4, … frames) one element's peak
    // is lower than with 25-frame chunks (about 123,000 against 147,000 KiB over the baseline), while
    // sixteen peak at about 179,000-212,000 KiB either way; a model loaded per element would be 16×.
    let one = least(1);
    let sixteen = least(16);
    assert!(
        (sixteen as f64) < 1.75 * one as f64,
        "16 shared elements: {sixteen} KiB over the baseline, one element: {one} KiB"
    );
}

/// Entry point of [`child_peak_kib`]: plays `OMNITTS_SCENARIO_ELEMENTS` elements at once.
#[test]
#[ignore = "run by sixteen_shared_elements_take_less_than_1_75x_the_memory_of_one in a child process"]
fn scenario() {
    let n: usize = std::env::var("OMNITTS_SCENARIO_ELEMENTS")
        .expect("OMNITTS_SCENARIO_ELEMENTS")
        .parse()
        .expect("a count");
    init();
    let base = peak_kib();
    let pipes: Vec<_> = TEXTS
        .iter()
        .cycle()
        .take(n)
        .map(|t| pipeline(t, true).0)
        .collect();
    play_all(&pipes);
    let peak = peak_kib();
    stop_all(&pipes);
    println!("PEAK_DELTA_KIB {}", peak.saturating_sub(base));
}

fn peak_kib() -> usize {
    let s = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmHWM in /proc/self/status")
}
