//! Stage 0's turns, one line each, for finding where new requests wait
//! (`OMNITTS_STAGE0_TRACE=FILE`; off by default, see `nn/switches.rs`). The first stage-0 thread
//! of the process writes `FILE`, later ones (another engine, a reloaded one) `FILE.2`, `FILE.3`,
//! … ([`TurnTrace::open_next`]), so that no engine's turns overwrite or interleave with
//! another's.
//!
//! A turn of stage 0's loop (`stage0.rs`, `run`) takes the requests that arrived, builds their
//! prompts, runs a step's prefill budget of them, maybe a step of the new rows alone, then the
//! batched step of every running row. The engine's per-request metrics say how long a request
//! waited in all; these lines say what the loop was doing meanwhile. Each line is tab-separated:
//!
//! | column | unit | what |
//! |---|---|---|
//! | `t_ms` | ms | the turn's start, from the trace's opening |
//! | `arrived` | requests | taken from the queue this turn |
//! | `admitted`, `admit_ms` | requests, ms | given a place, and the time for it: a whole text's prompt built (`Stage0Model::begin`), an open text's state made |
//! | `waiting` | requests | still waiting for a place after admission |
//! | `prefills`, `positions`, `prefill_ms` | prompts, positions, ms | the new prompts handed to the step's prefill call, and its time (a running request's later prompt, run after it, counts in `turn_ms` only) |
//! | `queued` | prompts | admitted prompts with positions still to run after it (not started, or started in pieces) |
//! | `alone_rows`, `alone_ms` | rows, ms | the step of new rows alone (0 when none ran) |
//! | `rows`, `step_ms` | rows, ms | the batched step (0 when none ran) |
//! | `turn_ms` | ms | the whole turn, waiting for work excluded |
//!
//! Writing a line costs a formatted write into a buffered file; the file is flushed when the
//! stage ends and every 256 lines. A file that cannot be opened or written is reported once on
//! stderr and the trace stops; the engine goes on.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// What one turn did (see the module doc's columns).
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Turn {
    pub arrived: usize,
    pub admitted: usize,
    pub admit: Duration,
    pub waiting: usize,
    pub prefills: usize,
    pub positions: usize,
    pub prefill: Duration,
    pub queued: usize,
    pub alone_rows: usize,
    pub alone: Duration,
    pub rows: usize,
    pub step: Duration,
}

/// The open trace file of one stage-0 thread.
pub(crate) struct TurnTrace {
    out: BufWriter<File>,
    opened: Instant,
    lines: usize,
}

/// The header line (the module doc's columns).
const HEADER: &str = "t_ms\tarrived\tadmitted\tadmit_ms\twaiting\tprefills\tpositions\tprefill_ms\tqueued\talone_rows\talone_ms\trows\tstep_ms\tturn_ms";

impl TurnTrace {
    /// Opens the next trace file of the process for `path`: `path` itself for the first call,
    /// `path.N` for the N-th (see the module doc); as [`Self::open`].
    pub fn open_next(path: &Path) -> Option<Self> {
        static OPENED: AtomicUsize = AtomicUsize::new(0);
        let n = OPENED.fetch_add(1, Ordering::Relaxed) + 1;
        Self::open(&numbered(path, n))
    }

    /// Opens (truncates) `path` and writes the header; `None`, with a line on stderr, when it
    /// cannot be written.
    pub fn open(path: &Path) -> Option<Self> {
        let opened = File::create(path).and_then(|f| {
            let mut out = BufWriter::new(f);
            writeln!(out, "{HEADER}")?;
            Ok(out)
        });
        match opened {
            Ok(out) => Some(Self {
                out,
                opened: Instant::now(),
                lines: 0,
            }),
            Err(e) => {
                eprintln!("omnitts: stage 0 trace {}: {e}; no trace", path.display());
                None
            }
        }
    }

    /// Writes the line of a turn that started at `start` and ended at `end`. `false` when the
    /// write failed (reported on stderr): the caller drops the trace.
    pub fn record(&mut self, start: Instant, end: Instant, t: &Turn) -> bool {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let written = writeln!(
            self.out,
            "{:.3}\t{}\t{}\t{:.3}\t{}\t{}\t{}\t{:.3}\t{}\t{}\t{:.3}\t{}\t{:.3}\t{:.3}",
            ms(start.saturating_duration_since(self.opened)),
            t.arrived,
            t.admitted,
            ms(t.admit),
            t.waiting,
            t.prefills,
            t.positions,
            ms(t.prefill),
            t.queued,
            t.alone_rows,
            ms(t.alone),
            t.rows,
            ms(t.step),
            ms(end.saturating_duration_since(start)),
        )
        .and_then(|()| {
            self.lines += 1;
            if self.lines.is_multiple_of(256) {
                self.out.flush()
            } else {
                Ok(())
            }
        });
        if let Err(e) = &written {
            eprintln!("omnitts: stage 0 trace: {e}; trace stopped");
        }
        written.is_ok()
    }
}

/// `path` for the first trace of the process, `path.n` for the n-th.
fn numbered(path: &Path, n: usize) -> PathBuf {
    if n <= 1 {
        return path.to_path_buf();
    }
    let mut name = path.as_os_str().to_os_string();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

impl Drop for TurnTrace {
    fn drop(&mut self) {
        let _ = self.out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("omnitts-trace-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("a temporary folder");
        d
    }

    #[test]
    fn a_turn_is_one_line_under_the_header() {
        let dir = temp_dir("line");
        let path = dir.join("turns.tsv");
        let mut trace = TurnTrace::open(&path).expect("the trace opens");
        let start = trace.opened + Duration::from_millis(5);
        let turn = Turn {
            arrived: 3,
            admitted: 3,
            admit: Duration::from_micros(1500),
            prefills: 2,
            positions: 61,
            prefill: Duration::from_millis(4),
            queued: 1,
            rows: 7,
            step: Duration::from_millis(9),
            ..Turn::default()
        };
        assert!(trace.record(start, start + Duration::from_millis(15), &turn));
        drop(trace);
        let text = std::fs::read_to_string(&path).expect("the trace is readable");
        std::fs::remove_dir_all(&dir).expect("the folder is removed");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0], HEADER);
        assert_eq!(
            lines[1],
            "5.000\t3\t3\t1.500\t0\t2\t61\t4.000\t1\t0\t0.000\t7\t9.000\t15.000"
        );
    }

    #[test]
    fn later_traces_of_the_process_are_numbered() {
        let p = Path::new("/tmp/turns.tsv");
        assert_eq!(numbered(p, 1), p);
        assert_eq!(numbered(p, 2), Path::new("/tmp/turns.tsv.2"));
        assert_eq!(numbered(p, 13), Path::new("/tmp/turns.tsv.13"));
    }

    #[test]
    fn an_unwritable_path_gives_no_trace() {
        let dir = temp_dir("missing");
        assert!(TurnTrace::open(&dir.join("missing").join("turns.tsv")).is_none());
        std::fs::remove_dir_all(&dir).expect("the folder is removed");
    }
}
