//! The reference sampler, in its order: on the **untempered** logits, sort descending, drop the
//! tokens past `top_k` and every token whose cumulative probability (inclusive of itself)
//! exceeds `top_p` — so the token that crosses `top_p` is dropped too, the first is always kept —
//! then divide the kept logits by the temperature (at least 1e-5) and softmax. A draw is
//! `argmax(p_i / q_i)` with `q_i ~ Exp(1)` (a sample from `p`). `top_k = 1` is greedy (argmax).
//!
//! Repetition-aware sampling (the slow AR's main token only): a second draw at temperature 1.0
//! and top_p 0.9 replaces the first when the first is a semantic token already among the last
//! [`RAS_WINDOW`] main tokens of the decode steps.

use rand::Rng;

/// The repetition-aware window, in frames.
pub const RAS_WINDOW: usize = 10;
/// Temperature of the repetition-aware redraw.
pub const RAS_TEMPERATURE: f32 = 1.0;
/// top_p of the repetition-aware redraw.
pub const RAS_TOP_P: f32 = 0.9;

/// Sampling settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    /// In (0, 1].
    pub top_p: f32,
    /// ≥ 1; 1 is greedy.
    pub top_k: usize,
}

impl SamplingParams {
    /// Greedy decoding.
    pub const GREEDY: Self = Self {
        temperature: 0.7,
        top_p: 0.9,
        top_k: 1,
    };

    /// The reference's defaults (`generate_long`): temperature 1.0, top_p 0.9, top_k 30.
    pub const REFERENCE_DEFAULT: Self = Self {
        temperature: 1.0,
        top_p: 0.9,
        top_k: 30,
    };

    /// The same filters with other temperature/top_p (the repetition-aware redraw).
    pub fn with(self, temperature: f32, top_p: f32) -> Self {
        Self {
            temperature,
            top_p,
            ..self
        }
    }
}

/// Index of the largest value (the first of equal maxima).
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

fn softmax(x: &[f32]) -> Vec<f32> {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = x.iter().map(|&v| (v - max).exp()).collect();
    let sum = e.iter().map(|&v| v as f64).sum::<f64>() as f32;
    e.into_iter().map(|v| v / sum).collect()
}

/// The probabilities the reference samples from (see the module docs).
pub fn logits_to_probs(logits: &[f32], p: SamplingParams) -> Vec<f32> {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    let sorted: Vec<f32> = order.iter().map(|&i| logits[i]).collect();
    let probs = softmax(&sorted);
    let mut cum = 0f64; // the reference's CPU cumsum accumulates in double
    let mut masked = vec![f32::NEG_INFINITY; logits.len()];
    let temp = p.temperature.max(1e-5);
    for (rank, (&i, &pr)) in order.iter().zip(&probs).enumerate() {
        cum += pr as f64;
        let remove = rank > 0 && ((cum as f32) > p.top_p || rank >= p.top_k);
        if !remove {
            masked[i] = logits[i] / temp;
        }
    }
    softmax(&masked)
}

/// One draw: greedy when `top_k` is 1, else `argmax(p / q)` with `q ~ Exp(1)` from `rng`.
pub fn sample(logits: &[f32], p: SamplingParams, rng: &mut impl Rng) -> usize {
    if p.top_k <= 1 {
        return argmax(logits);
    }
    let probs = logits_to_probs(logits, p);
    let mut best = (0, f32::NEG_INFINITY);
    for (i, &pr) in probs.iter().enumerate() {
        let u: f32 = rng.random::<f32>();
        let q = -(1.0 - u).ln(); // Exp(1), u in [0, 1)
        let score = pr / q;
        if score > best.1 {
            best = (i, score);
        }
    }
    best.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn crossing_token_is_dropped_and_first_kept() {
        // probabilities ≈ [0.5, 0.3, 0.2]: top_p 0.6 keeps only the first (0.8 > 0.6 drops the second)
        let l = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
        let p = logits_to_probs(
            &l,
            SamplingParams {
                temperature: 1.0,
                top_p: 0.6,
                top_k: 30,
            },
        );
        assert_eq!(p, [1.0, 0.0, 0.0]);
        let p = logits_to_probs(
            &l,
            SamplingParams {
                temperature: 1.0,
                top_p: 0.01,
                top_k: 30,
            },
        );
        assert_eq!(p, [1.0, 0.0, 0.0]);
        let p = logits_to_probs(
            &l,
            SamplingParams {
                temperature: 1.0,
                top_p: 0.9,
                top_k: 30,
            },
        );
        assert!((p[0] - 0.625).abs() < 1e-6 && p[2] == 0.0);
    }

    #[test]
    fn seeded_draws_repeat_and_greedy_is_argmax() {
        let l: Vec<f32> = (0..50).map(|i| ((i * 7919) % 23) as f32 / 5.0).collect();
        let p = SamplingParams {
            temperature: 0.8,
            top_p: 0.95,
            top_k: 20,
        };
        let draw = |seed| {
            let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            (0..20).map(|_| sample(&l, p, &mut r)).collect::<Vec<_>>()
        };
        assert_eq!(draw(3), draw(3));
        let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        assert_eq!(sample(&l, SamplingParams::GREEDY, &mut r), argmax(&l));
    }
}
