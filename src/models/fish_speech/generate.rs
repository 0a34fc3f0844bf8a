//! Generation of one request's frames: prefill, then one frame per step until `<|im_end|>` or
//! the cap, as the reference's `generate` + `generate_long` do.
//!
//! - The prefill's frame is kept without a stop check; every later frame whose main token is
//!   `<|im_end|>` stops generation.
//! - The last frame is dropped — the `<|im_end|>` frame when generation stopped, the last
//!   generated one when it hit the cap (the reference does both).
//! - The cap: `max_new_tokens` frames (0: up to `max_seq_len`), never past `max_seq_len`; a
//!   prompt longer than `max_seq_len − 2048` positions is refused.
//! - The main token is sampled from the allowed logits (semantic + `<|im_end|>`), with the
//!   repetition-aware redraw from the second frame on (the prefill's frame is not in the window);
//!   codes 1..=9 come from the fast AR with the same settings.

use candle_core::Tensor;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::error::{FishError, Result};
use super::fast_ar::FastAr;
use super::prompt::{Codes, Prompt};
use super::sampler::{RAS_TEMPERATURE, RAS_TOP_P, RAS_WINDOW, SamplingParams, sample};
use super::slow_ar::SlowAr;

/// Positions the reference keeps free after the prompt.
pub const PROMPT_HEADROOM: usize = 2048;

/// Generation settings.
#[derive(Debug, Clone, Copy)]
pub struct GenerateOptions {
    pub sampling: SamplingParams,
    /// Frames to generate at most (0: up to `max_seq_len`).
    pub max_new_tokens: usize,
    /// Seed of the draws (unused when greedy).
    pub seed: u64,
}

/// What [`generate`] produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Generated {
    /// `[num_codebooks][frames]`, the last generated frame dropped.
    pub codes: Codes,
    /// Whether a frame's main token was `<|im_end|>`.
    pub stopped: bool,
    /// Frames generated, the dropped one included.
    pub frames_generated: usize,
}

/// Debug values of the first frame.
#[derive(Debug, Clone, Default)]
pub struct FirstFrame {
    /// The prefill's allowed logits `[num_semantic + 1]`.
    pub prefill_logits: Option<Tensor>,
    /// Its final-normed hidden state as the fast AR takes it (after `project_in` when the
    /// widths differ; the reference's `hidden_states`) `[fast dim]`.
    pub prefill_fast_input: Option<Tensor>,
    /// The fast AR's logits of steps 1..=9.
    pub fast_logits: Vec<Tensor>,
}

/// The main token of a frame from its allowed logits `l`: a draw with `sampling` and, always, a
/// second at the repetition-aware settings, which replaces the first when `window` is given and
/// holds the first (a semantic token). Two draws from `rng` either way, as the reference makes.
pub fn main_token(
    slow: &SlowAr,
    l: &[f32],
    sampling: SamplingParams,
    window: Option<&[u32]>,
    rng: &mut ChaCha8Rng,
) -> u32 {
    let normal = slow.allowed_token(sample(l, sampling, rng));
    let high = slow.allowed_token(sample(l, sampling.with(RAS_TEMPERATURE, RAS_TOP_P), rng));
    match window {
        Some(w) if slow.is_semantic(normal) && w.contains(&normal) => high,
        _ => normal,
    }
}

/// One frame of every row: the main token (sampled with the repetition-aware redraw where
/// `windows[row]` is given) and the fast AR's codes. `logits`/`hidden` from [`SlowAr::forward`].
/// Returns per row `(main token, codes[num_codebooks])`.
pub fn frame_rows(
    (slow, fast): (&SlowAr, &FastAr),
    logits: &Tensor,
    hidden: &Tensor,
    sampling: SamplingParams,
    windows: &[Option<&[u32]>],
    rng: &mut ChaCha8Rng,
    debug: Option<&mut FirstFrame>,
) -> Result<Vec<(u32, Vec<u32>)>> {
    let rows: Vec<Vec<f32>> = logits.to_vec2()?;
    let mut mains = Vec::with_capacity(rows.len());
    for (r, l) in rows.iter().enumerate() {
        let window = windows.get(r).copied().flatten();
        mains.push(main_token(slow, l, sampling, window, rng));
    }
    let code0: Vec<u32> = mains.iter().map(|&t| slow.code0(t)).collect();
    let fast_logits = debug.map(|d| &mut d.fast_logits);
    let rest = fast.frame(
        hidden,
        &code0,
        |_, l| {
            let l: Vec<Vec<f32>> = l.to_vec2()?;
            Ok(l.iter()
                .map(|row| sample(row, sampling, rng) as u32)
                .collect())
        },
        fast_logits,
    )?;
    Ok(frames(mains, code0, rest))
}

/// Each row's `(main token, codes)`: its code 0 followed by the fast AR's codes 1.. (`rest[row]`).
pub fn frames(mains: Vec<u32>, code0: Vec<u32>, rest: Vec<Vec<u32>>) -> Vec<(u32, Vec<u32>)> {
    mains
        .into_iter()
        .zip(code0)
        .zip(rest)
        .map(|((m, c0), rest)| {
            let mut codes = vec![c0];
            codes.extend(rest);
            (m, codes)
        })
        .collect()
}

/// Generates the frames of `prompt` (one sequence).
pub fn generate(
    slow: &SlowAr,
    fast: &FastAr,
    prompt: &Prompt,
    opts: &GenerateOptions,
    mut debug: Option<&mut FirstFrame>,
) -> Result<Generated> {
    let t = prompt.len();
    let max_len = slow.max_seq_len();
    if t == 0 {
        return Err(FishError::InvalidRequest {
            field: "prompt",
            msg: "empty".into(),
        });
    }
    if t > max_len.saturating_sub(PROMPT_HEADROOM) {
        return Err(FishError::InvalidRequest {
            field: "prompt",
            msg: format!("{t} positions: longer than max_seq_len {max_len} − {PROMPT_HEADROOM}"),
        });
    }
    let max_new = if opts.max_new_tokens == 0 || t + opts.max_new_tokens > max_len {
        max_len - t
    } else {
        opts.max_new_tokens
    };
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed);
    let mut cache = slow.new_cache();
    let x = slow.embed(&[&prompt.rows])?;
    let (logits, hidden) = slow.forward(&x, &mut cache)?;
    if let Some(d) = debug.as_deref_mut() {
        d.prefill_logits = Some(logits.squeeze(0)?);
        d.prefill_fast_input = Some(fast.project(&hidden)?.squeeze(0)?);
    }
    let first = frame_rows(
        (slow, fast),
        &logits,
        &hidden,
        opts.sampling,
        &[None],
        &mut rng,
        debug,
    )?;
    let mut frames = vec![first[0].clone()];
    let mut window: Vec<u32> = Vec::with_capacity(RAS_WINDOW);
    let mut stopped = false;
    for _ in 1..max_new {
        let (main, codes) = frames.last().cloned().unwrap_or_default();
        let mut rows = vec![vec![main]];
        rows.extend(codes.iter().map(|&c| vec![c]));
        let x = slow.embed(&[&rows])?;
        let (logits, hidden) = slow.forward(&x, &mut cache)?;
        let w = window.clone();
        let next = frame_rows(
            (slow, fast),
            &logits,
            &hidden,
            opts.sampling,
            &[Some(&w)],
            &mut rng,
            None,
        )?;
        let (main, _) = next[0].clone();
        if window.len() == RAS_WINDOW {
            window.remove(0);
        }
        window.push(main);
        frames.push(next[0].clone());
        if main == slow.im_end() {
            stopped = true;
            break;
        }
    }
    let frames_generated = frames.len();
    frames.pop();
    let ncb = frames
        .first()
        .map_or(0, |f| f.1.len())
        .max(first[0].1.len());
    let mut codes: Codes = vec![Vec::with_capacity(frames.len()); ncb];
    for (_, c) in &frames {
        for (row, &v) in codes.iter_mut().zip(c) {
            row.push(v);
        }
    }
    Ok(Generated {
        codes,
        stopped,
        frames_generated,
    })
}
