//! The engine's cache of encoded voice-clone references (Base checkpoints).
//!
//! Encoding a reference recording (speaker encoder → x-vector, codec encoder → reference codes)
//! needs the Base `ArModel`, which lives on the stage-0 thread, so [`super::Engine::voice_clone_prompt`]
//! hands the audio to stage 0 as a job (run between two rounds of frames, so it delays the
//! utterances in flight by the encoding time once) and caches the result here. Repeated utterances
//! with the same reference, transcript and mode then reuse the prompt without touching stage 0.
//!
//! The cache is small (a few voices), least-recently-used, and keyed by a 64-bit hash of the
//! samples' bits plus their count, the transcript and the mode. Only successful encodings are
//! cached; an invalid reference (too short, silent, …) is checked again each time, which costs no
//! model work. Two callers that miss on the same key at the same moment both encode (the results
//! are equal); the engine's single caller per element makes this rare.

use std::collections::VecDeque;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use crate::models::tts::VoiceClonePrompt;

/// How many encoded references an engine keeps.
pub const VOICE_CLONE_CACHE_ENTRIES: usize = 8;

/// Counters of [`super::Engine::voice_clone_prompt`], since the engine was loaded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VoiceCloneStats {
    /// References encoded by stage 0 (successful encodings only).
    pub encodes: u64,
    /// Calls answered from the cache, without encoding.
    pub cache_hits: u64,
}

/// What identifies an encoded reference. In x-vector-only mode the transcript is not part of the
/// key (it is not used, as in the reference `generate_voice_clone`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CloneKey {
    samples: usize,
    hash: u64,
    ref_text: Option<String>,
    x_vector_only: bool,
}

impl CloneKey {
    /// The transcript the encoding uses: none in x-vector-only mode.
    pub fn ref_text(&self) -> Option<&str> {
        self.ref_text.as_deref()
    }

    pub fn new(audio_24k: &[f32], ref_text: Option<&str>, x_vector_only: bool) -> Self {
        let mut h = DefaultHasher::new();
        for x in audio_24k {
            h.write_u32(x.to_bits());
        }
        audio_24k.len().hash(&mut h);
        CloneKey {
            samples: audio_24k.len(),
            hash: h.finish(),
            ref_text: if x_vector_only {
                None
            } else {
                ref_text.map(str::to_string)
            },
            x_vector_only,
        }
    }
}

/// The LRU list and the counters (behind the engine's mutex).
#[derive(Debug, Default)]
pub(crate) struct CloneCache {
    /// Least recently used first.
    entries: VecDeque<(CloneKey, Arc<VoiceClonePrompt>)>,
    stats: VoiceCloneStats,
}

impl CloneCache {
    /// The cached prompt for `key` (counted as a hit, moved to most recently used).
    pub fn get(&mut self, key: &CloneKey) -> Option<Arc<VoiceClonePrompt>> {
        let i = self.entries.iter().position(|(k, _)| k == key)?;
        let entry = self.entries.remove(i)?;
        let prompt = entry.1.clone();
        self.entries.push_back(entry);
        self.stats.cache_hits += 1;
        Some(prompt)
    }

    /// Records a fresh encoding of `key`, evicting the least recently used entry when full.
    pub fn insert(&mut self, key: CloneKey, prompt: Arc<VoiceClonePrompt>) {
        self.stats.encodes += 1;
        self.entries.retain(|(k, _)| *k != key);
        self.entries.push_back((key, prompt));
        while self.entries.len() > VOICE_CLONE_CACHE_ENTRIES {
            self.entries.pop_front();
        }
    }

    pub fn stats(&self) -> VoiceCloneStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(v: f32) -> Arc<VoiceClonePrompt> {
        Arc::new(VoiceClonePrompt {
            x_vector: vec![v],
            ..Default::default()
        })
    }

    #[test]
    fn key_covers_samples_text_and_mode() {
        let a = [0.1f32, 0.2, 0.3];
        let k = CloneKey::new(&a, Some("t"), false);
        assert_eq!(k, CloneKey::new(&a, Some("t"), false));
        assert_ne!(k, CloneKey::new(&[0.1, 0.2, 0.30001], Some("t"), false));
        assert_ne!(k, CloneKey::new(&a[..2], Some("t"), false));
        assert_ne!(k, CloneKey::new(&a, Some("u"), false));
        assert_ne!(k, CloneKey::new(&a, Some("t"), true));
        // x-vector-only ignores the transcript.
        assert_eq!(
            CloneKey::new(&a, Some("t"), true),
            CloneKey::new(&a, None, true)
        );
    }

    #[test]
    fn lru_bounded_and_counted() {
        let mut c = CloneCache::default();
        let keys: Vec<CloneKey> = (0..=VOICE_CLONE_CACHE_ENTRIES)
            .map(|i| CloneKey::new(&[i as f32], None, true))
            .collect();
        c.insert(keys[0].clone(), prompt(0.0));
        assert_eq!(c.get(&keys[0]).unwrap().x_vector, vec![0.0]);
        for (i, k) in keys.iter().enumerate().skip(1) {
            // Touch key 0 so that key 1 is the oldest when the cache overflows.
            if i == VOICE_CLONE_CACHE_ENTRIES {
                assert!(c.get(&keys[0]).is_some());
            }
            c.insert(k.clone(), prompt(i as f32));
        }
        assert!(c.get(&keys[0]).is_some(), "recently used entry evicted");
        assert!(c.get(&keys[1]).is_none(), "oldest entry kept");
        assert_eq!(c.entries.len(), VOICE_CLONE_CACHE_ENTRIES);
        assert_eq!(
            c.stats(),
            VoiceCloneStats {
                encodes: VOICE_CLONE_CACHE_ENTRIES as u64 + 1,
                cache_hits: 3
            }
        );
    }
}
