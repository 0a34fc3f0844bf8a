//! Speech while the text is still being written: a simulated LLM streams a 60-word reply into a
//! live `omnittssrc` with `append-text` at a given rate (tokens per second), then `end-text`.
//!
//! For each rate (`--rates`, default 20,50) and round (`--rounds`, default 3), on a fresh
//! pipeline `omnittssrc is-live=true ! fakesink sync=false` (after one warm-up utterance, not
//! counted), it prints:
//!
//! - `first`: wall time from the first fragment (the `append-text` call) to the first buffer with
//!   sound (not GAP, not all zeros) at the sink: what a listener waits for, the element's own
//!   pacing included (a live source releases each buffer at its running time);
//! - `last`: wall time from the last fragment (`end-text`) to the last buffer with sound;
//! - `underruns`: silence buffers the element inserted after the utterance's first audio because
//!   its audio was late (the done message's `underruns`), and `wait-ms`, the silence before it;
//! - the mode the utterance got (`token` or `clause`, the `omnitts/text-stream-mode` message), its
//!   audio length and the done message's reason.
//!
//! The reply is cut as a byte-level BPE would cut it: each word with its leading space, words of
//! more than 5 letters in two tokens (74 tokens for the 60 words), sent evenly at the rate.
//!
//! ```sh
//! cargo run --release --example bench_text_stream -- --model models/omnitts-en
//! cargo run --release --example bench_text_stream -- \
//!     --model tests/fixtures/tiny-customvoice --speaker vivian --max-new-tokens 300
//! ```

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gst::prelude::*;
use gstomnitts::element_common::messages;

#[path = "common/llm_reply.rs"]
mod llm_reply;
#[path = "common/rate_arg.rs"]
mod rate_arg;
use llm_reply::{REPLY, tokens};
use rate_arg::positive_rate;

/// Speech while the text is still being written: an LLM reply streamed into a live omnittssrc.
#[derive(clap::Parser)]
#[command(about = "Speech while the text is still being written (append-text at a token rate)")]
struct Args {
    /// Checkpoint directory (or Hugging Face repo id).
    #[arg(long, default_value = "models/omnitts-en")]
    model: String,
    /// Preset speaker (checkpoints that have them).
    #[arg(long)]
    speaker: Option<String>,
    /// Token rates of the simulated LLM, tokens per second, comma separated (each > 0).
    #[arg(long, value_delimiter = ',', default_value = "20,50", value_parser = positive_rate)]
    rates: Vec<f64>,
    /// Rounds per rate (at least 1).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// max-new-tokens of the element.
    #[arg(long)]
    max_new_tokens: Option<u32>,
}

/// What the sink saw: wall times of the buffers with sound.
#[derive(Default)]
struct Seen {
    first: Option<Instant>,
    last: Option<Instant>,
}

struct Round {
    first_ms: f64,
    last_ms: f64,
    underruns: u32,
    wait_ms: f64,
    audio_ms: f64,
    mode: String,
    reason: String,
}

/// Waits for the element message `name` (posted by `src`) with `id`, up to `limit`.
fn wait_for(
    bus: &gst::Bus,
    name: &str,
    id: u64,
    limit: Duration,
) -> Result<gst::Structure, String> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        let Some(msg) = bus.timed_pop(gst::ClockTime::from_mseconds(100)) else {
            continue;
        };
        match msg.view() {
            gst::MessageView::Error(e) => return Err(format!("{} ({:?})", e.error(), e.debug())),
            gst::MessageView::Element(e) => {
                if let Some(s) = e.structure()
                    && s.name() == name
                    && s.get::<u64>("id").ok() == Some(id)
                {
                    return Ok(s.to_owned());
                }
            }
            _ => {}
        }
    }
    Err(format!("no {name} for utterance {id} within {limit:?}"))
}

fn round(a: &Args, rate: f64) -> Result<Round, String> {
    let src = gst::ElementFactory::make("omnittssrc")
        .property("model", &a.model)
        .property("is-live", true)
        .property("do-sample", false)
        .build()
        .map_err(|e| e.to_string())?;
    if let Some(s) = &a.speaker {
        src.set_property("speaker", s);
    }
    if let Some(n) = a.max_new_tokens {
        src.set_property("max-new-tokens", n);
    }
    let sink = gst::ElementFactory::make("fakesink")
        .property("sync", false)
        .property("signal-handoffs", true)
        .build()
        .map_err(|e| e.to_string())?;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let seen2 = seen.clone();
    sink.connect("handoff", false, move |args| {
        if let Some(b) = args.get(1).and_then(|v| v.get::<gst::Buffer>().ok())
            && !b.flags().contains(gst::BufferFlags::GAP)
            && let Ok(map) = b.map_readable()
            && map.as_slice().iter().any(|&x| x != 0)
        {
            let now = Instant::now();
            let mut g = seen2.lock().unwrap_or_else(|p| p.into_inner());
            g.first.get_or_insert(now);
            g.last = Some(now);
        }
        None
    });
    let pipeline = gst::Pipeline::new();
    pipeline
        .add_many([&src, &sink])
        .map_err(|e| e.to_string())?;
    src.link(&sink).map_err(|e| e.to_string())?;
    let bus = pipeline.bus().ok_or("no bus")?;
    if let Err(e) = pipeline.set_state(gst::State::Playing) {
        // The element's own error (a bad model or speaker) says more than the state change.
        let why = bus
            .timed_pop_filtered(gst::ClockTime::from_seconds(1), &[gst::MessageType::Error])
            .and_then(|m| match m.view() {
                gst::MessageView::Error(err) => Some(err.error().to_string()),
                _ => None,
            })
            .unwrap_or_else(|| e.to_string());
        let _ = pipeline.set_state(gst::State::Null);
        return Err(format!("PLAYING: {why}"));
    }
    // Warm-up (not counted): utterance 1.
    if !src.emit_by_name::<bool>("push-text", &[&"Hello there."]) {
        return Err("warm-up refused".into());
    }
    wait_for(&bus, messages::DONE, 1, Duration::from_secs(120))?;
    std::thread::sleep(Duration::from_millis(300));
    *seen.lock().unwrap_or_else(|p| p.into_inner()) = Seen::default();

    // The simulated LLM: utterance 2.
    let toks = tokens();
    let period = Duration::from_secs_f64(1.0 / rate);
    let t_first = Instant::now();
    for (i, t) in toks.iter().enumerate() {
        let due = t_first + period * i as u32;
        if let Some(d) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
        if !src.emit_by_name::<bool>("append-text", &[t]) {
            return Err(format!("append-text {t:?} refused"));
        }
    }
    src.emit_by_name::<bool>("end-text", &[]);
    let t_last = Instant::now();
    let mode = wait_for(&bus, messages::TEXT_STREAM_MODE, 2, Duration::from_secs(5))?;
    let done = wait_for(&bus, messages::DONE, 2, Duration::from_secs(300))?;
    // The last buffers may still be on their way to the sink.
    std::thread::sleep(Duration::from_millis(500));
    pipeline
        .set_state(gst::State::Null)
        .map_err(|e| format!("NULL: {e}"))?;
    let g = seen.lock().unwrap_or_else(|p| p.into_inner());
    let ms = |a: Instant, b: Option<Instant>| {
        b.map_or(f64::NAN, |b| {
            b.saturating_duration_since(a).as_secs_f64() * 1e3
        })
    };
    Ok(Round {
        first_ms: ms(t_first, g.first),
        last_ms: ms(t_last, g.last),
        underruns: done.get::<u32>("underruns").unwrap_or(0),
        wait_ms: done.get::<f64>("wait-ms").unwrap_or(f64::NAN),
        audio_ms: done.get::<f64>("audio-ms").unwrap_or(f64::NAN),
        mode: mode.get::<String>("mode").unwrap_or_default(),
        reason: done.get::<String>("reason").unwrap_or_default(),
    })
}

fn main() {
    let a = <Args as clap::Parser>::parse();
    if let Err(e) = gst::init() {
        eprintln!("bench_text_stream: gst::init: {e}");
        std::process::exit(1);
    }
    if let Err(e) = gstomnitts::plugin_register_static() {
        eprintln!("bench_text_stream: registering the plugin: {e}");
        std::process::exit(1);
    }
    let toks = tokens();
    println!(
        "model {} | reply: {} words, {} tokens | {} rounds per rate",
        a.model,
        REPLY.split_whitespace().count(),
        toks.len(),
        a.rounds
    );
    for &rate in &a.rates {
        for r in 0..a.rounds {
            match round(&a, rate) {
                Ok(x) => println!(
                    "rate {rate:>4} tok/s (text {:.1} s) round {r}: mode {} | first fragment → \
                     first audio {:.0} ms | last fragment → last audio {:.0} ms | underruns {} \
                     (wait {:.0} ms) | audio {:.1} s, reason {}",
                    toks.len() as f64 / rate,
                    x.mode,
                    x.first_ms,
                    x.last_ms,
                    x.underruns,
                    x.wait_ms,
                    x.audio_ms / 1e3,
                    x.reason
                ),
                Err(e) => {
                    eprintln!("rate {rate} round {r}: {e}");
                    std::process::exit(1);
                }
            }
        }
    }
}
