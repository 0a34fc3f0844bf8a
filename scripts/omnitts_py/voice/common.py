"""What every step of the voice recipe shares: the size presets, the speaker, the training language, logging, the
optimiser and the learning-rate schedule."""
import contextlib
import math
import time

import torch

from ..layout import SAMPLE_RATE, SAMPLES_PER_FRAME

SR = SAMPLE_RATE
HOP = SAMPLES_PER_FRAME           # samples per 12.5 Hz frame
SPEAKER = "joe"
SPEAKER_ID = 3000                 # codec_embedding row of the speaker (as the official finetune script uses)
# The language the voice is trained on (prompts use it or "auto"); config.json lists only it, so the element refuses
# the others by name instead of feeding untrained language rows.
TRAIN_LANGUAGE = "english"

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
# the second-round voice (`--scheme phone`): the real 16 codebooks and a decoder with the capacity to be clear;
# talker as `small` (its code-predictor tables grow with n_q: ~15.5 M parameters, 31 MB bf16), speech tokenizer
# ~7.4 M (14.9 MB bf16): ~46 MB exported, under the 48 MB budget (checked at export)
SIZES["voice16"] = dict(
    SIZES["small"], n_q=16, codec_dtype="bf16", budget_mb=48,
    dec=dict(codebook_dim=128, latent_dim=256, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=4, head_dim=64, decoder_dim=256))


def amp(a):
    """bf16 autocast on CUDA with --amp (the RVQ search, the losses and the EMA stay f32)."""
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


def make_adamw(params, a, **kw):
    if a.device.startswith("cuda"):
        kw["fused"] = True
    return torch.optim.AdamW(params, **kw)


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)
