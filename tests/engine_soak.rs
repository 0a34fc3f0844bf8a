//! 1000 short requests through one engine leave no threads behind and do not grow memory.
//! Alone in its own test binary so that /proc/self/task counts only this test's threads.

mod engine_common;
mod reference_util;

use engine_common::*;
use gstomnitts::engine::FinishReason;

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .count()
}

/// Resident set size, kB (`VmRSS` in /proc/self/status).
fn rss_kb() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS line")
}

#[test]
fn thousand_short_requests_leave_no_threads_and_no_memory_growth() {
    let before_load = threads();
    let e = load(
        "tiny-customvoice",
        config(|c| c.decoder.codec_chunk_frames = 2),
    );
    let with_engine = threads();
    assert_eq!(with_engine, before_load + 2, "one thread per stage");

    let texts = ["Hello world.", "Short one.", "A test, again."];
    let mut req = greedy(&e, voice(texts[0], Some("vivian")), 4);
    let mut one = |i: usize| {
        req.voice.text = texts[i % texts.len()].to_string();
        let r = run(&e, req.clone());
        assert_eq!(r.reason, FinishReason::Length);
        assert_eq!(r.audio.len(), 3 * e.samples_per_frame());
    };
    // Warm-up: allocator pools, lazily initialised kernels.
    for i in 0..30 {
        one(i);
    }
    // The compute library may have started its worker pool during the warm-up (once per
    // process); from here on the count must not move.
    let warm = threads();
    assert!(warm >= with_engine);
    let rss0 = rss_kb();
    for i in 0..1000 {
        one(i);
        if i % 100 == 99 {
            assert_eq!(threads(), warm, "threads after {} requests", i + 1);
        }
    }
    // Cancelled requests release their resources too.
    for i in 0..20 {
        let h = e
            .submit(greedy(&e, voice(texts[i % 3], Some("vivian")), 1000))
            .unwrap();
        if i % 2 == 0 {
            let _ = h.recv();
        }
        h.cancel();
        let (_, reason, _) = h.collect().unwrap();
        assert!(
            matches!(reason, FinishReason::Cancelled | FinishReason::Length),
            "{reason}"
        );
    }
    let rss1 = rss_kb();
    let growth_kb = rss1.saturating_sub(rss0);
    eprintln!("RSS {rss0} kB → {rss1} kB (+{growth_kb} kB) over 1020 requests");
    assert!(
        growth_kb < 8 * 1024,
        "RSS grew by {growth_kb} kB over 1020 requests"
    );
    assert_eq!(threads(), warm);
    drop(e);
    assert_eq!(threads(), warm - 2, "both stage threads joined on drop");
}
