//! The async-chunk buffer between stage 0 (producer of codec frames) and stage 1 (consumer).
//!
//! Protocol (vLLM-Omni `talker2code2wav_async_chunk`, docs/qwen3-tts.md §9.2), per request:
//! - the producer pushes one frame at a time; at `capacity` frames not yet taken it blocks (never
//!   drops) until the consumer takes a chunk, the request is cancelled, or — for the non-blocking
//!   variant — it gets the frame back;
//! - the consumer is woken when the next chunk boundary is reached: `initial` frames, then every
//!   `chunk` frames after that (boundaries at `initial`, `initial + chunk`, `initial + 2·chunk`, …;
//!   `initial == 0` means boundaries at multiples of `chunk`); with a [`ChunkRamp`], the chunks
//!   after the first grow until they reach `chunk` (by default each as long as all the audio
//!   before it: 1, 1, 2, 4, 8, 16, 25, 25, … for `initial` 1 and `chunk` 25), so that the first
//!   audio is one frame and a player that starts on it does not run dry while the chunks grow to
//!   their efficient size. It takes exactly one scheduled chunk per call, so the windows it
//!   decodes do not depend on timing;
//! - once the producer calls [`ChunkBuffer::finish`], the consumer takes the remainder (a short
//!   final chunk) and then sees [`Take::Done`];
//! - in batch mode ([`ChunkPolicy::Whole`]) the buffer is unbounded and the consumer gets every frame
//!   in one chunk after `finish`;
//! - [`ChunkBuffer::cancel`] drops every queued frame and wakes both sides, which then see
//!   `Cancelled`.
//!
//! Waking uses [`Signal`]s, which a whole stage can share: a stage thread serving several requests
//! waits on one signal and polls its requests' buffers with the non-blocking calls.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// An epoch counter with a condition variable: a lost-wakeup-free "something changed" flag.
/// Read [`Signal::epoch`], try the work, and if nothing could be done call
/// [`Signal::wait_past`] with the epoch read before trying.
#[derive(Debug, Default)]
pub struct Signal {
    epoch: Mutex<u64>,
    cv: Condvar,
}

impl Signal {
    /// A new signal at epoch 0.
    pub fn new() -> Arc<Signal> {
        Arc::new(Signal::default())
    }

    fn lock(&self) -> MutexGuard<'_, u64> {
        self.epoch.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The current epoch.
    pub fn epoch(&self) -> u64 {
        *self.lock()
    }

    /// Advances the epoch and wakes every waiter.
    pub fn notify(&self) {
        let mut e = self.lock();
        *e = e.wrapping_add(1);
        self.cv.notify_all();
    }

    /// Blocks until the epoch differs from `seen` (returns at once if it already does) or the
    /// timeout passes. Returns the epoch at return.
    pub fn wait_past(&self, seen: u64, timeout: Option<Duration>) -> u64 {
        let guard = self.lock();
        let guard = match timeout {
            None => self
                .cv
                .wait_while(guard, |e| *e == seen)
                .unwrap_or_else(PoisonError::into_inner),
            Some(t) => {
                self.cv
                    .wait_timeout_while(guard, t, |e| *e == seen)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            }
        };
        *guard
    }
}

/// How the chunks after the first grow to the chunk size (`codec_chunk_ramp`).
///
/// A player that starts on the first chunk needs chunk k+1 by the time the audio before it has
/// played. Counting from the first audio, with chunk k+1 as long as all that audio
/// ([`ChunkRamp::Total`]) stage 0 must make the second chunk's one frame in one frame's playing
/// time (1× real time), the second to fourth frames in two frames' time (1.5×), the second to
/// eighth in four (1.75×): 2× only as the chunks near their size. With each chunk twice the one
/// before ([`ChunkRamp::Twice`]), the second chunk's two frames have one frame's time: 2× real
/// time from the first audio on, which is where a loaded GPU ran late (docs/cuda.md, "The second
/// chunk").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkRamp {
    /// Chunks of `initial`, then of `chunk` (vLLM-Omni's schedule).
    Off,
    /// Each chunk after the first as long as all the audio before it (boundaries at `initial`,
    /// 2·`initial`, 4·`initial`, …: chunks 1, 1, 2, 4, 8, 16 for `initial` 1) while that is below
    /// `chunk`, then chunks of `chunk`.
    Total,
    /// Each chunk twice the one before (1, 2, 4, 8, 16 for `initial` 1) while that is below
    /// `chunk`, then chunks of `chunk` (`OMNITTS_CHUNK_RAMP=twice`).
    Twice,
}

/// When the consumer may take frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkPolicy {
    /// async_chunk: a chunk of `initial` frames first (0 = no separate first chunk), then chunks of
    /// `chunk` frames (≥ 1), then the remainder at finish.
    Streaming {
        /// `initial_codec_chunk_frames`.
        initial: usize,
        /// `codec_chunk_frames`.
        chunk: usize,
        /// `codec_chunk_ramp`: how the chunks after the first grow from `initial` to `chunk`.
        ramp: ChunkRamp,
    },
    /// Batch: everything in one chunk once the producer has finished.
    Whole,
}

impl ChunkPolicy {
    /// The frame count (total pushed so far) at which the chunk starting at `taken` is complete,
    /// or `None` in batch mode.
    pub fn next_boundary(&self, taken: usize) -> Option<usize> {
        match *self {
            ChunkPolicy::Whole => None,
            ChunkPolicy::Streaming {
                initial,
                chunk,
                ramp,
            } => {
                let chunk = chunk.max(1);
                if initial > 0 && taken < initial {
                    return Some(initial);
                }
                // Past the first chunk: the ramp's chunks below `chunk`, then chunks of `chunk`
                // from where the ramp ends. `base`: the frames before the next chunk; it grows
                // each turn since `initial > 0` (so the loop ends by `base ≥ chunk`).
                let mut base = initial;
                let mut size = initial;
                if initial > 0 {
                    loop {
                        size = match ramp {
                            ChunkRamp::Off => break,
                            ChunkRamp::Total if base < chunk => base,
                            ChunkRamp::Twice if size.saturating_mul(2) < chunk => size * 2,
                            _ => break,
                        };
                        if taken < base.saturating_add(size) {
                            return Some(base.saturating_add(size));
                        }
                        base = base.saturating_add(size);
                    }
                }
                // Saturating: a chunk size near usize::MAX means "the rest at finish".
                Some(base.saturating_add(((taken - base) / chunk + 1).saturating_mul(chunk)))
            }
        }
    }

    /// The chunk boundaries from the start (the frame counts at which successive chunks are
    /// complete), increasing, without end; none in batch mode. E.g. 1, 2, 4, 8, 16, 32, 57, …
    /// for a first chunk of 1, chunks of 25 and [`ChunkRamp::Total`].
    pub fn boundaries(self) -> impl Iterator<Item = usize> {
        std::iter::successors(self.next_boundary(0), move |&b| {
            self.next_boundary(b).filter(|&next| next > b)
        })
    }

    /// The largest chunk the consumer ever waits for (the minimum useful capacity).
    pub fn largest_chunk(&self) -> usize {
        match *self {
            ChunkPolicy::Whole => usize::MAX,
            ChunkPolicy::Streaming { initial, chunk, .. } => initial.max(chunk).max(1),
        }
    }
}

/// Why a push did not happen; the item is handed back.
#[derive(Debug, PartialEq, Eq)]
pub enum PushError<T> {
    /// `capacity` frames are waiting for the consumer.
    Full(T),
    /// The request was cancelled; nothing will be consumed any more.
    Cancelled(T),
    /// [`ChunkBuffer::finish`] was already called (a producer bug).
    Finished(T),
}

/// What the consumer gets from a take.
#[derive(Debug, PartialEq, Eq)]
pub enum Take<T> {
    /// The next scheduled chunk. `last` is true when the producer has finished and nothing
    /// remains after it.
    Chunk {
        /// Frames in order; `frames[0]` is frame number `first`.
        frames: Vec<T>,
        /// Index of the first frame in the utterance.
        first: usize,
        /// No more frames will follow.
        last: bool,
    },
    /// The next boundary has not been reached yet (only from [`ChunkBuffer::try_take`]).
    NotReady,
    /// The producer finished and every frame has been taken.
    Done,
    /// The request was cancelled; queued frames were dropped.
    Cancelled,
}

#[derive(Debug)]
struct Inner<T> {
    queue: VecDeque<T>,
    /// Frames handed to the consumer so far.
    taken: usize,
    finished: bool,
    cancelled: bool,
}

/// A bounded frame queue for one request; see the module docs for the protocol.
#[derive(Debug)]
pub struct ChunkBuffer<T> {
    inner: Mutex<Inner<T>>,
    policy: ChunkPolicy,
    capacity: usize,
    /// Woken when space frees up or the request is cancelled.
    producer: Arc<Signal>,
    /// Woken when frames arrive, the producer finishes, or the request is cancelled.
    consumer: Arc<Signal>,
}

impl<T> ChunkBuffer<T> {
    /// A buffer with its own signals. `capacity` (frames waiting, ≥ 1) is raised to the largest
    /// chunk of `policy` so the two sides cannot deadlock; batch mode is unbounded.
    pub fn new(policy: ChunkPolicy, capacity: usize) -> Self {
        Self::with_signals(policy, capacity, Signal::new(), Signal::new())
    }

    /// As [`ChunkBuffer::new`], waking the given (possibly stage-wide) signals.
    pub fn with_signals(
        policy: ChunkPolicy,
        capacity: usize,
        producer: Arc<Signal>,
        consumer: Arc<Signal>,
    ) -> Self {
        let capacity = match policy {
            ChunkPolicy::Whole => usize::MAX,
            ChunkPolicy::Streaming { .. } => capacity.max(policy.largest_chunk()),
        };
        ChunkBuffer {
            inner: Mutex::new(Inner {
                queue: VecDeque::new(),
                taken: 0,
                finished: false,
                cancelled: false,
            }),
            policy,
            capacity,
            producer,
            consumer,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<T>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The chunk policy.
    pub fn policy(&self) -> ChunkPolicy {
        self.policy
    }

    /// Frames that may wait for the consumer before the producer blocks (`usize::MAX` in batch).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Frames pushed and not yet taken.
    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    /// No frames waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Frames pushed so far (taken + waiting).
    pub fn pushed(&self) -> usize {
        let g = self.lock();
        g.taken + g.queue.len()
    }

    /// Whether [`ChunkBuffer::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.lock().cancelled
    }

    /// Whether the producer could push now without blocking (false once cancelled/finished).
    pub fn has_space(&self) -> bool {
        let g = self.lock();
        !g.cancelled && !g.finished && g.queue.len() < self.capacity
    }

    /// Appends a frame if there is room.
    pub fn try_push(&self, item: T) -> Result<(), PushError<T>> {
        {
            let mut g = self.lock();
            if g.cancelled {
                return Err(PushError::Cancelled(item));
            }
            if g.finished {
                return Err(PushError::Finished(item));
            }
            if g.queue.len() >= self.capacity {
                return Err(PushError::Full(item));
            }
            g.queue.push_back(item);
        }
        self.consumer.notify();
        Ok(())
    }

    /// Appends a frame, blocking while the buffer is full. Returns the frame if the request is
    /// cancelled (or already finished) instead.
    pub fn push(&self, mut item: T) -> Result<(), PushError<T>> {
        loop {
            let seen = self.producer.epoch();
            match self.try_push(item) {
                Err(PushError::Full(back)) => {
                    item = back;
                    self.producer.wait_past(seen, None);
                }
                other => return other,
            }
        }
    }

    /// The producer is done: no more frames. Idempotent.
    pub fn finish(&self) {
        self.lock().finished = true;
        self.consumer.notify();
    }

    /// Takes the next scheduled chunk if its boundary was reached (or the remainder after
    /// `finish`).
    pub fn try_take(&self) -> Take<T> {
        let out = {
            let mut g = self.lock();
            if g.cancelled {
                return Take::Cancelled;
            }
            let avail = g.queue.len();
            let n = match self.policy.next_boundary(g.taken) {
                _ if g.finished && avail == 0 => return Take::Done,
                Some(boundary) if g.taken + avail >= boundary => boundary - g.taken,
                _ if g.finished => avail,
                _ => return Take::NotReady,
            };
            let first = g.taken;
            let frames: Vec<T> = g.queue.drain(..n).collect();
            g.taken += n;
            let last = g.finished && g.queue.is_empty();
            Take::Chunk {
                frames,
                first,
                last,
            }
        };
        self.producer.notify();
        out
    }

    /// Blocks until a chunk is ready, the producer is done, or the request is cancelled.
    pub fn take(&self) -> Take<T> {
        loop {
            let seen = self.consumer.epoch();
            match self.try_take() {
                Take::NotReady => {
                    self.consumer.wait_past(seen, None);
                }
                other => return other,
            }
        }
    }

    /// Cancels the request: drops every waiting frame and wakes both sides. Idempotent.
    pub fn cancel(&self) {
        let dropped = {
            let mut g = self.lock();
            g.cancelled = true;
            std::mem::take(&mut g.queue)
        };
        drop(dropped);
        self.producer.notify();
        self.consumer.notify();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;
    use std::time::Instant;

    fn chunk_sizes(policy: ChunkPolicy, total: usize) -> Vec<usize> {
        let buf = ChunkBuffer::new(policy, usize::MAX);
        let mut sizes = Vec::new();
        for i in 0..total {
            buf.try_push(i).unwrap();
            while let Take::Chunk { frames, first, .. } = buf.try_take() {
                assert_eq!(frames[0], first);
                sizes.push(frames.len());
            }
        }
        buf.finish();
        loop {
            match buf.try_take() {
                Take::Chunk { frames, last, .. } => {
                    assert!(last);
                    sizes.push(frames.len())
                }
                Take::Done => break,
                other => panic!("unexpected {other:?}"),
            }
        }
        sizes
    }

    /// A streaming policy (tests).
    fn streaming(initial: usize, chunk: usize, ramp: ChunkRamp) -> ChunkPolicy {
        ChunkPolicy::Streaming {
            initial,
            chunk,
            ramp,
        }
    }

    #[test]
    fn wake_thresholds_and_remainder() {
        let s = |initial, chunk| streaming(initial, chunk, ChunkRamp::Off);
        assert_eq!(chunk_sizes(s(1, 25), 60), vec![1, 25, 25, 9]);
        assert_eq!(chunk_sizes(s(2, 10), 22), vec![2, 10, 10]);
        assert_eq!(chunk_sizes(s(0, 10), 25), vec![10, 10, 5]);
        assert_eq!(chunk_sizes(s(1, 1), 4), vec![1, 1, 1, 1]);
        assert_eq!(chunk_sizes(s(30, 25), 40), vec![30, 10]);
        assert_eq!(chunk_sizes(s(1, 25), 0), Vec::<usize>::new());
        assert_eq!(chunk_sizes(ChunkPolicy::Whole, 37), vec![37]);
        // A chunk size near usize::MAX (a request's override) is the rest at finish, not an
        // overflow, with and without the ramp.
        assert_eq!(chunk_sizes(s(1, usize::MAX), 7), vec![1, 6]);
        assert_eq!(s(1, usize::MAX).next_boundary(1), Some(usize::MAX));
        let ramped = |ramp| streaming(1, usize::MAX, ramp);
        assert_eq!(
            chunk_sizes(ramped(ChunkRamp::Twice), 20),
            vec![1, 2, 4, 8, 5]
        );
        assert_eq!(
            chunk_sizes(ramped(ChunkRamp::Total), 20),
            vec![1, 1, 2, 4, 8, 4]
        );
    }

    #[test]
    fn total_ramp_makes_each_chunk_as_long_as_the_audio_before_it() {
        let r = |initial, chunk| streaming(initial, chunk, ChunkRamp::Total);
        assert_eq!(
            chunk_sizes(r(1, 25), 120),
            vec![1, 1, 2, 4, 8, 16, 25, 25, 25, 13]
        );
        assert_eq!(chunk_sizes(r(1, 25), 10), vec![1, 1, 2, 4, 2]);
        assert_eq!(chunk_sizes(r(2, 25), 60), vec![2, 2, 4, 8, 16, 25, 3]);
        assert_eq!(chunk_sizes(r(3, 8), 30), vec![3, 3, 6, 8, 8, 2]);
        // No ramp where there is nothing to grow: chunk ≤ initial, or no first chunk.
        assert_eq!(chunk_sizes(r(1, 1), 4), vec![1, 1, 1, 1]);
        assert_eq!(chunk_sizes(r(1, 2), 7), vec![1, 1, 2, 2, 1]);
        assert_eq!(chunk_sizes(r(0, 10), 25), vec![10, 10, 5]);
        assert_eq!(chunk_sizes(r(30, 25), 40), vec![30, 10]);
        // Each chunk is complete by the time the audio before it has played whenever frames come
        // at least as fast as its length needs: the boundaries double.
        let p = r(1, 25);
        let first = |n| p.boundaries().take(n).collect::<Vec<_>>();
        assert_eq!(first(8), vec![1, 2, 4, 8, 16, 32, 57, 82]);
        assert_eq!(p.next_boundary(33), Some(57));
    }

    #[test]
    fn twice_ramp_doubles_up_to_the_chunk() {
        let r = |initial, chunk| streaming(initial, chunk, ChunkRamp::Twice);
        assert_eq!(
            chunk_sizes(r(1, 25), 120),
            vec![1, 2, 4, 8, 16, 25, 25, 25, 14]
        );
        assert_eq!(chunk_sizes(r(1, 25), 10), vec![1, 2, 4, 3]);
        assert_eq!(chunk_sizes(r(2, 25), 60), vec![2, 4, 8, 16, 25, 5]);
        assert_eq!(chunk_sizes(r(3, 8), 30), vec![3, 6, 8, 8, 5]);
        // A ramp that cannot grow (chunk ≤ 2·initial, or no first chunk) is the plain schedule.
        assert_eq!(chunk_sizes(r(1, 1), 4), vec![1, 1, 1, 1]);
        assert_eq!(chunk_sizes(r(1, 2), 7), vec![1, 2, 2, 2]);
        assert_eq!(chunk_sizes(r(0, 10), 25), vec![10, 10, 5]);
        assert_eq!(chunk_sizes(r(30, 25), 40), vec![30, 10]);
        // The boundaries as a player sees them: audio of chunk k+1 is complete by the time chunk k
        // plays out whenever frames come at least 2× faster than real time.
        let p = r(1, 25);
        assert_eq!(
            p.boundaries().take(7).collect::<Vec<_>>(),
            vec![1, 3, 7, 15, 31, 56, 81]
        );
        assert_eq!(p.next_boundary(32), Some(56));
        assert_eq!(p.next_boundary(56), Some(81));
    }

    #[test]
    fn boundaries() {
        let p = streaming(2, 10, ChunkRamp::Off);
        assert_eq!(p.next_boundary(0), Some(2));
        assert_eq!(p.next_boundary(1), Some(2));
        assert_eq!(p.next_boundary(2), Some(12));
        assert_eq!(p.next_boundary(12), Some(22));
        assert_eq!(ChunkPolicy::Whole.next_boundary(5), None);
    }

    #[test]
    fn not_ready_until_boundary_then_last_flag() {
        let buf = ChunkBuffer::new(streaming(2, 3, ChunkRamp::Off), 8);
        buf.try_push(0).unwrap();
        assert_eq!(buf.try_take(), Take::NotReady);
        buf.try_push(1).unwrap();
        assert_eq!(
            buf.try_take(),
            Take::Chunk {
                frames: vec![0, 1],
                first: 0,
                last: false
            }
        );
        for i in 2..5 {
            buf.try_push(i).unwrap();
        }
        buf.finish();
        assert_eq!(
            buf.try_take(),
            Take::Chunk {
                frames: vec![2, 3, 4],
                first: 2,
                last: true
            }
        );
        assert_eq!(buf.try_take(), Take::Done);
        assert_eq!(buf.try_push(9), Err(PushError::Finished(9)));
    }

    #[test]
    fn capacity_is_raised_to_largest_chunk() {
        let b: ChunkBuffer<u8> = ChunkBuffer::new(streaming(1, 25, ChunkRamp::Off), 4);
        assert_eq!(b.capacity(), 25);
        let b: ChunkBuffer<u8> = ChunkBuffer::new(ChunkPolicy::Whole, 4);
        assert_eq!(b.capacity(), usize::MAX);
    }

    #[test]
    fn producer_blocks_at_capacity_and_never_drops() {
        let buf = Arc::new(ChunkBuffer::new(streaming(0, 2, ChunkRamp::Off), 4));
        for i in 0..4 {
            buf.try_push(i).unwrap();
        }
        assert_eq!(buf.try_push(4), Err(PushError::Full(4)));
        let b = buf.clone();
        let producer = thread::spawn(move || {
            for i in 4..20 {
                b.push(i).unwrap();
                assert!(b.len() <= 4);
            }
            b.finish();
        });
        // The producer must be blocked now: nothing was taken.
        thread::sleep(Duration::from_millis(50));
        assert_eq!(buf.pushed(), 4);
        assert!(!producer.is_finished());
        let mut got = Vec::new();
        loop {
            match buf.take() {
                Take::Chunk { frames, .. } => {
                    got.extend(frames);
                    thread::sleep(Duration::from_millis(2)); // a slow consumer
                }
                Take::Done => break,
                other => panic!("unexpected {other:?}"),
            }
        }
        producer.join().unwrap();
        assert_eq!(got, (0..20).collect::<Vec<_>>());
    }

    #[test]
    fn cancel_wakes_a_blocked_producer_and_consumer() {
        let buf = Arc::new(ChunkBuffer::new(streaming(0, 3, ChunkRamp::Off), 3));
        for i in 0..3 {
            buf.try_push(vec![i; 1000]).unwrap();
        }
        let b = buf.clone();
        let producer = thread::spawn(move || b.push(vec![99; 10]));
        let consumer_buf = Arc::new(ChunkBuffer::<u32>::new(streaming(0, 3, ChunkRamp::Off), 3));
        let cb = consumer_buf.clone();
        let consumer = thread::spawn(move || cb.take());
        thread::sleep(Duration::from_millis(30));
        let t = Instant::now();
        buf.cancel();
        consumer_buf.cancel();
        match producer.join().unwrap() {
            Err(PushError::Cancelled(v)) => assert_eq!(v, vec![99; 10]),
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(consumer.join().unwrap(), Take::Cancelled);
        assert!(t.elapsed() < Duration::from_secs(1));
        // Every queued frame was released.
        assert_eq!(buf.len(), 0);
        assert_eq!(buf.try_take(), Take::Cancelled);
        assert!(!buf.has_space());
    }

    #[test]
    fn shared_signal_wakes_a_stage_waiting_on_several_buffers() {
        let sig = Signal::new();
        let a = Arc::new(ChunkBuffer::<u8>::with_signals(
            streaming(1, 1, ChunkRamp::Off),
            2,
            Signal::new(),
            sig.clone(),
        ));
        let b = Arc::new(ChunkBuffer::with_signals(
            streaming(1, 1, ChunkRamp::Off),
            2,
            Signal::new(),
            sig.clone(),
        ));
        let seen = sig.epoch();
        let bb = b.clone();
        let h = thread::spawn(move || {
            thread::sleep(Duration::from_millis(20));
            bb.try_push(7u8).unwrap();
        });
        assert_eq!(a.try_take(), Take::NotReady);
        assert_eq!(b.try_take(), Take::NotReady);
        let now = sig.wait_past(seen, Some(Duration::from_secs(5)));
        assert_ne!(now, seen);
        h.join().unwrap();
        assert!(matches!(b.try_take(), Take::Chunk { .. }));
    }

    #[test]
    fn signal_timeout() {
        let s = Signal::new();
        let e = s.epoch();
        let t = Instant::now();
        assert_eq!(s.wait_past(e, Some(Duration::from_millis(20))), e);
        assert!(t.elapsed() >= Duration::from_millis(20));
        s.notify();
        assert_eq!(s.wait_past(e, None), e + 1);
    }
}
