//! One frame for many sessions in one batched forward ([`ArModel::next_frames`]), the stage-0 step
//! of continuous batching.
//!
//! A frame is the same work for every row: codebook 0 is chosen on the host per row (each
//! session's own processors, settings and RNG; the rows' choices in parallel from
//! [`PARALLEL_CHOICES_FROM`] rows), the code predictor's 15 steps run over all rows at
//! once (every row is at the same code-predictor positions, so the rows are its batch dimension),
//! then the talker's decode step runs over all rows with their own positions and KV caches
//! ([`Talker::decode_rows`](super::talker::Talker::decode_rows): the norms, projections, MLP and
//! codec head as one `[rows, hidden]` matmul per weight, attention per row over its own cache).
//!
//! Exactness: every host-side step (processors, sampling, RNG draws, embedding lookups, the input
//! sums) is the one a session makes alone, in the same order. The matmuls are not bit-identical to
//! the one-row ones: candle's CPU matmul (the `gemm` crate) multiplies a single row with a
//! matrix-vector kernel and several rows with its blocked matrix kernel, which sum the products in
//! another order, so a row's hidden states and logits differ from its solo run by float rounding
//! (about 1e-6 relative in f32). Greedy codes then differ only where two logits tie within that
//! rounding; the tests check codes and logits against solo runs on the fixtures.
//!
//! On CUDA, with the batched frame graphs captured (`graphs/batch.rs`), the rows' whole frame is
//! one graph replay instead: the same host-side steps, the code predictor's picks made on the
//! device from each row's own parameters and uniforms, and the same numerics argument (GEMMs
//! against the one-stream path's one-row kernels).

use std::time::Instant;

use candle_core::Tensor;

use super::ar_model::ArModel;
use super::graphs::CacheGuard;
use super::session::{ArSession, ArStep, StepTiming};
use crate::models::tts::{FinishReason, ModelError};
use crate::nn::LayerCaches;
use crate::nn::switches::Switches;

impl ArModel {
    /// One frame for every session, in one batched forward. `results[i]` is what
    /// `sessions[i].next_frame()` returns, with the same codes for the same settings and seed
    /// (greedy and sampled) and hidden states and logits within float rounding of it (see the
    /// module documentation). Finished sessions return [`ArStep::Finished`] again at no cost; with
    /// one unfinished session this is exactly [`ArSession::next_frame`] (CUDA graphs included).
    /// Several rows replay the batched frame graphs when captured
    /// ([`ArModel::enable_batch_graphs`]) and every row is below their positions, else run
    /// eagerly. A failure of the batched forward fails every row
    /// that was in it (the message names the batch); those sessions cannot go on. A session of
    /// another model gets [`ModelError::InvalidRequest`] (`sessions`) and is not touched.
    pub fn next_frames(
        &self,
        sessions: &mut [&mut ArSession<'_>],
    ) -> Vec<Result<ArStep, ModelError>> {
        let t_choices = Instant::now();
        let mut results: Vec<Option<Result<ArStep, ModelError>>> =
            sessions.iter().map(|_| None).collect();
        for (i, s) in sessions.iter().enumerate() {
            if !std::ptr::eq(s.model, self) {
                results[i] = Some(Err(ModelError::InvalidRequest {
                    field: "sessions".into(),
                    value: format!("row {i}"),
                    msg: "a session of another model".into(),
                }));
            } else if s.waits_for_text() {
                results[i] = Some(Err(ModelError::TextPending));
            }
        }
        let eligible: Vec<bool> = results.iter().map(Option::is_none).collect();
        let choices = choose_codes0(sessions, &eligible);
        // (index in `sessions`, codebook-0 code) of the rows that make a frame, in order.
        let mut rows: Vec<(usize, u32)> = Vec::with_capacity(sessions.len());
        for (i, choice) in choices.into_iter().enumerate() {
            match choice {
                Some(Ok(a0)) => rows.push((i, a0)),
                Some(Err(reason)) => results[i] = Some(Ok(ArStep::Finished(reason))),
                None => {}
            }
        }
        let choices_ms = t_choices.elapsed().as_secs_f64() * 1e3;
        match rows.as_slice() {
            [] => {}
            &[(i, a0)] => results[i] = Some(sessions[i].finish_frame(a0).map(ArStep::Frame)),
            _ => match self.batched_frame(sessions, &rows, choices_ms) {
                Ok(frames) => {
                    for (&(i, _), codes) in rows.iter().zip(frames) {
                        results[i] = Some(Ok(ArStep::Frame(codes)));
                    }
                }
                Err(e) => {
                    let msg = format!("batched frame of {} rows: {e}", rows.len());
                    for &(i, _) in &rows {
                        results[i] = Some(Err(ModelError::Candle(candle_core::Error::Msg(
                            msg.clone(),
                        ))));
                    }
                }
            },
        }
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(ModelError::Candle(candle_core::Error::Msg(
                        "batched frame: a row got no result".into(),
                    )))
                })
            })
            .collect()
    }

    /// The rest of a frame for `rows` (index, codebook-0 code) of `sessions`, at least two, after
    /// [`ArSession::choose_code0`] (which took `choices_ms`). Returns each row's codes.
    fn batched_frame(
        &self,
        sessions: &mut [&mut ArSession<'_>],
        rows: &[(usize, u32)],
        choices_ms: f64,
    ) -> Result<Vec<Vec<u32>>, ModelError> {
        #[cfg(feature = "cuda")]
        if let Some(graphs) = self.graphs.batch() {
            let positions = rows
                .iter()
                .map(|&(i, _)| sessions[i].cache.seq_len().unwrap_or(usize::MAX));
            let mut graphs = graphs.lock().map_err(|_| {
                ModelError::Candle(candle_core::Error::Msg(
                    "batched frame graphs: lock poisoned by a panic".into(),
                ))
            })?;
            if graphs.takes(rows.len(), positions) {
                return self.graph_frame(&mut graphs, sessions, rows, choices_ms);
            }
        }
        let a0: Vec<u32> = rows.iter().map(|&(_, a0)| a0).collect();
        let c0 = self.talker.codec_embed(&a0)?; // [rows, d]
        let hidden: Vec<&Tensor> = rows.iter().map(|&(i, _)| &sessions[i].hidden).collect();
        let hidden = Tensor::cat(&hidden, 0)?; // [rows, 1, d]
        let t_cp = Instant::now();
        let mut cp_cache = self.code_predictor.new_cache();
        let rest = self.code_predictor.generate_rows(
            &hidden,
            &c0.unsqueeze(1)?,
            &mut cp_cache,
            |row, _, logits| {
                let d = &mut sessions[rows[row].0].decoding;
                d.cp_chooser.choose(logits, &mut d.rng)
            },
        )?;
        let t_talker = Instant::now();
        let mut frames = Vec::with_capacity(rows.len());
        let mut inputs = Vec::with_capacity(rows.len());
        for (r, (&(i, a0), rest)) in rows.iter().zip(rest).enumerate() {
            let mut codes = Vec::with_capacity(self.num_code_groups());
            codes.push(a0);
            codes.extend(rest);
            let text = sessions[i].text_row()?;
            inputs.push(self.talker_input(&codes, &c0.narrow(0, r, 1)?, &text)?);
            frames.push(codes);
        }
        let input = Tensor::cat(&inputs, 0)?; // [rows, 1, d]
        let (hidden, logits) = {
            let mut guards = lock_row_caches(sessions, rows)?;
            let mut caches: Vec<&mut LayerCaches> = guards.iter_mut().map(|g| &mut **g).collect();
            self.talker.decode_rows(&input, &mut caches)?
        };
        let timing = StepTiming {
            host_ms: choices_ms,
            ..StepTiming::between(t_cp, t_talker)
        };
        for (r, (&(i, _), logits)) in rows.iter().zip(logits).enumerate() {
            sessions[i].store_step(hidden.narrow(0, r, 1)?, logits, timing);
        }
        Ok(frames)
    }

    /// [`Self::batched_frame`] on the batched frame graphs (`graphs/batch.rs`): every row's code
    /// predictor parameters drawn from its own RNG as its solo frame draws them, its caches made
    /// ready for the next position, one replay for all rows, then each session stores its step.
    #[cfg(feature = "cuda")]
    fn graph_frame(
        &self,
        graphs: &mut super::graphs::batch::BatchGraphs,
        sessions: &mut [&mut ArSession<'_>],
        rows: &[(usize, u32)],
        choices_ms: f64,
    ) -> Result<Vec<Vec<u32>>, ModelError> {
        use super::device_sampler::{frame_params, greedy_row_params};
        use super::graphs::batch::FrameRow;
        let t0 = Instant::now();
        let (steps, vocab) = (
            self.code_predictor.steps(),
            self.code_predictor.vocab_size(),
        );
        let mut inputs = Vec::with_capacity(rows.len());
        for &(i, a0) in rows {
            let s = &mut sessions[i];
            let d = &mut s.decoding;
            let params = if d.cp_chooser.do_sample {
                frame_params(&d.cp_chooser, vocab, steps, &mut d.rng)
            } else {
                greedy_row_params(steps)
            };
            inputs.push((a0, params, s.text_row()?, s.hidden.clone()));
        }
        let mut guards = lock_row_caches(sessions, rows)?;
        for g in guards.iter_mut() {
            g.reserve_next(&self.talker.model.layers, self.dtype, &self.device)?;
        }
        let frame_rows: Vec<FrameRow<'_>> = inputs
            .into_iter()
            .zip(&guards)
            .map(|((a0, params, text, hidden), cache)| FrameRow {
                hidden,
                text,
                code0: a0,
                params,
                cache,
            })
            .collect();
        let out = graphs.frame(self, &frame_rows)?;
        drop(frame_rows);
        for g in guards.iter_mut() {
            g.advance(1)?;
        }
        drop(guards);
        let timing = StepTiming {
            code_predictor_ms: out.replay_ms,
            talker_ms: 0.0,
            host_ms: choices_ms + t0.elapsed().as_secs_f64() * 1e3 - out.replay_ms,
        };
        for (r, (&(i, _), logits)) in rows.iter().zip(out.logits).enumerate() {
            sessions[i].store_step(out.hidden.narrow(0, r, 1)?, logits, timing);
        }
        Ok(out.codes)
    }
}

/// Below this many sessions a frame's codebook-0 choices stay on the calling thread: spreading a
/// few costs about what they take (a sampled choice, the processors and warpers over the codec
/// vocabulary, took ~20 µs on an H100 machine's host: docs/cuda.md, "The host's part of a
/// batched frame").
const PARALLEL_CHOICES_FROM: usize = 8;

/// Each session's codebook-0 choice ([`ArSession::choose_code0`]) where `eligible[i]` (`None`
/// in the result elsewhere), spread over the host's cores from [`PARALLEL_CHOICES_FROM`]
/// sessions (`OMNITTS_PARALLEL_CHOICES=0`: one after another). A session's choice reads and
/// changes only that session (its logits, history, processors and RNG), so the codes are the same
/// either way.
fn choose_codes0(
    sessions: &mut [&mut ArSession<'_>],
    eligible: &[bool],
) -> Vec<Option<Result<u32, FinishReason>>> {
    use rayon::prelude::*;
    let choose = |(s, &ok): (&mut &mut ArSession<'_>, &bool)| ok.then(|| s.choose_code0());
    if sessions.len() >= PARALLEL_CHOICES_FROM && Switches::get().parallel_choices {
        sessions
            .par_iter_mut()
            .zip(eligible.par_iter())
            .map(choose)
            .collect()
    } else {
        sessions.iter_mut().zip(eligible).map(choose).collect()
    }
}

/// The talker caches of the sessions in `rows` (ascending session indices, as
/// [`ArModel::next_frames`] builds them), in row order, each with room for one more position (a
/// leased cache at its capacity continues on an own copy: [`TalkerCache::ensure_room`](super::graphs::TalkerCache::ensure_room)), locked
/// for one batched step.
fn lock_row_caches<'g>(
    sessions: &'g mut [&mut ArSession<'_>],
    rows: &[(usize, u32)],
) -> Result<Vec<CacheGuard<'g>>, ModelError> {
    let mut in_batch = vec![false; sessions.len()];
    rows.iter().for_each(|&(i, _)| in_batch[i] = true);
    let mut guards = Vec::with_capacity(rows.len());
    for (s, _) in sessions.iter_mut().zip(&in_batch).filter(|(_, b)| **b) {
        s.cache.ensure_room()?;
        guards.push(s.cache.lock()?);
    }
    Ok(guards)
}
