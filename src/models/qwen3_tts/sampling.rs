//! Logits processing and token choice, exactly in the order Hugging Face `generate` applies it
//! for the reference (transformers 4.57 `_get_logits_processor` + `_sample`; docs/qwen3-tts.md §5):
//!
//! talker codebook 0: repetition penalty over the codebook-0 ids generated so far →
//! min-new-tokens (EOS masked while fewer than `min_new_tokens` tokens exist) → suppression of
//! `[vocab-1024, vocab)` except EOS → (sampling only) temperature → top-k → top-p → softmax →
//! multinomial; greedy = first argmax after the processors.
//!
//! code predictor (codebooks 1..): no processors; (sampling only) temperature → top-k → top-p.
//!
//! All arithmetic is f32 like the reference (its logits are cast to f32 before processing).
//! The random source is a seedable ChaCha20 stream; torch's RNG stream is not reproduced, so
//! only greedy decoding is bit-comparable with the reference.

use std::collections::BTreeSet;

use rand::Rng;
use rand_chacha::ChaCha20Rng;

/// `RepetitionPenaltyLogitsProcessor`: for every distinct id in `history`, a negative logit is
/// multiplied by `penalty`, a non-negative one divided by it. No-op for `penalty == 1`.
pub fn apply_repetition_penalty(logits: &mut [f32], history: &[u32], penalty: f32) {
    if penalty == 1.0 {
        return;
    }
    let distinct: BTreeSet<u32> = history.iter().copied().collect();
    for id in distinct {
        if let Some(x) = logits.get_mut(id as usize) {
            *x = if *x < 0.0 { *x * penalty } else { *x / penalty };
        }
    }
}

/// `MinNewTokensLengthLogitsProcessor`: EOS gets -inf while `generated < min_new_tokens`.
pub fn apply_min_new_tokens(logits: &mut [f32], generated: usize, min_new_tokens: usize, eos: u32) {
    if generated < min_new_tokens
        && let Some(x) = logits.get_mut(eos as usize)
    {
        *x = f32::NEG_INFINITY;
    }
}

/// `SuppressTokensLogitsProcessor` with the reference's list: every id in
/// `[vocab-1024, vocab)` except `eos` gets -inf.
pub fn apply_control_suppression(logits: &mut [f32], eos: u32) {
    let vocab = logits.len();
    for (id, x) in logits
        .iter_mut()
        .enumerate()
        .skip(vocab.saturating_sub(1024))
    {
        if id != eos as usize {
            *x = f32::NEG_INFINITY;
        }
    }
}

/// `TemperatureLogitsWarper` (skipped for 1.0).
pub fn apply_temperature(logits: &mut [f32], temperature: f32) {
    if temperature == 1.0 {
        return;
    }
    logits.iter_mut().for_each(|x| *x /= temperature);
}

/// `TopKLogitsWarper`: keeps every logit >= the k-th largest (ties kept), -inf elsewhere.
/// Skipped for `k == 0` or `k >= len`.
pub fn apply_top_k(logits: &mut [f32], k: usize) {
    if k == 0 || k >= logits.len() {
        return;
    }
    // The k-th largest value: a selection, not a sort (the same value, in linear time).
    let mut values: Vec<f32> = logits.to_vec();
    let (_, &mut threshold, _) = values.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
    logits.iter_mut().for_each(|x| {
        if *x < threshold {
            *x = f32::NEG_INFINITY
        }
    });
}

/// Softmax in f32 (max-subtracted), -inf → 0.
pub fn softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = logits.iter().map(|x| (x - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}

/// `TopPLogitsWarper` (skipped for `top_p >= 1`): sort ascending, remove the tokens whose
/// cumulative probability is `<= 1 - top_p`, always keeping the most probable one.
pub fn apply_top_p(logits: &mut [f32], top_p: f32) {
    if top_p >= 1.0 {
        return;
    }
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[a].total_cmp(&logits[b]));
    let sorted: Vec<f32> = order.iter().map(|&i| logits[i]).collect();
    let probs = softmax(&sorted);
    let cut = 1.0 - top_p;
    let mut cum = 0f32;
    let last = order.len().saturating_sub(1);
    for (rank, (&i, p)) in order.iter().zip(probs).enumerate() {
        cum += p;
        if cum <= cut && rank != last {
            logits[i] = f32::NEG_INFINITY;
        }
    }
}

/// First index of the maximum (torch.argmax semantics).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Draws an index from `softmax(logits)` (torch.multinomial with one sample).
pub fn sample_multinomial(logits: &[f32], rng: &mut ChaCha20Rng) -> u32 {
    let probs = softmax(logits);
    let total: f64 = probs.iter().map(|&p| p as f64).sum();
    let u: f64 = rng.random::<f64>() * total;
    let mut cum = 0f64;
    let mut last_nonzero = 0usize;
    for (i, &p) in probs.iter().enumerate() {
        if p > 0.0 {
            last_nonzero = i;
            cum += p as f64;
            if u < cum {
                return i as u32;
            }
        }
    }
    last_nonzero as u32
}

/// The warpers and the choice of one generation stream (talker codebook 0 or the subtalker).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenChooser {
    pub do_sample: bool,
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
}

impl TokenChooser {
    /// Applies the warpers (sampling only) and picks a token. `logits` are consumed in place.
    pub fn choose(&self, logits: &mut [f32], rng: &mut ChaCha20Rng) -> u32 {
        if !self.do_sample {
            return argmax(logits);
        }
        apply_temperature(logits, self.temperature);
        apply_top_k(logits, self.top_k);
        apply_top_p(logits, self.top_p);
        sample_multinomial(logits, rng)
    }
}

/// The talker's codebook-0 processors (before the warpers).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TalkerProcessors {
    pub repetition_penalty: f32,
    pub min_new_tokens: usize,
    pub eos: u32,
}

impl TalkerProcessors {
    /// `history`: codebook-0 ids sampled so far in this utterance (EOS never included).
    pub fn apply(&self, logits: &mut [f32], history: &[u32]) {
        apply_repetition_penalty(logits, history, self.repetition_penalty);
        apply_min_new_tokens(logits, history.len(), self.min_new_tokens, self.eos);
        apply_control_suppression(logits, self.eos);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    const NI: f32 = f32::NEG_INFINITY;

    #[test]
    fn repetition_penalty_divides_positive_multiplies_negative_once() {
        let mut l = vec![2.0, -2.0, 1.0, 0.0];
        apply_repetition_penalty(&mut l, &[0, 1, 0, 3], 2.0);
        assert_eq!(l, vec![1.0, -4.0, 1.0, 0.0]);
        let mut l = vec![2.0, -2.0];
        apply_repetition_penalty(&mut l, &[0, 1], 1.0);
        assert_eq!(l, vec![2.0, -2.0]);
    }

    #[test]
    fn min_new_tokens_masks_eos_until_reached() {
        let mut l = vec![0.0; 4];
        apply_min_new_tokens(&mut l, 1, 2, 2);
        assert_eq!(l, vec![0.0, 0.0, NI, 0.0]);
        let mut l = vec![0.0; 4];
        apply_min_new_tokens(&mut l, 2, 2, 2);
        assert_eq!(l, vec![0.0; 4]);
    }

    #[test]
    fn suppression_covers_last_1024_but_eos() {
        let mut l = vec![1.0f32; 3072];
        apply_control_suppression(&mut l, 2150);
        assert!(l[..2048].iter().all(|&x| x == 1.0));
        assert_eq!(l[2150], 1.0);
        assert_eq!(l[2048], NI);
        assert_eq!(l[3071], NI);
        assert_eq!(l.iter().filter(|x| x.is_finite()).count(), 2049);
    }

    #[test]
    fn temperature_top_k_top_p() {
        let mut l = vec![1.0, 2.0, 4.0];
        apply_temperature(&mut l, 2.0);
        assert_eq!(l, vec![0.5, 1.0, 2.0]);

        let mut l = vec![3.0, 1.0, 2.0, 2.0, 0.0];
        apply_top_k(&mut l, 2);
        // k-th largest is 2.0 and ties are kept.
        assert_eq!(l, vec![3.0, NI, 2.0, 2.0, NI]);

        // probs of [ln 1, ln 2, ln 7] = [0.1, 0.2, 0.7]; ascending cum = 0.1, 0.3, 1.0.
        let mut l = vec![1f32.ln(), 2f32.ln(), 7f32.ln()];
        apply_top_p(&mut l, 0.75); // cut 0.25: removes only the 0.1 token
        assert_eq!(l[0], NI);
        assert!(l[1].is_finite() && l[2].is_finite());
        let mut l = vec![1f32.ln(), 2f32.ln(), 7f32.ln()];
        apply_top_p(&mut l, 0.5); // cut 0.5: removes 0.1 and 0.2 (cum 0.3)
        assert_eq!(l[..2], [NI, NI]);
        let mut l = vec![0.0, 0.0];
        apply_top_p(&mut l, 1e-6); // always keeps the top one
        assert_eq!(l.iter().filter(|x| x.is_finite()).count(), 1);
    }

    /// The selection keeps exactly what a full sort's k-th largest value keeps, ties included.
    #[test]
    fn top_k_matches_the_sorted_threshold() {
        let mut rng = ChaCha20Rng::seed_from_u64(7);
        for (len, k) in [(2048, 50), (2048, 1), (2048, 2047), (3072, 50), (17, 16)] {
            // Values on a coarse grid, so that ties at the threshold occur.
            let mut logits: Vec<f32> = (0..len)
                .map(|_| (rng.random::<f32>() * 64.0).floor() / 8.0)
                .collect();
            // -inf (a suppressed token) and NaN are ordered as the full sort orders them.
            logits[3] = f32::NEG_INFINITY;
            logits[len / 2] = f32::NAN;
            let mut sorted = logits.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            let threshold = sorted[k - 1];
            let mut got = logits.clone();
            apply_top_k(&mut got, k);
            for (g, x) in got.iter().zip(&logits) {
                let want = if *x < threshold { NI } else { *x };
                assert_eq!(g.to_bits(), want.to_bits(), "len {len}, k {k}");
            }
            assert!(got.iter().filter(|x| **x > NI).count() >= k.min(len - 2));
        }
    }

    #[test]
    fn argmax_takes_first_max() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, NI]), 1);
        assert_eq!(argmax(&[NI, NI, 0.5]), 2);
    }

    #[test]
    fn multinomial_follows_probabilities_and_seed() {
        let logits = vec![0f32.ln(), 1f32.ln(), 3f32.ln()]; // probs 0, .25, .75
        let mut rng = ChaCha20Rng::seed_from_u64(7);
        let mut counts = [0usize; 3];
        for _ in 0..4000 {
            counts[sample_multinomial(&logits, &mut rng) as usize] += 1;
        }
        assert_eq!(counts[0], 0);
        let frac = counts[2] as f64 / 4000.0;
        assert!((frac - 0.75).abs() < 0.03, "{frac}");
        let draw = |seed| {
            let mut r = ChaCha20Rng::seed_from_u64(seed);
            (0..20)
                .map(|_| sample_multinomial(&logits, &mut r))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(3), draw(3));
    }

    #[test]
    fn talker_processors_in_order_and_greedy() {
        // vocab 1030: ids [6, 1030) suppressed except eos = 8.
        let mut l = vec![0.0f32; 1030];
        l[0] = 5.0;
        l[1] = 4.9;
        l[8] = 10.0;
        l[9] = 20.0;
        let p = TalkerProcessors {
            repetition_penalty: 1.05,
            min_new_tokens: 2,
            eos: 8,
        };
        let mut a = l.clone();
        p.apply(&mut a, &[0]);
        assert_eq!(a[8], NI); // only one token so far
        assert_eq!(a[9], NI); // suppressed
        assert_eq!(a[0], 5.0 / 1.05);
        let greedy = TokenChooser {
            do_sample: false,
            temperature: 0.9,
            top_k: 50,
            top_p: 1.0,
        };
        let mut rng = ChaCha20Rng::seed_from_u64(0);
        // 5.0 / 1.05 = 4.76 < 4.9: the penalty moves the argmax from 0 to 1.
        assert_eq!(greedy.choose(&mut a, &mut rng), 1);
        let mut b = l.clone();
        p.apply(&mut b, &[0, 0]);
        assert_eq!(greedy.choose(&mut b, &mut rng), 8); // EOS allowed after 2 tokens
    }

    #[test]
    fn sampling_respects_top_k_one() {
        let c = TokenChooser {
            do_sample: true,
            temperature: 0.9,
            top_k: 1,
            top_p: 1.0,
        };
        let mut rng = ChaCha20Rng::seed_from_u64(1);
        for _ in 0..50 {
            let mut l = vec![0.1, 0.3, 0.2];
            assert_eq!(c.choose(&mut l, &mut rng), 1);
        }
    }
}
