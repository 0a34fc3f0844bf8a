#!/usr/bin/env python3
"""Training recipe for the bundled omnitts English voice, in the exact Qwen3-TTS checkpoint layout.

Everything that is exported is an instance of the official classes of the PyPI package qwen-tts 0.1.1
(transformers 4.57.3): `Qwen3TTSForConditionalGeneration` (talker + code predictor, CustomVoice with one speaker)
and `Qwen3TTSTokenizerV2Model` (speech tokenizer: the 12 Hz Code2Wav decoder, plus a tiny untrained Mimi encoder kept
only so the directory has the real layout; CustomVoice never uses the encoder). Sizes are small and come from a
preset (SIZES below); every special id is written into the config JSON and read back from it.

Steps (each writes into WORK; run them in order, or `all`):

  tokenizer  byte-level BPE (Qwen2 pre-tokenizer regex, NFC, ByteLevel) trained on the training text; the special
             tokens (<|im_start|>, <tts_pad>, ...) get ids after the BPE vocabulary; "assistant" and "\\n" are single
             tokens so the reference prompt slicing (ids[:3] role, ids[3:-5] body) holds.
  quantizer  (--scheme mel, the default) defines the codes before any training: each 80 ms frame is 4 log-mel
             sub-frames of 20 ms (320 values, normalised per value); codebook 0 is a k-means of whole frames, codebook q
             a k-means of the residual left by codebooks < q (WORK/quantizer.pt).
  codec      trains the official Code2Wav decoder on teacher audio (multi-scale mel + multi-resolution STFT, optional
             multi-scale STFT discriminator): with --scheme mel as a vocoder from the fixed codes (its codebook vectors
             are ordinary parameters, started from the centroids' principal axes); with --scheme learned (the first
             device run) together with a small conv encoder (training only, not exported) and the official split RVQ
             (EMA k-means updates written into `embedding_sum`/`cluster_usage`). --gta-from EXPORT: the decoder
             learns from ground-truth-aligned codes instead (gta_codes: the residual codebooks as the code predictor
             predicts them), i.e. from the inputs it gets at inference.
  codes      encodes every teacher utterance into [frames, n] codes (WORK/codes.pt, or --codes-out).
  talker     trains talker + code predictor on (text, codes; --codes: one or more files) in the non-streaming CustomVoice prompt format (the
             format omnitts and the reference use by default for CustomVoice): language "english" or "auto" at random,
             speaker "joe". Loss: codebook-0 next-frame CE incl. EOS (official `talker.forward(labels=...)`) + code-predictor
             CE on the logits of the official `talker.forward_sub_talker_finetune` (its built-in loss shifts the
             labels once too often, so it is not used).
  roundtrip  (evaluation) encodes + decodes the utterances of --manifest with the trained codec, for wer.py: the
             codec's own ceiling, separate from the talker's. With --gta-from EXPORT the residual codebooks are the
             ones that export's code predictor greedily predicts (codebook 0 stays the audio's): what the decoder
             gets at inference when the talker picks the right codebook-0 code.
  probe      (diagnosis) teacher-forced CE of an export with altered inputs: wrong text, random residual codes.
  export     writes the checkpoint directory (bf16 model.safetensors, f32 speech_tokenizer/model.safetensors, configs,
             vocab.json/merges.txt/tokenizer_config.json) and checks it loads through the official
             `Qwen3TTSModel.from_pretrained` and speaks a sentence with `generate_custom_voice`.

    python scripts/voice/train.py all --manifest /work/voice-data/teacher/manifest.jsonl \
        --text /work/voice-data/corpus/train.txt --work /work/voice-data/run --out models/omnitts-en --size small

Smoke test (CPU, a minute or two): --size toy --codec-steps 20 --talker-steps 20 --limit 16.
Environment: tests/fixtures/requirements.txt (torch 2.5.1, qwen-tts 0.1.1, transformers 4.57.3, tokenizers 0.22.2).
Needs only torch, numpy, safetensors, tokenizers, transformers (+ accelerate) and qwen-tts: audio I/O is the
standard `wave` module, and the packages qwen-tts imports but these paths never use (librosa, soundfile, sox,
torchaudio, onnxruntime) are stubbed when absent, as in tests/fixtures/generate.py.
"""
import argparse
import importlib.machinery
import importlib.util
import json
import math
import os
import random
import shutil
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
SR = 24000
HOP = 1920                      # samples per 12.5 Hz frame
SPEAKER = "joe"
SPEAKER_ID = 3000               # codec_embedding row of the speaker (as the official finetune script uses)
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
            "<tts_text_bos_single>"]
# The language the voice is trained on (prompts use it or "auto"); config.json lists only it, so the element refuses
# the others by name instead of feeding untrained language rows.
TRAIN_LANGUAGE = "english"
LANGS = {"chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071,
         "spanish": 2054, "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069}
CODEC = dict(pad=2148, bos=2149, eos=2150, think=2154, nothink=2155, think_bos=2156, think_eos=2157)
GENERATION_CONFIG = {"do_sample": True, "repetition_penalty": 1.05, "temperature": 0.9, "top_p": 1.0, "top_k": 50,
                     "subtalker_dosample": True, "subtalker_temperature": 0.9, "subtalker_top_p": 1.0,
                     "subtalker_top_k": 50, "max_new_tokens": 8192}
PREPROCESSOR_CONFIG = {"chunk_length_s": None, "feature_extractor_type": "EncodecFeatureExtractor",
                       "feature_size": 1, "overlap": None, "padding_side": "right", "padding_value": 0.0,
                       "return_attention_mask": True, "sampling_rate": 24000}

# Size presets. n_q = codebooks per frame (= talker num_code_groups = decoder num_quantizers); the code-predictor
# tables ((n_q-1) x 2048 x talker hidden) and heads dominate the talker's size, so n_q is part of the budget.
SIZES = {
    "toy": dict(
        bpe_vocab=400, n_q=4,
        talker=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=1, head_dim=32), mrope_section=[8, 4, 4], text_hidden_size=64,
        cp=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, head_dim=32),
        dec=dict(codebook_dim=32, latent_dim=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                 num_attention_heads=2, num_key_value_heads=2, head_dim=32, decoder_dim=64),
        enc_ch=64),
    # ~ 20 MB bf16 talker + ~ 11 MB f32 speech tokenizer (checked at export against the 32 MiB budget)
    "small": dict(
        bpe_vocab=1024, n_q=8,
        talker=dict(hidden_size=192, intermediate_size=640, num_hidden_layers=7, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=64), mrope_section=[16, 8, 8], text_hidden_size=192,
        cp=dict(hidden_size=128, intermediate_size=384, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32),
        dec=dict(codebook_dim=64, latent_dim=128, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=2, head_dim=64, decoder_dim=192),
        enc_ch=256),
}
# The Mimi encoder that the speech_tokenizer layout requires (unused by CustomVoice; same tiny shape as the
# repository's test fixtures).
TINY_ENCODER = dict(hidden_size=32, num_filters=4, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                    head_dim=16, intermediate_size=64, codebook_dim=4, vector_quantization_hidden_dimension=4,
                    upsample_groups=32)


# ------------------------------------------------------------------------------------------------------------
# qwen-tts imports (librosa/sox/torchaudio/onnxruntime are imported at module level by the package but are not used
# on these paths; stubs raise if called). Same approach as tests/fixtures/generate.py.
# ------------------------------------------------------------------------------------------------------------
def _stub(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    m.__spec__ = importlib.machinery.ModuleSpec(name, None)
    sys.modules[name] = m
    return m


def import_qwen():
    def unavailable(what):
        def f(*a, **k):
            raise RuntimeError(f"{what} is stubbed in train.py")
        return f
    if importlib.util.find_spec("librosa") is None:
        lib = _stub("librosa", load=unavailable("librosa.load"), resample=unavailable("librosa.resample"))
        lib.__path__ = []
        lib.filters = _stub("librosa.filters", mel=unavailable("librosa.filters.mel"))
    if importlib.util.find_spec("soundfile") is None:
        _stub("soundfile", read=unavailable("soundfile.read"), write=unavailable("soundfile.write"))
    if importlib.util.find_spec("sox") is None:
        _stub("sox", Transformer=unavailable("sox.Transformer"))
    if importlib.util.find_spec("onnxruntime") is None:
        _stub("onnxruntime", InferenceSession=unavailable("onnxruntime"), SessionOptions=unavailable("onnxruntime"))
    if importlib.util.find_spec("torchaudio") is None:
        ta = _stub("torchaudio")
        ta.__path__ = []
        ta.compliance = _stub("torchaudio.compliance")
        ta.compliance.__path__ = []
        ta.compliance.kaldi = _stub("torchaudio.compliance.kaldi", fbank=unavailable("torchaudio fbank"))
        ta.transforms = _stub("torchaudio.transforms")
        ta.functional = _stub("torchaudio.functional")
    from qwen_tts import Qwen3TTSModel
    from qwen_tts.core import Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Decoder
    from transformers.modeling_utils import no_init_weights
    return types.SimpleNamespace(**locals())


def dump_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def load_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def amp(torch, a):
    """bf16 autocast on CUDA with --amp (the RVQ search, the losses and the EMA stay f32)."""
    import contextlib
    if a.amp and a.device.startswith("cuda"):
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def lr_factor(step, steps, warmup, elapsed_s, max_minutes, warmup_from=0):
    """Linear warm-up over `warmup` steps from step `warmup_from` (a fresh optimiser's first step), then cosine to
    5 %; progress is the larger of step/steps and elapsed_s/max-minutes, so a run cut by --max-minutes still
    anneals."""
    prog = step / max(1, steps)
    if max_minutes:
        prog = max(prog, elapsed_s / (60 * max_minutes))
    return (min(1.0, (step - warmup_from + 1) / max(1, warmup))
            * max(0.05, 0.5 * (1 + math.cos(math.pi * min(1.0, prog)))))


def make_adamw(torch, params, a, **kw):
    if a.device.startswith("cuda"):
        kw["fused"] = True
    return torch.optim.AdamW(params, **kw)


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


# ------------------------------------------------------------------------------------------------------------
# 1. Tokenizer
# ------------------------------------------------------------------------------------------------------------
def build_pipeline(vocab, merges):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def step_tokenizer(a, size):
    """Trains the BPE and writes vocab.json, merges.txt, tokenizer_config.json into WORK/tok."""
    from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
    out = os.path.join(a.work, "tok")
    os.makedirs(out, exist_ok=True)
    with open(a.text) as f:
        lines = [ln.strip() for ln in f if ln.strip()]
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=size["bpe_vocab"], min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    # the role words of the prompt must be single tokens: repeat them so that BPE merges them completely
    extra = ["assistant\n", "user\n"] * 5000
    tok.train_from_iterator(lines + extra, trainer=trainer)
    d = json.loads(tok.to_str())
    vocab = d["model"]["vocab"]
    merges = d["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    base = len(vocab)
    added = {}
    for i, s in enumerate(SPECIALS):
        added[str(base + i)] = dict(content=s, lstrip=False, normalized=False, rstrip=False, single_word=False,
                                    special=True)
    with open(os.path.join(out, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(out, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "\n".join(merges) + "\n")
    cfg = {"add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added,
           "additional_special_tokens": [s for s in SPECIALS if s != "<|endoftext|>"], "bos_token": None,
           "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace",
           "extra_special_tokens": {}, "model_max_length": 131072, "pad_token": "<|endoftext|>",
           "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}
    dump_json(os.path.join(out, "tokenizer_config.json"), cfg)
    ids = special_ids(out)
    log(f"tokenizer: {base} BPE entries + {len(SPECIALS)} specials, text_vocab_size {ids['text_vocab_size']}")
    return out


def load_tokenizer(tok_dir):
    from tokenizers import AddedToken
    vocab = load_json(os.path.join(tok_dir, "vocab.json"))
    with open(os.path.join(tok_dir, "merges.txt"), encoding="utf-8") as f:
        merges = [tuple(ln.rstrip("\n").split(" ")) for ln in f if ln.strip() and not ln.startswith("#version")]
    tok = build_pipeline(vocab, merges)
    cfg = load_json(os.path.join(tok_dir, "tokenizer_config.json"))
    for i, e in sorted(cfg["added_tokens_decoder"].items(), key=lambda kv: int(kv[0])):
        tok.add_special_tokens([AddedToken(e["content"], special=True, normalized=False)])
        assert tok.token_to_id(e["content"]) == int(i), (e, tok.token_to_id(e["content"]))
    return tok


def special_ids(tok_dir):
    tok = load_tokenizer(tok_dir)
    g = tok.token_to_id
    ids = dict(im_start=g("<|im_start|>"), im_end=g("<|im_end|>"), tts_pad=g("<tts_pad>"), tts_bos=g("<tts_text_bos>"),
               tts_eos=g("<tts_text_eod>"), assistant=g("assistant"), newline=g("\u010a"))
    assert None not in ids.values(), ids
    n = tok.get_vocab_size(with_added_tokens=True)
    ids["text_vocab_size"] = int(math.ceil(n / 64) * 64)
    # the reference slices the prompt by position: 3 header ids, 5 tail ids
    head = tok.encode("<|im_start|>assistant\n", add_special_tokens=False).ids
    tail = tok.encode("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False).ids
    assert head == [ids["im_start"], ids["assistant"], ids["newline"]], head
    assert len(tail) == 5, tail
    return ids


def text_body_ids(tok, text):
    ids = tok.encode(f"<|im_start|>assistant\n{text.strip()}<|im_end|>\n<|im_start|>assistant\n",
                     add_special_tokens=False).ids
    return ids[:3], ids[3:-5]


# ------------------------------------------------------------------------------------------------------------
# Configs (same structure as the released checkpoints; values from the preset and the tokenizer)
# ------------------------------------------------------------------------------------------------------------
def main_config(size, ids):
    cp = dict(attention_bias=False, attention_dropout=0.0, hidden_act="silu", initializer_range=0.02,
              max_position_embeddings=65536, max_window_layers=28, num_code_groups=size["n_q"], rms_norm_eps=1e-06,
              rope_scaling=None, rope_theta=1000000, sliding_window=None, use_cache=True, use_sliding_window=False,
              vocab_size=2048, **size["cp"])
    talker = dict(attention_bias=False, attention_dropout=0.0, code_predictor_config=cp,
                  codec_bos_id=CODEC["bos"], codec_eos_token_id=CODEC["eos"], codec_language_id={TRAIN_LANGUAGE: LANGS[TRAIN_LANGUAGE]},
                  codec_nothink_id=CODEC["nothink"], codec_pad_id=CODEC["pad"], codec_think_bos_id=CODEC["think_bos"],
                  codec_think_eos_id=CODEC["think_eos"], codec_think_id=CODEC["think"], hidden_act="silu",
                  initializer_range=0.02, max_position_embeddings=32768, num_code_groups=size["n_q"],
                  position_id_per_seconds=13, rms_norm_eps=1e-06,
                  rope_scaling={"interleaved": True, "mrope_section": list(size["mrope_section"]),
                                "rope_type": "default"},
                  rope_theta=1000000, sliding_window=None, spk_id={SPEAKER: SPEAKER_ID},
                  spk_is_dialect={SPEAKER: False}, text_hidden_size=size["text_hidden_size"],
                  text_vocab_size=ids["text_vocab_size"], use_cache=True, use_sliding_window=False, vocab_size=3072,
                  **size["talker"])
    spk_enc = dict(mel_dim=128, enc_dim=size["talker"]["hidden_size"], enc_channels=[512, 512, 512, 512, 1536],
                   enc_kernel_sizes=[5, 3, 3, 3, 1], enc_dilations=[1, 2, 3, 4, 1], enc_attention_channels=128,
                   enc_res2net_scale=8, enc_se_channels=128, sample_rate=24000)
    # transformers_version 4.57.1: keeps the reference Python loader on the Qwen2 regex (qwen3-tts.md section 2)
    return dict(architectures=["Qwen3TTSForConditionalGeneration"], assistant_token_id=ids["assistant"],
                im_end_token_id=ids["im_end"], im_start_token_id=ids["im_start"], model_type="qwen3_tts",
                speaker_encoder_config=spk_enc, talker_config=talker, tokenizer_type="qwen3_tts_tokenizer_12hz",
                torch_dtype="bfloat16", transformers_version="4.57.1", tts_bos_token_id=ids["tts_bos"],
                tts_eos_token_id=ids["tts_eos"], tts_model_size="0b6", tts_model_type="custom_voice",
                tts_pad_token_id=ids["tts_pad"])


def speech_tokenizer_config(size):
    dec = dict(attention_bias=False, attention_dropout=0.0, codebook_size=2048, hidden_act="silu",
               layer_scale_initial_scale=0.01, max_position_embeddings=8000, num_quantizers=size["n_q"],
               num_semantic_quantizers=1, rms_norm_eps=1e-05, rope_theta=10000, semantic_codebook_size=4096,
               sliding_window=72, upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2],
               vector_quantization_hidden_dimension=512, **size["dec"])
    enc = dict(_frame_rate=12.5, attention_bias=False, attention_dropout=0.0, audio_channels=1, codebook_size=2048,
               compress=2, dilation_growth_rate=2, hidden_act="gelu", initializer_range=0.02, kernel_size=7,
               last_kernel_size=3, layer_scale_initial_scale=0.01, max_position_embeddings=8000, model_type="mimi",
               norm_eps=1e-05, num_quantizers=32, num_residual_layers=1, num_semantic_quantizers=1,
               pad_mode="constant", residual_kernel_size=3, rope_theta=10000.0, sampling_rate=24000,
               sliding_window=250, trim_right_ratio=1.0, upsampling_ratios=[8, 6, 5, 4], use_cache=False,
               use_causal_conv=True, use_conv_shortcut=False, use_streaming=False, **TINY_ENCODER)
    return dict(architectures=["Qwen3TTSTokenizerV2Model"], model_type="qwen3_tts_tokenizer_12hz",
                decode_upsample_rate=1920, decoder_config=dec, encode_downsample_rate=1920, encoder_config=enc,
                encoder_valid_num_quantizers=size["n_q"], input_sample_rate=24000, output_sample_rate=24000,
                transformers_version="4.57.1")


# ------------------------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------------------------
def save_codes(torch, path, out):
    """Codes of many utterances: a list of dicts (id, text, codes [frames, n_q] int16). A path ending in .xz is
    written compactly (one int16 tensor + lengths, xz-compressed: ~10 bits a code, small enough to carry)."""
    if path.endswith(".xz"):
        import io
        import lzma
        buf = io.BytesIO()
        torch.save(dict(ids=[d["id"] for d in out], texts=[d["text"] for d in out],
                        lengths=[int(d["codes"].shape[0]) for d in out],
                        codes=torch.cat([d["codes"].to(torch.int16) for d in out])), buf)
        with lzma.open(path, "wb", preset=6) as f:
            f.write(buf.getvalue())
    else:
        torch.save(out, path)


def load_codes(torch, path):
    """The inverse of save_codes (either format)."""
    if not path.endswith(".xz"):
        return torch.load(path, weights_only=False)
    import io
    import lzma
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
    import wave
    import numpy as np
    pcm = (np.clip(np.asarray(x, dtype=np.float32), -1.0, 1.0) * 32767.0).round().astype("<i2")
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SR)
        w.writeframes(pcm.tobytes())


def load_audio(manifest_path, rows):
    """int16 tensors, zero-padded to a whole number of frames."""
    import wave
    import numpy as np
    import torch
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


# ------------------------------------------------------------------------------------------------------------
# 2. Codec: encoder (training only) + official split RVQ + official decoder
# ------------------------------------------------------------------------------------------------------------
def mel_filterbank(n_fft, n_mels, sr=SR):
    """Triangular filters on the HTK mel scale, area-normalised ([n_mels, n_fft // 2 + 1]); numpy only."""
    import numpy as np
    def hz2mel(f):
        return 2595.0 * np.log10(1.0 + f / 700.0)
    def mel2hz(m):
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)
    freqs = np.linspace(0, sr / 2, n_fft // 2 + 1)
    pts = mel2hz(np.linspace(hz2mel(0.0), hz2mel(sr / 2), n_mels + 2))
    fb = np.zeros((n_mels, len(freqs)), dtype=np.float32)
    for i in range(n_mels):
        lo, c, hi = pts[i], pts[i + 1], pts[i + 2]
        fb[i] = np.maximum(0.0, np.minimum((freqs - lo) / (c - lo), (hi - freqs) / (hi - c)))
        fb[i] *= 2.0 / (hi - lo)
    return fb


def make_mel(torch, n_fft, hop, n_mels, device):
    fb = torch.tensor(mel_filterbank(n_fft, n_mels), dtype=torch.float32, device=device)
    win = torch.hann_window(n_fft, device=device)

    def mel(x):                                     # x [B, N] -> [B, n_mels, N // hop]
        s = torch.stft(x, n_fft, hop, window=win, center=True, return_complex=True).abs()
        m = torch.matmul(fb, s)
        return torch.log(m.clamp(min=1e-5))[..., : x.shape[-1] // hop]
    return mel


# ------------------------------------------------------------------------------------------------------------
# 2a. Codes: a fixed residual k-means of log-mel frames (the `mel` code scheme)
# ------------------------------------------------------------------------------------------------------------
# One 12.5 Hz frame (80 ms) = SUB log-mel sub-frames of 20 ms; its code is the residual k-means of their
# normalised concatenation ([SUB * n_mels]): stage 0 (the talker's codebook 0) clusters the whole frame, stage q the
# residual left by stages < q. The codes are defined before any network is trained, so the decoder (a vocoder from
# codes) and the talker (text -> codes) can be trained at the same time, on different GPUs, from the first step.
FEAT = dict(n_fft=1024, hop=480, n_mels=80)
SUB = HOP // FEAT["hop"]


def frame_features(torch, mel, x):
    """x [B, N] float audio (N a multiple of HOP) -> [B, N // HOP, SUB * n_mels] log-mel frames."""
    m = mel(x)                                       # [B, n_mels, N // hop]
    B, M, S = m.shape
    T = S // SUB
    return m[..., : T * SUB].reshape(B, M, T, SUB).permute(0, 2, 3, 1).reshape(B, T, SUB * M)


def kmeans_assign(torch, X, C, chunk=32768):
    """Nearest centroid of each row of X [N, D] among C [K, D] -> [N] long."""
    cc = (C * C).sum(1)
    return torch.cat([(cc[None] - 2 * X[s:s + chunk] @ C.t()).argmin(1) for s in range(0, X.shape[0], chunk)])


def fit_rvq_kmeans(torch, X, n_q, K, iters):
    """Residual k-means (Lloyd, random-sample init, empty clusters re-seeded): X [N, D] -> centroids [n_q, K, D]."""
    R = X.clone()
    cents = []
    for q in range(n_q):
        C = R[torch.randperm(R.shape[0], device=R.device)[:K]].clone()
        for _ in range(iters):
            idx = kmeans_assign(torch, R, C)
            counts = torch.bincount(idx, minlength=K).float()
            sums = torch.zeros_like(C).index_add_(0, idx, R)
            seed = R[torch.randint(0, R.shape[0], (K,), device=R.device)]
            C = torch.where((counts == 0)[:, None], seed, sums / counts.clamp(min=1)[:, None])
        before = float(R.pow(2).mean())
        R = R - C[kmeans_assign(torch, R, C)]
        log(f"quantizer: stage {q}: residual energy {before:.4f} -> {float(R.pow(2).mean()):.4f}")
        cents.append(C)
    return torch.stack(cents)


def rvq_encode(torch, X, cents):
    """X [N, D] normalised features -> codes [N, n_q] (greedy residual assignment)."""
    R = X.clone()
    codes = []
    for C in cents:
        idx = kmeans_assign(torch, R, C)
        R = R - C[idx]
        codes.append(idx)
    return torch.stack(codes, 1)


def load_quantizer(torch, work, dev):
    q = torch.load(os.path.join(work, "quantizer.pt"), map_location=dev, weights_only=False)
    # a carried copy may hold the centroids in f16 (quantizer16.pt)
    q = {k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in q.items()}
    return q, make_mel(torch, FEAT["n_fft"], FEAT["hop"], FEAT["n_mels"], dev)


def encode_audio(torch, q, mel, audio, dev, batch_seconds=600):
    """int16 utterances (whole frames) -> list of codes [T, n_q] int16, in batches of similar length."""
    out = [None] * len(audio)
    order = sorted(range(len(audio)), key=lambda i: len(audio[i]))
    b = 0
    with torch.no_grad():
        while b < len(order):
            e = b + 1
            while e < len(order) and (e - b + 1) * len(audio[order[e]]) <= batch_seconds * SR:
                e += 1
            idx = order[b:e]
            n = max(len(audio[i]) for i in idx)
            x = torch.stack([torch.nn.functional.pad(audio[i], (0, n - len(audio[i]))) for i in idx])
            f = frame_features(torch, mel, (x.float() / 32768.0).to(dev))
            B, T, D = f.shape
            c = rvq_encode(torch, ((f - q["mean"]) / q["std"]).reshape(-1, D), q["centroids"]).view(B, T, -1)
            for j, i in enumerate(idx):
                out[i] = c[j, : len(audio[i]) // HOP].to(torch.int16).cpu()
            b = e
    return out


def init_codebooks_from_centroids(torch, dec, cents):
    """Decoder codebook q <- centroids of stage q projected on the leading principal axes of stage 0's centroids
    (scaled to unit variance): a structured start for the vocoder's code embeddings."""
    C0 = cents[0] - cents[0].mean(0)
    _, _, V = torch.linalg.svd(C0, full_matrices=False)
    layers = [l for rvq in (dec.quantizer.rvq_first, dec.quantizer.rvq_rest) for l in rvq.vq.layers]
    d = layers[0]._codebook.embedding_sum.shape[1]
    P = V[:d].t() / (C0 @ V[:d].t()).std()
    for q, layer in enumerate(layers):
        layer._codebook.embedding_sum.data[: cents.shape[1]].copy_(cents[q] @ P)
        layer._codebook.cluster_usage.data.fill_(1.0)


def step_quantizer(a, size, ns):
    """Fits the feature normalisation and the residual k-means on (a sample of) the manifest's audio."""
    import torch
    dev = torch.device(a.device)
    torch.manual_seed(a.seed)
    rows = load_manifest(a.manifest, a.limit)
    audio = load_audio(a.manifest, rows)
    mel = make_mel(torch, FEAT["n_fft"], FEAT["hop"], FEAT["n_mels"], dev)
    feats = []
    with torch.no_grad():
        for x in audio:
            feats.append(frame_features(torch, mel, (x.float() / 32768.0).to(dev)[None])[0])
    X = torch.cat(feats)
    if X.shape[0] > a.kmeans_frames:
        X = X[torch.randperm(X.shape[0], device=dev)[: a.kmeans_frames]]
    mean, std = X.mean(0), X.std(0).clamp(min=1e-3)
    log(f"quantizer: {X.shape[0]} frames of {X.shape[1]} features, {size['n_q']} x {a.kmeans_k} centroids")
    cents = fit_rvq_kmeans(torch, (X - mean) / std, size["n_q"], a.kmeans_k, a.kmeans_iters)
    torch.save({"mean": mean.cpu(), "std": std.cpu(), "centroids": cents.cpu(), "feat": FEAT},
               os.path.join(a.work, "quantizer.pt"))


def build_codec_modules(ns, size, device):
    import torch
    import torch.nn as nn
    tcfg = ns.Qwen3TTSTokenizerV2Config(**json.loads(json.dumps(speech_tokenizer_config(size))))
    codec = ns.Qwen3TTSTokenizerV2Model._from_config(tcfg, dtype=torch.float32)
    D = size["dec"]["codebook_dim"]
    ch = size["enc_ch"]

    class Res(nn.Module):
        def __init__(self, c, dil):
            super().__init__()
            self.c1 = nn.Conv1d(c, c, 3, padding=dil, dilation=dil)
            self.c2 = nn.Conv1d(c, c, 1)

        def forward(self, x):
            return x + self.c2(nn.functional.gelu(self.c1(nn.functional.gelu(x))))

    class Encoder(nn.Module):
        """log-mel at 100 Hz -> conv stack -> 12.5 Hz latents [B, codebook_dim, T] (training only)."""
        def __init__(self):
            super().__init__()
            self.mel = make_mel(torch, 1024, 240, 80, device)
            layers = [nn.Conv1d(80, ch, 5, padding=2), Res(ch, 1), Res(ch, 3)]
            for _ in range(3):
                layers += [nn.GELU(), nn.Conv1d(ch, ch, 4, stride=2, padding=1), Res(ch, 1), Res(ch, 3)]
            layers += [nn.GELU(), nn.Conv1d(ch, D, 3, padding=1)]
            self.net = nn.Sequential(*layers)

        def forward(self, wav):                      # [B, N] float
            return self.net(self.mel(wav))

    return codec.to(device), Encoder().to(device)


def rvq_quantize(torch, rvq, x, train, decay=0.99, eps=1e-5):
    """One official ResidualVectorQuantizer: input_proj -> residual nearest-codebook search -> output_proj.
    EMA k-means updates go into the official `embedding_sum` / `cluster_usage` (what `decode` divides).
    Returns (quantized after output_proj with a straight-through gradient, codes [B, n, T], commitment loss)."""
    xin = rvq.input_proj(x)                          # [B, d, T]
    B, d, T = xin.shape
    flat = xin.transpose(1, 2).reshape(-1, d)
    residual = flat.detach()
    qsum = torch.zeros_like(flat)
    codes = []
    for layer in rvq.vq.layers:
        cb = layer._codebook
        emb = cb.embedding_sum / cb.cluster_usage.clamp(min=cb.epsilon)[:, None]
        dist = (residual.pow(2).sum(1, keepdim=True) - 2 * residual @ emb.t() + emb.pow(2).sum(1)[None])
        idx = dist.argmin(1)
        q = emb[idx]
        if train:
            with torch.no_grad():
                onehot = torch.zeros(flat.shape[0], emb.shape[0], device=flat.device, dtype=flat.dtype)
                onehot.scatter_(1, idx[:, None], 1.0)
                counts = onehot.sum(0)
                sums = onehot.t() @ residual
                cb.cluster_usage.data.mul_(decay).add_(counts, alpha=1 - decay)
                cb.embedding_sum.data.mul_(decay).add_(sums, alpha=1 - decay)
                # dead codes: re-seed from the current residuals
                dead = cb.cluster_usage.data < 0.02 * (flat.shape[0] / emb.shape[0]) + 1e-3
                nd = int(dead.sum())
                if nd:
                    pick = residual[torch.randint(0, residual.shape[0], (nd,), device=flat.device)]
                    cb.embedding_sum.data[dead] = pick
                    cb.cluster_usage.data[dead] = 1.0
        codes.append(idx.view(B, T))
        qsum = qsum + q
        residual = residual - q
    commit = torch.nn.functional.mse_loss(flat, qsum.detach())
    qst = flat + (qsum - flat).detach()
    out = rvq.output_proj(qst.view(B, T, d).transpose(1, 2))
    return out, torch.stack(codes, 1), commit


def quantize(torch, dec, z, train):
    """Official SplitResidualVectorQuantizer semantics: rvq_first (1 codebook) and rvq_rest (n-1) both quantize z;
    decode() sums their outputs. codes: [B, n, T] in decoder order."""
    q1, c1, l1 = rvq_quantize(torch, dec.quantizer.rvq_first, z, train)
    q2, c2, l2 = rvq_quantize(torch, dec.quantizer.rvq_rest, z, train)
    return q1 + q2, torch.cat([c1, c2], 1), l1 + l2


def decoder_from_quantized(dec, hidden):
    """Qwen3TTSTokenizerV2Decoder.forward after quantizer.decode (same modules, same order)."""
    hidden = dec.pre_conv(hidden).transpose(1, 2)
    hidden = dec.pre_transformer(inputs_embeds=hidden).last_hidden_state
    hidden = hidden.permute(0, 2, 1)
    for blocks in dec.upsample:
        for block in blocks:
            hidden = block(hidden)
    wav = hidden
    for block in dec.decoder:
        wav = block(wav)
    return wav.clamp(min=-1, max=1)


def spectral_losses(torch, y, x, mels):
    loss = 0.0
    for mel in mels:
        loss = loss + (mel(y) - mel(x)).abs().mean()
    for n_fft in (512, 1024, 2048):
        w = torch.hann_window(n_fft, device=x.device)
        sy = torch.stft(y, n_fft, n_fft // 4, window=w, return_complex=True).abs()
        sx = torch.stft(x, n_fft, n_fft // 4, window=w, return_complex=True).abs()
        loss = loss + (torch.log(sy.clamp(min=1e-5)) - torch.log(sx.clamp(min=1e-5))).abs().mean()
        loss = loss + torch.linalg.norm(sy - sx) / torch.linalg.norm(sx).clamp(min=1e-5)
    return loss


def make_disc(torch, device):
    import torch.nn as nn

    class STFTD(nn.Module):
        def __init__(self, n_fft, ch=32):
            super().__init__()
            self.n_fft = n_fft
            self.register_buffer("win", torch.hann_window(n_fft))
            self.convs = nn.ModuleList([
                nn.Conv2d(2, ch, (3, 9), padding=(1, 4)),
                nn.Conv2d(ch, ch, (3, 9), stride=(1, 2), padding=(1, 4)),
                nn.Conv2d(ch, ch, (3, 9), stride=(1, 2), padding=(1, 4)),
                nn.Conv2d(ch, ch, (3, 3), padding=(1, 1))])
            self.out = nn.Conv2d(ch, 1, (3, 3), padding=(1, 1))

        def forward(self, x):
            s = torch.stft(x, self.n_fft, self.n_fft // 4, window=self.win, return_complex=True)
            z = torch.stack([s.real, s.imag], 1).transpose(2, 3)
            feats = []
            for c in self.convs:
                z = nn.functional.leaky_relu(c(z), 0.2)
                feats.append(z)
            return self.out(z), feats

    return nn.ModuleList([STFTD(n) for n in (512, 1024, 2048)]).to(device)


def step_codec(a, size, ns):
    import torch
    dev = torch.device(a.device)
    torch.manual_seed(a.seed)
    rows = load_manifest(a.manifest, a.limit)
    audio = load_audio(a.manifest, rows)
    log(f"codec: {len(audio)} utterances, {sum(len(x) for x in audio) / SR / 3600:.2f} h, scheme {a.scheme}")
    codec, enc = build_codec_modules(ns, size, dev)
    if a.init_from:
        load_export_codec(codec, a.init_from)
    dec = codec.decoder
    mel_codes = None
    if a.scheme == "mel":
        # fixed codes: no encoder; the decoder's codebook vectors are ordinary trainable parameters
        q, fmel = load_quantizer(torch, a.work, dev)
        mel_codes = encode_audio(torch, q, fmel, audio, dev)
        if a.gta_from:
            if a.gta_share < 1 and mel_codes and mel_codes[0].shape[1] < size["n_q"]:
                raise SystemExit("codec --gta-share < 1 needs a quantizer with every codebook")
            gta = gta_replace(a, ns, size, dev, rows, mel_codes)
            # a share (1 - --gta-share) of the utterances keep their true residual codes
            keep = random.Random(a.seed).random
            mel_codes = [g if keep() < a.gta_share else c for g, c in zip(gta, mel_codes)]
        enc = torch.nn.Module()
    for n, p in dec.named_parameters():
        if n.endswith("cluster_usage") or (n.endswith("embedding_sum") and mel_codes is None):
            p.requires_grad_(False)
    gen_params = [p for p in list(enc.parameters()) + list(dec.parameters()) if p.requires_grad]
    opt = make_adamw(torch, gen_params, a, lr=a.codec_lr, betas=(0.8, 0.99))
    disc = make_disc(torch, dev) if a.gan_start >= 0 else None
    dopt = torch.optim.AdamW(disc.parameters(), lr=a.codec_lr, betas=(0.8, 0.99)) if disc else None
    mels = [make_mel(torch, n, n // 4, m, dev) for n, m in ((512, 64), (1024, 80), (2048, 128))]
    seg = a.seg_frames * HOP
    lens = [len(x) for x in audio]

    long_enough = [i for i in range(len(audio)) if lens[i] >= seg]

    def batch():
        if mel_codes is not None:                    # aligned crops of audio and codes
            xs, cs = [], []
            for _ in range(a.codec_batch):
                i = random.choice(long_enough)
                f = random.randrange(0, lens[i] // HOP - a.seg_frames + 1)
                xs.append(audio[i][f * HOP:f * HOP + seg])
                cs.append(mel_codes[i][f:f + a.seg_frames])
            return ((torch.stack(xs).float() / 32768.0).to(dev),
                    torch.stack(cs).long().transpose(1, 2).to(dev))     # [B, n_q, F]
        xs = []
        for _ in range(a.codec_batch):
            i = random.randrange(len(audio))
            n = lens[i]
            if n <= seg:
                x = torch.nn.functional.pad(audio[i], (0, seg - n))
            else:
                s = random.randrange(0, (n - seg) // HOP + 1) * HOP
                x = audio[i][s:s + seg]
            xs.append(x)
        return (torch.stack(xs).float() / 32768.0).to(dev)

    out = os.path.join(a.work, "codec")
    os.makedirs(out, exist_ok=True)
    ckpt = os.path.join(out, "codec.pt")
    start = 1
    if a.resume and os.path.exists(ckpt):
        st = torch.load(ckpt, map_location=dev)
        codec.load_state_dict(st["codec"])
        enc.load_state_dict(st["encoder"])
        if "opt" in st:
            opt.load_state_dict(st["opt"])
        if disc is not None and "disc" in st:
            disc.load_state_dict(st["disc"])
            dopt.load_state_dict(st["dopt"])
        start = st.get("step", 0) + 1
        log(f"codec: resumed at step {start}")
    with torch.no_grad():
        if start == 1 and mel_codes is not None and not a.init_from:
            init_codebooks_from_centroids(torch, dec, q["centroids"].to(dev))
        z = enc(batch()) if start == 1 and mel_codes is None and not a.init_from else None
        for rvq in (dec.quantizer.rvq_first, dec.quantizer.rvq_rest) if z is not None else ():
            flat = rvq.input_proj(z).transpose(1, 2).reshape(-1, rvq.input_proj.out_channels)
            for layer in rvq.vq.layers:
                cb = layer._codebook
                pick = flat[torch.randint(0, flat.shape[0], (cb.codebook_size,), device=dev)]
                cb.embedding_sum.data.copy_(pick + 1e-3 * torch.randn_like(pick))
                cb.cluster_usage.data.fill_(1.0)
    t0 = time.time()
    step = start - 1
    for step in range(start, a.codec_steps + 1):
        for g in opt.param_groups:
            g["lr"] = a.codec_lr * lr_factor(step, a.codec_steps, a.codec_warmup, time.time() - t0, a.max_minutes)
        if mel_codes is not None:
            x, codes = batch()
            commit = torch.zeros((), device=dev)
            with amp(torch, a):
                y = dec(codes)[:, 0]                 # the official decode path: quantizer.decode + decoder
        else:
            x = batch()
            with amp(torch, a):
                z = enc(x)
            z = z.float()
            qz, codes, commit = quantize(torch, dec, z, train=True)
            with amp(torch, a):
                y = decoder_from_quantized(dec, qz)[:, 0]
        y = y.float()
        rec = spectral_losses(torch, y, x, mels)
        loss = rec + a.commit_weight * commit
        use_gan = disc is not None and step >= a.gan_start
        if use_gan:
            adv, fm = 0.0, 0.0
            for d in disc:
                sy, fy = d(y)
                with torch.no_grad():
                    _, fx = d(x)
                adv = adv + torch.relu(1 - sy).mean()
                fm = fm + sum((u - v).abs().mean() for u, v in zip(fy, fx)) / len(fy)
            loss = loss + a.adv_weight * adv + a.fm_weight * fm
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(gen_params, 1.0)
        opt.step()
        if use_gan:
            dl = 0.0
            for d in disc:
                sx, _ = d(x)
                sy, _ = d(y.detach())
                dl = dl + torch.relu(1 - sx).mean() + torch.relu(1 + sy).mean()
            dopt.zero_grad(set_to_none=True)
            dl.backward()
            dopt.step()
        if step % a.log_every == 0 or step == a.codec_steps:
            used = [int((layer._codebook.cluster_usage > 0.5).sum()) for rvq in
                    (dec.quantizer.rvq_first, dec.quantizer.rvq_rest) for layer in rvq.vq.layers]
            usage = "" if mel_codes is not None else f" codes>0.5 use {min(used)}..{max(used)}"
            log(f"codec step {step}: lr {opt.param_groups[0]['lr']:.2e} rec {rec.item():.3f} commit {commit.item():.4f}"
                f"{usage}{' (gan)' if use_gan else ''} ({time.time() - t0:.0f} s)")
        if a.max_minutes and time.time() - t0 > 60 * a.max_minutes:
            log(f"codec: time limit at step {step}")
            break
    st = {"codec": codec.state_dict(), "encoder": enc.state_dict(), "size": a.size, "step": step,
          "opt": opt.state_dict()}
    if disc is not None:
        st.update(disc=disc.state_dict(), dopt=dopt.state_dict())
    torch.save(st, ckpt)
    return codec, enc


def load_export_codec(codec, export_dir):
    """An exported checkpoint's speech_tokenizer/model.safetensors into `codec` (as f32); the codec step then fine-tunes
    from it (fresh optimiser, step count from 1)."""
    from safetensors.torch import load_file
    sd = load_file(os.path.join(export_dir, "speech_tokenizer", "model.safetensors"))
    codec.load_state_dict({k: v.float() for k, v in sd.items()})
    log(f"codec: initialised from {export_dir}")


def step_codes(a, size, ns, codec=None, enc=None):
    import torch
    dev = torch.device(a.device)
    path = a.codes_out or os.path.join(a.work, "codes.pt")
    if a.scheme == "mel":
        rows = load_manifest(a.manifest, a.limit)
        audio = load_audio(a.manifest, rows)
        q, fmel = load_quantizer(torch, a.work, dev)
        codes = encode_audio(torch, q, fmel, audio, dev)
        out = [dict(id=r["id"], text=r["text"], codes=c) for r, c in zip(rows, codes)]
        save_codes(torch, path, out)
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
            _, codes, _ = quantize(torch, codec.decoder, z, train=False)
            codes = codes.to(torch.int16).cpu()
            for j, i in enumerate(idx):
                T = len(audio[i]) // HOP
                out[i] = dict(id=rows[i]["id"], text=rows[i]["text"], codes=codes[j, :, :T].t().contiguous())   # [T, n]
    save_codes(torch, path, out)
    frames = sum(o["codes"].shape[0] for o in out)
    log(f"codes: {len(out)} utterances, {frames} frames -> {path}")
    # round trip through the official decode path (quantizer.decode + forward) on the first utterance
    with torch.no_grad():
        c = out[0]["codes"].t()[None].long().to(dev)
        wav = codec.decoder(c)[0, 0].cpu().numpy()
    write_wav(os.path.join(a.work, "codec_roundtrip_0.wav"), wav)
    return out


# ------------------------------------------------------------------------------------------------------------
# 3. Talker + code predictor
# ------------------------------------------------------------------------------------------------------------
def build_example(tok, ids, text, codes, language):
    """Text-track ids, codec-track ids and masks for one utterance in the non-streaming CustomVoice prompt
    (qwen3-tts.md section 3.4):
      role (3):        T(im_start) T(assistant) T(\\n)                     no codec part
      tags (m-1):      P+K..., P+C(speaker), B+C(pad)                     K = think,think_bos,LANG,think_eos | nothink,think_bos,think_eos
      text (n+2):      T(x_i)+C(pad) ..., E+C(pad), P+C(bos)
      frames (F):      P + sum_q Emb_q(codes[f, q])
      end (1):         P + C(eos)   (input of the position after the last frame; never predicted from)
    Labels (HF causal shift inside the loss): label[p] = codebook-0 code at frame positions, EOS at the end row."""
    head, body = text_body_ids(tok, text)
    if language == "auto":
        K = [CODEC["nothink"], CODEC["think_bos"], CODEC["think_eos"]]
    else:
        K = [CODEC["think"], CODEC["think_bos"], LANGS[language], CODEC["think_eos"]]
    tags_codec = K + [SPEAKER_ID, CODEC["pad"]]
    text_tr = list(head) + [ids["tts_pad"]] * (len(tags_codec) - 1) + [ids["tts_bos"]]
    codec_tr = [-1] * 3 + tags_codec
    text_tr += list(body) + [ids["tts_eos"], ids["tts_pad"]]
    codec_tr += [CODEC["pad"]] * (len(body) + 1) + [CODEC["bos"]]
    F = codes.shape[0]
    first = len(text_tr)
    text_tr += [ids["tts_pad"]] * (F + 1)
    codec_tr += [-2] * F + [CODEC["eos"]]          # -2: frame rows (sum of codebook embeddings)
    labels = [-100] * first + [int(c) for c in codes[:, 0]] + [CODEC["eos"]]
    return dict(text=text_tr, codec=codec_tr, labels=labels, first=first, codes=codes)


def example_tensors(torch, e):
    """build_example's lists as tensors (built once per utterance and cached; collate then only pads)."""
    return dict(text=torch.tensor(e["text"]), codec=torch.tensor(e["codec"]), labels=torch.tensor(e["labels"]),
                first=e["first"], codes=e["codes"].long())


def collate(torch, exs, dev):
    """Pads example_tensors() of one batch to its longest prompt: text/codec ids, labels, attention mask, the frame
    codes [B, L, n_q] at the frame rows and their mask."""
    from torch.nn.utils.rnn import pad_sequence
    B = len(exs)
    text = pad_sequence([e["text"] for e in exs], batch_first=True)
    codec = pad_sequence([e["codec"] for e in exs], batch_first=True, padding_value=-1)
    labels = pad_sequence([e["labels"] for e in exs], batch_first=True, padding_value=-100)
    L = text.shape[1]
    lens = torch.tensor([len(e["text"]) for e in exs])
    att = (torch.arange(L)[None] < lens[:, None]).long()
    n_q = exs[0]["codes"].shape[1]
    frames = torch.zeros(B, L, n_q, dtype=torch.long)
    fmask = torch.zeros(B, L, dtype=torch.bool)
    for i, e in enumerate(exs):
        F = e["codes"].shape[0]
        frames[i, e["first"]:e["first"] + F] = e["codes"]
        fmask[i, e["first"]:e["first"] + F] = True
    return [t.to(dev, non_blocking=True) for t in (text, codec, labels, att, frames, fmask)]


def talker_forward(torch, model, batch, resid_noise=0.0):
    """The talker teacher-forced on one collated batch. resid_noise: the share of frames whose residual codes
    (codebooks 1..n_q-1) in the talker's *input* are replaced by uniformly random codes (targets stay true). At
    inference those inputs are the code predictor's own samples, which carry nothing the talker's state did not
    already hold, only sampling noise; a talker trained on the true residuals learns to read them (for k-means
    residuals they nearly identify the utterance) and derails on sampled ones.
    Returns (the talker's output incl. its codebook-0 CE, the hidden states [N, hidden] that predict the N frames,
    the frames' true codes [N, n_q])."""
    text, codec, labels, att, frames, fmask = batch
    t = model.talker
    emb = t.text_projection(t.model.text_embedding(text)) * att[..., None]
    cmask = (codec >= 0)[..., None]
    emb = emb + t.model.codec_embedding(codec.clamp(min=0)) * cmask
    frames_in = frames
    if resid_noise > 0:
        noisy = torch.rand(frames.shape[:2], device=frames.device) < resid_noise
        rnd = torch.randint_like(frames[..., 1:], 0, t.code_predictor.get_input_embeddings()[0].num_embeddings)
        frames_in = torch.cat([frames[..., :1], torch.where(noisy[..., None], rnd, frames[..., 1:])], -1)
    femb = t.model.codec_embedding(frames_in[..., 0])
    for q in range(1, frames.shape[-1]):
        femb = femb + t.code_predictor.get_input_embeddings()[q - 1](frames_in[..., q])
    emb = emb + femb * fmask[..., None]
    out = t(inputs_embeds=emb, attention_mask=att, labels=labels, output_hidden_states=True)
    hidden = out.hidden_states[0][-1][:, :-1]        # hidden at p-1 predicts the frame at p
    return out, hidden[fmask[:, 1:]], frames[fmask]


def talker_loss(torch, model, batch, resid_noise=0.0):
    """Codebook-0 CE (incl. EOS) and code-predictor CE of one collated batch (resid_noise: see talker_forward)."""
    out, h, c = talker_forward(torch, model, batch, resid_noise)
    # forward_sub_talker_finetune's own loss goes through the causal-LM loss, which shifts the labels by one
    # more position (lm_head[i-1] at position i would learn code i+1); the logits are right, so score them here.
    logits, _ = model.talker.forward_sub_talker_finetune(c, h)            # [N, n_q-1, 2048]: logits[:, i-1] -> code i
    sub_loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                 c[:, 1:].reshape(-1))
    return out.loss, sub_loss


def greedy_residuals(torch, model, h, code0):
    """The code predictor's greedy residual codes (codebooks 1..n_q-1) for frames whose talker hidden states h
    [N, hidden] and codebook-0 codes code0 [N] are given: what inference decodes when the talker picks code0
    (generation_config subtalker_dosample=false). The code predictor is causal, so filling one codebook per pass
    of forward_sub_talker_finetune is exactly its autoregressive greedy loop. Returns [N, n_q] codes."""
    n_q = model.talker.config.num_code_groups
    c = torch.zeros(len(code0), n_q, dtype=torch.long, device=code0.device)
    c[:, 0] = code0
    for i in range(1, n_q):
        logits, _ = model.talker.forward_sub_talker_finetune(c, h)
        c[:, i] = logits[:, i - 1].argmax(-1)
    return c


def gta_codes(torch, model, tok, ids, data, dev, batch=32):
    """Ground-truth-aligned codes for decoder training: for every utterance of `data` (dicts with text and codes
    [T, n_q]), its true codebook-0 codes with the residual codebooks replaced by what the code predictor greedily
    predicts from the talker teacher-forced on them. As at inference, each frame's input to the talker holds the
    residual codes predicted for it: a first pass with random residual inputs (what the talker was trained on,
    --resid-noise 1) predicts them, a second pass reads them and predicts again. The decoder then learns from the
    residual codes it gets at inference, with the true audio as target (as Tacotron 2 trains its WaveNet on
    ground-truth-aligned predictions). Returns a list of [T, n_q] int16 tensors."""
    out = []
    with torch.no_grad():
        for b in range(0, len(data), batch):
            exs = [example_tensors(torch, build_example(tok, ids, d["text"], d["codes"], "english"))
                   for d in data[b:b + batch]]
            frames = [e["codes"].shape[0] for e in exs]
            _, h, c = talker_forward(torch, model, collate(torch, exs, dev), resid_noise=1.0)
            for e, p in zip(exs, greedy_residuals(torch, model, h, c[:, 0]).cpu().split(frames)):
                e["codes"] = p
            _, h, c = talker_forward(torch, model, collate(torch, exs, dev))
            out += greedy_residuals(torch, model, h, c[:, 0]).to(torch.int16).cpu().split(frames)
    return out


def gta_replace(a, ns, size, dev, rows, mel_codes):
    """--gta-from: mel_codes (per utterance [T, n_q], or [T, 1] from a quantizer that holds codebook 0 only) with
    their residual codebooks replaced by gta_codes() of the talker of the export a.gta_from (tokenizer from
    WORK/tok). Returns [T, n_q] int16 codes per utterance."""
    import torch
    n_q = size["n_q"]
    full = bool(mel_codes) and mel_codes[0].shape[1] == n_q
    if not full:
        # the talker reads random residual inputs anyway (resid_noise=1), so only codebook 0 has to be real
        mel_codes = [torch.nn.functional.pad(c, (0, n_q - c.shape[1])) for c in mel_codes]
    tok_dir = os.path.join(a.work, "tok")
    tok, ids = load_tokenizer(tok_dir), special_ids(tok_dir)
    model = build_talker(ns, size, ids).to(dev)
    load_export_weights(model, a.gta_from)
    model.eval()
    torch.manual_seed(a.seed)                       # the first pass's random residual inputs
    t0 = time.time()
    data = [dict(text=r["text"], codes=c.long()) for r, c in zip(rows, mel_codes)]
    pred = gta_codes(torch, model, tok, ids, data, dev)
    same = ""
    if full:
        eq = sum(int((p[:, 1:] == c[:, 1:].to(p.dtype)).sum()) for p, c in zip(pred, mel_codes))
        same = f"; {100 * eq / max(sum(c[:, 1:].numel() for c in mel_codes), 1):.1f} % equal to the quantizer's"
    log(f"gta: residual codes of {len(pred)} utterances from {a.gta_from} ({time.time() - t0:.0f} s{same})")
    return pred


def build_talker(ns, size, ids):
    """The official Qwen3TTSForConditionalGeneration (talker + code predictor) of the size preset, f32, untrained."""
    import torch
    cfg = ns.Qwen3TTSConfig(**json.loads(json.dumps(main_config(size, ids))))
    return ns.Qwen3TTSForConditionalGeneration._from_config(cfg, dtype=torch.float32)


def load_export_weights(model, export_dir):
    """An exported checkpoint's model.safetensors (bf16) into `model` (as f32)."""
    from safetensors.torch import load_file
    sd = load_file(os.path.join(export_dir, "model.safetensors"))
    model.load_state_dict({k: v.float() for k, v in sd.items()})


def step_talker(a, size, ns, data=None):
    """Talker + code predictor training. Data parallel when started by torchrun (WORLD_SIZE > 1): every process
    draws its own batches of --talker-batch utterances, the gradients are averaged with one all-reduce, and the
    clock that drives the learning rate and --max-minutes is the slowest process's, so all stay in step; only rank 0
    logs and saves."""
    import torch
    import torch.distributed as dist
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    dev = torch.device(a.device)
    if world > 1:
        if a.device.startswith("cuda"):
            dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(dev)
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    torch.manual_seed(a.seed)
    random.seed(a.seed + rank)
    tok_dir = os.path.join(a.work, "tok")
    tok = load_tokenizer(tok_dir)
    ids = special_ids(tok_dir)
    if data is None:
        data = [d for p in (a.codes or [os.path.join(a.work, "codes.pt")]) for d in load_codes(torch, p)]
    model = build_talker(ns, size, ids).to(dev)
    model.train()
    opt = make_adamw(torch, model.parameters(), a, lr=a.talker_lr, weight_decay=0.01, betas=(0.9, 0.98))
    n_params = sum(p.numel() for p in model.parameters())
    say = log if rank == 0 else (lambda *_: None)
    say(f"talker: {n_params / 1e6:.2f} M parameters, {len(data)} utterances, {sum(len(d['codes']) for d in data)} "
        f"frames, {world} process(es) x batch {a.talker_batch}")
    out = os.path.join(a.work, "talker")
    os.makedirs(out, exist_ok=True)
    ckpt = os.path.join(out, "talker.pt")
    start = 1
    if a.resume and os.path.exists(ckpt):
        st = torch.load(ckpt, map_location=dev)
        model.load_state_dict(st["model"])
        if "opt" in st:
            opt.load_state_dict(st["opt"])
        start = st.get("step", 0) + 1
        say(f"talker: resumed at step {start}")
    elif a.init_from:
        load_export_weights(model, a.init_from)   # the optimiser starts afresh
        start = a.init_step + 1
        say(f"talker: initialised from {a.init_from}, counting from step {start}")
    if world > 1:                                    # identical start on every process
        for p in model.parameters():
            dist.broadcast(p.data, 0)
    params = [p for p in model.parameters() if p.requires_grad]
    cache = {}                                       # (utterance, language) -> prompt tensors (built once)
    val = [example_tensors(torch, build_example(tok, ids, d["text"], d["codes"], TRAIN_LANGUAGE))
           for p in (a.val_codes or []) for d in load_codes(torch, p)] if rank == 0 else []
    best = dict(ce=float("inf"), step=None, model=None)

    def validate(step):
        """Code-0 and code-predictor CE on the held-out utterances (--val-codes), with random residual codes in the
        talker's input as at inference (fixed noise seed); keeps a copy of the best weights by code-0 CE."""
        model.eval()
        tot0 = tot1 = 0.0
        with torch.no_grad(), torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
            torch.manual_seed(1234)
            for b in range(0, len(val), 64):
                with amp(torch, a):
                    l0, l1 = talker_loss(torch, model, collate(torch, val[b:b + 64], dev), resid_noise=1.0)
                n = len(val[b:b + 64])
                tot0, tot1 = tot0 + l0.item() * n, tot1 + l1.item() * n
        model.train()
        ce0, ce1 = tot0 / len(val), tot1 / len(val)
        if ce0 < best["ce"]:
            best.update(ce=ce0, step=step, model={k: v.detach().clone() for k, v in model.state_dict().items()})
        log(f"talker step {step}: validation ({len(val)} held-out utterances, random residual inputs) "
            f"code0 {ce0:.3f} sub {ce1:.3f}{' (best)' if best['step'] == step else ''}")

    def example(i, lang):
        if (i, lang) not in cache:
            d = data[i]
            cache[(i, lang)] = example_tensors(torch, build_example(tok, ids, d["text"], d["codes"], lang))
        return cache[(i, lang)]

    def elapsed():
        """Seconds since the start, the slowest process's (one small all-reduce)."""
        e = time.time() - t0
        if world > 1:
            e_t = torch.tensor([e], device=dev, dtype=torch.float64)
            dist.all_reduce(e_t, op=dist.ReduceOp.MAX)
            e = e_t.item()
        return e

    t0 = time.time()
    step = start - 1
    for step in range(start, a.talker_steps + 1):
        el = elapsed()
        for g in opt.param_groups:
            g["lr"] = a.talker_lr * lr_factor(step, a.talker_steps, a.warmup, el, a.max_minutes,
                                              warmup_from=start if a.init_from else 0)
        exs = [example(random.randrange(len(data)), TRAIN_LANGUAGE if random.random() < a.p_english else "auto")
               for _ in range(a.talker_batch)]
        batch = collate(torch, exs, dev)
        with amp(torch, a):
            l0, l1 = talker_loss(torch, model, batch, a.resid_noise)
        loss = l0 + a.sub_weight * l1
        opt.zero_grad(set_to_none=False)
        loss.backward()
        if world > 1:
            from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
            for p in params:                         # a parameter this batch did not reach still takes part
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            flat = _flatten_dense_tensors([p.grad for p in params])
            dist.all_reduce(flat)
            flat /= world
            for p, g in zip(params, _unflatten_dense_tensors(flat, [p.grad for p in params])):
                p.grad.copy_(g)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % a.log_every == 0 or step == a.talker_steps:
            say(f"talker step {step}: code0 {l0.item():.3f} sub {l1.item():.3f} lr {opt.param_groups[0]['lr']:.2e} "
                f"({el:.0f} s)")
        if rank == 0 and a.snapshot_every and step % a.snapshot_every == 0:
            snap = os.path.join(out, f"snap-{step}.pt")
            torch.save({"model": {k: v.detach().to(torch.bfloat16).cpu() for k, v in model.state_dict().items()},
                        "size": a.size, "step": step}, snap)
            say(f"talker: snapshot -> {snap}")
        stop = a.max_minutes and el > 60 * a.max_minutes
        if val and (step % (a.log_every * a.val_every) == 0 or stop or step == a.talker_steps):
            validate(step)
        if stop:
            say(f"talker: time limit at step {step}")
            break
    if rank == 0:
        torch.save({"model": model.state_dict(), "size": a.size, "step": step, "opt": opt.state_dict()}, ckpt)
        if best["model"] is not None:
            torch.save({"model": best["model"], "size": a.size, "step": best["step"], "val_code0": best["ce"]},
                       os.path.join(out, "talker-best.pt"))
            log(f"talker: best validation code0 {best['ce']:.3f} at step {best['step']} -> talker-best.pt")
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return model


def step_probe(a, size, ns):
    """Teacher-forced CE of an export (--init-from) on --probe-n random utterances of --codes, with the inputs
    altered: the true text and codes; another utterance's text; random residual codes (codebooks 1..n_q-1) in the
    talker's input; the previous frame's residual codes. Shows what the talker reads (scripts/voice/README.md,
    third round): a talker that reads the residual codes derails on the code predictor's samples."""
    import torch
    tok_dir = os.path.join(a.work, "tok")
    tok, ids = load_tokenizer(tok_dir), special_ids(tok_dir)
    model = build_talker(ns, size, ids)
    load_export_weights(model, a.init_from)
    model.eval()
    n_codes = model.talker.code_predictor.get_input_embeddings()[0].num_embeddings
    data = [d for p in a.codes for d in load_codes(torch, p)]
    rng = random.Random(a.seed)
    idx = rng.sample(range(len(data)), a.probe_n)
    other = idx[1:] + idx[:1]

    def ce(texts, resid=None):
        exs = [example_tensors(torch, build_example(tok, ids, t, data[i]["codes"], "english")) for t, i in zip(texts, idx)]
        for e in exs:
            if resid is not None:
                e["codes"] = torch.cat([e["codes"][:, :1], resid(e["codes"][:, 1:])], 1)
        with torch.no_grad():
            l0, l1 = talker_loss(torch, model, collate(torch, exs, torch.device("cpu")))
        return f"code-0 CE {l0.item():.3f}, code-predictor CE {l1.item():.3f}"
    own = [data[i]["text"] for i in idx]
    log(f"probe {a.init_from}, {a.probe_n} utterances:")
    log(f"  true text, true codes:               {ce(own)}")
    log(f"  another utterance's text:            {ce([data[j]['text'] for j in other])}")
    log(f"  random residual codes in the input:  {ce(own, lambda r: torch.randint_like(r, 0, n_codes))}")
    log(f"  previous frame's residual codes:     {ce(own, lambda r: torch.roll(r, 1, 0))}")


# ------------------------------------------------------------------------------------------------------------
# 4. Export in the exact layout + check with the official loader
# ------------------------------------------------------------------------------------------------------------
def step_export(a, size, ns):
    import torch
    from safetensors.torch import save_file
    tok_dir = os.path.join(a.work, "tok")
    ids = special_ids(tok_dir)
    cfg_dict = main_config(size, ids)
    tcfg_dict = speech_tokenizer_config(size)
    model = build_talker(ns, size, ids)
    model.load_state_dict(torch.load(os.path.join(a.work, "talker", "talker.pt"), map_location="cpu", weights_only=False)["model"])
    codec, _ = build_codec_modules(ns, size, torch.device("cpu"))
    codec.load_state_dict(torch.load(os.path.join(a.work, "codec", "codec.pt"), map_location="cpu", weights_only=False)["codec"])

    out = a.out
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(os.path.join(out, "speech_tokenizer"))
    sd = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    save_file(sd, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    csd = {k: v.detach().to(torch.float32).contiguous() for k, v in codec.state_dict().items()}
    save_file(csd, os.path.join(out, "speech_tokenizer", "model.safetensors"), metadata={"format": "pt"})
    dump_json(os.path.join(out, "config.json"), cfg_dict)
    dump_json(os.path.join(out, "generation_config.json"), GENERATION_CONFIG)
    dump_json(os.path.join(out, "speech_tokenizer", "config.json"), tcfg_dict)
    dump_json(os.path.join(out, "speech_tokenizer", "preprocessor_config.json"), PREPROCESSOR_CONFIG)
    for f in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(tok_dir, f), os.path.join(out, f))
    total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(out) for f in fs)
    log(f"export: {out}, {total / 1e6:.2f} MB "
        f"(talker {sum(v.numel() for v in sd.values()) / 1e6:.2f} M bf16, codec {sum(v.numel() for v in csd.values()) / 1e6:.2f} M f32)")
    if total > 32 * 1024 * 1024:
        log("WARNING: over the 32 MB budget")

    # official loader + generate_custom_voice (greedy, short)
    tts = ns.Qwen3TTSModel.from_pretrained(out, dtype=torch.float32)
    wavs, sr = tts.generate_custom_voice(text="Hello there.", speaker=SPEAKER, language="English",
                                        do_sample=False, subtalker_dosample=False, max_new_tokens=a.check_frames)
    write_wav(os.path.join(a.work, "export_check.wav"), wavs[0])
    log(f"export check: official generate_custom_voice -> {len(wavs[0]) / sr:.2f} s at {sr} Hz")
    return out


def step_roundtrip(a, size, ns):
    """Codec ceiling: encode + decode (official decoder forward on the codes) every utterance of --manifest (e.g.
    teacher.py's render of test_sentences.txt) into WORK/roundtrip/<line>.wav, for wer.py --wav-dir."""
    import torch
    if a.init_from and a.scheme != "mel":
        raise SystemExit("roundtrip --init-from: an export holds no encoder; use the mel scheme")
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
    if a.scheme == "mel":
        q, fmel = load_quantizer(torch, a.work, dev)
        mel_codes = encode_audio(torch, q, fmel, audio, dev)
        if a.gta_from:
            mel_codes = gta_replace(a, ns, size, dev, rows, mel_codes)
    else:
        enc.load_state_dict(st["encoder"])
        enc.eval()
    out = os.path.join(a.work, "roundtrip")
    os.makedirs(out, exist_ok=True)
    with torch.no_grad():
        for k, (r, x) in enumerate(zip(rows, audio)):
            if a.scheme == "mel":
                codes = mel_codes[k].t()[None].long().to(dev)
            else:
                z = enc((x.float() / 32768.0).to(dev)[None])
                _, codes, _ = quantize(torch, codec.decoder, z, train=False)
            wav = codec.decoder(codes)[0, 0].cpu().numpy()
            write_wav(os.path.join(out, r["id"] + ".wav"), wav)
    log(f"roundtrip: {len(rows)} utterances -> {out} (codec trained {st.get('step')} steps)")


def step_check(a, size, ns):
    """Greedy official generation (Qwen3TTSModel.generate_custom_voice, non-streaming, language english) for the
    first --check-n training texts, compared frame by frame with their training codes: on a model that has learned
    (or memorised) them this shows that the training prompt format is the one inference uses."""
    import torch
    data = load_codes(torch, os.path.join(a.work, "codes.pt"))[: a.check_n]
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


# ------------------------------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=["tokenizer", "quantizer", "codec", "codes", "talker", "export", "check",
                                     "roundtrip", "probe", "all"])
    ap.add_argument("--work", required=True)
    ap.add_argument("--text", help="training sentences (tokenizer)")
    ap.add_argument("--manifest", help="teacher.py manifest.jsonl")
    ap.add_argument("--out", help="export directory")
    ap.add_argument("--size", default="small", choices=sorted(SIZES))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit", type=int, default=None, help="use the first N utterances")
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--codec-steps", type=int, default=20000)
    ap.add_argument("--codec-batch", type=int, default=16)
    ap.add_argument("--codec-lr", type=float, default=3e-4)
    ap.add_argument("--codec-warmup", type=int, default=200)
    ap.add_argument("--codes-batch", type=int, default=1, help="codes: utterances per batch (sorted by length)")
    ap.add_argument("--scheme", default="mel", choices=["mel", "learned"],
                    help="codes: fixed residual k-means of log-mel frames (quantizer step) or a learned encoder + EMA RVQ")
    ap.add_argument("--kmeans-frames", type=int, default=400000, help="quantizer: frames sampled for k-means")
    ap.add_argument("--kmeans-k", type=int, default=2048, help="quantizer: centroids per stage (<= 2048)")
    ap.add_argument("--kmeans-iters", type=int, default=20)
    ap.add_argument("--codes-out", help="codes: output file (default WORK/codes.pt)")
    ap.add_argument("--codes", nargs="*", help="talker: codes files to train on (default WORK/codes.pt)")
    ap.add_argument("--seg-frames", type=int, default=24, help="training crop, in 12.5 Hz frames")
    ap.add_argument("--commit-weight", type=float, default=1.0)
    ap.add_argument("--gan-start", type=int, default=-1, help="step to switch the discriminator on (-1: never)")
    ap.add_argument("--adv-weight", type=float, default=1.0)
    ap.add_argument("--fm-weight", type=float, default=2.0)
    ap.add_argument("--talker-steps", type=int, default=20000)
    ap.add_argument("--talker-batch", type=int, default=16)
    ap.add_argument("--talker-lr", type=float, default=5e-4)
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--sub-weight", type=float, default=1.0)
    ap.add_argument("--resid-noise", type=float, default=0.0,
                    help="talker: share of frames whose residual-code inputs are random (see talker_loss)")
    ap.add_argument("--val-codes", nargs="*", help="talker: codes files of held-out utterances (validation CE)")
    ap.add_argument("--val-every", type=int, default=5, help="talker: validate every N x --log-every steps")
    ap.add_argument("--snapshot-every", type=int, default=0,
                    help="talker: also keep the weights every N steps (bf16) as talker/snap-STEP.pt, so a call's "
                         "checkpoints can be compared by wer.py (the error rate moves by several points between them)")
    ap.add_argument("--init-from", help="talker / codec / roundtrip: start from (or use) an exported checkpoint "
                    "directory's weights (talker: model.safetensors; codec: speech_tokenizer/)")
    ap.add_argument("--gta-from", help="codec / roundtrip (mel scheme): replace the residual codes by the code "
                    "predictor's greedy ones from this export's talker, teacher-forced on the true codebook 0 (gta_codes)")
    ap.add_argument("--gta-share", type=float, default=1.0, help="codec --gta-from: share of utterances that get them")
    ap.add_argument("--probe-n", type=int, default=48, help="probe: utterances")
    ap.add_argument("--init-step", type=int, default=0, help="talker: step count of --init-from (logs, warm-up)")
    ap.add_argument("--p-english", type=float, default=0.5, help="share of prompts with language=english (else auto)")
    ap.add_argument("--check-frames", type=int, default=40)
    ap.add_argument("--check-n", type=int, default=4, help="check: number of training texts")
    ap.add_argument("--resume", action="store_true", help="continue codec/talker from WORK/*/ *.pt (step count kept)")
    ap.add_argument("--max-minutes", type=float, default=0, help="stop a training step after this long and save")
    ap.add_argument("--amp", action="store_true", help="bf16 autocast on CUDA")
    a = ap.parse_args()
    size = SIZES[a.size]
    os.makedirs(a.work, exist_ok=True)
    random.seed(a.seed)
    # the mel scheme's quantizer and codes steps need torch only (no qwen-tts / transformers)
    ns = None if (a.scheme == "mel" and a.step in ("quantizer", "codes")) else import_qwen()
    import torch
    # at most 8 CPU threads (on the device machine the CPU work is data handling beside other processes)
    torch.set_num_threads(max(1, min(os.cpu_count() or 1, 8 if a.device == "cpu" else 4)))
    codec = enc = data = None
    if a.step in ("tokenizer", "all"):
        step_tokenizer(a, size)
    if a.step == "quantizer" or (a.step == "all" and a.scheme == "mel"):
        step_quantizer(a, size, ns)
    if a.step in ("codec", "all"):
        codec, enc = step_codec(a, size, ns)
    if a.step in ("codes", "all"):
        data = step_codes(a, size, ns, codec, enc)
    if a.step in ("talker", "all"):
        step_talker(a, size, ns, data)
    if a.step in ("export", "all"):
        step_export(a, size, ns)
    if a.step == "check":
        step_check(a, size, ns)
    if a.step == "roundtrip":
        step_roundtrip(a, size, ns)
    if a.step == "probe":
        step_probe(a, size, ns)


if __name__ == "__main__":
    main()
