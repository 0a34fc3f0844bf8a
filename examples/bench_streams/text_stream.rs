//! Text streamed into one running request through the engine (`--text-rates`): a simulated LLM
//! sends its reply (`common/llm_reply.rs`, 74 tokens) at a rate in tokens per second with
//! [`TextSender::append`], then [`TextSender::end`], into a request from
//! `Engine::submit_open` (streaming prompt mode: the talker takes one text id a frame). What the
//! element adds on top (`bench_text_stream`) is its clock; this is the engine's share, and runs
//! where GStreamer is not installed.
//!
//! Per run: the time from the first fragment, and from the second (a word's id is final once the
//! next word starts, so the second fragment is the one that completes the first frame's text),
//! to the arrival of the chunk holding the first audible audio; from `end` to the last chunk; and
//! the underruns of a player that starts on the first chunk without a buffer ([`playback::play`]).

use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use gstomnitts::engine::{EngineEvent, EngineRequest, SharedEngine, TextSender};
use gstomnitts::models::qwen3_tts::{PromptMode, VoiceRequest};
use serde::Serialize;

use crate::llm_reply::tokens;
use crate::playback::{self, Chunk};

/// One streamed reply's figures (seconds).
#[derive(Debug, Clone, Serialize)]
pub struct TextRun {
    /// Tokens per second.
    pub rate: f64,
    /// First fragment → the chunk holding the first audible audio.
    pub first_s: Option<f64>,
    /// Second fragment (the first frame's text complete) → the same chunk.
    pub first_after_second_s: Option<f64>,
    /// `end` → the last chunk.
    pub last_s: Option<f64>,
    pub underruns: usize,
    pub audio_s: f64,
    /// Why the request ended.
    pub finish: String,
}

/// Feeds `toks` into `sender` at `rate` tokens per second from `t0` (the first at once), then ends
/// the text. Returns when each fragment went in, seconds since `t0`, and when the text ended.
fn feed(sender: TextSender, toks: &[String], rate: f64, t0: Instant) -> Result<(Vec<f64>, f64)> {
    let mut sent = Vec::with_capacity(toks.len());
    for (i, tok) in toks.iter().enumerate() {
        let at = t0 + Duration::from_secs_f64(i as f64 / rate);
        let now = Instant::now();
        if now < at {
            thread::sleep(at - now);
        }
        sender.append(tok)?;
        sent.push(t0.elapsed().as_secs_f64());
    }
    sender.end();
    Ok((sent, t0.elapsed().as_secs_f64()))
}

/// Streams the reply at `rate` tokens per second into one open request of `engine` (the
/// checkpoint's first speaker; greedy or its sampling with `seed`; at most `max_frames` frames,
/// since random weights never end by themselves) and follows it to its end.
pub fn run(
    engine: &SharedEngine,
    rate: f64,
    greedy: bool,
    seed: u64,
    max_frames: usize,
) -> Result<TextRun> {
    let voice = VoiceRequest {
        text: String::new(),
        speaker: engine.speakers().first().cloned(),
        prompt_mode: Some(PromptMode::Streaming),
        ..Default::default()
    };
    let mut s = engine.default_sampling_params();
    if greedy {
        s = s.greedy();
    }
    s.seed = seed;
    s.max_new_tokens = max_frames + 1;
    let toks = tokens();
    let (h, sender) = engine.submit_open(EngineRequest::new(voice, s))?;
    let t0 = Instant::now();
    let feeder = thread::spawn(move || feed(sender, &toks, rate, t0));
    let sample_rate = engine.sample_rate();
    let (mut chunks, mut audio, mut finish) = (Vec::new(), Vec::new(), String::from("none"));
    while let Some(ev) = h.recv() {
        match ev {
            EngineEvent::Audio(c) => {
                chunks.push(Chunk {
                    arrival_s: t0.elapsed().as_secs_f64(),
                    offset: c.offset,
                    len: c.samples.len(),
                });
                audio.extend_from_slice(&c.samples);
            }
            EngineEvent::Finished { reason, .. } => {
                finish = reason.as_str().to_string();
                break;
            }
            _ => {}
        }
    }
    let Ok(fed) = feeder.join() else {
        bail!("the text feeder panicked");
    };
    let (sent, ended) = fed?;
    let heard = playback::audible_onset(&audio, sample_rate)
        .and_then(|s| playback::chunk_holding(&chunks, s))
        .map(|c| c.arrival_s);
    let play = playback::play(&chunks, sample_rate);
    Ok(TextRun {
        rate,
        first_s: heard,
        first_after_second_s: heard.zip(sent.get(1)).map(|(h, s)| h - s),
        last_s: chunks.last().map(|c| c.arrival_s - ended),
        underruns: play.underruns(),
        audio_s: audio.len() as f64 / sample_rate as f64,
        finish,
    })
}

/// One table line of a run.
pub fn line(r: &TextRun) -> String {
    let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.0}", v * 1e3));
    format!(
        "{:>6.0} | {:>9} {:>18} | {:>8} | {:>9} | {:>6.1} | {}",
        r.rate,
        ms(r.first_s),
        ms(r.first_after_second_s),
        ms(r.last_s),
        r.underruns,
        r.audio_s,
        r.finish
    )
}

/// The table's header line.
pub fn header() -> String {
    format!(
        "{:>6} | {:>9} {:>18} | {:>8} | {:>9} | {:>6} | end",
        "tok/s", "first ms", "after 2nd frag ms", "last ms", "underruns", "audio s"
    )
}
