//! Decoding several streams in one pass ([`Code2Wav::decode_chunks`]) and the batched streaming
//! state behind it.
//!
//! Each stream keeps its own state (one row). For a pass, the states of the streams in it are
//! stacked along the batch dimension ([`BatchState::stack`]), the layers run once over
//! `[rows, channels, time]`, and the updated state is split back into one state per stream
//! ([`BatchState::split`]). Rows never mix, and each computes what its stream computes alone, to
//! the bit: the elementwise layers, norms and attention products treat rows independently, the
//! transformer gives each row its own RoPE positions and attends per group of equal windows with a
//! lone stream's mask, and the weight products (linear layers, convolutions) run row by row
//! ([`RowLinear`], [`row_by_row`](crate::nn::conv::row_by_row)), because the CPU matrix kernels round a folded batch
//! differently. So a stream's audio does not depend on which streams share its passes. On CUDA
//! the linear layers and convolutions (not the transposed ones) run one product for all rows
//! ([`per_row_on_cpu`]: a launch per stream and product would dominate a pass of many streams),
//! and a row is then within float rounding of its stream alone.
//!
//! A pass needs equal lengths in all its rows, and a stream decodes a chunk in passes of at most
//! `max_frames_per_pass` frames, as it would alone. The chunks are therefore cut into the same
//! passes a lone stream would run, round by round (every stream's first pass, then every second
//! one, ...), and the passes of equal length in a round run together, at most
//! `max_batch_frames` frames (rows × frames) at a time.

use crate::models::tts::chunk_count_mismatch;
use std::collections::BTreeMap;

use crate::nn::Linear;
use candle_core::{DType, Module, Tensor};

use super::{Code2Wav, Code2WavStream, ModelError};
use crate::nn::conv::{CausalConvState, ConvTransposeState, per_row_on_cpu};
use crate::nn::readback;

/// A [`Linear`] whose product runs row by row over the streams of a batched pass on the CPU
/// ([`per_row_on_cpu`]: each row then rounds exactly as the stream alone; on CUDA one product
/// for all rows, each within float rounding of its stream alone).
#[derive(Debug, Clone)]
pub(crate) struct RowLinear(pub(crate) Linear);

impl Module for RowLinear {
    /// `x` `[rows, t, in]` → `[rows, t, out]`.
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        per_row_on_cpu(x, |row| self.0.forward(row))
    }
}

/// A streaming state that stacks with other streams' states for one batched pass.
pub(crate) trait BatchState: Sized {
    /// The states of `states.len()` streams (one row each) as one state of that many rows, in
    /// order. Errors if they belong to different layers.
    fn stack(states: &[&Self]) -> candle_core::Result<Self>;

    /// A state of `rows` rows (after a pass) as the `rows` per-stream states, in order: the
    /// inverse of [`BatchState::stack`].
    fn split(self, rows: usize) -> candle_core::Result<Vec<Self>>;
}

/// [`BatchState::stack`] of one field of each state.
pub(crate) fn stack_field<S, T: BatchState>(
    states: &[&S],
    field: impl Fn(&S) -> &T,
) -> candle_core::Result<T> {
    let fields: Vec<&T> = states.iter().map(|s| field(s)).collect();
    T::stack(&fields)
}

impl BatchState for CausalConvState {
    fn stack(states: &[&Self]) -> candle_core::Result<Self> {
        CausalConvState::stack(states)
    }

    fn split(self, rows: usize) -> candle_core::Result<Vec<Self>> {
        CausalConvState::split(self, rows)
    }
}

impl BatchState for ConvTransposeState {
    fn stack(states: &[&Self]) -> candle_core::Result<Self> {
        ConvTransposeState::stack(states)
    }

    fn split(self, rows: usize) -> candle_core::Result<Vec<Self>> {
        ConvTransposeState::split(self, rows)
    }
}

/// The states of a stack of layers, layer by layer.
impl<T: BatchState> BatchState for Vec<T> {
    fn stack(states: &[&Self]) -> candle_core::Result<Self> {
        let layers = states.first().map_or(0, |s| s.len());
        if states.iter().any(|s| s.len() != layers) {
            candle_core::bail!("code2wav: stacking states of different layer counts")
        }
        (0..layers)
            .map(|l| stack_field(states, |s| &s[l]))
            .collect()
    }

    fn split(self, rows: usize) -> candle_core::Result<Vec<Self>> {
        let mut out: Vec<Self> = (0..rows).map(|_| Vec::with_capacity(self.len())).collect();
        for layer in self {
            for (o, part) in out.iter_mut().zip(layer.split(rows)?) {
                o.push(part);
            }
        }
        Ok(out)
    }
}

impl<T: BatchState, const N: usize> BatchState for [T; N] {
    fn stack(states: &[&Self]) -> candle_core::Result<Self> {
        let layers = (0..N)
            .map(|l| stack_field(states, |s| &s[l]))
            .collect::<candle_core::Result<Vec<T>>>()?;
        layers
            .try_into()
            .map_err(|_| candle_core::Error::Msg("code2wav: stacked layer count".into()))
    }

    fn split(self, rows: usize) -> candle_core::Result<Vec<Self>> {
        Vec::from(self)
            .split(rows)?
            .into_iter()
            .map(|v| {
                v.try_into()
                    .map_err(|_| candle_core::Error::Msg("code2wav: split layer count".into()))
            })
            .collect()
    }
}

/// Frames of one stream's pass number `round` (empty once its chunk is done).
fn pass_frames(chunk: &[Vec<u32>], round: usize, frames_per_pass: usize) -> &[Vec<u32>] {
    let start = (round * frames_per_pass).min(chunk.len());
    &chunk[start..(start + frames_per_pass).min(chunk.len())]
}

/// Most fresh streams' one-frame first chunks one call decodes on the first-frame graph (one
/// replay and read-back each); the rest go in the eager pass. Not measured yet.
const FIRST_FRAME_GRAPH_ROWS: usize = 4;

impl Code2Wav {
    /// Decodes the next chunk of several streams at once: `chunks[i]`, frames
    /// `[n_i][num_quantizers]`, on `streams[i]`. Returns, per stream in order, what
    /// `streams[i].decode_chunk(chunks[i])` alone returns: exactly `n_i × samples_per_frame`
    /// samples in [-1, 1], or its error. The streams may be at any point of their utterances
    /// and the chunks of any lengths; streams whose passes have equal lengths share them (see
    /// the module docs). With [`Code2Wav::enable_first_frame_graph`], a fresh stream's one-frame
    /// chunk replays the first-frame graph instead, and that stream's next chunk is decoded behind
    /// the frame (first_frame.rs); the samples are the same.
    ///
    /// Errors, per stream: [`ModelError::InvalidRequest`] for bad codes, a stream of another
    /// model, or `chunks.len() != streams.len()` (every stream; none decodes); such a stream is
    /// left untouched and the others decode. [`ModelError::Candle`] for a failed pass (every
    /// stream in it) or NaN/Inf in a stream's output; after a `Candle` error the stream's state
    /// is undefined: call [`Code2WavStream::reset`].
    pub fn decode_chunks(
        &self,
        streams: &mut [&mut Code2WavStream<'_>],
        chunks: &[&[Vec<u32>]],
    ) -> Vec<Result<Vec<f32>, ModelError>> {
        if let Some(errors) = chunk_count_mismatch(streams.len(), chunks.len()) {
            return errors;
        }
        let spf = self.samples_per_frame();
        let per_pass = self.max_frames_per_pass;
        let mut results: Vec<Result<Vec<f32>, ModelError>> = streams
            .iter()
            .zip(chunks)
            .map(|(stream, chunk)| {
                if !std::ptr::eq(stream.model, self) {
                    return Err(ModelError::InvalidRequest {
                        field: "stream".into(),
                        value: "a stream of another Code2Wav".into(),
                        msg: "decode a stream with the model that created it".into(),
                    });
                }
                self.validate(chunk)?;
                Ok(Vec::with_capacity(chunk.len() * spf))
            })
            .collect();
        // Fresh streams' one-frame first chunks on the first-frame graph (first_frame.rs), a
        // few of them: each replay waits for its audio, and many such chunks are cheaper in one
        // eager pass. A replay that fails leaves its stream to the eager pass.
        let mut on_graph = vec![false; streams.len()];
        if let Some(graph) = &self.first_frame {
            let fresh: Vec<usize> = (0..streams.len())
                .filter(|&i| results[i].is_ok() && chunks[i].len() == 1 && streams[i].is_fresh())
                .take(FIRST_FRAME_GRAPH_ROWS)
                .collect();
            for i in fresh {
                if let Ok(wav) = self.decode_first_frame(graph, streams[i], &chunks[i][0]) {
                    on_graph[i] = true;
                    results[i] = Ok(wav);
                }
            }
        }
        // Every other chunk, behind the frames its stream still has to replay.
        let replayed: Vec<usize> = streams
            .iter()
            .zip(chunks)
            .enumerate()
            .map(|(i, (s, c))| {
                if on_graph[i] || c.is_empty() || results[i].is_err() {
                    0
                } else {
                    s.replay.len()
                }
            })
            .collect();
        let joined: Vec<Vec<Vec<u32>>> = streams
            .iter()
            .zip(chunks)
            .zip(&replayed)
            .map(|((s, c), &r)| {
                if r == 0 {
                    Vec::new()
                } else {
                    s.replay.iter().chain(c.iter()).cloned().collect()
                }
            })
            .collect();
        let chunks: Vec<&[Vec<u32>]> = chunks
            .iter()
            .zip(&joined)
            .enumerate()
            .map(|(i, (&c, j))| {
                if on_graph[i] {
                    &[][..]
                } else if replayed[i] > 0 {
                    j.as_slice()
                } else {
                    c
                }
            })
            .collect();
        let rounds = chunks
            .iter()
            .map(|chunk| chunk.len().div_ceil(per_pass))
            .max()
            .unwrap_or(0);
        for round in 0..rounds {
            // Streams still decoding, by the length of this round's pass.
            let mut by_len: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
            for (i, chunk) in chunks.iter().enumerate() {
                let n = pass_frames(chunk, round, per_pass).len();
                if n > 0 && results[i].is_ok() {
                    by_len.entry(n).or_default().push(i);
                }
            }
            for (n, rows) in by_len {
                let rows_per_pass = (self.max_batch_frames / n).max(1);
                for rows in rows.chunks(rows_per_pass) {
                    let frames: Vec<&[Vec<u32>]> = rows
                        .iter()
                        .map(|&i| pass_frames(chunks[i], round, per_pass))
                        .collect();
                    match self.run_pass(streams, rows, &frames) {
                        Ok(wavs) => {
                            for (&i, wav) in rows.iter().zip(wavs) {
                                // The state has now seen the frames to replay.
                                if round == 0 {
                                    streams[i].replay.clear();
                                }
                                let first = PassStart {
                                    frame: round * per_pass,
                                    replayed: replayed[i],
                                };
                                if let Ok(out) = &mut results[i] {
                                    match check_samples(wav, first, spf) {
                                        Ok(wav) => out.extend(wav),
                                        Err(e) => results[i] = Err(e),
                                    }
                                }
                            }
                        }
                        Err(e) => {
                            for &i in rows {
                                results[i] =
                                    Err(candle_core::Error::Msg(format!("code2wav: {e}")).into());
                            }
                        }
                    }
                }
            }
        }
        // The replayed frames' samples went out before.
        for (i, &r) in replayed.iter().enumerate() {
            if let (true, Ok(wav)) = (r > 0, &mut results[i]) {
                wav.drain(..(r * spf).min(wav.len()));
            }
        }
        results
    }

    /// A fresh `stream`'s one-frame first chunk `frame` (validated) on the first-frame graph: its
    /// samples, clamped; the stream then replays the frame in front of its next chunk.
    fn decode_first_frame(
        &self,
        graph: &std::sync::Mutex<super::FirstFrameGraph>,
        stream: &mut Code2WavStream<'_>,
        frame: &[u32],
    ) -> Result<Vec<f32>, ModelError> {
        let wav = graph
            .lock()
            .map_err(|_| {
                candle_core::Error::Msg("code2wav: first-frame graph lock poisoned".into())
            })?
            .decode(self, frame)
            .map_err(|e| candle_core::Error::Msg(format!("code2wav: first frame: {e}")))?;
        let first = PassStart {
            frame: 0,
            replayed: 0,
        };
        let wav = check_samples(wav, first, self.samples_per_frame())?;
        stream.replay = vec![frame.to_vec()];
        Ok(wav)
    }

    /// One pass over `frames[k]` (equal lengths) of the streams `streams[rows[k]]`, updating
    /// their states: the unclamped samples of each row.
    fn run_pass(
        &self,
        streams: &mut [&mut Code2WavStream<'_>],
        rows: &[usize],
        frames: &[&[Vec<u32>]],
    ) -> candle_core::Result<Vec<Vec<f32>>> {
        let states: Vec<_> = rows.iter().map(|&i| &streams[i].state).collect();
        let mut state = BatchState::stack(&states)?;
        let wav = self.forward(frames, &mut state)?; // [rows, 1, n × spf]
        let expect = frames[0].len() * self.samples_per_frame();
        if wav.dims3()? != (rows.len(), 1, expect) {
            candle_core::bail!(
                "produced {:?} samples for {} rows of {} frames, expected {expect} per row",
                wav.shape(),
                rows.len(),
                frames[0].len()
            )
        }
        for (&i, s) in rows.iter().zip(state.split(rows.len())?) {
            streams[i].state = s;
        }
        let samples = readback::to_vec::<f32>(&wav.to_dtype(DType::F32)?)?;
        Ok(samples.chunks(expect).map(<[f32]>::to_vec).collect())
    }
}

/// Where a pass starts in the frames a stream decoded in this call: `frame` in the joined chunk,
/// whose first `replayed` frames were replayed (their audio went out in an earlier call).
#[derive(Debug, Clone, Copy)]
struct PassStart {
    frame: usize,
    replayed: usize,
}

/// Clamps one row's pass output to [-1, 1]; NaN/Inf is an error naming the sample and the frame
/// of the chunk (`spf`: samples per frame).
fn check_samples(wav: Vec<f32>, first: PassStart, spf: usize) -> Result<Vec<f32>, ModelError> {
    if let Some(j) = wav.iter().position(|v| !v.is_finite()) {
        let frame = match (first.frame + j / spf).checked_sub(first.replayed) {
            Some(f) => format!("frame {f} of this chunk"),
            None => "the replayed first frame".to_string(),
        };
        return Err(candle_core::Error::Msg(format!(
            "code2wav output is not finite ({}) at sample {j} of a pass, in {frame}",
            wav[j]
        ))
        .into());
    }
    Ok(wav.into_iter().map(|v| v.clamp(-1.0, 1.0)).collect())
}
