"""The recipe's files: the teacher manifest and its audio, codes files, WAV output."""
import io
import json
import lzma
import math
import os
import wave

import numpy as np
import torch

from .common import HOP, SR


def save_codes(path, out):
    """Codes of many utterances: a list of dicts (id, text, codes [frames, n_q] int16). A path ending in .xz is
    written compactly (one int16 tensor + lengths, xz-compressed: ~10 bits a code, small enough to carry)."""
    if path.endswith(".xz"):
        buf = io.BytesIO()
        torch.save(dict(ids=[d["id"] for d in out], texts=[d["text"] for d in out],
                        lengths=[int(d["codes"].shape[0]) for d in out],
                        codes=torch.cat([d["codes"].to(torch.int16) for d in out])), buf)
        with lzma.open(path, "wb", preset=6) as f:
            f.write(buf.getvalue())
    else:
        torch.save(out, path)


def load_codes(path):
    """The inverse of save_codes (either format)."""
    if not path.endswith(".xz"):
        return torch.load(path, weights_only=False)
    with lzma.open(path, "rb") as f:
        d = torch.load(io.BytesIO(f.read()), weights_only=False)
    parts = torch.split(d["codes"], d["lengths"])
    return [dict(id=i, text=t, codes=c) for i, t, c in zip(d["ids"], d["texts"], parts)]


def load_manifest(path, limit=None):
    rows = []
    with open(path) as f:
        for ln in f:
            if ln.strip():
                rows.append(json.loads(ln))
    rows.sort(key=lambda r: r["id"])
    return rows[:limit] if limit else rows


def write_wav(path, x):
    pcm = (np.clip(np.asarray(x, dtype=np.float32), -1.0, 1.0) * 32767.0).round().astype("<i2")
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SR)
        w.writeframes(pcm.tobytes())


def load_audio(manifest_path, rows):
    """int16 tensors, zero-padded to a whole number of frames."""
    base = os.path.dirname(os.path.abspath(manifest_path))
    out = []
    for r in rows:
        with wave.open(os.path.join(base, r["wav"]), "rb") as w:
            assert w.getframerate() == SR and w.getsampwidth() == 2 and w.getnchannels() == 1, r["wav"]
            a = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").copy()
        n = int(math.ceil(len(a) / HOP)) * HOP
        a = np.pad(a, (0, n - len(a)))
        out.append(torch.from_numpy(a))
    return out
