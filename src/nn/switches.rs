//! The `OMNITTS_*` environment switches, read once per process, in one place. Each selects one of
//! several equivalent execution paths, for A/B runs against the default (docs/cuda.md has the
//! measurements). Every build reads them; without the `cuda` feature only `OMNITTS_ALONE_ARRIVALS`
//! (while stage 0's `first_frame_alone` is on), `OMNITTS_CHUNK_RAMP`, `OMNITTS_DECODER_CONV`,
//! `OMNITTS_PREFILL_BUDGET` and `OMNITTS_STAGE0_TRACE` have an effect.
//!
//! | variable | values | default |
//! |---|---|---|
//! | `OMNITTS_FUSED_KERNELS` | `0` no fused decode kernels, `1` the four per-layer kernels of the first fused version | all kernels |
//! | `OMNITTS_DECODE_STACK` | `1` the whole-stack decode kernel | off |
//! | `OMNITTS_STACK_BLOCKS_PER_SM` | blocks per SM of that kernel, ≥ 1 | 2 |
//! | `OMNITTS_FUSED_SAMPLER` | `0` the code predictor's sampled codes without the fused sampler kernel | on |
//! | `OMNITTS_CP_FRAME_GRAPH` | `0` one code-predictor CUDA graph per step instead of one per frame | one per frame |
//! | `OMNITTS_BATCH_GRAPHS` | `0` batched frames of several streams eager instead of on the batched frame graphs | graphs |
//! | `OMNITTS_DECODER_KERNELS` | `0` Code2Wav's SnakeBeta as five tensor operations and its transposed convolutions as candle's, row by row | one kernel; one product for all rows |
//! | `OMNITTS_DECODER_CONV` | `candle` Code2Wav's convolutions as candle's `conv1d` (im2col, GEMM, transposing copy) and, on CUDA, transposed convolutions as one product and an overlap-add | `cols`: one product per convolution over a tap-major input (on CUDA written in place, the bias epilogue after it; on the CPU, f32, stacked from the taps' views a stream at a time), writing `[batch, channels, time]` |
//! | `OMNITTS_PINNED_READBACK` | `0` device → host reads through pageable memory instead of a pinned buffer | pinned |
//! | `OMNITTS_PREFILL_GRAPHS` | `0` prompts through the talker eagerly instead of on the prefill graphs | graphs |
//! | `OMNITTS_DECODER_FIRST_GRAPH` | `0` a fresh stream's one-frame first chunk through Code2Wav eagerly instead of on its CUDA graph (docs/cuda.md, "The first chunk on a graph, and arrivals after a step alone") | graph |
//! | `OMNITTS_FISH_GRAPHS` | `1` Fish S2 Pro's frame (the slow AR's step, the fast AR's positions) replays CUDA graphs per batch bucket (`models/fish_speech/graphs.rs`; on an H100 6 % faster a frame and equal to eager, but one stream's first audio came later: docs/cuda.md, "Fish Audio S2 Pro on CUDA") | eager |
//! | `OMNITTS_ALONE_ARRIVALS` | `0` after a step of new rows alone, stage 0 goes on to the batched step before it takes the requests that arrived during it (`engine/first_frame.rs`) | arrivals first |
//! | `OMNITTS_BATCHED_PREFILL` | `0` every prompt through the talker on its own (on the prefill graphs when they hold it) instead of whole prompts of similar lengths that start in one step in one batched pass (`models/qwen3_tts/prefill.rs`) | batched |
//! | `OMNITTS_PARALLEL_CHOICES` | `0` a batched frame's codebook-0 choices (each row's processors, warpers and draw on the host) one row after another instead of spread over the host's cores (`models/qwen3_tts/batch.rs`) | spread |
//! | `OMNITTS_CHUNK_RAMP` | `twice` with `codec_chunk_ramp` on, each chunk after the first twice the one before (1, 2, 4, 8, …) instead of as long as all the audio before it (1, 1, 2, 4, …; `engine/chunk_buffer.rs`, [`crate::engine::ChunkRamp`]); the audio is the same, only its chunks' times differ | as long as the audio before |
//! | `OMNITTS_ATTN_THREADS` | `64`, `128` or `256`: every launch of `decode_attention`, `rope_attention` and `rows_attention` in blocks of that size (at least half the head width; the whole-stack kernel keeps 256), for A/B runs; the output is the same (`nn/cuda_kernels/decode_attention.rs`) | 256 while the grid fits one wave, else the fewest threads that give each key of a full context and each NeoX pair one (a 64-row code-predictor step 64, the talker 256) |
//! | `OMNITTS_PREFILL_BUDGET` | prompt positions stage 0 prefills a step, ≥ 64 (`engine/stage0.rs`), for A/B runs | 512 (`PREFILL_CHUNK`) |
//! | `OMNITTS_STAGE0_TRACE` | a file path: stage 0 writes a line per turn of its loop there (arrivals, prompts built, the prefill, the steps; `engine/turn_trace.rs`) | no trace |
//! | `OMNITTS_KEEP_FREED` | `0` each CUDA device's memory pool gives the memory freed since the last synchronisation back to the driver at every synchronisation (CUDA's default: release threshold 0) instead of keeping it for the next allocations (`engine/device.rs`) | kept |
//! | `OMNITTS_STREAM_PRIORITY` | the CUDA streams above the default priority: `none`, or ranks from the device's greatest priority down separated by `>`, each a comma list of `ar` (stage 0), `lane` (the first-chunk lane), `decoder` (stage 1's thread): `ar,lane` both at the greatest, `lane>ar` the lane at the greatest and stage 0 one level below | as stage 0's `priority_over_decoder` says: `lane>ar` when on, else `none` |
//!
//! Values are trimmed; anything else than the values listed keeps the default.

use std::sync::OnceLock;

/// Which fused CUDA decode kernels run (`OMNITTS_FUSED_KERNELS`), in increasing order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FusedKernels {
    /// Candle ops and cuBLAS only.
    Off,
    /// The first fused version: q/k norm + RoPE + KV write, decode attention, add + RMSNorm,
    /// SiLU · up (9 launches per decoder layer).
    PerLayer,
    /// Every kernel: the one-row matmuls and the frame kernels too (5 launches per layer).
    All,
}

/// How Code2Wav's convolutions run (`OMNITTS_DECODER_CONV`; on CUDA with `OMNITTS_DECODER_KERNELS`
/// on, on the CPU in f32); see [`crate::nn::conv`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecoderConv {
    /// candle's `conv1d` (a concatenation with the history, im2col, GEMM, transposing copy); the
    /// transposed convolutions as one product and an overlap-add.
    Candle,
    /// One product over a tap-major input: on CUDA written from the history and the chunk in place
    /// (`nn::cuda_kernels::shift_cols`), the bias epilogue after the GEMM; on the CPU stacked from
    /// the taps' views of the padded chunk, one stream at a time.
    Cols,
}

/// Which stage threads' CUDA streams run above the default priority (`OMNITTS_STREAM_PRIORITY`),
/// as ranks: rank 0 is the device's greatest priority, rank 1 the level below it, and so on; a
/// role without a rank keeps the default (least) priority. The block scheduler starts a
/// higher-priority stream's pending blocks first, so a latency-bound stream's small kernels do
/// not queue behind a throughput stream's large ones on a shared GPU. Without the variable the
/// stage config decides ([`crate::engine::StageConfig::stream_priority`]: none, or
/// [`StreamPriority::OVER_DECODER`]; docs/cuda.md, "Stage 0 above Code2Wav").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamPriority {
    /// Stage 0 (the talker and code predictor steps).
    pub ar: Option<u8>,
    /// The first-chunk lane (stage 1's first chunks).
    pub lane: Option<u8>,
    /// Stage 1's thread (Code2Wav passes).
    pub decoder: Option<u8>,
}

impl StreamPriority {
    /// Stage 0 above stage 1's passes, the first-chunk lane above both (`lane>ar`; the stage
    /// config's `priority_over_decoder`).
    pub const OVER_DECODER: StreamPriority = StreamPriority {
        ar: Some(1),
        lane: Some(0),
        decoder: None,
    };

    /// The ranks in force: `env` (`OMNITTS_STREAM_PRIORITY`) when set, else
    /// [`StreamPriority::OVER_DECODER`] when the stage config's `priority_over_decoder` is on,
    /// else none above the default.
    pub fn resolve(env: Option<StreamPriority>, over_decoder: Option<bool>) -> StreamPriority {
        env.unwrap_or(if over_decoder == Some(true) {
            StreamPriority::OVER_DECODER
        } else {
            StreamPriority::default()
        })
    }

    /// Parses `none`, or ranks from the greatest down separated by `>`, each a comma list of
    /// `ar`, `lane`, `decoder` (`ar,lane`: both at the greatest priority; `lane>ar`: the lane at
    /// the greatest, stage 0 one level below); `None` for anything else: an empty rank (`ar>`)
    /// or a role named twice included.
    fn parse(v: &str) -> Option<StreamPriority> {
        let mut p = StreamPriority::default();
        if v == "none" {
            return Some(p);
        }
        for (rank, roles) in v.split('>').enumerate() {
            let rank = u8::try_from(rank).ok()?;
            for role in roles.split(',').map(str::trim) {
                let slot = match role {
                    "ar" => &mut p.ar,
                    "lane" => &mut p.lane,
                    "decoder" => &mut p.decoder,
                    _ => return None,
                };
                if slot.replace(rank).is_some() {
                    return None;
                }
            }
        }
        Some(p)
    }
}

/// The switches' values (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Switches {
    /// `OMNITTS_FUSED_KERNELS`.
    pub fused_kernels: FusedKernels,
    /// `OMNITTS_DECODE_STACK`: the whole-stack decode kernel (bit-identical, slower on an H200).
    pub decode_stack: bool,
    /// `OMNITTS_STACK_BLOCKS_PER_SM`.
    pub stack_blocks_per_sm: u32,
    /// `OMNITTS_FUSED_SAMPLER`: the fused top-k/top-p sampler of the code predictor's frame.
    pub fused_sampler: bool,
    /// `OMNITTS_CP_FRAME_GRAPH`: one CUDA graph per code-predictor frame (else one per step).
    pub cp_frame_graph: bool,
    /// `OMNITTS_BATCH_GRAPHS`: batched frames on their CUDA graphs (else eager).
    pub batch_graphs: bool,
    /// `OMNITTS_PINNED_READBACK`: small device → host reads through a pinned buffer
    /// ([`crate::nn::readback`]).
    pub pinned_readback: bool,
    /// `OMNITTS_DECODER_KERNELS`: Code2Wav's SnakeBeta as one kernel and its transposed
    /// convolutions as one product for all rows ([`crate::nn::conv`]).
    pub decoder_kernels: bool,
    /// `OMNITTS_DECODER_CONV`: how Code2Wav's convolutions run (on CUDA, needs `decoder_kernels`).
    pub decoder_conv: DecoderConv,
    /// `OMNITTS_PREFILL_GRAPHS=0`: prompts run through the talker eagerly instead of replaying the
    /// prefill graphs (`models/qwen3_tts/graphs/prefill.rs`).
    pub prefill_graphs: bool,
    /// `OMNITTS_STREAM_PRIORITY`: which stages' CUDA streams run above the default priority
    /// (`None`: unset, the stage config decides).
    pub stream_priority: Option<StreamPriority>,
    /// `OMNITTS_DECODER_FIRST_GRAPH=0`: Code2Wav decodes a fresh stream's one-frame first chunk
    /// eagerly instead of on its CUDA graph (`models/qwen3_tts/code2wav/first_frame.rs`).
    pub decoder_first_graph: bool,
    /// `OMNITTS_FISH_GRAPHS`: Fish S2 Pro's frame (the slow AR's step, the fast AR's positions)
    /// on CUDA graphs.
    pub fish_graphs: bool,
    /// `OMNITTS_ALONE_ARRIVALS=0`: after a step of new rows alone, stage 0 goes on to the batched
    /// step instead of first taking the requests that arrived during it.
    pub arrivals_after_alone: bool,
    /// `OMNITTS_BATCHED_PREFILL=0`: every prompt through the talker on its own instead of whole
    /// prompts that start in one step in one batched pass.
    pub batched_prefill: bool,
    /// `OMNITTS_PARALLEL_CHOICES=0`: a batched frame's codebook-0 choices one row after another
    /// on stage 0's thread instead of spread over the host's cores.
    pub parallel_choices: bool,
    /// `OMNITTS_CHUNK_RAMP=twice`: the chunk ramp doubles each chunk instead of making it as long
    /// as the audio before it.
    pub twice_ramp: bool,
    /// `OMNITTS_ATTN_THREADS`: the threads of every attention block (64, 128 or 256) instead of
    /// the size the grid and the context ask for.
    pub attn_threads: Option<usize>,
    /// `OMNITTS_PREFILL_BUDGET`: prompt positions stage 0 prefills a step instead of
    /// `PREFILL_CHUNK`.
    pub prefill_budget: Option<usize>,
    /// `OMNITTS_STAGE0_TRACE`: the file of stage 0's turn trace.
    pub stage0_trace: Option<std::path::PathBuf>,
    /// `OMNITTS_KEEP_FREED=0`: the CUDA memory pools keep CUDA's release threshold of 0 (freed
    /// memory goes back to the driver at every synchronisation) instead of keeping it.
    pub keep_freed: bool,
}

impl Default for Switches {
    fn default() -> Self {
        Self::from_lookup(|_| None)
    }
}

impl Switches {
    /// The switches of the process environment, read on the first call.
    pub fn get() -> &'static Switches {
        static SWITCHES: OnceLock<Switches> = OnceLock::new();
        SWITCHES.get_or_init(|| Self::from_lookup(|name| std::env::var(name).ok()))
    }

    /// The switches with `lookup(name)` as each variable's value (`None`: unset).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let value = |name: &str| lookup(name).map(|v| v.trim().to_string());
        let is = |name: &str, want: &str| value(name).is_some_and(|v| v == want);
        Self {
            fused_kernels: match value("OMNITTS_FUSED_KERNELS").as_deref() {
                Some("0") => FusedKernels::Off,
                Some("1") => FusedKernels::PerLayer,
                _ => FusedKernels::All,
            },
            decode_stack: is("OMNITTS_DECODE_STACK", "1"),
            stack_blocks_per_sm: value("OMNITTS_STACK_BLOCKS_PER_SM")
                .and_then(|v| v.parse().ok())
                .filter(|&n| n >= 1)
                .unwrap_or(2),
            fused_sampler: !is("OMNITTS_FUSED_SAMPLER", "0"),
            cp_frame_graph: !is("OMNITTS_CP_FRAME_GRAPH", "0"),
            batch_graphs: !is("OMNITTS_BATCH_GRAPHS", "0"),
            pinned_readback: !is("OMNITTS_PINNED_READBACK", "0"),
            decoder_kernels: !is("OMNITTS_DECODER_KERNELS", "0"),
            decoder_conv: match value("OMNITTS_DECODER_CONV").as_deref() {
                Some("candle") => DecoderConv::Candle,
                _ => DecoderConv::Cols,
            },
            prefill_graphs: !is("OMNITTS_PREFILL_GRAPHS", "0"),
            stream_priority: value("OMNITTS_STREAM_PRIORITY")
                .and_then(|v| StreamPriority::parse(&v)),
            decoder_first_graph: !is("OMNITTS_DECODER_FIRST_GRAPH", "0"),
            fish_graphs: is("OMNITTS_FISH_GRAPHS", "1"),
            arrivals_after_alone: !is("OMNITTS_ALONE_ARRIVALS", "0"),
            batched_prefill: !is("OMNITTS_BATCHED_PREFILL", "0"),
            parallel_choices: !is("OMNITTS_PARALLEL_CHOICES", "0"),
            twice_ramp: is("OMNITTS_CHUNK_RAMP", "twice"),
            attn_threads: value("OMNITTS_ATTN_THREADS")
                .and_then(|v| v.parse().ok())
                .filter(|n| [64, 128, 256].contains(n)),
            prefill_budget: value("OMNITTS_PREFILL_BUDGET")
                .and_then(|v| v.parse().ok())
                .filter(|&n| n >= 64),
            stage0_trace: value("OMNITTS_STAGE0_TRACE")
                .filter(|v| !v.is_empty())
                .map(std::path::PathBuf::from),
            keep_freed: !is("OMNITTS_KEEP_FREED", "0"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Switches {
        Switches::from_lookup(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn defaults_without_variables() {
        let s = with(&[]);
        assert_eq!(s, Switches::default());
        assert_eq!(s.fused_kernels, FusedKernels::All);
        assert!(!s.decode_stack);
        assert_eq!(s.stack_blocks_per_sm, 2);
        assert!(s.fused_sampler);
        assert!(s.cp_frame_graph);
        assert!(s.batch_graphs);
        assert!(s.pinned_readback);
        assert!(s.decoder_kernels);
        assert_eq!(s.decoder_conv, DecoderConv::Cols);
        assert!(s.prefill_graphs);
        assert_eq!(s.stream_priority, None);
        assert!(s.decoder_first_graph);
        assert!(s.arrivals_after_alone);
        assert!(s.batched_prefill);
        assert!(s.parallel_choices);
        assert!(!s.fish_graphs);
        assert!(!s.twice_ramp);
        assert_eq!(s.attn_threads, None);
        assert_eq!(s.prefill_budget, None);
        assert_eq!(s.stage0_trace, None);
        assert!(s.keep_freed);
    }

    #[test]
    fn each_variable_is_read() {
        let s = with(&[
            ("OMNITTS_FUSED_KERNELS", " 1 "),
            ("OMNITTS_DECODE_STACK", "1"),
            ("OMNITTS_STACK_BLOCKS_PER_SM", "3"),
            ("OMNITTS_FUSED_SAMPLER", "0"),
            ("OMNITTS_CP_FRAME_GRAPH", "0"),
            ("OMNITTS_BATCH_GRAPHS", "0"),
            ("OMNITTS_PINNED_READBACK", "0"),
            ("OMNITTS_DECODER_KERNELS", "0"),
            ("OMNITTS_DECODER_CONV", " candle"),
            ("OMNITTS_PREFILL_GRAPHS", "0"),
            ("OMNITTS_STREAM_PRIORITY", "lane, decoder"),
            ("OMNITTS_DECODER_FIRST_GRAPH", "0"),
            ("OMNITTS_ALONE_ARRIVALS", " 0"),
            ("OMNITTS_FISH_GRAPHS", "1"),
            ("OMNITTS_BATCHED_PREFILL", "0"),
            ("OMNITTS_PARALLEL_CHOICES", "0"),
            ("OMNITTS_CHUNK_RAMP", "twice "),
            ("OMNITTS_ATTN_THREADS", "128"),
            ("OMNITTS_PREFILL_BUDGET", "2048"),
            ("OMNITTS_STAGE0_TRACE", " /tmp/turns.tsv"),
            ("OMNITTS_KEEP_FREED", "0"),
        ]);
        assert_eq!(s.attn_threads, Some(128));
        assert_eq!(s.prefill_budget, Some(2048));
        assert_eq!(
            s.stage0_trace.as_deref(),
            Some(std::path::Path::new("/tmp/turns.tsv"))
        );
        assert!(s.fish_graphs);
        assert!(!s.batched_prefill);
        assert!(!s.parallel_choices);
        assert!(s.twice_ramp);
        assert!(!s.decoder_first_graph);
        assert!(!s.arrivals_after_alone);
        assert!(!s.keep_freed);
        assert_eq!(
            s.stream_priority,
            Some(StreamPriority {
                ar: None,
                lane: Some(0),
                decoder: Some(0)
            })
        );
        let none = with(&[("OMNITTS_STREAM_PRIORITY", "none")]).stream_priority;
        assert_eq!(none, Some(StreamPriority::default()));
        let ranked = with(&[("OMNITTS_STREAM_PRIORITY", "lane > ar")]).stream_priority;
        assert_eq!(ranked, Some(StreamPriority::OVER_DECODER));
        assert_eq!(s.decoder_conv, DecoderConv::Candle);
        assert!(!s.pinned_readback);
        assert!(!s.prefill_graphs);
        assert!(!s.decoder_kernels);
        assert_eq!(s.fused_kernels, FusedKernels::PerLayer);
        assert!(s.decode_stack);
        assert_eq!(s.stack_blocks_per_sm, 3);
        assert!(!s.fused_sampler);
        assert!(!s.cp_frame_graph);
        assert!(!s.batch_graphs);
        assert_eq!(
            with(&[("OMNITTS_FUSED_KERNELS", "0")]).fused_kernels,
            FusedKernels::Off
        );
        assert!(
            FusedKernels::Off < FusedKernels::PerLayer
                && FusedKernels::PerLayer < FusedKernels::All
        );
    }

    #[test]
    fn stream_priority_ranks_and_their_resolution() {
        let three = with(&[("OMNITTS_STREAM_PRIORITY", "ar > lane,decoder")]).stream_priority;
        let mixed = with(&[("OMNITTS_STREAM_PRIORITY", "decoder>lane>ar")]).stream_priority;
        assert_eq!(
            three,
            Some(StreamPriority {
                ar: Some(0),
                lane: Some(1),
                decoder: Some(1)
            })
        );
        assert_eq!(
            mixed,
            Some(StreamPriority {
                ar: Some(2),
                lane: Some(1),
                decoder: Some(0)
            })
        );
        let none = StreamPriority::default();
        // The variable, when set, wins over the stage config; without it the config decides.
        assert_eq!(StreamPriority::resolve(Some(none), Some(true)), none);
        assert_eq!(StreamPriority::resolve(three, None), three.unwrap());
        assert_eq!(
            StreamPriority::resolve(None, Some(true)),
            StreamPriority::OVER_DECODER
        );
        assert_eq!(StreamPriority::resolve(None, Some(false)), none);
        assert_eq!(StreamPriority::resolve(None, None), none);
        assert_eq!(
            StreamPriority::OVER_DECODER,
            with(&[("OMNITTS_STREAM_PRIORITY", "lane>ar")])
                .stream_priority
                .unwrap()
        );
    }

    #[test]
    fn other_values_keep_the_defaults() {
        let s = with(&[
            ("OMNITTS_FUSED_KERNELS", "2"),
            ("OMNITTS_DECODE_STACK", "yes"),
            ("OMNITTS_STACK_BLOCKS_PER_SM", "0"),
            ("OMNITTS_FUSED_SAMPLER", "off"),
            ("OMNITTS_CP_FRAME_GRAPH", ""),
            ("OMNITTS_BATCH_GRAPHS", "no"),
            ("OMNITTS_STREAM_PRIORITY", "ar,stage1"),
            ("OMNITTS_DECODER_FIRST_GRAPH", "off"),
            ("OMNITTS_ALONE_ARRIVALS", "no"),
            ("OMNITTS_BATCHED_PREFILL", "off"),
            ("OMNITTS_PREFILL_BUDGET", "63"),
            ("OMNITTS_STAGE0_TRACE", " "),
        ]);
        assert_eq!(s, Switches::default());
        let s = with(&[("OMNITTS_STACK_BLOCKS_PER_SM", "many")]);
        assert_eq!(s.stack_blocks_per_sm, 2);
        for bad in ["ar>ar", "lane,lane", "ar>", ">ar", "ar;lane", "None"] {
            let s = with(&[("OMNITTS_STREAM_PRIORITY", bad)]);
            assert_eq!(s.stream_priority, None, "{bad}");
        }
    }
}
