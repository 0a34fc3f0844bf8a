"""Step `export`: the checkpoint directory in the exact Qwen3-TTS layout, checked with the official loader."""
import os

import torch

from ..layout import write_checkpoint_dir
from .codec import build_codec_modules
from .common import SPEAKER, log
from .configs import main_config, speech_tokenizer_config
from .data import write_wav
from .talker import build_talker
from .tokenizer import special_ids


def step_export(a, size, ns):
    """Writes --out from the trained talker and codec of WORK, then loads it with the official Qwen3TTSModel and
    speaks a sentence with generate_custom_voice (WORK/export_check.wav)."""
    tok_dir = os.path.join(a.work, "tok")
    ids = special_ids(tok_dir)
    cfg_dict = main_config(size, ids)
    tcfg_dict = speech_tokenizer_config(size)
    model = build_talker(ns, size, ids)
    model.load_state_dict(torch.load(os.path.join(a.work, "talker", "talker.pt"), map_location="cpu", weights_only=False)["model"])
    codec, _ = build_codec_modules(ns, size, torch.device("cpu"))
    codec.load_state_dict(torch.load(os.path.join(a.work, "codec", "codec.pt"), map_location="cpu", weights_only=False)["codec"])

    out = a.out
    cdt = size.get("codec_dtype", "f32")
    sd, csd = write_checkpoint_dir(out, model, codec, cfg_dict, tcfg_dict, tok_dir, codec_dtype=cdt)
    total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(out) for f in fs)
    log(f"export: {out}, {total / 1e6:.2f} MB (talker {sum(v.numel() for v in sd.values()) / 1e6:.2f} M bf16, "
        f"codec {sum(v.numel() for v in csd.values()) / 1e6:.2f} M {cdt})")
    budget = size.get("budget_mb", 32)
    if total > budget * 1e6:
        log(f"WARNING: over the {budget} MB budget")

    # official loader + generate_custom_voice (greedy, short)
    tts = ns.Qwen3TTSModel.from_pretrained(out, dtype=torch.float32)
    wavs, sr = tts.generate_custom_voice(text="Hello there.", speaker=SPEAKER, language="English",
                                        do_sample=False, subtalker_dosample=False, max_new_tokens=a.check_frames)
    write_wav(os.path.join(a.work, "export_check.wav"), wavs[0])
    log(f"export check: official generate_custom_voice -> {len(wavs[0]) / sr:.2f} s at {sr} Hz")
    return out
