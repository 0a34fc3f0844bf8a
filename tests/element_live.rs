//! `omnittssrc is-live=true`: latency, clock pacing, GAP silence between utterances, text spoken
//! at the running time it arrives, application EOS, and Opus over RTP on loopback.

mod element_util;
mod reference_util;

use element_util::{drain, element_messages, errors, init, serial, wait_element_message, warnings};
use gst::prelude::*;
use gst_check::Harness;
use gstomnitts::element_common::messages;
use reference_util::fixture_model;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const SPF: u64 = 1920;

/// The latency is the first chunk's (or a buffer's, when longer); one above a second is said in
/// a warning naming the property that made it.
#[test]
fn latency_is_the_first_chunk() {
    init();
    for (initial, spb, want_ms) in [
        (3u32, 480u32, 240u64),
        (1, 480, 80),
        (1, 24000, 1000),
        (13, 480, 1040),
        (1, 36000, 1500),
    ] {
        let mut h = Harness::new("omnittssrc");
        let e = h.element().unwrap();
        let bus = gst::Bus::new();
        e.set_bus(Some(&bus));
        e.set_property("model", fixture_model("tiny-customvoice"));
        e.set_property("is-live", true);
        e.set_property("initial-chunk-frames", initial);
        e.set_property("samples-per-buffer", spb);
        h.use_systemclock();
        h.play();
        let q = h.query_latency().expect("latency answered");
        assert_eq!(
            q,
            gst::ClockTime::from_mseconds(want_ms),
            "initial-chunk-frames={initial} samples-per-buffer={spb}"
        );
        let mut query = gst::query::Latency::new();
        assert!(e.static_pad("src").unwrap().query(&mut query));
        let (live, min, max) = query.result();
        assert!(live);
        assert_eq!(min, gst::ClockTime::from_mseconds(want_ms));
        assert_eq!(max, None);
        let warned = warnings(&drain(&bus))
            .into_iter()
            .filter(|w| w.contains("live latency"))
            .collect::<Vec<_>>();
        if want_ms <= 1000 {
            assert!(warned.is_empty(), "{want_ms} ms: {warned:?}");
        } else {
            assert_eq!(warned.len(), 1, "{want_ms} ms: {warned:?}");
            let property = if initial > 1 {
                format!("initial-chunk-frames={initial}")
            } else {
                format!("samples-per-buffer={spb}")
            };
            assert!(
                warned[0].contains(&format!("live latency {want_ms} ms"))
                    && warned[0].contains(&property),
                "{}",
                warned[0]
            );
        }
    }
}

/// Before its model is loaded a live element cannot tell its latency: the query fails (as a live
/// source whose device is not open does) rather than answering BaseSrc's live latency of 0, which
/// a mixer would take and then have to change once the element starts.
#[test]
fn a_live_latency_is_not_told_before_the_model_is_loaded() {
    init();
    let e = gst::ElementFactory::make("omnittssrc")
        .property("model", fixture_model("tiny-customvoice"))
        .property("is-live", true)
        .build()
        .unwrap();
    let pad = e.static_pad("src").unwrap();
    for state in [gst::State::Null, gst::State::Ready] {
        e.set_state(state).unwrap();
        let mut query = gst::query::Latency::new();
        assert!(
            !pad.query(&mut query),
            "{state:?}: answered {:?}",
            query.result()
        );
    }
    e.set_state(gst::State::Paused).unwrap();
    let mut query = gst::query::Latency::new();
    assert!(pad.query(&mut query), "answered once loaded");
    assert_eq!(
        query.result(),
        (true, gst::ClockTime::from_mseconds(80), None)
    );
    e.set_state(gst::State::Null).unwrap();
}

/// The bundled voice (its load takes long enough for a mixer to ask for latency first).
fn bundled_voice() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/omnitts-en")
}

/// Two live elements into `audiomixer`: the mixer learns the elements' latency before its first
/// output, so its timeline starts once and runs on without a buffer that goes back in time (with
/// BaseSrc's answer before the load, the mixer timed out after 10 ms with a GAP at 0, then
/// started again at 0 with the latency it learnt later).
#[test]
fn a_mixer_of_live_elements_starts_its_timeline_once() {
    init();
    let _serial = serial();
    let pipeline = gst::parse::launch(&format!(
        "audiomixer name=mix ! fakesink name=sink sync=true signal-handoffs=true \
         omnittssrc is-live=true model=\"{m}\" text=\"The first voice speaks here.\" ! mix. \
         omnittssrc is-live=true model=\"{m}\" text=\"A second voice.\" ! mix.",
        m = bundled_voice().display()
    ))
    .unwrap()
    .downcast::<gst::Pipeline>()
    .unwrap();
    let spans = Arc::new(Mutex::new(Vec::new()));
    let s2 = spans.clone();
    pipeline
        .by_name("sink")
        .unwrap()
        .connect("handoff", false, move |args| {
            let buf = args[1].get::<gst::Buffer>().unwrap();
            s2.lock().unwrap().push((buf.pts(), buf.duration()));
            None
        });
    pipeline.set_state(gst::State::Playing).unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    while spans.lock().unwrap().len() < 30 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    pipeline.set_state(gst::State::Null).unwrap();
    let spans = spans.lock().unwrap().clone();
    assert!(spans.len() >= 30, "only {} buffers in 20 s", spans.len());
    for (i, w) in spans.windows(2).enumerate() {
        let (Some(pts), Some(duration)) = w[0] else {
            panic!("buffer {i} without PTS or duration: {:?}", w[0]);
        };
        assert_eq!(
            Some(pts + duration),
            w[1].0,
            "buffer {} does not follow buffer {i}: {:?}",
            i + 1,
            &spans[..(i + 3).min(spans.len())]
        );
    }
}

#[derive(Debug, Clone)]
struct Seen {
    pts: gst::ClockTime,
    duration: gst::ClockTime,
    offset: u64,
    samples: u64,
    gap: bool,
    discont: bool,
    zero: bool,
}

/// A live pipeline into `fakesink sync=true`, recording every buffer.
fn live_pipeline(extra: &str) -> (gst::Pipeline, gst::Element, Arc<Mutex<Vec<Seen>>>) {
    init();
    let pipeline = gst::parse::launch(&format!(
        "omnittssrc name=src is-live=true model=\"{}\" do-sample=false {extra} ! \
         fakesink name=sink sync=true signal-handoffs=true",
        fixture_model("tiny-customvoice")
    ))
    .unwrap()
    .downcast::<gst::Pipeline>()
    .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let sink = pipeline.by_name("sink").unwrap();
    sink.connect("handoff", false, move |args| {
        let buf = args[1].get::<gst::Buffer>().unwrap();
        let m = buf.map_readable().unwrap();
        let zero = m.as_slice().iter().all(|b| *b == 0);
        s2.lock().unwrap().push(Seen {
            pts: buf.pts().unwrap(),
            duration: buf.duration().unwrap(),
            offset: buf.offset(),
            samples: (buf.size() / 4) as u64,
            gap: buf.flags().contains(gst::BufferFlags::GAP),
            discont: buf.flags().contains(gst::BufferFlags::DISCONT),
            zero,
        });
        None
    });
    let src = pipeline.by_name("src").unwrap();
    (pipeline, src, seen)
}

fn running_time(p: &gst::Pipeline) -> gst::ClockTime {
    p.current_running_time().expect("running time")
}

/// Sets `p` PLAYING and returns once its running time has reached `t`.
fn play_for(p: &gst::Pipeline, t: gst::ClockTime) {
    p.set_state(gst::State::Playing).unwrap();
    let t0 = Instant::now();
    while running_time(p) < t {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the pipeline does not play"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Silence until text arrives, speech starting at its arrival running time, silence after.
#[test]
fn gap_silence_then_text_at_its_running_time() {
    let _g = serial();
    let (pipeline, src, seen) = live_pipeline("max-new-tokens=30 initial-chunk-frames=2");
    let bus = pipeline.bus().unwrap();
    assert_eq!(
        pipeline.set_state(gst::State::Paused).unwrap(),
        gst::StateChangeSuccess::NoPreroll,
        "a live source does not preroll"
    );
    pipeline.set_state(gst::State::Playing).unwrap();
    std::thread::sleep(Duration::from_millis(700));
    let t_push = running_time(&pipeline);
    assert!(src.emit_by_name::<bool>("push-text", &[&"Now speak."]));
    let mut msgs = Vec::new();
    let done = wait_element_message(&bus, messages::DONE, Duration::from_secs(30), &mut msgs)
        .expect("done message");
    std::thread::sleep(Duration::from_millis(400));
    pipeline.set_state(gst::State::Null).unwrap();
    while let Some(m) = bus.pop() {
        msgs.push(m);
    }
    assert!(errors(&msgs).is_empty(), "{:?}", errors(&msgs));
    let seen = seen.lock().unwrap().clone();

    // Contiguous sample timeline; PTS advance exactly with the samples.
    let base = seen[0].pts;
    let mut n = 0;
    for (i, b) in seen.iter().enumerate() {
        assert_eq!(b.offset, n, "buffer {i}: offset");
        assert_eq!(b.pts, base + element_util::pts_of(n), "buffer {i}: pts");
        assert_eq!(
            b.duration,
            element_util::pts_of(n + b.samples) - element_util::pts_of(n)
        );
        assert_eq!(b.discont, i == 0, "buffer {i}: DISCONT");
        // GAP buffers carry zeros; speech buffers are not GAP.
        if b.gap {
            assert!(b.zero, "buffer {i}: GAP with non-zero samples");
        }
        n += b.samples;
    }
    let first_speech = seen.iter().position(|b| !b.gap).expect("speech buffers");
    let last_speech = seen.iter().rposition(|b| !b.gap).unwrap();
    assert!(first_speech > 0, "no silence before the text arrived");
    assert!(seen[..first_speech].iter().all(|b| b.gap));
    assert!(
        seen[last_speech + 1..].iter().any(|b| b.gap),
        "no silence after the utterance"
    );
    let speech: u64 = seen.iter().filter(|b| !b.gap).map(|b| b.samples).sum();
    assert_eq!(speech, done.get::<u64>("frames").unwrap() * SPF);
    // Live chunks as small as the first keep pace: the speech is one contiguous run.
    assert_eq!(done.get::<u32>("underruns").unwrap(), 0);
    assert!(
        seen[first_speech..=last_speech].iter().all(|b| !b.gap),
        "silence inside the utterance"
    );

    // Spoken at the running time the text arrived (plus at most the engine's lateness).
    let start = seen[first_speech].pts;
    let started = element_messages(&msgs, messages::STARTED);
    assert_eq!(started.len(), 1);
    let early = gst::ClockTime::from_mseconds(25);
    assert!(
        start + early >= t_push,
        "speech at {start} before the text arrived at {t_push}"
    );
    assert!(
        start <= t_push + gst::ClockTime::from_mseconds(1500),
        "speech at {start}, text arrived at {t_push}"
    );
}

/// Real-time pacing: N seconds of wall time give about N seconds of stream.
#[test]
fn paced_by_the_clock() {
    let _g = serial();
    let (pipeline, _src, seen) =
        live_pipeline("text=\"Pacing.\" max-new-tokens=5 initial-chunk-frames=2");
    pipeline.set_state(gst::State::Playing).unwrap();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_millis(1500));
    let wall = t0.elapsed();
    pipeline.set_state(gst::State::Null).unwrap();
    let seen = seen.lock().unwrap();
    let samples: u64 = seen.iter().map(|b| b.samples).sum();
    let stream = Duration::from_nanos(element_util::pts_of(samples).nseconds());
    assert!(
        // Never ahead of the clock (plus one buffer); behind by the latency (80 ms) and the start-up
        // of the streaming thread, generously bounded for a loaded CI machine.
        stream <= wall + Duration::from_millis(100) && stream + Duration::from_millis(700) >= wall,
        "stream {stream:?} vs wall {wall:?}"
    );
}

#[test]
fn application_eos_ends_a_live_stream() {
    let _g = serial();
    let (pipeline, _src, _seen) = live_pipeline("text=\"Bye.\"");
    let bus = pipeline.bus().unwrap();
    pipeline.set_state(gst::State::Playing).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(pipeline.send_event(gst::event::Eos::new()));
    let msg = bus
        .timed_pop_filtered(
            gst::ClockTime::from_seconds(10),
            &[gst::MessageType::Eos, gst::MessageType::Error],
        )
        .expect("EOS");
    assert_eq!(msg.type_(), gst::MessageType::Eos);
    pipeline.set_state(gst::State::Null).unwrap();
}

/// Opus over RTP to a UDP port on 127.0.0.1, received by a second pipeline in this process.
#[test]
fn opus_over_rtp_on_loopback() {
    let _g = serial();
    init();
    let port = {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap().port()
    };
    let receiver = gst::parse::launch(&format!(
        "udpsrc address=127.0.0.1 port={port} \
         caps=\"application/x-rtp,media=audio,clock-rate=48000,encoding-name=OPUS,payload=96\" ! \
         rtpjitterbuffer latency=200 ! rtpopusdepay ! opusdec ! audioconvert ! audioresample ! \
         audio/x-raw,format=F32LE,rate=24000,channels=1 ! \
         fakesink name=rx sync=false signal-handoffs=true"
    ))
    .unwrap()
    .downcast::<gst::Pipeline>()
    .unwrap();
    let received = Arc::new(Mutex::new((0u64, 0f32)));
    let r2 = received.clone();
    receiver
        .by_name("rx")
        .unwrap()
        .connect("handoff", false, move |args| {
            let buf = args[1].get::<gst::Buffer>().unwrap();
            let m = buf.map_readable().unwrap();
            let mut r = r2.lock().unwrap();
            r.0 += (m.size() / 4) as u64;
            for c in m.as_slice().chunks_exact(4) {
                r.1 = r.1.max(f32::from_le_bytes([c[0], c[1], c[2], c[3]]).abs());
            }
            None
        });
    receiver.set_state(gst::State::Playing).unwrap();

    let sender = gst::parse::launch(&format!(
        "omnittssrc name=src is-live=true model=\"{}\" do-sample=false max-new-tokens=12 \
         text=\"Over the network.\" ! audioconvert ! audioresample ! opusenc ! \
         rtpopuspay pt=96 ! udpsink host=127.0.0.1 port={port} sync=true",
        fixture_model("tiny-customvoice")
    ))
    .unwrap()
    .downcast::<gst::Pipeline>()
    .unwrap();
    let bus = sender.bus().unwrap();
    sender.set_state(gst::State::Playing).unwrap();
    let mut msgs = Vec::new();
    let done = wait_element_message(&bus, messages::DONE, Duration::from_secs(30), &mut msgs)
        .expect("done message");
    std::thread::sleep(Duration::from_millis(800));
    sender.set_state(gst::State::Null).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    receiver.set_state(gst::State::Null).unwrap();
    assert!(errors(&msgs).is_empty(), "{:?}", errors(&msgs));
    let (samples, peak) = *received.lock().unwrap();
    let speech = done.get::<u64>("frames").unwrap() * SPF;
    assert!(
        samples >= speech,
        "received {samples} samples at 24 kHz, less than the {speech} of speech"
    );
    assert!(peak > 0.01, "received only silence (peak {peak})");
    assert!(errors(&receiver.bus().unwrap().iter().collect::<Vec<_>>()).is_empty());
}

/// Checks that `seen` tiles the timeline (offsets contiguous, PTS = first PTS + sample time)
/// except at the buffers listed in `jumps`, where the PTS jumps forward and DISCONT is set;
/// DISCONT is set on the first buffer and at the jumps only.
fn check_live_timeline(seen: &[Seen], jumps: &[usize]) {
    let mut base = seen[0].pts;
    let mut n = 0;
    for (i, b) in seen.iter().enumerate() {
        assert_eq!(b.offset, n, "buffer {i}: offset");
        let expected = base + element_util::pts_of(n);
        if jumps.contains(&i) {
            assert!(b.pts > expected, "buffer {i}: no jump at {}", b.pts);
            base = b.pts - element_util::pts_of(n);
        } else {
            assert_eq!(b.pts, expected, "buffer {i}: pts");
        }
        assert_eq!(
            b.discont,
            i == 0 || jumps.contains(&i),
            "buffer {i}: DISCONT"
        );
        n += b.samples;
    }
}

/// The utterance messages' `pts` are the PTS of the buffers they describe, and PAUSED → PLAYING
/// keeps the timeline (the running time stood still): no jump, no DISCONT, no audio lost.
#[test]
fn messages_agree_with_buffers_across_pause() {
    let _g = serial();
    let (pipeline, src, seen) = live_pipeline("max-new-tokens=30 initial-chunk-frames=2");
    let bus = pipeline.bus().unwrap();
    pipeline.set_state(gst::State::Playing).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(src.emit_by_name::<bool>("push-text", &[&"Pause in the middle."]));
    let mut msgs = Vec::new();
    wait_element_message(&bus, messages::STARTED, Duration::from_secs(30), &mut msgs)
        .expect("started message");
    std::thread::sleep(Duration::from_millis(600));
    pipeline.set_state(gst::State::Paused).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    pipeline.set_state(gst::State::Playing).unwrap();
    let done = wait_element_message(&bus, messages::DONE, Duration::from_secs(30), &mut msgs)
        .expect("done message");
    std::thread::sleep(Duration::from_millis(300));
    pipeline.set_state(gst::State::Null).unwrap();
    while let Some(m) = bus.pop() {
        msgs.push(m);
    }
    assert!(errors(&msgs).is_empty(), "{:?}", errors(&msgs));
    let seen = seen.lock().unwrap().clone();
    check_live_timeline(&seen, &[]);

    let first_speech = seen.iter().position(|b| !b.gap).expect("speech buffers");
    let last_speech = seen.iter().rposition(|b| !b.gap).unwrap();
    let started = &element_messages(&msgs, messages::STARTED)[0];
    let pts = |s: &gst::Structure| gst::ClockTime::from_nseconds(s.get::<u64>("pts").unwrap());
    assert_eq!(pts(started), seen[first_speech].pts, "started pts");
    assert_eq!(pts(&done), seen[first_speech].pts, "done pts");
    let end = seen[last_speech].pts + seen[last_speech].duration;
    assert_eq!(
        done.get::<u64>("duration").unwrap(),
        (end - seen[first_speech].pts).nseconds(),
        "done duration"
    );
    let speech: u64 = seen.iter().filter(|b| !b.gap).map(|b| b.samples).sum();
    assert_eq!(
        speech,
        done.get::<u64>("frames").unwrap() * SPF,
        "audio lost"
    );
    assert_eq!(done.get::<u64>("samples").unwrap(), speech);
}

/// A pipeline whose running time goes on while paused (no start time): after PLAYING again the
/// timeline jumps to the running time, and that buffer is DISCONT.
#[test]
fn a_running_time_that_moved_on_is_a_discont() {
    let _g = serial();
    let (pipeline, _src, seen) = live_pipeline("");
    pipeline.set_start_time(gst::ClockTime::NONE);
    pipeline.set_state(gst::State::Playing).unwrap();
    std::thread::sleep(Duration::from_millis(400));
    pipeline.set_state(gst::State::Paused).unwrap();
    let paused = seen.lock().unwrap().len();
    std::thread::sleep(Duration::from_millis(600));
    pipeline.set_state(gst::State::Playing).unwrap();
    std::thread::sleep(Duration::from_millis(400));
    pipeline.set_state(gst::State::Null).unwrap();
    let seen = seen.lock().unwrap().clone();
    let jump = seen
        .iter()
        .skip(1)
        .position(|b| b.discont)
        .map(|i| i + 1)
        .expect("a DISCONT after the pause");
    assert!(
        jump >= paused.saturating_sub(2),
        "DISCONT at {jump}, paused at {paused}"
    );
    check_live_timeline(&seen, &[jump]);
    let prev = &seen[jump - 1];
    let gap = seen[jump].pts - (prev.pts + prev.duration);
    assert!(
        gap >= gst::ClockTime::from_mseconds(300),
        "jump of {gap} for a 600 ms pause"
    );
}

/// A FLUSH_START / FLUSH_STOP pair sent to the source pad itself (`gst_pad_send_event`, as an
/// element downstream does; not to the element or the pipeline) cancels the utterance being
/// spoken, and the stream goes on: text pushed after it is spoken. BaseSrc's own handling of that
/// flush ends it without restarting the streaming task that the flushed `create()` paused (the
/// stream was dead for good). Downstream was not flushed: the timeline goes on (the buffer on its
/// way when the flush began is dropped at the pad, so the first one after it is DISCONT), and the
/// pad, whose segment the FLUSH_STOP removed, sends the same segment again before its data.
#[test]
fn a_flush_pair_on_the_src_pad_keeps_the_stream_going() {
    let _g = serial();
    let (pipeline, src, seen) = live_pipeline("max-new-tokens=200 initial-chunk-frames=2");
    let bus = pipeline.bus().unwrap();
    let pad = src.static_pad("src").unwrap();
    let segments = Arc::new(Mutex::new(Vec::new()));
    let s2 = segments.clone();
    pad.add_probe(gst::PadProbeType::EVENT_DOWNSTREAM, move |_, info| {
        if let Some(gst::EventView::Segment(s)) = info.event().map(|e| e.view()) {
            s2.lock().unwrap().push(s.segment().clone());
        }
        gst::PadProbeReturn::Ok
    })
    .unwrap();
    pipeline.set_state(gst::State::Playing).unwrap();
    // Some silence first: the stream's first segment and buffer are out before the flush.
    let t0 = Instant::now();
    while seen.lock().unwrap().len() < 3 {
        assert!(t0.elapsed() < Duration::from_secs(30), "no buffers");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(src.emit_by_name::<bool>("push-text", &[&"A long utterance that a flush cuts short."]));
    let mut msgs = Vec::new();
    wait_element_message(
        &bus,
        messages::FIRST_AUDIO,
        Duration::from_secs(30),
        &mut msgs,
    )
    .expect("first-audio message");
    assert!(pad.send_event(gst::event::FlushStart::new()));
    assert!(pad.send_event(gst::event::FlushStop::new(true)));
    let cut = wait_element_message(&bus, messages::DONE, Duration::from_secs(10), &mut msgs)
        .expect("done message of the flushed utterance");
    assert_eq!(cut.get::<&str>("reason").unwrap(), "cancelled");
    // Short, so that it is spoken (in real time) within the test.
    src.set_property("max-new-tokens", 10u32);
    const AFTER: &str = "Spoken after the flush.";
    assert!(src.emit_by_name::<bool>("push-text", &[&AFTER]));
    let done = wait_element_message(&bus, messages::DONE, Duration::from_secs(30), &mut msgs)
        .expect("the text pushed after the flush is spoken: its done message");
    assert_eq!(done.get::<&str>("text").unwrap(), AFTER);
    let reason = done.get::<&str>("reason").unwrap();
    assert!(reason == "eos" || reason == "length", "{reason}");
    std::thread::sleep(Duration::from_millis(300));
    pipeline.set_state(gst::State::Null).unwrap();
    while let Some(m) = bus.pop() {
        msgs.push(m);
    }
    assert!(errors(&msgs).is_empty(), "{:?}", errors(&msgs));
    let seen = seen.lock().unwrap().clone();
    // Offsets contiguous but where a buffer was dropped by the flush: the next one is DISCONT.
    // The first buffer is DISCONT (or was the dropped one).
    let mut n = seen[0].offset;
    for (i, b) in seen.iter().enumerate() {
        assert!(b.offset >= n, "buffer {i}: offset {} before {n}", b.offset);
        if b.offset > n {
            assert!(
                b.discont,
                "buffer {i}: a hole in the offsets without DISCONT"
            );
        }
        n = b.offset + b.samples;
    }
    let disconts: Vec<usize> = (0..seen.len()).filter(|&i| seen[i].discont).collect();
    assert!(
        disconts.len() == 2 && disconts[0] == 0,
        "DISCONT at {disconts:?}"
    );
    // A timeline (PTS = r + samples) before the flush and one after it, from the DISCONT on:
    // the same, or later by as much as the flush held the stream past the latency (the
    // running time went on).
    let origin = |b: &Seen| b.pts - element_util::pts_of(b.offset);
    let (before, after) = seen.split_at(disconts[1]);
    for part in [before, after] {
        let r = origin(&part[0]);
        for b in part {
            assert_eq!(origin(b), r, "{b:?}");
        }
    }
    assert!(
        origin(&after[0]) >= origin(&before[0]),
        "{:?}",
        &seen[disconts[1] - 1..]
    );
    // Its audio went out, from its start on.
    let start = gst::ClockTime::from_nseconds(done.get::<u64>("pts").unwrap());
    let speech: u64 = seen
        .iter()
        .filter(|b| b.pts >= start && !b.gap)
        .map(|b| b.samples)
        .sum();
    assert_eq!(speech, done.get::<u64>("samples").unwrap());
    assert!(speech > 0);
    let segments = segments.lock().unwrap().clone();
    assert_eq!(segments.len(), 2, "{segments:?}");
    let time = |s: &gst::Segment| {
        let s = s.downcast_ref::<gst::ClockTime>().expect("a TIME segment");
        (s.start(), s.base(), s.rate())
    };
    assert_eq!(time(&segments[1]), time(&segments[0]), "{segments:?}");
}

/// A flush sent to the pipeline with `reset_time` sets its running time back to 0: the timeline
/// starts again there, and text pushed after it is spoken at the running time it arrives, not
/// once the running time has caught up with where the timeline was before the flush.
#[test]
fn a_pipeline_flush_that_resets_the_running_time_starts_the_timeline_again() {
    let _g = serial();
    let (pipeline, src, seen) = live_pipeline("max-new-tokens=10 initial-chunk-frames=2");
    let bus = pipeline.bus().unwrap();
    play_for(&pipeline, gst::ClockTime::from_mseconds(1500));
    let before = seen
        .lock()
        .unwrap()
        .last()
        .map(|b| b.pts)
        .expect("buffers before");
    assert!(pipeline.send_event(gst::event::FlushStart::new()));
    assert!(pipeline.send_event(gst::event::FlushStop::new(true)));
    let at_push = running_time(&pipeline);
    assert!(
        at_push < before,
        "running time {at_push} not reset (was {before})"
    );
    const AFTER: &str = "Spoken after the flush.";
    assert!(src.emit_by_name::<bool>("push-text", &[&AFTER]));
    let mut msgs = Vec::new();
    let done = wait_element_message(&bus, messages::DONE, Duration::from_secs(30), &mut msgs)
        .expect("the text pushed after the flush is spoken: its done message");
    pipeline.set_state(gst::State::Null).unwrap();
    while let Some(m) = bus.pop() {
        msgs.push(m);
    }
    assert!(errors(&msgs).is_empty(), "{:?}", errors(&msgs));
    assert_eq!(done.get::<&str>("text").unwrap(), AFTER);
    let pts = gst::ClockTime::from_nseconds(done.get::<u64>("pts").unwrap());
    assert!(
        pts >= at_push && pts < at_push + gst::ClockTime::from_mseconds(1000),
        "spoken at {pts}, pushed at running time {at_push} (before the flush: {before})"
    );
    // The first buffer after the flush starts the new timeline, DISCONT, below the old one.
    let seen = seen.lock().unwrap().clone();
    let first = 1 + seen
        .windows(2)
        .position(|w| w[1].pts < w[0].pts)
        .expect("buffers after the flush, on a timeline started again");
    assert!(seen[first].discont, "{:?}", seen[first]);
    for w in seen[first..].windows(2) {
        assert_eq!(w[1].pts, w[0].pts + w[0].duration, "{w:?}");
    }
}

/// Text pushed while a flush holds the stream is due as soon as the flush ends, not once the
/// running time has gone on by the time the flush lasted.
#[test]
fn text_pushed_during_a_long_flush_is_spoken_when_it_ends() {
    let _g = serial();
    let (pipeline, src, _seen) = live_pipeline("max-new-tokens=10 initial-chunk-frames=2");
    let bus = pipeline.bus().unwrap();
    let pad = src.static_pad("src").unwrap();
    play_for(&pipeline, gst::ClockTime::from_mseconds(300));
    assert!(pad.send_event(gst::event::FlushStart::new()));
    std::thread::sleep(Duration::from_millis(1000));
    const TEXT: &str = "Pushed during the flush.";
    assert!(src.emit_by_name::<bool>("push-text", &[&TEXT]));
    assert!(pad.send_event(gst::event::FlushStop::new(false)));
    let stopped = running_time(&pipeline);
    let mut msgs = Vec::new();
    let done = wait_element_message(&bus, messages::DONE, Duration::from_secs(30), &mut msgs)
        .expect("the text pushed during the flush is spoken: its done message");
    pipeline.set_state(gst::State::Null).unwrap();
    assert_eq!(done.get::<&str>("text").unwrap(), TEXT);
    let pts = gst::ClockTime::from_nseconds(done.get::<u64>("pts").unwrap());
    assert!(
        pts < stopped + gst::ClockTime::from_mseconds(500),
        "spoken at {pts}, the flush ended at running time {stopped}"
    );
}

/// Texts refused while an utterance is still being spoken keep their place in the stream; an EOS
/// event before the stream reaches them still posts every refusal.
#[test]
fn refusals_behind_a_live_eos_are_posted() {
    let _g = serial();
    let (pipeline, src, _seen) = live_pipeline("max-new-tokens=200");
    let bus = pipeline.bus().unwrap();
    pipeline.set_state(gst::State::Playing).unwrap();
    assert!(src.emit_by_name::<bool>(
        "push-text",
        &[&"A long utterance that is still being spoken."]
    ));
    for i in 0..24 {
        assert!(
            !src.emit_by_name::<bool>("push-text", &[&" \u{200B} "]),
            "refusal {i}"
        );
    }
    let mut msgs = Vec::new();
    wait_element_message(
        &bus,
        messages::FIRST_AUDIO,
        Duration::from_secs(30),
        &mut msgs,
    )
    .expect("first-audio message");
    std::thread::sleep(Duration::from_millis(300));
    assert!(errors(&msgs).is_empty(), "{:?}", errors(&msgs));
    assert!(pipeline.send_event(gst::event::Eos::new()));
    loop {
        let m = bus
            .timed_pop(gst::ClockTime::from_seconds(10))
            .expect("EOS within 10 s");
        let eos = m.type_() == gst::MessageType::Eos;
        msgs.push(m);
        if eos {
            break;
        }
    }
    pipeline.set_state(gst::State::Null).unwrap();
    let errs = errors(&msgs);
    assert_eq!(errs.len(), 24, "{errs:?}");
    for (i, e) in errs.iter().enumerate() {
        assert!(e.contains(&format!("utterance {} refused", i + 2)), "{e}");
        assert!(e.contains("nothing to speak"), "{e}");
    }
}
