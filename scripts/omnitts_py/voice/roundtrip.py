"""Step `roundtrip` (evaluation): encode + decode with the trained codec, the codec's own ceiling for wer.py."""
import os

import torch

from .codec import build_codec_modules, load_export_codec, quantize
from .common import log
from .data import load_audio, load_manifest, write_wav
from .quantizer import encode_audio, load_quantizer
from .talker import gta_replace


def step_roundtrip(a, size, ns):
    """Codec ceiling: encode + decode (official decoder forward on the codes) every utterance of --manifest (e.g.
    teacher.py's render of test_sentences.txt) into WORK/roundtrip/<line>.wav, for wer.py --wav-dir."""
    if a.init_from and a.scheme == "learned":
        raise SystemExit("roundtrip --init-from: an export holds no encoder; use the mel or phone scheme")
    dev = torch.device(a.device)
    codec, enc = build_codec_modules(ns, size, dev)
    if a.init_from:
        load_export_codec(codec, a.init_from)
        st = {"step": f"(export {a.init_from})"}
    else:
        st = torch.load(os.path.join(a.work, "codec", "codec.pt"), map_location=dev, weights_only=False)
        codec.load_state_dict(st["codec"])
    codec.eval()
    rows = load_manifest(a.manifest, a.limit)
    audio = load_audio(a.manifest, rows)
    if a.scheme != "learned":
        q, fmel = load_quantizer(a.work, dev)
        mel_codes = encode_audio(q, fmel, audio, dev, rows=rows)
        if a.gta_from:
            mel_codes = gta_replace(a, ns, size, dev, rows, mel_codes)
    else:
        enc.load_state_dict(st["encoder"])
        enc.eval()
    out = os.path.join(a.work, "roundtrip")
    os.makedirs(out, exist_ok=True)
    with torch.no_grad():
        for k, (r, x) in enumerate(zip(rows, audio)):
            if a.scheme != "learned":
                codes = mel_codes[k].t()[None].long().to(dev)
            else:
                z = enc((x.float() / 32768.0).to(dev)[None])
                _, codes, _ = quantize(codec.decoder, z, train=False)
            wav = codec.decoder(codes)[0, 0].cpu().numpy()
            write_wav(os.path.join(out, r["id"] + ".wav"), wav)
    log(f"roundtrip: {len(rows)} utterances -> {out} (codec trained {st.get('step')} steps)")
