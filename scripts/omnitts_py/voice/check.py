"""Step `check`: greedy official generation of training texts compared frame by frame with their training codes."""
import os

import torch

from .common import SPEAKER, log
from .data import load_codes


def step_check(a, size, ns):
    """Greedy official generation (Qwen3TTSModel.generate_custom_voice, non-streaming, language english) for the
    first --check-n training texts, compared frame by frame with their training codes: on a model that has learned
    (or memorised) them this shows that the training prompt format is the one inference uses."""
    data = load_codes(os.path.join(a.work, "codes.pt"))[: a.check_n]
    tts = ns.Qwen3TTSModel.from_pretrained(a.out, dtype=torch.float32)
    cap = {}
    orig = tts.model.generate

    def generate(*x, **k):
        out = orig(*x, **k)
        cap["codes"] = out[0][0]
        return out
    tts.model.generate = generate
    res = []
    for d in data:
        ref = d["codes"].long()
        tts.generate_custom_voice(text=d["text"], speaker=SPEAKER, language="English", do_sample=False,
                                  subtalker_dosample=False, max_new_tokens=ref.shape[0] + 10)
        got = torch.as_tensor(cap["codes"]).long().cpu()
        n = min(len(got), len(ref))
        res.append(dict(frames_ref=len(ref), frames_got=len(got),
                        code0_match=float((got[:n, 0] == ref[:n, 0]).float().mean()) if n else 0.0,
                        all_match=float((got[:n] == ref[:n]).float().mean()) if n else 0.0))
        log(f"check: {d['text'][:50]!r}: {res[-1]}")
    return res
