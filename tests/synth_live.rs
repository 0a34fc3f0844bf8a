//! `omnittssynth` live: `appsrc is-live=true` pushing timestamped text → omnittssynth →
//! `fakesink sync=true`. The LATENCY answer (upstream + `latency`), every cue's audio on time at
//! its sample, and cues made late on purpose handled by the overflow policy with a warning and a
//! count in the cue message.

mod element_util;
mod reference_util;

use element_util::{element_messages, init, serial, warnings};
use gst::prelude::*;
use gstomnitts::omnittssynth::cue_message::CUE;
use reference_util::fixture_model;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const RATE: u64 = 24_000;
/// appsrc's min-latency and the element's `latency`.
const UPSTREAM_MS: u64 = 100;
const LATENCY_MS: u64 = 1500;

/// One buffer as fakesink rendered it.
#[derive(Debug, Clone)]
struct Seen {
    pts: gst::ClockTime,
    offset: u64,
    samples: u64,
    gap: bool,
    /// Running time when fakesink rendered it.
    rendered: Option<gst::ClockTime>,
}

struct Live {
    pipeline: gst::Pipeline,
    src: gst::Element,
    synth: gst::Element,
    seen: Arc<Mutex<Vec<Seen>>>,
    msgs: Vec<gst::Message>,
}

impl Live {
    fn new(props: &str) -> Live {
        Live::with(
            &format!("min-latency={}", UPSTREAM_MS * 1_000_000),
            &format!("latency={LATENCY_MS} {props}"),
            "",
        )
    }

    /// `appsrc is-live=true <src_props> ! omnittssynth <props> ! <between> fakesink sync=true`.
    fn with(src_props: &str, props: &str, between: &str) -> Live {
        init();
        let pipeline = gst::parse::launch(&format!(
            "appsrc name=src is-live=true format=time {src_props} \
             caps=text/x-raw,format=utf8 ! omnittssynth name=synth model=\"{}\" do-sample=false \
             max-new-tokens=6 {props} ! {between} \
             fakesink name=sink sync=true signal-handoffs=true",
            fixture_model("tiny-customvoice")
        ))
        .expect("pipeline")
        .downcast::<gst::Pipeline>()
        .unwrap();
        let src = pipeline.by_name("src").unwrap();
        let synth = pipeline.by_name("synth").unwrap();
        let sink = pipeline.by_name("sink").unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let p = pipeline.downgrade();
        sink.connect("handoff", false, move |args| {
            let b = args[1].get::<gst::Buffer>().ok()?;
            let rendered = p.upgrade().and_then(|p| p.current_running_time());
            s.lock().unwrap().push(Seen {
                pts: b.pts().unwrap(),
                offset: b.offset(),
                samples: b.size() as u64 / 4,
                gap: b.flags().contains(gst::BufferFlags::GAP),
                rendered,
            });
            None
        });
        pipeline.set_state(gst::State::Playing).expect("PLAYING");
        // The sink completes PLAYING with its first buffer; the clock runs from now.
        let t0 = Instant::now();
        while pipeline.current_running_time().is_none() {
            assert!(t0.elapsed() < Duration::from_secs(30), "no running time");
            std::thread::sleep(Duration::from_millis(10));
        }
        Live {
            pipeline,
            src,
            synth,
            seen,
            msgs: Vec::new(),
        }
    }

    fn now(&self) -> gst::ClockTime {
        self.pipeline.current_running_time().expect("running")
    }

    fn push(&self, text: &str, pts: gst::ClockTime, duration: gst::ClockTime) {
        let mut b = gst::Buffer::from_slice(text.as_bytes().to_vec());
        {
            let b = b.get_mut().unwrap();
            b.set_pts(pts);
            b.set_duration(duration);
        }
        let ret = self
            .src
            .emit_by_name::<gst::FlowReturn>("push-buffer", &[&b]);
        assert_eq!(ret, gst::FlowReturn::Ok);
    }

    /// Waits until `cues` cue messages have been posted.
    fn wait_cues(&mut self, cues: usize) {
        let bus = self.pipeline.bus().unwrap();
        let t0 = Instant::now();
        while element_messages(&self.msgs, CUE).len() < cues {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "cue messages missing"
            );
            if let Some(m) = bus.timed_pop(gst::ClockTime::from_mseconds(50)) {
                if let gst::MessageView::Error(e) = m.view() {
                    panic!("{} ({:?})", e.error(), e.debug());
                }
                self.msgs.push(m);
            }
        }
    }

    /// Ends the stream and waits for EOS; returns the cue messages.
    fn finish(&mut self, cues: usize) -> Vec<gst::Structure> {
        self.wait_cues(cues);
        let bus = self.pipeline.bus().unwrap();
        let ret = self
            .src
            .emit_by_name::<gst::FlowReturn>("end-of-stream", &[]);
        assert_eq!(ret, gst::FlowReturn::Ok);
        loop {
            let m = bus
                .timed_pop(gst::ClockTime::from_seconds(30))
                .expect("no EOS");
            match m.view() {
                gst::MessageView::Eos(_) => break,
                gst::MessageView::Error(e) => panic!("{} ({:?})", e.error(), e.debug()),
                _ => self.msgs.push(m),
            }
        }
        element_messages(&self.msgs, CUE)
    }

    /// Buffers tile the timeline: contiguous offsets from 0, PTS from the sample count.
    fn check_tiling(&self) -> Vec<Seen> {
        let seen = self.seen.lock().unwrap().clone();
        let mut n = 0;
        for b in &seen {
            assert_eq!(b.offset, n, "contiguous offsets");
            assert_eq!(b.pts.nseconds(), n * 1_000_000_000 / RATE);
            n += b.samples;
        }
        seen
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        let _ = self.pipeline.set_state(gst::State::Null);
    }
}

fn ns(s: &gst::Structure, f: &str) -> u64 {
    s.get::<u64>(f)
        .unwrap_or_else(|e| panic!("{f} in {s}: {e}"))
}

#[test]
fn latency_answer_and_every_cue_on_time() {
    let _serial = serial();
    let mut live = Live::new("overflow=clip");
    let base = live.now() + gst::ClockTime::from_mseconds(300);
    let cues: Vec<gst::ClockTime> = (0..3)
        .map(|i| base + gst::ClockTime::from_mseconds(1_000 * i))
        .collect();
    for (i, pts) in cues.iter().enumerate() {
        live.push(
            &format!("Cue number {}.", i + 1),
            *pts,
            gst::ClockTime::from_mseconds(800),
        );
    }
    // The element adds its latency to the upstream latency.
    let mut q = gst::query::Latency::new();
    assert!(live.synth.static_pad("src").unwrap().query(&mut q));
    let (is_live, min, _) = q.result();
    assert!(is_live);
    assert_eq!(min, gst::ClockTime::from_mseconds(UPSTREAM_MS + LATENCY_MS));
    // Once the sink has its first buffer, the pipeline's latency adds the sink's deadline.
    live.wait_cues(1);
    let mut q = gst::query::Latency::new();
    assert!(live.pipeline.query(&mut q));
    let sink_deadline = live
        .pipeline
        .by_name("sink")
        .unwrap()
        .property::<u64>("processing-deadline");
    assert_eq!(
        q.result().1.nseconds(),
        (UPSTREAM_MS + LATENCY_MS) * 1_000_000 + sink_deadline
    );

    let reports = live.finish(3);
    let seen = live.check_tiling();
    for (r, pts) in reports.iter().zip(&cues) {
        assert_eq!(r.get::<u32>("late").unwrap(), 0, "on time: {r}");
        // Exactly at its sample: the first at or after its PTS (PTS → sample, rounded up, → PTS).
        let n = (pts.nseconds() * RATE).div_ceil(1_000_000_000);
        assert_eq!(ns(r, "start"), n * 1_000_000_000 / RATE, "{r}");
        assert!(ns(r, "output-duration") > 0);
        // fakesink rendered the cue's first buffer when due: running time + pipeline latency.
        let first = seen
            .iter()
            .find(|b| b.offset == n)
            .expect("a buffer at the cue's sample");
        assert!(!first.gap);
        let due = first.pts + q.result().1;
        let rendered = first.rendered.expect("rendered");
        assert!(
            rendered < due + gst::ClockTime::from_mseconds(250),
            "cue rendered at {rendered}, due {due}"
        );
    }
    // No warning but max-new-tokens' (random weights rarely end their speech themselves).
    let w: Vec<String> = warnings(&live.msgs)
        .into_iter()
        .filter(|w| !w.contains("ended by length: max-new-tokens was reached"))
        .collect();
    assert!(w.is_empty(), "{w:?}");
}

#[test]
fn late_cues_are_handled_by_the_policy_with_a_warning_and_a_count() {
    let _serial = serial();
    // shift: the late cue is spoken whole, from where the output is when its audio comes.
    let mut live = Live::new("overflow=shift");
    let first = live.now() + gst::ClockTime::from_mseconds(200);
    live.push("On time.", first, gst::ClockTime::from_mseconds(800));
    std::thread::sleep(Duration::from_millis(3_500));
    // Stamped 3 s in the past: its deadline (PTS + 1.6 s) has passed when it arrives.
    let late_pts = live.now() - gst::ClockTime::from_seconds(3);
    live.push("Too late.", late_pts, gst::ClockTime::from_mseconds(800));
    let reports = live.finish(2);
    live.check_tiling();
    assert_eq!(reports[0].get::<u32>("late").unwrap(), 0, "{}", reports[0]);
    let r = &reports[1];
    assert!(r.get::<u32>("late").unwrap() >= 1, "{r}");
    assert!(r.get::<f64>("late-ms").unwrap() > 0.0 || ns(r, "start") > late_pts.nseconds());
    assert!(ns(r, "start") > late_pts.nseconds() + 1_000_000_000, "{r}");
    assert_eq!(
        ns(r, "output-duration"),
        ns(r, "speech-duration"),
        "shift: spoken whole"
    );
    let w = warnings(&live.msgs);
    assert!(
        w.iter()
            .any(|w| w.contains("cue 2") && w.contains("deadline") && w.contains("shift")),
        "{w:?}"
    );
    drop(live);

    // clip: a late cue whose slot is over before its audio can start is cut to nothing.
    let mut live = Live::new("overflow=clip");
    live.push("On time.", live.now(), gst::ClockTime::from_mseconds(800));
    live.wait_cues(1);
    std::thread::sleep(Duration::from_millis(4_500));
    // The output runs a pipeline latency (1.6 s) behind the clock: 4 s ago is past its slot.
    let late_pts = live.now() - gst::ClockTime::from_seconds(4);
    live.push(
        "Far too late.",
        late_pts,
        gst::ClockTime::from_mseconds(500),
    );
    let reports = live.finish(2);
    live.check_tiling();
    let r = &reports[1];
    assert_eq!(r.get::<String>("action").unwrap(), "clipped", "{r}");
    assert_eq!(ns(r, "output-duration"), 0, "{r}");
    assert_eq!(r.get::<u32>("late").unwrap(), 1, "{r}");
    assert!(r.get::<f64>("late-ms").unwrap() > 1_000.0, "{r}");
    let w = warnings(&live.msgs);
    assert!(
        w.iter().any(|w| w.contains("cue 2") && w.contains("clip")),
        "{w:?}"
    );
}

#[test]
fn the_readme_caption_pipeline_runs_without_latency_warnings() {
    let _serial = serial();
    // The README's live caption pipeline (fakesink for the speakers), and one whose source
    // states its latency as a fixed window (min = max), as live sources often do.
    for (src_props, between) in [
        ("", "audioconvert ! audioresample !"),
        ("min-latency=100000000 max-latency=100000000", ""),
    ] {
        let mut live = Live::with(src_props, "latency=800 overflow=overlap", between);
        let at = live.now() + gst::ClockTime::from_mseconds(100);
        live.push("Good evening.", at, gst::ClockTime::from_seconds(1));
        live.push(
            "Here is the news.",
            at + gst::ClockTime::from_mseconds(1_200),
            gst::ClockTime::from_seconds(1),
        );
        let reports = live.finish(2);
        for r in &reports {
            assert_eq!(
                r.get::<u32>("late").unwrap(),
                0,
                "{src_props}: on time: {r}"
            );
        }
        // The element's answer leaves the sink its processing deadline: the most it can buffer
        // (max) is well above what it needs (min).
        let mut q = gst::query::Latency::new();
        assert!(live.synth.static_pad("src").unwrap().query(&mut q));
        let (is_live, min, max) = q.result();
        assert!(is_live);
        assert!(
            max.is_none_or(|max| max >= min + gst::ClockTime::from_seconds(1)),
            "{src_props}: min {min}, max {max:?}"
        );
        // No warning but max-new-tokens' (the tiny checkpoint's random weights rarely end
        // their speech themselves).
        let w: Vec<String> = warnings(&live.msgs)
            .into_iter()
            .filter(|w| !w.contains("ended by length: max-new-tokens was reached"))
            .collect();
        assert!(w.is_empty(), "{src_props}: {w:?}");
    }
}
