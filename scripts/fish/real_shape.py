#!/usr/bin/env python3
"""A random-weight Fish Audio S2 Pro checkpoint of the REAL shapes (or a `small` one for CPU
checks) in the real file layout, seeded, with no expected outputs: the common input of omnitts
and the official reference (scripts/fish/ref_bench.py) for side-by-side timings on identical
weights.

    # on a GPU machine (one H200: ~9.1 GB of bf16 LLM weights + the f32 codec, tens of seconds)
    FISH_SPEECH=/path/to/fish-speech python3 scripts/fish/real_shape.py --out /tmp/s2pro
    # on a CPU, for checking the scripts
    FISH_SPEECH=/work/fishref/fish-speech /work/fishref/venv/bin/python \
        scripts/fish/real_shape.py --shape small --device cpu --out /tmp/s2small

The reference (fishaudio/fish-speech, Fish Audio Research License) is imported from outside the
repository, at the commit named in make_tiny.py's docstring (3578e4e7, "S2 beta (#1167)"); only
its classes are used, on the `meta` device, for the exact parameter names and shapes (so nothing
of the reference is copied here). The tensors themselves are drawn directly on --device.

What it writes into --out:
  config.json                      model_type fish_qwen3_omni, nested text_config +
                                   audio_decoder_config (the keys make_tiny.py writes)
  model-0000i-of-0000n.safetensors bf16, the real key names (`text_model.model.*`,
  model.safetensors.index.json     `audio_decoder.*`), sharded at --shard-gb (HF's 5 GB default)
  tokenizer.json, tokenizer_config.json, special_tokens_map.json
                                   copied from tests/fixtures/tiny-fish (a small BPE with
                                   Qwen3's and Fish's special tokens, <|semantic:0..4095|> =
                                   ids 565..4660); config.json's vocab_size is the real 155,776
                                   (larger than the tokenizer: the extra rows are never looked up)
  codec.pth                        f32 torch state dict, weight norm as parametrizations; for
                                   `real`, the shapes of the reference's configs/modded_dac_vq.yaml
                                   and NO codec_config.yaml (like the real checkpoint; omnitts and
                                   the reference then use the real codec values); for `small`, the
                                   tiny codec of make_tiny.py and its codec_config.yaml.

Where the real values come from (the real fishaudio/s2-pro config.json was not available offline;
every value below is also what public third-party S2 ports pin as the published config.json, seen
in public code while writing this: text_config max_seq_len 32768, the fast AR's 32/8 heads, 128
head_dim, 9728 SwiGLU, no q/k norm, norm_eps 1e-6, rope_base 1e6, audio_decoder max_seq_len 11,
text_dim 2560, plus two keys no loader reads, "audio_hidden_dim": 5120 and "use_moe": false, and
"initializer_range": 0.01976423537605237, all written here for `real`):
  - slow AR: 36 layers, dim 2560, 32 query / 8 KV heads, head_dim 128, q/k norm, SwiGLU 9728,
    tied output, vocab 155,776, RoPE base 1e6: the task's brief (a Qwen3 backbone). norm_eps 1e-6:
    Qwen3's value, as make_tiny.py's tiny fixture (which mirrors S2 Pro's structure) uses.
  - fast AR: 4 layers, width 2560, 10 positions: the brief. Its heads (32 / 8, head_dim 128) and
    SwiGLU width (9728) are also the reference's fallbacks (llama.py DualARModelArgs takes every
    unset fast_* value from the slow model, and so does omnitts' config.rs); with them the fast AR
    has 0.42 B parameters, matching the reference README's "400M parameters along the depth axis"
    (and the slow ~4.1 B its "4B"). attention_qk_norm false in the fast AR: make_tiny.py's
    structure ("q/k norm in the slow model only").
  - num_codebooks 10, codebook vocab 4096 (audio_decoder_config.vocab_size; the fast head and each
    codebook-embedding slice), residual codebooks 9 x 1024 and semantic 4096: configs/
    modded_dac_vq.yaml (n_codebooks 9, codebook_size 1024, semantic_codebook_size 4096) and the
    tokenizer's 4096 <|semantic:i|> tokens.
  - max_seq_len 32768 (--max-seq-len to change it): the reference's own default, 2048, cannot run
    at all (it refuses prompts longer than max_seq_len - 2048). It matters for speed: the
    reference's decode step attends over the whole KV cache (max_seq_len positions,
    repeat_interleave'd to 32 heads in every layer), so its ms per frame grows with it (see
    ref_bench.py --short-seq-len).
  - codec: configs/modded_dac_vq.yaml of the reference (44.1 kHz, hop 512 x 2 x 2 = 2048).
  - token ids: the tiny tokenizer's (<|im_end|> 536, semantic 565..4660), not the real ones
    (151645, 151678..155773); both loaders take them from tokenizer.json.

Values: norms 1 + 0.2 N(0,1); embeddings N(0,1); other matrices N(0,1)/sqrt(fan_in) (O(1)
activations, as make_tiny.py); the codec as make_tiny.py's build_codec. Each tensor is drawn from
its own generator seeded by (--seed, crc32(name)), so the result does not depend on the order;
CPU and CUDA streams differ, so a checkpoint is identical only for the same --device.
"""

import argparse
import json
import math
import os
import shutil
import sys
import time
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_tiny as mt  # noqa: E402 (its helpers import nothing heavy at module level)

REPO = HERE.parent.parent

SHAPES = {
    "real": dict(
        text=dict(dim=2560, n_layer=36, n_head=32, n_local_heads=8, head_dim=128,
                  intermediate_size=9728, vocab_size=155_776, attention_qk_norm=True),
        fast=dict(dim=2560, n_layer=4, n_head=32, n_local_heads=8, head_dim=128,
                  intermediate_size=9728, attention_qk_norm=False),
        max_seq_len=32768,
        # keys of the published config.json that no loader reads (kept for fidelity)
        extra=dict(audio_hidden_dim=5120, use_moe=False, initializer_range=0.01976423537605237),
        codec=None,  # the reference's configs/modded_dac_vq.yaml; no codec_config.yaml written
    ),
    "small": dict(
        # the real vocabulary (the big embedding / tied head path), small everything else
        text=dict(dim=256, n_layer=4, n_head=4, n_local_heads=2, head_dim=64,
                  intermediate_size=768, vocab_size=155_776, attention_qk_norm=True),
        fast=dict(dim=256, n_layer=2, n_head=4, n_local_heads=2, head_dim=64,
                  intermediate_size=640, attention_qk_norm=False),
        max_seq_len=4096,
        codec="tiny",  # make_tiny.py's tiny codec (the s2 variant's) + its codec_config.yaml
    ),
}
NUM_CODEBOOKS = 10
CODEBOOK_SIZE = 4096
ROPE_BASE = 1_000_000
NORM_EPS = 1e-6


def tokenizer_ids(tok_dir: Path):
    data = json.loads((tok_dir / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in data["added_tokens"]}
    sem = [ids[f"<|semantic:{i}|>"] for i in range(4096)]
    assert sem == list(range(sem[0], sem[0] + 4096)), "semantic tokens must be contiguous"
    return ids, sem[0], sem[-1]


def write_config(out: Path, shape, ids, sem0, sem1, max_seq_len):
    common = dict(
        attention_o_bias=False, attention_qkv_bias=False, dropout=0.0, norm_eps=NORM_EPS,
        rope_base=ROPE_BASE, use_gradient_checkpointing=True, initializer_range=0.02,
    )
    common.update(shape.get("extra", {}))
    t, f = dict(shape["text"]), dict(shape["fast"])
    cfg = {
        "architectures": ["FishQwen3OmniForCausalLM"],
        "model_type": "fish_qwen3_omni",
        "dtype": "bfloat16",
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|pad|>"],
        "audio_pad_token_id": ids["<|audio_pad|>"],
        "semantic_start_token_id": sem0,
        "semantic_end_token_id": sem1,
        "text_config": dict(
            common, model_type="fish_qwen3", max_seq_len=max_seq_len, tie_word_embeddings=True,
            **t,
        ),
        "audio_decoder_config": dict(
            common, model_type="fish_qwen3_audio_decoder", vocab_size=CODEBOOK_SIZE,
            num_codebooks=NUM_CODEBOOKS, max_seq_len=NUM_CODEBOOKS + 1,
            tie_word_embeddings=False, text_dim=t["dim"], **f,
        ),
    }
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return cfg


def gen_for(name, seed, device):
    import torch

    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
    return g


def llm_value(name, shape, g, device):
    import torch

    x = torch.randn(shape, generator=g, device=device, dtype=torch.float32)
    if len(shape) == 1:  # RMSNorm weights
        return x.mul_(0.2).add_(1.0)
    if "embeddings" in name:
        return x
    return x.mul_(1.0 / math.sqrt(shape[1]))


def codec_value(name, shape, g, device):
    """make_tiny.build_codec's rules."""
    import torch

    def randn():
        return torch.randn(shape, generator=g, device=device, dtype=torch.float32)

    def rand():
        return torch.rand(shape, generator=g, device=device, dtype=torch.float32)

    if name.endswith(("parametrizations.weight.original0", "weight_g")):
        return rand().mul_(0.6).add_(0.6)
    if name.endswith(("parametrizations.weight.original1", "weight_v")):
        return randn()
    if name.endswith(".alpha"):
        return rand().add_(0.5)
    if name.endswith("codebook.weight"):
        return randn()
    if name.endswith(".gamma"):
        return rand().mul_(0.4).add_(0.3)
    if name.endswith(".bias"):
        return randn().mul_(0.05)
    if len(shape) == 1:
        return randn().mul_(0.2).add_(1.0)
    if len(shape) == 2:
        return randn().mul_(1.0 / math.sqrt(shape[1]))
    if len(shape) == 3:
        return randn().mul_(1.0 / math.sqrt(shape[1] * shape[2]))
    raise ValueError(f"unexpected codec parameter {name} {tuple(shape)}")


def llm_shapes(out: Path, sem0, sem1):
    """Names and shapes of the reference's DualARTransformer for out/config.json, built on the
    meta device (no memory, no init time), in the checkpoint's naming."""
    import torch
    from fish_speech.models.text2semantic.llama import BaseModelArgs, DualARTransformer

    cfg = BaseModelArgs.from_pretrained(str(out))
    cfg.semantic_begin_id, cfg.semantic_end_id = sem0, sem1
    with torch.device("meta"):
        m = DualARTransformer(cfg)
    return {k: tuple(v.shape) for k, v in mt.hf_state_dict(m).items()}


def codec_shapes(yaml_text):
    import torch
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    with torch.device("meta"):
        codec = instantiate(OmegaConf.create(yaml_text))
    params = dict(codec.named_parameters())
    sd = {k: v for k, v in codec.state_dict().items()
          if not k.endswith(("freqs_cis", "causal_mask"))}
    extra = [k for k in sd if k not in params]
    assert not extra, f"codec buffers that are not parameters: {extra}"
    return {k: tuple(v.shape) for k, v in sd.items()}


def save_sharded(out: Path, shapes, seed, device, shard_bytes):
    import torch
    from safetensors.torch import save_file

    names = sorted(shapes)
    plan, cur, cur_size = [], [], 0
    for n in names:
        size = math.prod(shapes[n]) * 2
        if cur and cur_size + size > shard_bytes:
            plan.append(cur)
            cur, cur_size = [], 0
        cur.append(n)
        cur_size += size
    plan.append(cur)
    weight_map, total = {}, 0
    for i, shard in enumerate(plan):
        fname = f"model-{i + 1:05d}-of-{len(plan):05d}.safetensors"
        tensors = {}
        for n in shard:
            t = llm_value(n, shapes[n], gen_for(n, seed, device), device)
            tensors[n] = t.to(torch.bfloat16).cpu().contiguous()
            total += tensors[n].numel() * 2
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in shard})
        del tensors
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
    )
    return total, len(plan)


def real_codec_yaml():
    ref = Path(os.environ.get("FISH_SPEECH", "/work/fishref/fish-speech"))
    return (ref / "fish_speech" / "configs" / "modded_dac_vq.yaml").read_text()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="real")
    ap.add_argument("--device", default=None, help="cuda if available, else cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-seq-len", type=int, default=None,
                    help="text_config.max_seq_len (real: 32768, small: 4096)")
    ap.add_argument("--shard-gb", type=float, default=5.0, help="largest shard, GB (1e9 bytes)")
    ap.add_argument("--dry-run", action="store_true",
                    help="config, tokenizer and the parameter count only: no tensors")
    ap.add_argument("--tokenizer-from", default=str(REPO / "tests" / "fixtures" / "tiny-fish"))
    args = ap.parse_args()

    mt._import_reference()
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    shape = SHAPES[args.shape]
    max_seq_len = args.max_seq_len or shape["max_seq_len"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for stale in list(out.glob("model-*.safetensors")) + [out / "codec_config.yaml"]:
        stale.unlink(missing_ok=True)
    t0 = time.perf_counter()

    tok_dir = Path(args.tokenizer_from)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copyfile(tok_dir / f, out / f)
    ids, sem0, sem1 = tokenizer_ids(out)
    cfg = write_config(out, shape, ids, sem0, sem1, max_seq_len)

    shapes = llm_shapes(out, sem0, sem1)
    n_params = sum(math.prod(s) for s in shapes.values())
    fast = sum(math.prod(s) for k, s in shapes.items() if k.startswith("audio_decoder.")
               and not k.startswith("audio_decoder.codebook_embeddings"))
    if args.dry_run:
        if shape["codec"] is None:
            cshapes = codec_shapes(real_codec_yaml())
        else:
            cshapes = codec_shapes(mt.codec_yaml(mt.VARIANTS["s2"]["codec"]))
        print(json.dumps({"llm_params": n_params, "fast_ar_params": fast,
                          "llm_bytes_bf16": 2 * n_params, "llm_tensors": len(shapes),
                          "codec_params": sum(math.prod(s) for s in cshapes.values()),
                          "codec_tensors": len(cshapes), "max_seq_len": max_seq_len}))
        return
    total, n_shards = save_sharded(out, shapes, args.seed, device,
                                   int(args.shard_gb * 1e9))
    t_llm = time.perf_counter() - t0

    if shape["codec"] is None:
        yaml_text = real_codec_yaml()
    else:
        yaml_text = mt.codec_yaml(mt.VARIANTS["s2"]["codec"])
        (out / "codec_config.yaml").write_text(yaml_text)
    cshapes = codec_shapes(yaml_text)
    csd = {k: codec_value(k, s, gen_for("codec." + k, args.seed, device), device).cpu()
           for k, s in sorted(cshapes.items())}
    torch.save(csd, str(out / "codec.pth"))
    c_params = sum(t.numel() for t in csd.values())
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    summary = {
        "out": str(out), "shape": args.shape, "device": device, "seed": args.seed,
        "max_seq_len": max_seq_len, "llm_params": n_params, "fast_ar_params": fast,
        "llm_bytes_bf16": total, "shards": n_shards, "llm_tensors": len(shapes),
        "codec_params": c_params, "codec_tensors": len(csd),
        "codec_config_yaml": shape["codec"] is not None,
        "semantic_start_token_id": sem0, "semantic_end_token_id": sem1,
        "im_end_id": ids["<|im_end|>"], "vocab_size": cfg["text_config"]["vocab_size"],
        "seconds_llm": round(t_llm, 1), "seconds_total": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
