"""Step `codes`: every teacher utterance encoded into [frames, n_q] codes."""
import os

import torch

from .codec import build_codec_modules, quantize
from .common import HOP, log
from .data import load_audio, load_manifest, save_codes, write_wav
from .quantizer import encode_audio, load_quantizer


def step_codes(a, size, ns, codec=None, enc=None):
    dev = torch.device(a.device)
    path = a.codes_out or os.path.join(a.work, "codes.pt")
    if a.scheme in ("mel", "phone"):
        rows = load_manifest(a.manifest, a.limit)
        audio = load_audio(a.manifest, rows)
        q, fmel = load_quantizer(a.work, dev)
        codes = encode_audio(q, fmel, audio, dev, rows=rows)
        out = [dict(id=r["id"], text=r["text"], codes=c) for r, c in zip(rows, codes)]
        save_codes(path, out)
        log(f"codes: {len(out)} utterances, {sum(len(c) for c in codes)} frames -> {path}")
        return out
    if codec is None:
        codec, enc = build_codec_modules(ns, size, dev)
        st = torch.load(os.path.join(a.work, "codec", "codec.pt"), map_location=dev)
        codec.load_state_dict(st["codec"])
        enc.load_state_dict(st["encoder"])
    codec.eval()
    enc.eval()
    rows = load_manifest(a.manifest, a.limit)
    audio = load_audio(a.manifest, rows)
    out = [None] * len(rows)
    order = sorted(range(len(rows)), key=lambda i: len(audio[i]))
    bs = a.codes_batch
    with torch.no_grad():
        # batches of similar length, zero-padded to the longest; each utterance keeps its own frame count (the
        # padding can only touch the last frame or two of the shorter ones, whose tails are near-silence anyway)
        for b in range(0, len(order), bs):
            idx = order[b:b + bs]
            n = max(len(audio[i]) for i in idx)
            x = torch.stack([torch.nn.functional.pad(audio[i], (0, n - len(audio[i]))) for i in idx])
            z = enc((x.float() / 32768.0).to(dev))
            _, codes, _ = quantize(codec.decoder, z, train=False)
            codes = codes.to(torch.int16).cpu()
            for j, i in enumerate(idx):
                T = len(audio[i]) // HOP
                out[i] = dict(id=rows[i]["id"], text=rows[i]["text"], codes=codes[j, :, :T].t().contiguous())   # [T, n]
    save_codes(path, out)
    frames = sum(o["codes"].shape[0] for o in out)
    log(f"codes: {len(out)} utterances, {frames} frames -> {path}")
    # round trip through the official decode path (quantizer.decode + forward) on the first utterance
    with torch.no_grad():
        c = out[0]["codes"].t()[None].long().to(dev)
        wav = codec.decoder(c)[0, 0].cpu().numpy()
    write_wav(os.path.join(a.work, "codec_roundtrip_0.wav"), wav)
    return out
