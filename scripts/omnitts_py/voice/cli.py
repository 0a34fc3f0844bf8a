"""Training recipe for the bundled omnitts English voice, in the exact Qwen3-TTS checkpoint layout.

Everything that is exported is an instance of the official classes of the PyPI package qwen-tts 0.1.1
(transformers 4.57.3): `Qwen3TTSForConditionalGeneration` (talker + code predictor, CustomVoice with one speaker)
and `Qwen3TTSTokenizerV2Model` (speech tokenizer: the 12 Hz Code2Wav decoder, plus a tiny untrained Mimi encoder kept
only so the directory has the real layout; CustomVoice never uses the encoder). Sizes are small and come from a
preset (voice/common.py SIZES); every special id is written into the config JSON and read back from it.

Steps (each writes into WORK; run them in order, or `all`):

  tokenizer  byte-level BPE (Qwen2 pre-tokenizer regex, NFC, ByteLevel) trained on the training text; the special
             tokens (<|im_start|>, <tts_pad>, ...) get ids after the BPE vocabulary; "assistant" and "\\n" are single
             tokens so the reference prompt slicing (ids[:3] role, ids[3:-5] body) holds.
  quantizer  (--scheme mel, the default) defines the codes before any training: each 80 ms frame is 4 log-mel
             sub-frames of 20 ms (320 values, normalised per value); codebook 0 is a k-means of whole frames, codebook q
             a k-means of the residual left by codebooks < q (WORK/quantizer.pt). --scheme phone: codebook 0 clusters
             the frame's log-mel together with the teacher's phoneme alignment (manifest durations, weighted by
             --phone-weight), so it carries what is said; stored with int8 centroids.
  codec      trains the official Code2Wav decoder on teacher audio (multi-scale mel + multi-resolution STFT, optional
             multi-scale STFT and multi-period discriminators from --gan-start): with --scheme mel as a vocoder from the fixed codes (its codebook vectors
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
torchaudio, onnxruntime) are stubbed when absent (omnitts_py.qwen_stack).
"""
import argparse
import os
import random

import torch

from ..qwen_stack import import_qwen_tts
from .check import step_check
from .codec import step_codec
from .codes import step_codes
from .common import SIZES
from .export import step_export
from .probe import step_probe
from .quantizer import step_quantizer
from .roundtrip import step_roundtrip
from .talker import step_talker
from .tokenizer import step_tokenizer


def main(argv=None):
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
    ap.add_argument("--scheme", default="mel", choices=["mel", "phone", "learned"],
                    help="codes: fixed residual k-means of log-mel frames (quantizer step; `phone`: codebook 0 also "
                         "clusters the teacher's phoneme alignment) or a learned encoder + EMA RVQ")
    ap.add_argument("--phone-weight", type=float, default=10.0,
                    help="quantizer, phone scheme: weight of the phoneme alignment against the normalised mel in "
                         "codebook 0's k-means")
    ap.add_argument("--kmeans-frames", type=int, default=400000, help="quantizer: frames sampled for k-means")
    ap.add_argument("--kmeans-k", type=int, default=2048, help="quantizer: centroids per stage (<= 2048)")
    ap.add_argument("--kmeans-iters", type=int, default=20)
    ap.add_argument("--codes-out", help="codes: output file (default WORK/codes.pt)")
    ap.add_argument("--codes", nargs="*", help="talker: codes files to train on (default WORK/codes.pt)")
    ap.add_argument("--seg-frames", type=int, default=24, help="training crop, in 12.5 Hz frames")
    ap.add_argument("--commit-weight", type=float, default=1.0)
    ap.add_argument("--gan-start", type=int, default=-1, help="step to switch the discriminator on (-1: never)")
    ap.add_argument("--disc-from", help="codec: start the discriminators from this safetensors file (a previous "
                    "call's disc.safetensors)")
    ap.add_argument("--adv-weight", type=float, default=1.0)
    ap.add_argument("--fm-weight", type=float, default=2.0)
    ap.add_argument("--talker-steps", type=int, default=20000)
    ap.add_argument("--talker-batch", type=int, default=16)
    ap.add_argument("--talker-lr", type=float, default=5e-4)
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--sub-weight", type=float, default=1.0)
    ap.add_argument("--resid-noise", type=float, default=0.0,
                    help="talker: share of frames whose residual-code inputs are random (see talker_loss)")
    ap.add_argument("--talker-dropout", type=float, default=0.0,
                    help="talker: attention dropout in the talker's and code predictor's layers while training (the "
                         "models' attention_dropout; the exported config keeps 0.0 and inference never drops)")
    ap.add_argument("--talker-wd", type=float, default=0.01, help="talker: AdamW weight decay")
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
    ap.add_argument("--init-transfer", action="store_true",
                    help="talker --init-from: take only what carries over to other codes (text side, layers, "
                         "control rows), e.g. from the first-round voice into the phone scheme")
    ap.add_argument("--init-step", type=int, default=0, help="talker: step count of --init-from (logs, warm-up)")
    ap.add_argument("--p-english", type=float, default=0.5, help="share of prompts with language=english (else auto)")
    ap.add_argument("--check-frames", type=int, default=40)
    ap.add_argument("--check-n", type=int, default=4, help="check: number of training texts")
    ap.add_argument("--resume", action="store_true", help="continue codec/talker from WORK/*/ *.pt (step count kept)")
    ap.add_argument("--max-minutes", type=float, default=0, help="stop a training step after this long and save")
    ap.add_argument("--amp", action="store_true", help="bf16 autocast on CUDA")
    a = ap.parse_args(argv)
    size = SIZES[a.size]
    os.makedirs(a.work, exist_ok=True)
    random.seed(a.seed)
    # the mel scheme's quantizer and codes steps need torch only (no qwen-tts / transformers)
    ns = None if (a.scheme in ("mel", "phone") and a.step in ("quantizer", "codes")) else import_qwen_tts()
    # at most 8 CPU threads (on the device machine the CPU work is data handling beside other processes)
    torch.set_num_threads(max(1, min(os.cpu_count() or 1, 8 if a.device == "cpu" else 4)))
    codec = enc = data = None
    if a.step in ("tokenizer", "all"):
        step_tokenizer(a, size)
    if a.step == "quantizer" or (a.step == "all" and a.scheme in ("mel", "phone")):
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
