//! `bench_gpu --rows N,…`: stage 0 alone stepping N streams together with `ArModel::next_frames`
//! (the batched frame graphs on CUDA), no Code2Wav beside it: ms per step of the whole batch and
//! the stage-0 capacity it gives (N × 80 ms of audio per step). The N prompts start as a burst
//! does in the engine: built, then prefilled together in batched passes, each part timed. With
//! `--profile step`, one step in the middle of each timed run is the CUDA profiler's range (`ncu
//! --profile-from-start off`), so the kernels of exactly one batched frame can be summed against
//! its wall time; with `--profile prefill`, the start's prefill is. Each N also reports
//! how a step splits between the replay (launch to read-back) and the host's work around it
//! (`StepTiming::host_ms`).

use std::time::Instant;

use anyhow::{Result, bail};
use gstomnitts::models::qwen3_tts::{
    ArModel, ArSession, ArStep, PendingSession, SamplingParams, VoiceRequest,
};
use serde_json::{Value, json};

use crate::cuda_profiler::profiler_range;

/// The work `bench_gpu --rows … --profile` marks as the CUDA profiler's range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Profiled {
    /// One batched step in the middle of each timed run.
    Step,
    /// The start's batched prefill of every prompt.
    Prefill,
}

/// One batched step of every session; errors if a session finished (EOS is unreachable here).
fn step(ar: &ArModel, sessions: &mut [ArSession<'_>]) -> Result<()> {
    let mut refs: Vec<&mut ArSession<'_>> = sessions.iter_mut().collect();
    for r in ar.next_frames(&mut refs) {
        match r? {
            ArStep::Frame(_) => {}
            ArStep::Finished(reason) => bail!("a stream finished early ({reason:?})"),
        }
    }
    Ok(())
}

/// `n` sessions of `req` started as one engine step starts a burst of arrivals: every prompt
/// built ([`ArModel::begin`]), then all prefilled in one [`ArModel::prefill_steps`] (batched passes
/// of one length class, as stage 0 runs them). Returns the sessions, the milliseconds the prompts
/// took to build and the milliseconds of the prefill (which reads its logits back, so the device's
/// work is in it). With `profile`, the prefill is the CUDA profiler's range.
fn start_together<'m>(
    ar: &'m ArModel,
    req: &VoiceRequest,
    sampling: &SamplingParams,
    n: usize,
    profile: bool,
) -> Result<(Vec<ArSession<'m>>, f64, f64)> {
    let t = Instant::now();
    let mut pending = (0..n)
        .map(|_| ar.begin(req, sampling))
        .collect::<Result<Vec<_>, _>>()?;
    let begin_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    if profile {
        profiler_range(true);
    }
    let mut steps: Vec<(&mut PendingSession<'m>, usize)> =
        pending.iter_mut().map(|p| (p, usize::MAX)).collect();
    let results = ar.prefill_steps(&mut steps);
    if profile {
        profiler_range(false);
    }
    let prefill_ms = t.elapsed().as_secs_f64() * 1e3;
    for r in results {
        if !r? {
            bail!("a prompt was not prefilled whole");
        }
    }
    let sessions = pending
        .into_iter()
        .map(PendingSession::into_session)
        .collect::<Result<Vec<_>, _>>()?;
    Ok((sessions, begin_ms, prefill_ms))
}

/// For each N in `rows`: N sessions of `req` started together ([`start_together`]), 3 warm-up
/// steps, then `frames` timed steps. Returns one JSON object per N (`rows`, `ms_per_step`,
/// `audio_s_per_s`, `begin_ms` and `prefill_ms` of the start, and the step's mean `replay_ms` and
/// `host_ms`).
pub fn bench_rows(
    ar: &ArModel,
    req: &VoiceRequest,
    sampling: &SamplingParams,
    rows: &[usize],
    frames: usize,
    profile: Option<Profiled>,
) -> Result<Vec<Value>> {
    let mut sp = sampling.clone();
    sp.max_new_tokens = frames + 8;
    let mut out = Vec::new();
    for &n in rows {
        let (mut sessions, begin_ms, prefill_ms) =
            start_together(ar, req, &sp, n, profile == Some(Profiled::Prefill))?;
        for _ in 0..3 {
            step(ar, &mut sessions)?;
        }
        let (mut host_ms, mut replay_ms) = (0.0, 0.0);
        let t = Instant::now();
        for i in 0..frames {
            let marked = profile == Some(Profiled::Step) && i == frames / 2;
            if marked {
                profiler_range(true);
            }
            step(ar, &mut sessions)?;
            if marked {
                profiler_range(false);
            }
            if let Some(s) = sessions.first() {
                let timing = s.last_timing();
                host_ms += timing.host_ms;
                replay_ms += timing.code_predictor_ms + timing.talker_ms;
            }
        }
        let ms_per_step = t.elapsed().as_secs_f64() * 1e3 / frames.max(1) as f64;
        let audio_s_per_s = n as f64 * 0.08 / (ms_per_step / 1e3);
        let (host_ms, replay_ms) = (
            host_ms / frames.max(1) as f64,
            replay_ms / frames.max(1) as f64,
        );
        eprintln!(
            "stage 0 alone, {n} rows: {ms_per_step:.2} ms a step ({replay_ms:.2} the replay or \
             device passes to their read-back, {host_ms:.2} the host's part of a batched step), \
             {audio_s_per_s:.1} audio-s/s (prompts built in {begin_ms:.1} ms, prefilled together \
             in {prefill_ms:.1} ms)"
        );
        out.push(json!({
            "rows": n, "ms_per_step": ms_per_step, "audio_s_per_s": audio_s_per_s,
            "begin_ms": begin_ms, "prefill_ms": prefill_ms, "frames": frames, "host_ms": host_ms,
            "replay_ms": replay_ms,
        }));
    }
    Ok(out)
}
