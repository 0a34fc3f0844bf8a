//! Open-loop load on one engine, measured as a client hears it: requests arrive at Poisson
//! instants at a given rate, whatever the engine is doing, and each request's figures come from
//! the audio chunks it receives (see the crate doc of `bench_streams` for the rules).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::Result;
use gstomnitts::engine::{
    EngineError, EngineEvent, EngineRequest, FinishReason, Metrics, RequestHandle, SharedEngine,
};
use gstomnitts::models::qwen3_tts::VoiceRequest;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde::Serialize;

use crate::playback::{self, Chunk, percentile};

/// English sentences of 10–13 words; each request speaks one, picked by the seeded RNG.
pub const SENTENCES: [&str; 24] = [
    "The morning train was late again, so we walked to the station together.",
    "Please put the kettle on and bring two cups to the table.",
    "A light rain fell over the harbour while the boats came slowly home.",
    "She opened the letter, read it twice, and then smiled at the garden.",
    "Turn left at the old mill, and the farm is on the right.",
    "The meeting starts at nine, but the coffee is ready a little before.",
    "He painted the fence blue because his daughter asked him to.",
    "We listened to the wind in the trees until the fire burned low.",
    "Our flight leaves early tomorrow, so please pack your bags tonight.",
    "The library will be closed on Monday for the public holiday.",
    "My brother bought a new bicycle and rode it to work today.",
    "Could you tell me where the nearest pharmacy is, please?",
    "The children built a small castle out of sand near the water.",
    "After dinner we played cards and talked about our summer plans.",
    "The baker opens his shop at six and sells out by noon.",
    "I forgot my umbrella at home, and of course it started raining.",
    "The old clock in the hall stopped at exactly half past three.",
    "Remember to water the plants while we are away next week.",
    "The museum has a new exhibition about the history of flight.",
    "She practised the piano every evening until her fingers grew tired.",
    "The bus driver waited for the last passenger before closing the doors.",
    "We found a quiet table in the corner and ordered some soup.",
    "The weather report says the snow will stop by Sunday afternoon.",
    "His new phone takes better pictures than the camera he used before.",
];

/// Shortest and longest drawn utterance, codec frames (80 ms each: 2.4–6.4 s).
pub const FRAMES: std::ops::RangeInclusive<usize> = 30..=80;

/// How often the load sampler reads the in-flight and waiting counts.
const LOAD_TICK: Duration = Duration::from_millis(100);
/// How often GPU memory is read (one `nvidia-smi` call each).
const GPU_TICK: Duration = Duration::from_millis(500);

/// One open-loop run: a rate, a seed, and the phases.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// Mean arrivals per second.
    pub rate: f64,
    /// Seed of the arrival instants and of every request's text, length and sampling seed.
    pub seed: u64,
    /// Seconds of arrivals before the measured window (not counted).
    pub warmup_s: f64,
    /// Seconds of measured arrivals.
    pub duration_s: f64,
    /// After the measured window, how long requests may still run before they are cancelled and
    /// counted as timed out.
    pub drain_s: f64,
    /// Stop each request after exactly its drawn length (`max_new_tokens = frames + 1`, the engine
    /// loaded with the runaway guard off); otherwise the checkpoint ends it (EOS, guard, its
    /// `max_new_tokens`).
    pub fixed_length: bool,
    /// Greedy decoding instead of the checkpoint's sampling settings.
    pub greedy: bool,
    /// Overrides the stage config's first chunk and chunk size, frames (`EngineRequest`'s
    /// `initial_chunk_frames` / `chunk_frames`).
    pub initial_chunk_frames: Option<usize>,
    pub chunk_frames: Option<usize>,
}

/// One scheduled request.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    /// Scheduled arrival, seconds since the run's start.
    pub at_s: f64,
    /// Index into [`SENTENCES`].
    pub sentence: usize,
    /// Drawn length, frames (used when the length is fixed).
    pub frames: usize,
    /// The request's sampling seed.
    pub seed: u64,
    /// Arrives in the measured window (else in the warm-up).
    pub measured: bool,
}

/// The arrivals of a run: exponential gaps of mean `1 / rate` from `seed` over
/// `warmup_s + duration_s`, the first `warmup_s` seconds the warm-up. Each request draws its gap,
/// sentence, length and seed from the same stream, so request `i` has the same content at every
/// rate.
pub fn schedule(rate: f64, seed: u64, warmup_s: f64, duration_s: f64) -> Vec<Planned> {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let mut at = 0.0;
    let mut plan = Vec::new();
    loop {
        let u: f64 = rng.random();
        at += -(1.0 - u).ln() / rate;
        let sentence = rng.random_range(0..SENTENCES.len());
        let frames = rng.random_range(FRAMES);
        let seed = rng.random();
        if at >= warmup_s + duration_s {
            return plan;
        }
        plan.push(Planned {
            at_s: at,
            sentence,
            frames,
            seed,
            measured: at >= warmup_s,
        });
    }
}

/// The engine request of `p`: the checkpoint's first speaker and sampling (or greedy), with a
/// fixed length exactly `p.frames` frames, and the chunk sizes of `spec`.
fn request(engine: &SharedEngine, p: &Planned, spec: &RunSpec) -> EngineRequest {
    let voice = VoiceRequest {
        text: SENTENCES[p.sentence].to_string(),
        speaker: engine.speakers().first().cloned(),
        ..Default::default()
    };
    let mut s = engine.default_sampling_params();
    if spec.greedy {
        s = s.greedy();
    }
    if spec.fixed_length {
        // The limit counts sampled tokens; the last one is not a frame.
        s.max_new_tokens = p.frames + 1;
    }
    s.seed = p.seed;
    EngineRequest {
        initial_chunk_frames: spec.initial_chunk_frames,
        chunk_frames: spec.chunk_frames,
        ..EngineRequest::new(voice, s)
    }
}

/// Requests submitted, out of the engine's queue (started or finished without starting), and
/// finished; the load sampler reads them.
#[derive(Default)]
struct Counters {
    submitted: AtomicUsize,
    left_queue: AtomicUsize,
    finished: AtomicUsize,
}

impl Counters {
    /// Submitted and not finished.
    fn in_flight(&self) -> usize {
        let done = self.finished.load(Ordering::Acquire);
        self.submitted.load(Ordering::Acquire).saturating_sub(done)
    }

    /// Submitted and not yet taken by stage 0 (no `Started` yet).
    fn waiting(&self) -> usize {
        let left = self.left_queue.load(Ordering::Acquire);
        self.submitted.load(Ordering::Acquire).saturating_sub(left)
    }
}

/// What one request received.
struct Received {
    chunks: Vec<Chunk>,
    audio: Vec<f32>,
    /// `Finished`, seconds since the scheduled arrival.
    end_s: f64,
    reason: FinishReason,
    /// The engine's timing of the request (with `Finished`).
    metrics: Option<Metrics>,
    /// Still running at the deadline, then cancelled.
    timed_out: bool,
}

/// Follows `h` to its `Finished`, timing every event from `scheduled`; at `deadline` the request
/// is cancelled (and marked timed out).
fn follow(h: RequestHandle, scheduled: Instant, deadline: Instant, n: &Counters) -> Received {
    let since = |t: Instant| t.saturating_duration_since(scheduled).as_secs_f64();
    let mut r = Received {
        chunks: Vec::new(),
        audio: Vec::new(),
        end_s: f64::NAN,
        reason: FinishReason::Cancelled,
        metrics: None,
        timed_out: false,
    };
    let mut queued = true;
    let leave_queue = |queued: &mut bool| {
        if std::mem::take(queued) {
            n.left_queue.fetch_add(1, Ordering::AcqRel);
        }
    };
    loop {
        let ev = if r.timed_out {
            h.recv()
        } else {
            match h.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(ev) => Some(ev),
                Err(RecvTimeoutError::Timeout) => {
                    r.timed_out = true;
                    h.cancel();
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => None,
            }
        };
        let now = Instant::now();
        match ev {
            Some(EngineEvent::Started) => leave_queue(&mut queued),
            Some(EngineEvent::Audio(c)) => {
                r.chunks.push(Chunk {
                    arrival_s: since(now),
                    offset: c.offset,
                    len: c.samples.len(),
                });
                r.audio.extend_from_slice(&c.samples);
            }
            Some(EngineEvent::FirstAudio { .. }) => {}
            Some(EngineEvent::Finished { reason, metrics }) => {
                r.end_s = since(now);
                r.reason = reason;
                r.metrics = Some(metrics);
                break;
            }
            None => break,
        }
    }
    leave_queue(&mut queued);
    n.finished.fetch_add(1, Ordering::AcqRel);
    r
}

/// One request's figures, seconds since its scheduled arrival.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Arrived in the measured window.
    pub measured: bool,
    /// Refused by admission (`EngineError::Busy`); nothing else is set.
    pub refused: bool,
    /// Submit returned − scheduled arrival.
    pub lag_s: f64,
    /// The first audio chunk arrived.
    pub first_chunk_s: Option<f64>,
    /// The chunk holding the audible onset arrived.
    pub audible_s: Option<f64>,
    /// The audible onset played (its chunk's start on the playback timeline + its place in it).
    pub audible_played_s: Option<f64>,
    /// `Finished` arrived (`None`: cancelled at the drain deadline).
    pub end_s: Option<f64>,
    /// Audio received, seconds.
    pub audio_s: f64,
    /// Indices of the chunks that came late on the playback timeline (one underrun each,
    /// [`playback::Playback::late_chunks`]), and the time the player waited.
    pub late_chunks: Vec<usize>,
    pub stalled_s: f64,
    /// Where the first audio waited (the engine's timing, seconds since the scheduled arrival):
    /// stage 0 took the request, its prefill ended, its first frame was made.
    pub started_s: Option<f64>,
    pub prefilled_s: Option<f64>,
    pub first_frame_s: Option<f64>,
    /// The prefill alone (tokens, prompt, talker), seconds.
    pub prefill_s: Option<f64>,
    /// Frames of the stage-1 pass that decoded the first chunk.
    pub first_pass_frames: Option<usize>,
    /// The chunks whose frames the engine timed (its first [`gstomnitts::engine::TIMED_FRAMES`]
    /// frames), in order.
    pub chunk_times: Vec<ChunkTimes>,
    /// Why it ended (`eos`, `length`, `guard`, `error`, …; `timeout` when cancelled at the drain
    /// deadline, `refused`).
    pub finish: &'static str,
}

/// When one chunk's frames were ready on stage 0, when its audio arrived and when the player
/// needed it, seconds since the request's scheduled arrival.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChunkTimes {
    pub frames_ready_s: f64,
    pub arrival_s: f64,
    pub needed_s: f64,
}

impl ChunkTimes {
    /// The chunks of `chunks` (played as `play`) whose last frame is among those `frames_ready_ms`
    /// times (ms after submit, which came `lag_s` after the scheduled arrival), with `spf`
    /// samples a frame; the first chunk that is not ends the list.
    fn of(
        chunks: &[Chunk],
        play: &playback::Playback,
        frames_ready_ms: &[f64],
        lag_s: f64,
        spf: usize,
    ) -> Vec<ChunkTimes> {
        chunks
            .iter()
            .zip(&play.needed_s)
            .map_while(|(c, &needed_s)| {
                let end = (c.offset + c.len as u64).div_ceil(spf.max(1) as u64) as usize;
                let ready_ms = *frames_ready_ms.get(end.checked_sub(1)?)?;
                Some(ChunkTimes {
                    frames_ready_s: lag_s + ready_ms / 1e3,
                    arrival_s: c.arrival_s,
                    needed_s,
                })
            })
            .collect()
    }

    /// The chunk came late while its frames were ready in time: stage 1 made it late.
    fn late_on_stage1(&self) -> bool {
        self.arrival_s > self.needed_s && self.frames_ready_s <= self.needed_s
    }
}

impl Outcome {
    fn refused(p: &Planned) -> Outcome {
        Outcome {
            measured: p.measured,
            refused: true,
            lag_s: f64::NAN,
            first_chunk_s: None,
            audible_s: None,
            audible_played_s: None,
            end_s: None,
            audio_s: 0.0,
            late_chunks: Vec::new(),
            stalled_s: 0.0,
            started_s: None,
            prefilled_s: None,
            first_frame_s: None,
            prefill_s: None,
            first_pass_frames: None,
            chunk_times: Vec::new(),
            finish: "refused",
        }
    }

    /// The figures of what `r` received (`spf` samples a frame).
    fn of(p: &Planned, lag_s: f64, r: &Received, sample_rate: u32, spf: usize) -> Outcome {
        let onset = playback::audible_onset(&r.audio, sample_rate);
        let play = playback::play(&r.chunks, sample_rate);
        let m = r.metrics.as_ref();
        let after_lag = |ms: f64| lag_s + ms / 1e3;
        Outcome {
            measured: p.measured,
            refused: false,
            lag_s,
            first_chunk_s: r.chunks.first().map(|c| c.arrival_s),
            audible_s: onset
                .and_then(|s| playback::chunk_holding(&r.chunks, s))
                .map(|c| c.arrival_s),
            audible_played_s: onset
                .and_then(|s| playback::played_at(&r.chunks, &play, s, sample_rate)),
            end_s: (!r.timed_out).then_some(r.end_s),
            audio_s: r.audio.len() as f64 / sample_rate as f64,
            stalled_s: play.stalled_s,
            late_chunks: play.late_chunks.clone(),
            started_s: m.map(|m| after_lag(m.queue_ms)),
            prefilled_s: m.map(|m| after_lag(m.queue_ms + m.ar_prefill_ms)),
            first_frame_s: m.and_then(|m| m.first_frame_ms).map(after_lag),
            prefill_s: m.map(|m| m.ar_prefill_ms / 1e3),
            first_pass_frames: m.and_then(|m| m.first_pass_frames),
            chunk_times: m.map_or_else(Vec::new, |m| {
                ChunkTimes::of(&r.chunks, &play, &m.frames_ready_ms, lag_s, spf)
            }),
            finish: if r.timed_out {
                "timeout"
            } else {
                r.reason.as_str()
            },
        }
    }

    /// Ended by itself (not refused, cancelled at the deadline, or failed).
    fn finished(&self) -> bool {
        !matches!(self.finish, "refused" | "timeout" | "error" | "cancelled")
    }

    /// `value` for a latency percentile: the value; +∞ when the request was cancelled at the drain
    /// deadline before it came (it did not come within the run); `None` (left out) when the
    /// request ended without it (refused, failed, or its audio never became audible).
    fn latency(&self, value: Option<f64>) -> Option<f64> {
        match value {
            Some(v) => Some(v),
            None if self.finish == "timeout" => Some(f64::INFINITY),
            None => None,
        }
    }
}

/// The in-flight and waiting counts at one instant of the measured window.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct LoadSample {
    /// Seconds since the measured window began.
    pub t_s: f64,
    pub in_flight: usize,
    pub waiting: usize,
}

/// Reads `n` every [`LOAD_TICK`] from `from` to `until` (both included).
fn sample_load(n: &Counters, from: Instant, until: Instant) -> Vec<LoadSample> {
    let mut out = Vec::new();
    let mut next = from;
    loop {
        let now = Instant::now();
        if now < next {
            thread::sleep(next - now);
        }
        let t = next.min(until);
        out.push(LoadSample {
            t_s: t.saturating_duration_since(from).as_secs_f64(),
            in_flight: n.in_flight(),
            waiting: n.waiting(),
        });
        if t >= until {
            return out;
        }
        next = (next + LOAD_TICK).min(until);
    }
}

/// GPU memory in use on GPU `index`, MiB, from `nvidia-smi`; `None` when it is not there or says
/// nothing readable.
fn gpu_memory_mib(index: usize) -> Option<u64> {
    let out = std::process::Command::new("nvidia-smi")
        .args([
            "--query-gpu=memory.used",
            "--format=csv,noheader,nounits",
            "-i",
            &index.to_string(),
        ])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

/// The most GPU memory seen on GPU `index` until `stop` is set, MiB.
fn peak_gpu_memory(index: usize, stop: &AtomicBool) -> Option<u64> {
    let mut peak = gpu_memory_mib(index)?;
    while !stop.load(Ordering::Acquire) {
        thread::sleep(GPU_TICK);
        peak = peak.max(gpu_memory_mib(index).unwrap_or(0));
    }
    Some(peak)
}

/// One run's requests and load.
pub struct RunResult {
    pub spec: RunSpec,
    pub outcomes: Vec<Outcome>,
    pub load: Vec<LoadSample>,
    pub gpu_peak_mib: Option<u64>,
}

/// Runs `spec` on `engine`: the calling thread sleeps until each scheduled arrival and submits
/// (nothing else; building a request happens before the sleep), one thread follows each admitted
/// request, one samples the load over the measured window and, with `gpu`, one polls the GPU's
/// memory. Returns when every request has finished or been cancelled at the drain deadline.
pub fn run(engine: &SharedEngine, spec: &RunSpec, gpu: Option<usize>) -> Result<RunResult> {
    let plan = schedule(spec.rate, spec.seed, spec.warmup_s, spec.duration_s);
    let sample_rate = engine.sample_rate();
    let spf = engine.samples_per_frame();
    let counters = Counters::default();
    let stop = AtomicBool::new(false);
    // A moment to start the helper threads before the first arrival.
    let start = Instant::now() + Duration::from_millis(50);
    let window = start + Duration::from_secs_f64(spec.warmup_s);
    let window_end = window + Duration::from_secs_f64(spec.duration_s);
    let deadline = window_end + Duration::from_secs_f64(spec.drain_s);
    let (outcomes, load, gpu_peak_mib) = thread::scope(|s| -> Result<_> {
        let stop = &stop;
        let gpu = gpu.map(|i| s.spawn(move || peak_gpu_memory(i, stop)));
        let load = s.spawn(|| sample_load(&counters, window, window_end));
        let mut followers = Vec::with_capacity(plan.len());
        let mut refused = Vec::new();
        for p in &plan {
            let req = request(engine, p, spec);
            let at = start + Duration::from_secs_f64(p.at_s);
            let now = Instant::now();
            if now < at {
                thread::sleep(at - now);
            }
            match engine.submit(req) {
                Ok(h) => {
                    let lag_s = at.elapsed().as_secs_f64();
                    counters.submitted.fetch_add(1, Ordering::AcqRel);
                    let counters = &counters;
                    followers.push(s.spawn(move || {
                        let r = follow(h, at, deadline, counters);
                        Outcome::of(p, lag_s, &r, sample_rate, spf)
                    }));
                }
                Err(EngineError::Busy { .. }) => refused.push(Outcome::refused(p)),
                Err(e) => {
                    stop.store(true, Ordering::Release);
                    return Err(e.into());
                }
            }
        }
        let mut outcomes = followers
            .into_iter()
            .map(|j| {
                j.join()
                    .map_err(|_| anyhow::anyhow!("request thread panicked"))
            })
            .collect::<Result<Vec<_>>>()?;
        outcomes.extend(refused);
        let load = load
            .join()
            .map_err(|_| anyhow::anyhow!("load sampler panicked"))?;
        stop.store(true, Ordering::Release);
        let gpu_peak = gpu.and_then(|j| j.join().ok().flatten());
        Ok((outcomes, load, gpu_peak))
    })?;
    Ok(RunResult {
        spec: spec.clone(),
        outcomes,
        load,
        gpu_peak_mib,
    })
}

/// How much a count grew over a window by its least-squares trend: slope × window length. A
/// steady count (fluctuating around a level) gives about 0; a queue that gains a request every
/// second gives about the window's length in seconds.
pub fn trend_growth(points: &[(f64, f64)]) -> f64 {
    if points.len() < 2 {
        return 0.0;
    }
    let n = points.len() as f64;
    let mt = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let stt: f64 = points.iter().map(|p| (p.0 - mt).powi(2)).sum();
    if stt == 0.0 {
        return 0.0;
    }
    let sty: f64 = points.iter().map(|p| (p.0 - mt) * (p.1 - my)).sum();
    let span = points[points.len() - 1].0 - points[0].0;
    sty / stt * span
}

/// Whether a count stayed bounded: its trend grew by no more than `2 + 2·√mean` (a steady
/// queue of mean L fluctuates by about √L; one that the engine cannot keep up with grows by
/// (arrival − service rate) × window, far beyond that over a window much longer than a request).
pub fn steady(points: &[(f64, f64)]) -> bool {
    let mean = points.iter().map(|p| p.1).sum::<f64>() / points.len().max(1) as f64;
    trend_growth(points) <= 2.0 + 2.0 * mean.sqrt()
}

/// Whether the backlog stayed bounded during one run, and the figures behind it.
#[derive(Debug, Clone, Serialize)]
pub struct Backlog {
    /// Requests in flight (submitted, not finished) when the measured window ended.
    pub in_flight_end: usize,
    /// What a server that keeps up holds (Little's law with each request lasting its audio):
    /// rate × mean audio seconds of the measured requests.
    pub in_flight_expected: f64,
    /// Trend growth of the in-flight and waiting counts over the measured window
    /// ([`trend_growth`]).
    pub in_flight_growth: f64,
    pub waiting_growth: f64,
    /// Mean waiting count (not yet taken by stage 0) over the measured window.
    pub waiting_mean: f64,
    /// No request refused, none cancelled at the drain deadline, and neither count grew
    /// ([`steady`]).
    pub bounded: bool,
}

/// The backlog figures of `r`.
pub fn backlog(r: &RunResult) -> Backlog {
    let measured: Vec<&Outcome> = r.outcomes.iter().filter(|o| o.measured).collect();
    let admitted: Vec<&&Outcome> = measured.iter().filter(|o| !o.refused).collect();
    let audio_mean = admitted.iter().map(|o| o.audio_s).sum::<f64>() / admitted.len().max(1) as f64;
    let series = |f: fn(&LoadSample) -> usize| -> Vec<(f64, f64)> {
        r.load.iter().map(|l| (l.t_s, f(l) as f64)).collect()
    };
    let in_flight = series(|l| l.in_flight);
    let waiting = series(|l| l.waiting);
    let lost = measured.iter().any(|o| o.refused || o.finish == "timeout");
    Backlog {
        in_flight_end: r.load.last().map_or(0, |l| l.in_flight),
        in_flight_expected: r.spec.rate * audio_mean,
        in_flight_growth: trend_growth(&in_flight),
        waiting_growth: trend_growth(&waiting),
        waiting_mean: waiting.iter().map(|p| p.1).sum::<f64>() / waiting.len().max(1) as f64,
        bounded: !lost && steady(&in_flight) && steady(&waiting),
    }
}

/// p50 / p95 / p99 in ms; `null` in JSON when there is no value, or when the percentile falls on a
/// request that never got there (∞).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Pcts {
    pub p50: Option<f64>,
    pub p95: Option<f64>,
    pub p99: Option<f64>,
}

impl Pcts {
    fn of(seconds: &[f64]) -> Pcts {
        Self::of_values(&seconds.iter().map(|s| s * 1e3).collect::<Vec<f64>>())
    }

    /// "p50 / p95" (with `p99`, "p50 / p95 / p99") with `decimals` decimals, "-" where there is no
    /// value.
    fn text(&self, decimals: usize, p99: bool) -> String {
        let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.decimals$}"));
        let mut t = format!("{} / {}", f(self.p50), f(self.p95));
        if p99 {
            t.push_str(&format!(" / {}", f(self.p99)));
        }
        t
    }

    /// The percentiles of `values` as they are (not seconds).
    fn of_values(values: &[f64]) -> Pcts {
        let at = |p| Some(percentile(values, p)).filter(|v| v.is_finite());
        Pcts {
            p50: at(50.0),
            p95: at(95.0),
            p99: at(99.0),
        }
    }
}

/// The time to the first chunk in parts, ms (p50 / p95 / p99 of each part over the requests):
/// `queue` scheduled arrival → stage 0 took it; `prefill` the prefill itself; `to_first_frame`
/// prefill end → stage 0's first frame (the batch step it waited for and its own); `stage1`
/// first frame → first chunk out of stage 1 (the pass it waited for and its own).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Parts {
    pub queue: Pcts,
    pub prefill: Pcts,
    pub to_first_frame: Pcts,
    pub stage1: Pcts,
    /// Frames of the pass that decoded the first chunk.
    pub first_pass_frames: Pcts,
}

impl Parts {
    fn of(m: &[&Outcome]) -> Parts {
        let part = |f: &dyn Fn(&Outcome) -> Option<f64>| -> Pcts {
            Pcts::of(&m.iter().filter_map(|o| f(o)).collect::<Vec<f64>>())
        };
        let diff = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| (a - b).max(0.0));
        Parts {
            queue: part(&|o| o.started_s),
            prefill: part(&|o| o.prefill_s),
            to_first_frame: part(&|o| diff(o.first_frame_s, o.prefilled_s)),
            stage1: part(&|o| diff(o.first_chunk_s, o.first_frame_s)),
            first_pass_frames: Pcts::of_values(
                &m.iter()
                    .filter_map(|o| o.first_pass_frames.map(|f| f as f64))
                    .collect::<Vec<f64>>(),
            ),
        }
    }

    /// One line: p50 / p95 of each part.
    pub fn line(&self) -> String {
        let p = |x: &Pcts| x.text(1, false);
        format!(
            "  first audio, p50 / p95 ms: queue {} | prefill {} | to first frame {} | stage 1 {} | first pass frames {}",
            p(&self.queue),
            p(&self.prefill),
            p(&self.to_first_frame),
            p(&self.stage1),
            p(&self.first_pass_frames)
        )
    }
}

/// A request's second chunk, ms (p50 / p95 / p99 over the requests): needed as soon as the first
/// chunk has played, the chunk with the least slack (with the default ramp one frame, needed 80
/// ms after the first audio; with `OMNITTS_CHUNK_RAMP=twice` two frames in that time).
/// `frames_ready`: its frames ready on stage 0 after the first chunk arrived (negative: before it);
/// `stage1`: its audio after its frames; `late_by`: its arrival after the player needed it
/// (negative: in time by that much).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SecondChunk {
    pub frames_ready: Pcts,
    pub stage1: Pcts,
    pub late_by: Pcts,
}

impl SecondChunk {
    fn of(m: &[&Outcome]) -> SecondChunk {
        let of = |f: &dyn Fn(&ChunkTimes, f64) -> f64| {
            Pcts::of(
                &m.iter()
                    .filter_map(|o| Some(f(o.chunk_times.get(1)?, o.first_chunk_s?)))
                    .collect::<Vec<f64>>(),
            )
        };
        SecondChunk {
            frames_ready: of(&|c, first| c.frames_ready_s - first),
            stage1: of(&|c, _| c.arrival_s - c.frames_ready_s),
            late_by: of(&|c, _| c.arrival_s - c.needed_s),
        }
    }
}

/// The figures of one rate: one run (a seed) or several together.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub rate_per_s: f64,
    pub seeds: Vec<u64>,
    /// Measured requests scheduled (the warm-up's are not counted anywhere here).
    pub requests: usize,
    /// Ended by themselves (EOS, length, guard).
    pub finished: usize,
    pub refused: usize,
    /// Still running at the drain deadline (cancelled).
    pub timed_out: usize,
    /// Failed or cancelled otherwise.
    pub errors: usize,
    /// Ended by EOS (with a fixed length: before their drawn length).
    pub ended_by_eos: usize,
    /// Ended with audio that never reached the audible level.
    pub inaudible: usize,
    /// Scheduled arrival → arrival of the chunk holding the audible onset.
    pub ttfa_audible_ms: Pcts,
    /// Scheduled arrival → arrival of the first chunk, audible or not.
    pub ttfa_first_chunk_ms: Pcts,
    /// Scheduled arrival → the audible onset played on the playback timeline (its chunk's play
    /// start + its offset in the chunk): the serving benchmark's "audible TTFA".
    pub ttfa_audible_played_ms: Pcts,
    /// Scheduled arrival → `Finished`.
    pub e2e_ms: Pcts,
    /// Where the first audio waited: the parts of the time to the first chunk.
    pub first_audio_parts: Parts,
    pub underruns: usize,
    pub requests_with_underruns: usize,
    /// Underruns by the late chunk's place: the second chunk, the third, the fourth, the fifth,
    /// and any later one (with the default chunk ramp 1, 2, 4 and 8 frames, then 16 or more).
    pub underruns_by_chunk: [usize; 5],
    /// Of the late chunks whose frames the engine timed: those whose frames were ready before
    /// the player needed them (stage 1 made them late), and the others (stage 0 did).
    pub late_on_stage1: usize,
    pub late_on_stage0: usize,
    /// The second chunks' timing.
    pub second_chunk: SecondChunk,
    pub stalled_ms_max: f64,
    pub audio_s_mean: f64,
    /// Submit returned − scheduled arrival (the load generator's own delay), ms.
    pub submit_lag_ms_p99: f64,
    pub submit_lag_ms_max: f64,
    /// Per run (seed), in the order of `seeds`.
    pub backlog: Vec<Backlog>,
    /// Every run's backlog bounded.
    pub bounded: bool,
    /// Highest GPU memory seen, MiB (CUDA devices with `nvidia-smi` only).
    pub gpu_memory_peak_mib: Option<u64>,
}

impl Summary {
    /// No measured request underran, was refused, timed out or failed.
    pub fn clean(&self) -> bool {
        self.underruns == 0 && self.refused == 0 && self.timed_out == 0 && self.errors == 0
    }
}

/// The figures of `runs` (of one rate) taken together.
pub fn summarize(runs: &[RunResult]) -> Summary {
    let m: Vec<&Outcome> = runs
        .iter()
        .flat_map(|r| r.outcomes.iter())
        .filter(|o| o.measured)
        .collect();
    let lat = |f: fn(&Outcome) -> Option<f64>| -> Vec<f64> {
        m.iter()
            .filter(|o| !o.refused)
            .filter_map(|o| o.latency(f(o)))
            .collect()
    };
    let count = |f: fn(&Outcome) -> bool| m.iter().filter(|o| f(o)).count();
    let admitted: Vec<&Outcome> = m.iter().copied().filter(|o| !o.refused).collect();
    let lags: Vec<f64> = admitted.iter().map(|o| o.lag_s * 1e3).collect();
    let backlog: Vec<Backlog> = runs.iter().map(backlog).collect();
    Summary {
        rate_per_s: runs.first().map_or(f64::NAN, |r| r.spec.rate),
        seeds: runs.iter().map(|r| r.spec.seed).collect(),
        requests: m.len(),
        finished: count(|o| o.finished()),
        refused: count(|o| o.refused),
        timed_out: count(|o| o.finish == "timeout"),
        errors: count(|o| matches!(o.finish, "error" | "cancelled")),
        ended_by_eos: count(|o| o.finish == "eos"),
        inaudible: count(|o| o.finished() && o.audible_s.is_none()),
        ttfa_audible_ms: Pcts::of(&lat(|o| o.audible_s)),
        ttfa_first_chunk_ms: Pcts::of(&lat(|o| o.first_chunk_s)),
        ttfa_audible_played_ms: Pcts::of(&lat(|o| o.audible_played_s)),
        e2e_ms: Pcts::of(&lat(|o| o.end_s)),
        first_audio_parts: Parts::of(&admitted),
        underruns: m.iter().map(|o| o.late_chunks.len()).sum(),
        requests_with_underruns: count(|o| !o.late_chunks.is_empty()),
        underruns_by_chunk: by_chunk(&m),
        late_on_stage1: late_where(&m, true),
        late_on_stage0: late_where(&m, false),
        second_chunk: SecondChunk::of(&admitted),
        stalled_ms_max: m.iter().map(|o| o.stalled_s * 1e3).fold(0.0, f64::max),
        audio_s_mean: admitted.iter().map(|o| o.audio_s).sum::<f64>()
            / admitted.len().max(1) as f64,
        submit_lag_ms_p99: percentile(&lags, 99.0),
        submit_lag_ms_max: percentile(&lags, 100.0),
        bounded: backlog.iter().all(|b| b.bounded),
        backlog,
        gpu_memory_peak_mib: runs.iter().filter_map(|r| r.gpu_peak_mib).max(),
    }
}

/// [`Summary::underruns_by_chunk`] of `outcomes`.
fn by_chunk(outcomes: &[&Outcome]) -> [usize; 5] {
    let mut n = [0; 5];
    for k in outcomes.iter().flat_map(|o| &o.late_chunks) {
        // Chunk 0 starts the timeline and is never late; chunk 1 is the second.
        n[k.saturating_sub(1).min(4)] += 1;
    }
    n
}

/// The late chunks of `outcomes` whose frames were timed and were ready in time (`on_stage1`),
/// or not.
fn late_where(outcomes: &[&Outcome], on_stage1: bool) -> usize {
    outcomes
        .iter()
        .flat_map(|o| o.late_chunks.iter().filter_map(|&k| o.chunk_times.get(k)))
        .filter(|c| c.late_on_stage1() == on_stage1)
        .count()
}

/// Where the underruns of `s` fell, one line (empty when none did).
pub fn underrun_line(s: &Summary) -> String {
    if s.underruns == 0 {
        return String::new();
    }
    let [second, third, fourth, fifth, later] = s.underruns_by_chunk;
    format!(
        "  underruns by chunk: 2nd {second} | 3rd {third} | 4th {fourth} | 5th {fifth} | later {later}; longest stall {:.0} ms; frames ready in time {} of {}",
        s.stalled_ms_max,
        s.late_on_stage1,
        s.late_on_stage1 + s.late_on_stage0
    )
}

/// The second chunks' timing, one line.
pub fn second_chunk_line(s: &Summary) -> String {
    let c = &s.second_chunk;
    let p = |x: &Pcts| x.text(0, true);
    format!(
        "  2nd chunk, p50 / p95 / p99 ms: frames ready after the first audio {} | stage 1 after its frames {} | arrival after needed {}",
        p(&c.frames_ready),
        p(&c.stage1),
        p(&c.late_by)
    )
}

/// The table's header line.
pub fn table_header() -> String {
    format!(
        "{:>6} {:>5} {:>5} {:>5} {:>4} {:>4} | {:>23} | {:>17} | {:>8} | {:>9} | {:>7} {:>7} {:>7} | {:>7}",
        "rate/s",
        "seed",
        "reqs",
        "done",
        "ref",
        "t/o",
        "TTFA audible p50/95/99",
        "1st chunk p50/95",
        "E2E p95",
        "underruns",
        "inflight",
        "expect",
        "bounded",
        "GPU MiB"
    )
}

/// One line of the table (`seed`: the run's seed, or `all`).
pub fn table_row(s: &Summary, seed: &str) -> String {
    let ms = |v: Option<f64>| v.map_or("inf".to_string(), |v| format!("{v:.0}"));
    let inflight = s.backlog.iter().map(|b| b.in_flight_end).max().unwrap_or(0);
    let expect = s
        .backlog
        .iter()
        .map(|b| b.in_flight_expected)
        .fold(0.0, f64::max);
    let a = &s.ttfa_audible_ms;
    format!(
        "{:>6.1} {:>5} {:>5} {:>5} {:>4} {:>4} | {:>23} | {:>17} | {:>8} | {:>9} | {:>7} {:>7.1} {:>7} | {:>7}",
        s.rate_per_s,
        seed,
        s.requests,
        s.finished,
        s.refused,
        s.timed_out,
        format!("{} / {} / {}", ms(a.p50), ms(a.p95), ms(a.p99)),
        format!(
            "{} / {}",
            ms(s.ttfa_first_chunk_ms.p50),
            ms(s.ttfa_first_chunk_ms.p95)
        ),
        ms(s.e2e_ms.p95),
        format!("{} ({})", s.underruns, s.requests_with_underruns),
        inflight,
        expect,
        if s.bounded { "yes" } else { "NO" },
        s.gpu_memory_peak_mib
            .map_or("-".to_string(), |m| m.to_string())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentences_have_10_to_13_words() {
        assert!(SENTENCES.len() >= 20);
        for s in SENTENCES {
            let words = s.split_whitespace().count();
            assert!((10..=13).contains(&words), "{words} words: {s}");
        }
    }

    #[test]
    fn schedule_is_seeded_poisson_with_drawn_lengths() {
        let a = schedule(20.0, 1, 10.0, 50.0);
        assert_eq!(a, schedule(20.0, 1, 10.0, 50.0), "same seed, same schedule");
        assert_ne!(
            a,
            schedule(20.0, 2, 10.0, 50.0),
            "another seed, another schedule"
        );
        // 60 s at 20/s: 1200 expected, sd ≈ 35.
        assert!((1_100..1_300).contains(&a.len()), "{} arrivals", a.len());
        assert!(a.windows(2).all(|w| w[0].at_s <= w[1].at_s));
        assert!(
            a.iter()
                .all(|p| p.at_s < 60.0 && p.measured == (p.at_s >= 10.0))
        );
        let warm = a.iter().filter(|p| !p.measured).count();
        assert!((150..250).contains(&warm), "{warm} warm-up arrivals");
        assert!(a.iter().all(|p| FRAMES.contains(&p.frames)));
        assert!(a.iter().any(|p| p.frames == 30) && a.iter().any(|p| p.frames == 80));
        // Gaps are exponential: their coefficient of variation is about 1 (0 for a fixed pace).
        let gaps: Vec<f64> = a.windows(2).map(|w| w[1].at_s - w[0].at_s).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let sd = (gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64).sqrt();
        assert!((sd / mean - 1.0).abs() < 0.1, "cv {}", sd / mean);
        // Request i has the same content at another rate.
        let b = schedule(40.0, 1, 10.0, 50.0);
        assert_eq!(
            (a[5].sentence, a[5].frames, a[5].seed),
            (b[5].sentence, b[5].frames, b[5].seed)
        );
    }

    #[test]
    fn trend_growth_tells_a_growing_queue_from_a_steady_one() {
        // 60 s sampled every 0.1 s.
        let t = |i: usize| i as f64 * 0.1;
        let growing: Vec<(f64, f64)> = (0..=600).map(|i| (t(i), (t(i) * 2.0).floor())).collect();
        assert!((trend_growth(&growing) - 120.0).abs() < 1.0);
        assert!(!steady(&growing));
        // A level of 20 with a ±5 wobble.
        let wobble: Vec<(f64, f64)> = (0..=600)
            .map(|i| (t(i), 20.0 + 5.0 * (t(i) * 1.3).sin()))
            .collect();
        assert!(trend_growth(&wobble).abs() < 2.0);
        assert!(steady(&wobble));
        assert_eq!(trend_growth(&[(0.0, 3.0)]), 0.0);
    }

    fn outcome(finish: &'static str, audible_s: Option<f64>, late_chunks: &[usize]) -> Outcome {
        Outcome {
            measured: true,
            refused: finish == "refused",
            lag_s: 0.0,
            first_chunk_s: audible_s,
            audible_s,
            audible_played_s: audible_s,
            end_s: (finish != "timeout").then_some(3.0),
            audio_s: 3.0,
            late_chunks: late_chunks.to_vec(),
            stalled_s: 0.0,
            started_s: None,
            prefilled_s: None,
            first_frame_s: None,
            prefill_s: None,
            first_pass_frames: None,
            chunk_times: Vec::new(),
            finish,
        }
    }

    /// The first audio's parts are the gaps between the engine's timestamps, per request.
    #[test]
    fn parts_split_the_time_to_the_first_chunk() {
        let mut a = outcome("length", Some(0.030), &[]);
        (a.started_s, a.prefill_s, a.prefilled_s) = (Some(0.010), Some(0.005), Some(0.015));
        (a.first_frame_s, a.first_pass_frames) = (Some(0.020), Some(3));
        let p = Parts::of(&[&a]);
        let near = |v: Option<f64>, want: f64| v.is_some_and(|v| (v - want).abs() < 1e-9);
        assert!(near(p.queue.p50, 10.0), "{:?}", p.queue);
        assert!(near(p.prefill.p50, 5.0), "{:?}", p.prefill);
        assert!(near(p.to_first_frame.p50, 5.0), "{:?}", p.to_first_frame);
        assert!(near(p.stage1.p50, 10.0), "{:?}", p.stage1);
        assert!(
            near(p.first_pass_frames.p95, 3.0),
            "{:?}",
            p.first_pass_frames
        );
        // A request without the engine's timing adds nothing.
        let b = outcome("refused", None, &[]);
        assert_eq!(Parts::of(&[&b]).queue.p50, None);
    }

    /// A chunk's frames are ready when its last frame is; a late chunk whose frames were ready
    /// before the player needed it was late on stage 1.
    #[test]
    fn chunk_times_tell_which_stage_made_a_chunk_late() {
        let spf = 1920;
        // Chunks of 1, 2 and 4 frames; the second needed at 0.18 s and arriving at 0.20 s.
        let lens = [spf, 2 * spf, 4 * spf];
        let arrivals = [0.1, 0.2, 0.25];
        let mut offset = 0;
        let chunks: Vec<Chunk> = lens
            .iter()
            .zip(arrivals)
            .map(|(&len, arrival_s)| {
                let c = Chunk {
                    arrival_s,
                    offset,
                    len,
                };
                offset += len as u64;
                c
            })
            .collect();
        let play = playback::play(&chunks, 24_000);
        // Five frames timed (ms after submit, 10 ms after the scheduled arrival): the third
        // chunk's last frame (the seventh) is not among them.
        let ready = [40.0, 60.0, 140.0, 150.0, 160.0];
        let t = ChunkTimes::of(&chunks, &play, &ready, 0.010, spf);
        assert_eq!(t.len(), 2, "{t:?}");
        assert!((t[0].frames_ready_s - 0.05).abs() < 1e-9);
        assert!((t[1].frames_ready_s - 0.15).abs() < 1e-9, "the third frame");
        assert!((t[1].needed_s - 0.18).abs() < 1e-9);
        assert!(t[1].late_on_stage1());
        let mut o = outcome("length", Some(0.1), &play.late_chunks);
        o.chunk_times = t;
        let c = SecondChunk::of(&[&o]);
        let near = |v: Option<f64>, want: f64| v.is_some_and(|v| (v - want).abs() < 1e-6);
        assert!(near(c.frames_ready.p50, 50.0), "{c:?}");
        assert!(near(c.stage1.p50, 50.0), "{c:?}");
        assert!(near(c.late_by.p50, 20.0), "{c:?}");
        assert_eq!((late_where(&[&o], true), late_where(&[&o], false)), (1, 0));
        // Frames ready only after the chunk was needed: stage 0 made it late.
        let slow = [40.0, 60.0, 185.0];
        o.chunk_times = ChunkTimes::of(&chunks, &play, &slow, 0.010, spf);
        assert_eq!((late_where(&[&o], true), late_where(&[&o], false)), (0, 1));
    }

    #[test]
    fn summary_counts_timeouts_as_infinite_and_leaves_refusals_out() {
        let mut outcomes: Vec<Outcome> = (1..=8)
            .map(|i| outcome("length", Some(i as f64 * 0.1), &[]))
            .collect();
        outcomes.push(outcome("timeout", None, &[]));
        outcomes.push(outcome("refused", None, &[]));
        outcomes.push(outcome("length", None, &[])); // silent audio
        outcomes.push(outcome("eos", Some(0.05), &[1, 6]));
        let mut warm = outcome("length", Some(9.0), &[1, 2, 3, 4, 5]);
        warm.measured = false;
        outcomes.push(warm);
        let load = (0..=10)
            .map(|i| LoadSample {
                t_s: i as f64,
                in_flight: 3,
                waiting: 0,
            })
            .collect();
        let r = RunResult {
            spec: RunSpec {
                rate: 2.0,
                seed: 7,
                warmup_s: 1.0,
                duration_s: 10.0,
                drain_s: 1.0,
                fixed_length: true,
                greedy: false,
                initial_chunk_frames: None,
                chunk_frames: None,
            },
            outcomes,
            load,
            gpu_peak_mib: None,
        };
        let s = summarize(std::slice::from_ref(&r));
        assert_eq!(s.requests, 12);
        assert_eq!(s.finished, 10);
        assert_eq!(
            (s.refused, s.timed_out, s.inaudible, s.ended_by_eos),
            (1, 1, 1, 1)
        );
        // Audible values: 0.05, 0.1 … 0.8 and ∞ (the timeout): 10 values.
        assert_eq!(s.ttfa_audible_ms.p50.map(f64::round), Some(400.0));
        assert_eq!(s.ttfa_audible_ms.p95, None, "the timed-out request is ∞");
        assert_eq!((s.underruns, s.requests_with_underruns), (2, 1));
        // The measured request's second and seventh chunks; the warm-up's five are not counted.
        assert_eq!(s.underruns_by_chunk, [1, 0, 0, 0, 1]);
        assert!(underrun_line(&s).contains("2nd 1 | 3rd 0 | 4th 0 | 5th 0 | later 1"));
        assert!(
            !s.bounded,
            "a refusal and a timeout are not a bounded backlog"
        );
        assert!(!s.clean());
        assert_eq!(s.backlog[0].in_flight_end, 3);
        assert!((s.backlog[0].in_flight_expected - 6.0).abs() < 1e-9);
    }
}
