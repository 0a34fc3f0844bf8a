#!/usr/bin/env python3
"""Re-render teacher audio from the phoneme ids that teacher.py stored, with ONNX Runtime alone (no piper-tts, no
espeak-ng): for a machine that has ONNX Runtime and NumPy but not the teacher's packages (the device machine).

    python scripts/voice/render_ids.py --manifest teacher/manifest.jsonl --onnx en_US-joe-medium.onnx \
        --out /data/teacher [--providers CUDAExecutionProvider,CPUExecutionProvider] [--jobs N]

Does what piper-tts 1.8.0 `PiperVoice.synthesize` does per chunk: the model's inputs `input` (int64 ids),
`input_lengths`, `scales` = [noise, length, noise_w] (defaults: the voice's 0.667 / 1.0 / 0.8), peak
normalisation, × volume (0.7 as in teacher.py), chunks concatenated; then 22.05 -> 24 kHz with soxr (VHQ) when it is
installed, else scipy's polyphase resampler (160/147), and a 16-bit WAV per utterance plus OUT/manifest.jsonl with
the same ids, texts and paths as teacher.py. With --noise 0 --noise-w 0 the output is deterministic and equals
piper-tts with the same settings (checked on this repository's machine; see README.md).

With a model that has the `durations` output (onnx_fp16_weights.py adds it) each manifest row also gets
`durations`: per chunk, the duration of every phoneme id in decoder frames of 256 samples at 22.05 kHz (the chunk's
audio is exactly their sum times 256 samples before resampling). --lead-frames N puts N codec frames (80 ms each,
1920 samples at 24 kHz) of silence in front of every utterance (`lead_samples` in the row), so that a voice trained
on the renders starts from silence.
"""
import argparse
import json
import os
import sys
import time
import wave

import numpy as np

TEACHER_SR, OUT_SR = 22050, 24000


def resample(x):
    try:
        import soxr
        return soxr.resample(x, TEACHER_SR, OUT_SR, quality="VHQ").astype(np.float32)
    except ImportError:
        from scipy.signal import resample_poly
        return resample_poly(x, 160, 147).astype(np.float32)


def write_wav(path, x):
    pcm = (np.clip(x, -1.0, 1.0) * 32767.0).round().astype("<i2")
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(OUT_SR)
        w.writeframes(pcm.tobytes())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--manifest", required=True, help="teacher.py's manifest.jsonl (or .jsonl.gz)")
    ap.add_argument("--onnx", required=True, help="the Piper voice model (fp32 or a reduced-precision copy)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--providers", default="CPUExecutionProvider")
    ap.add_argument("--threads", type=int, default=0, help="ORT intra-op threads (0: ORT default)")
    ap.add_argument("--noise", type=float, default=0.667)
    ap.add_argument("--length", type=float, default=1.0)
    ap.add_argument("--noise-w", type=float, default=0.8)
    ap.add_argument("--volume", type=float, default=0.7)
    ap.add_argument("--lead-frames", type=int, default=0, help="80 ms frames of silence before each utterance")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--exclude", default=None, help="file of utterance ids (one a line) not to render, e.g. those "
                    "an earlier call rendered")
    ap.add_argument("--shard", default=None, help="K/N: render rows K, K+N, ... and write OUT/manifest-K.jsonl")
    ap.add_argument("--max-seconds", type=float, default=0, help="stop after this long (what is done is kept)")
    a = ap.parse_args()

    import onnxruntime as ort
    so = ort.SessionOptions()
    if a.threads:
        so.intra_op_num_threads = a.threads
    # CUDA: heuristic cuDNN algorithm choice (the default exhaustive search re-runs for every new input length)
    providers = [(p, {"cudnn_conv_algo_search": "HEURISTIC"}) if p == "CUDAExecutionProvider" else p
                 for p in a.providers.split(",")]
    sess = ort.InferenceSession(a.onnx, sess_options=so, providers=providers)
    in_types = {i.name: i.type for i in sess.get_inputs()}
    scale_dtype = np.float16 if in_types.get("scales") == "tensor(float16)" else np.float32
    out_names = [o.name for o in sess.get_outputs()]
    with_durations = "durations" in out_names
    import gzip
    with (gzip.open(a.manifest, "rt") if a.manifest.endswith(".gz") else open(a.manifest)) as f:
        rows = [json.loads(ln) for ln in f if ln.strip()]
    if a.exclude:
        with open(a.exclude) as f:
            skip = {ln.strip() for ln in f if ln.strip()}
        rows = [r for r in rows if r["id"] not in skip]
    rows = rows[: a.limit] if a.limit else rows
    name = "manifest.jsonl"
    if a.shard:
        k, n_sh = (int(v) for v in a.shard.split("/"))
        rows, name = rows[k::n_sh], f"manifest-{k}.jsonl"
    os.makedirs(os.path.join(a.out, "wav"), exist_ok=True)
    t0, secs, n = time.time(), 0.0, 0
    with open(os.path.join(a.out, name), "w") as man:
        for n, r in enumerate(rows, 1):
            if a.max_seconds and time.time() - t0 > a.max_seconds:
                n -= 1
                break
            chunks, durs = [], []
            for ids in r["phoneme_ids"]:
                x = np.array(ids, dtype=np.int64)[None]
                res = sess.run(None, {"input": x, "input_lengths": np.array([x.shape[1]], dtype=np.int64),
                                      "scales": np.array([a.noise, a.length, a.noise_w], dtype=scale_dtype)})
                audio = res[0].squeeze().astype(np.float32)
                if with_durations:
                    durs.append([int(v) for v in np.asarray(res[out_names.index("durations")]).reshape(-1)])
                m = float(np.max(np.abs(audio))) if audio.size else 0.0
                audio = np.zeros_like(audio) if m < 1e-8 else audio / m
                chunks.append(np.clip(audio * a.volume, -1.0, 1.0))
            y = resample(np.concatenate(chunks) if chunks else np.zeros(0, np.float32))
            y = np.clip(y, -1.0, 1.0)
            lead = a.lead_frames * 1920
            y = np.concatenate([np.zeros(lead, np.float32), y])
            wav = os.path.join("wav", r["id"] + ".wav")
            write_wav(os.path.join(a.out, wav), y)
            secs += len(y) / OUT_SR
            man.write(json.dumps({"id": r["id"], "text": r["text"], "wav": wav, "samples": int(len(y)),
                                  "seconds": round(len(y) / OUT_SR, 4), "phoneme_ids": r["phoneme_ids"], "lead_samples": lead,
                                  **({"durations": durs} if with_durations else {})}) + "\n")
            if n % 500 == 0:
                el = time.time() - t0
                print(f"{n}/{len(rows)}, {secs / 3600:.2f} h, {secs / el:.1f}x real time", file=sys.stderr, flush=True)
    el = time.time() - t0
    print(json.dumps({"utterances": n, "audio_seconds": round(secs, 1), "wall_seconds": round(el, 1),
                      "x_real_time": round(secs / max(el, 1e-9), 2), "providers": sess.get_providers()}))


if __name__ == "__main__":
    main()
