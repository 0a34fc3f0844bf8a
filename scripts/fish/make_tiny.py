#!/usr/bin/env python3
"""Tiny random-weight Fish Audio S2 Pro checkpoints in the real file layout, plus the official
reference's outputs on them: the parity oracle of omnitts' Fish Speech port (src/models/fish_speech/).

Usage (the reference is never part of this repository; it is imported from outside):

    # 1. the reference, at the commit that introduced S2, outside the repository
    git clone https://github.com/fishaudio/fish-speech /work/fishref/fish-speech
    git -C /work/fishref/fish-speech checkout 3578e4e7          # tag v2.0.0-beta, "S2 beta (#1167)"
    # 2. a venv (python 3.11): torch 2.8.0 (CPU is enough), transformers 4.57.3, tokenizers,
    #    einops, loguru, safetensors, hydra-core 1.3.8, omegaconf 2.3.0, soundfile, numpy, click,
    #    tqdm, pyyaml; with --no-deps: descript-audio-codec 1.0.0, argbind, docstring-parser, loralib
    # 3. from the repository root
    FISH_SPEECH=/work/fishref/fish-speech /work/fishref/venv/bin/python scripts/fish/make_tiny.py \
        --out tests/fixtures/tiny-fish
    # the second fixture (other shapes and the config options S2 Pro leaves at one value)
    FISH_SPEECH=… …/python scripts/fish/make_tiny.py --variant alt --out tests/fixtures/tiny-fish-alt
    # then expected/prompts.json of each (it reads the weights and expected/'s ref_codes)
    FISH_SPEECH=… …/python scripts/fish/prompt_cases.py --fixture tests/fixtures/tiny-fish
    FISH_SPEECH=… …/python scripts/fish/prompt_cases.py --fixture tests/fixtures/tiny-fish-alt --texts 0

What it writes into --out (tests/fixtures/tiny-fish/README.md describes every file):
  config.json, model-0000{1,2}-of-00002.safetensors + model.safetensors.index.json (bf16, the real
  key names), tokenizer.json + tokenizer_config.json + special_tokens_map.json, codec.pth (a torch
  state dict, f32, weight-norm parametrisations as in the real file) + codec_config.yaml (the tiny
  codec's hydra config), and expected/ (the reference's outputs, float32 on the CPU).

The `audiotools` package (descript-audiotools) is only imported by the reference for type names;
this script puts a minimal stand-in module in sys.modules instead of installing it.
Everything is seeded: two runs give identical files.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import types
from pathlib import Path

# --------------------------------------------------------------------------------------------
# Imports of the reference (from outside the repository).


def reference_commit() -> str:
    """The commit of the reference checkout in use."""
    ref = os.environ.get("FISH_SPEECH", "/work/fishref/fish-speech")
    out = subprocess.run(["git", "-C", ref, "rev-parse", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip()


def _install_audiotools_stub():
    import torch

    class _Placeholder:  # only referenced (type names, class bodies), never used on these paths
        pass

    class BaseModel(torch.nn.Module):
        INTERN: list = []
        EXTERN: list = []

    def module(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        def getattr_(attr):  # any other public name: a placeholder class
            if attr.startswith("_"):
                raise AttributeError(attr)
            return _Placeholder

        m.__getattr__ = getattr_
        sys.modules[name] = m
        return m

    ml = module("audiotools.ml", BaseModel=BaseModel)
    core = module("audiotools.core", util=module("audiotools.core.util"))
    module("audiotools", ml=ml, core=core, AudioSignal=_Placeholder, STFTParams=_Placeholder)


def _import_reference():
    ref = os.environ.get("FISH_SPEECH", "/work/fishref/fish-speech")
    if not Path(ref, "fish_speech").is_dir():
        sys.exit(f"FISH_SPEECH={ref}: not a fish-speech checkout")
    sys.path.insert(0, ref)
    _install_audiotools_stub()


# --------------------------------------------------------------------------------------------
# Tiny dimensions. The structure (10 codebooks: 1 x 4096 semantic + 9 x 1024 residual, the
# 4096-wide fast vocabulary, hop 2048 = 512 x 2 x 2, the codec's window of 128 frames, q/k norm in
# the slow model only, a query width that differs from the model width, GQA, a tied head) is the
# real one; widths and depths are tiny.

VARIANTS = {
    # The main fixture (tests/fixtures/tiny-fish): S2 Pro's own flags (q/k norm in the slow model
    # only, no biases, a tied head, the fast AR as wide as the slow model).
    "s2": dict(
        text=dict(dim=8, n_layer=2, n_head=4, n_local_heads=2, head_dim=4, intermediate_size=24),
        fast=dict(dim=8, n_layer=2, n_head=4, n_local_heads=2, head_dim=4, intermediate_size=20),
        text_flags=dict(attention_qk_norm=True, tie_word_embeddings=True),
        fast_flags=dict(attention_qk_norm=False),
        codec=dict(
            encoder_dim=4,  # latent 4 * 2^4 = 64
            decoder_dim=32,
            encoder_transformer_layers=[0, 0, 0, 1],
            # S2 lists 4 decoder transformer layers that its decoder builds but never runs; a tiny
            # decoder (width < 64) cannot build them (n_head = width // 64), so it lists none.
            decoder_transformer_layers=[0, 0, 0, 0],
            quant_dim=64,
            quant_layers=1,
            quant_heads=4,
            quant_head_dim=16,
            quant_intermediate=128,
        ),
    ),
    # The second fixture (tests/fixtures/tiny-fish-alt): every option of the reference's config
    # that S2 Pro leaves at one value takes the other, and other depths and head geometry: a fast
    # AR narrower than the slow model (its `project_in`), q/k/v and output biases in the slow
    # model (the fast AR's config overrides them back off), q/k norm in the fast AR, an untied
    # head (`output.weight`), 3 slow layers with 2 heads of 8 over 1 KV head, a 1-layer fast AR
    # with 3 query heads over 1 KV head, and a wider codec decoder with 2 quantizer layers.
    "alt": dict(
        text=dict(dim=16, n_layer=3, n_head=2, n_local_heads=1, head_dim=8, intermediate_size=40),
        fast=dict(dim=12, n_layer=1, n_head=3, n_local_heads=1, head_dim=4, intermediate_size=28),
        text_flags=dict(
            attention_qk_norm=True, tie_word_embeddings=False, attention_qkv_bias=True,
            attention_o_bias=True,
        ),
        fast_flags=dict(attention_qk_norm=True, attention_qkv_bias=False, attention_o_bias=False),
        codec=dict(
            encoder_dim=4,
            decoder_dim=48,
            encoder_transformer_layers=[0, 0, 0, 1],
            decoder_transformer_layers=[0, 0, 0, 0],
            quant_dim=64,
            quant_layers=2,
            quant_heads=2,
            quant_head_dim=32,
            quant_intermediate=96,
        ),
    ),
}
NUM_CODEBOOKS = 10
CODEBOOK_SIZE = 4096  # audio_decoder_config.vocab_size (the fast head and each embedding slice)
MAX_SEQ_LEN = 2560  # the reference refuses prompts longer than max_seq_len - 2048
ROPE_BASE = 1_000_000
NORM_EPS = 1e-6

# Qwen3's own special tokens (in Qwen3's order) before Fish's, then the 4096 semantic tokens,
# then padding rows up to a multiple of 64, as in S2 Pro (semantic 151678..155773, vocab 155776).
QWEN_SPECIALS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
]
FISH_SPECIALS = [
    "<|pad|>", "<|phoneme_start|>", "<|phoneme_end|>", "<|text|>", "<|voice|>", "<|interleave|>",
    "<|audio_start|>", "<|audio_end|>", "<|audio_pad|>",
]
SPEAKERS = [f"<|speaker:{i}|>" for i in range(8)]
N_SEMANTIC = 4096

CORPUS = """convert the provided text to speech reference to the following:

Text:
Speech:
Hello world. This is a small test of speech synthesis, with numbers like 42 and 2026!
The quick brown fox jumps over the lazy dog. She said: "it's fine, we'll see."
Good morning, how are you today? I am fine, thank you. Let's go to the park.
你好，世界。今天天气很好。我们一起去公园吧。这是一个语音合成的小测试。
谢谢你的帮助，我们明天见。请把文本转换成语音。
"""

PROMPTS = {
    # name: (text, clone reference transcript or None)
    "en_text": ("Hello world. This is a small test of speech.", None),
    "zh_text": ("你好，世界。今天天气很好。", None),
    "en_clone": ("Good morning, how are you today?", "The quick brown fox."),
    "zh_clone": ("谢谢你的帮助，我们明天见。", "我们一起去公园吧。"),
    "speakers": ("ignored <|speaker:0|> Hi there.  <|speaker:1|>Hello, fox!", None),
}
MAX_NEW_TOKENS = 12
REF_AUDIO_SAMPLES = 30_000  # not a multiple of 2048: encode pads to 15 frames
WINDOW_FRAMES = 140  # > the codec window (128 frames): the decode case that exercises the window
WINDOW_TAIL_FRAMES = 8


# --------------------------------------------------------------------------------------------


def build_tokenizer(out: Path):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    qwen2_pattern = (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+"
    )
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(qwen2_pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator([CORPUS] * 3, trainer=trainer)
    base = tok.get_vocab_size()
    specials = QWEN_SPECIALS + FISH_SPECIALS + SPEAKERS
    semantic = [f"<|semantic:{i}|>" for i in range(N_SEMANTIC)]
    tok.add_special_tokens(specials + semantic)
    tok.save(str(out / "tokenizer.json"), pretty=False)
    total = base + len(specials) + len(semantic)
    vocab_size = (total + 63) // 64 * 64
    ids = {t: tok.token_to_id(t) for t in specials}
    sem0, sem_last = tok.token_to_id(semantic[0]), tok.token_to_id(semantic[-1])
    assert sem_last - sem0 == N_SEMANTIC - 1, "semantic tokens must be contiguous"
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "add_prefix_space": False,
                "bos_token": None,
                "eos_token": "<|im_end|>",
                "pad_token": "<|pad|>",
                "clean_up_tokenization_spaces": False,
                "model_max_length": 131072,
                "split_special_tokens": False,
                "errors": "replace",
            },
            ensure_ascii=False,
        )
    )
    (out / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|pad|>"})
    )
    return dict(
        base=base, vocab_size=vocab_size, ids=ids, semantic_start=sem0, semantic_end=sem_last
    )


def write_config(out: Path, tk, v):
    common = dict(
        attention_o_bias=False, attention_qkv_bias=False, dropout=0.0, norm_eps=NORM_EPS,
        rope_base=ROPE_BASE, use_gradient_checkpointing=True, initializer_range=0.02,
    )
    cfg = {
        "architectures": ["FishQwen3OmniForCausalLM"],
        "model_type": "fish_qwen3_omni",
        "dtype": "bfloat16",
        "eos_token_id": tk["ids"]["<|im_end|>"],
        "pad_token_id": tk["ids"]["<|pad|>"],
        "audio_pad_token_id": tk["ids"]["<|audio_pad|>"],
        "semantic_start_token_id": tk["semantic_start"],
        "semantic_end_token_id": tk["semantic_end"],
        "text_config": dict(
            common, model_type="fish_qwen3", vocab_size=tk["vocab_size"], max_seq_len=MAX_SEQ_LEN,
            **{**v["text_flags"], **v["text"]},
        ),
        "audio_decoder_config": dict(
            common, model_type="fish_qwen3_audio_decoder", vocab_size=CODEBOOK_SIZE,
            num_codebooks=NUM_CODEBOOKS, max_seq_len=NUM_CODEBOOKS + 1, **v["fast_flags"],
            tie_word_embeddings=False, text_dim=v["text"]["dim"], **v["fast"],
        ),
    }
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return cfg


def randomise_llm(model, im_end_id, im_end_scale):
    """Weights with O(1) activations (the reference's 0.02 init leaves tiny models near-flat)."""
    import torch

    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:  # RMSNorm weights (ones at init)
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif "embeddings" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
        model.embeddings.weight[im_end_id] *= im_end_scale
        if hasattr(model, "output"):  # an untied head: its own <|im_end|> row sets the logit
            model.output.weight[im_end_id] *= im_end_scale
        for p in model.parameters():  # the checkpoint is bf16: keep the truth bf16-representable
            p.copy_(p.to(torch.bfloat16).to(torch.float32))


def hf_state_dict(model):
    """The reference's module names -> the names in S2 Pro's safetensors (the inverse of its remap)."""
    out = {}
    for k, v in model.state_dict().items():
        if k in ("freqs_cis", "causal_mask", "fast_freqs_cis"):
            continue
        if k.startswith("codebook_embeddings."):
            nk = "audio_decoder." + k
        elif k.startswith("fast_"):
            nk = "audio_decoder." + k[len("fast_"):]
        else:
            nk = "text_model.model." + k
        out[nk] = v
    return out


def save_sharded(out: Path, sd):
    import torch
    from safetensors.torch import save_file

    names = sorted(sd)
    shards = [
        [n for n in names if n.startswith("text_model.")],
        [n for n in names if not n.startswith("text_model.")],
    ]
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {n: sd[n].to(torch.bfloat16).contiguous() for n in shard}
        total += sum(t.numel() * 2 for t in tensors.values())
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in shard})
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
    )


CODEC_YAML = """_target_: fish_speech.models.dac.modded_dac.DAC
# The tiny S2 codec of omnitts' fixtures: S2 Pro's structure (configs/modded_dac_vq.yaml of the
# reference) with tiny widths. hop = 2*4*8*8 * 2*2 = 2048 samples at 44.1 kHz.
sample_rate: 44100
encoder_dim: {encoder_dim}
encoder_rates: [2, 4, 8, 8]
decoder_dim: {decoder_dim}
decoder_rates: [8, 8, 4, 2]
encoder_transformer_layers: {encoder_transformer_layers}
decoder_transformer_layers: {decoder_transformer_layers}
transformer_general_config:
  _target_: fish_speech.models.dac.modded_dac.ModelArgs
  _partial_: true
  block_size: 8192
  n_local_heads: -1
  head_dim: 64
  rope_base: 10000
  norm_eps: 1e-5
  dropout_rate: 0.1
  attn_dropout_rate: 0.1
  channels_first: true
quantizer:
  _target_: fish_speech.models.dac.rvq.DownsampleResidualVectorQuantize
  input_dim: {latent}
  n_codebooks: 9
  codebook_size: 1024
  codebook_dim: 8
  quantizer_dropout: 0.5
  downsample_factor: [2, 2]
  post_module: &transformer_module
    _target_: fish_speech.models.dac.modded_dac.WindowLimitedTransformer
    causal: true
    window_size: 128
    input_dim: {latent}
    config: &transformer_config
      _target_: fish_speech.models.dac.modded_dac.ModelArgs
      block_size: 2048
      n_layer: {quant_layers}
      n_head: {quant_heads}
      dim: {quant_dim}
      intermediate_size: {quant_intermediate}
      n_local_heads: -1
      head_dim: {quant_head_dim}
      rope_base: 10000
      norm_eps: 1e-5
      dropout_rate: 0.1
      attn_dropout_rate: 0.1
      channels_first: true
  pre_module: *transformer_module
  semantic_codebook_size: 4096
"""


def codec_yaml(codec):
    return CODEC_YAML.format(latent=codec["encoder_dim"] * 16, **codec)


def build_codec(out: Path, v):
    import torch
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    text = codec_yaml(v["codec"])
    (out / "codec_config.yaml").write_text(text)
    torch.manual_seed(99)
    codec = instantiate(OmegaConf.create(text))
    g = torch.Generator().manual_seed(4321)
    with torch.no_grad():
        for name, p in codec.named_parameters():
            shape = p.shape
            if name.endswith(("parametrizations.weight.original0", "weight_g")):  # norm g [out,1,1]
                p.copy_(0.6 + 0.6 * torch.rand(shape, generator=g))
            elif name.endswith(("parametrizations.weight.original1", "weight_v")):  # weight-norm v
                p.copy_(torch.randn(shape, generator=g))
            elif name.endswith(".alpha"):  # Snake1d alpha [1, C, 1]
                p.copy_(0.5 + torch.rand(shape, generator=g))
            elif name.endswith("codebook.weight"):
                p.copy_(torch.randn(shape, generator=g))
            elif name.endswith(".gamma"):  # LayerScale (1e-2 at init) and ConvNeXt (1e-6)
                p.copy_(0.3 + 0.4 * torch.rand(shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.05 * torch.randn(shape, generator=g))
            elif p.ndim == 1:  # RMSNorm / LayerNorm weights
                p.copy_(1.0 + 0.2 * torch.randn(shape, generator=g))
            elif p.ndim == 2:  # Linear
                p.copy_(torch.randn(shape, generator=g) / math.sqrt(shape[1]))
            elif p.ndim == 3:  # plain Conv1d / ConvTranspose1d (the quantizer's resamplers)
                fan_in = shape[1] * shape[2]
                p.copy_(torch.randn(shape, generator=g) / math.sqrt(fan_in))
            else:
                raise ValueError(f"unexpected codec parameter {name} {tuple(shape)}")
    sd = codec.state_dict()
    sd = {k: v for k, v in sd.items() if not k.endswith(("freqs_cis", "causal_mask"))}
    torch.save(sd, str(out / "codec.pth"))
    return sd


# --------------------------------------------------------------------------------------------
# Reloading with the reference and checking every tensor (its loaders use strict=False).


def check_reload(out: Path, llm_sd, codec_sd):
    import torch
    from fish_speech.models.text2semantic.inference import init_model

    model, _ = init_model(str(out), "cpu", torch.float32)
    got = {k: v for k, v in hf_state_dict(model).items()}
    assert set(got) == set(llm_sd), set(got) ^ set(llm_sd)
    for k, v in llm_sd.items():
        assert torch.equal(got[k], v), f"LLM tensor {k} differs after reload"
    codec = load_codec(out)
    cgot = codec.state_dict()
    for k, v in codec_sd.items():
        assert torch.equal(cgot[k], v), f"codec tensor {k} differs after reload"
    missing = [k for k in cgot if k not in codec_sd and not k.endswith(("freqs_cis", "causal_mask"))]
    assert not missing, missing
    return model, codec


def load_codec(out: Path):
    """The reference's load_codec_model reads its own configs/modded_dac_vq.yaml; the tiny codec
    needs codec_config.yaml, so this repeats its steps (instantiate, torch.load, load_state_dict
    with strict=False, eval, f32) with that config."""
    import torch
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    codec = instantiate(OmegaConf.load(str(out / "codec_config.yaml")))
    sd = torch.load(str(out / "codec.pth"), map_location="cpu")
    res = codec.load_state_dict(sd, strict=False)
    assert not res.unexpected_keys, res.unexpected_keys
    codec.eval()
    return codec.to(torch.float32)


# --------------------------------------------------------------------------------------------
# Expected outputs.


def reference_audio():
    """A deterministic 30000-sample signal at 44.1 kHz: two chirps and seeded noise, |x| < 0.8."""
    import torch

    g = torch.Generator().manual_seed(7)
    t = torch.arange(REF_AUDIO_SAMPLES, dtype=torch.float64) / 44100.0
    x = 0.4 * torch.sin(2 * math.pi * (180 * t + 300 * t * t))
    x += 0.2 * torch.sin(2 * math.pi * (900 * t - 150 * t * t))
    x += 0.05 * torch.randn(REF_AUDIO_SAMPLES, generator=g, dtype=torch.float64)
    return x.to(torch.float32)


class Recorder:
    """Wraps the model's forward_generate / forward_generate_fast to keep the first calls."""

    def __init__(self, model):
        self.model = model
        self.slow = []
        self.fast = []
        self.layer0_in = []
        self._fg = model.forward_generate
        self._ff = model.forward_generate_fast
        model.forward_generate = self.forward_generate
        model.forward_generate_fast = self.forward_generate_fast
        self.hook = model.layers[0].register_forward_pre_hook(self.pre_hook)

    def pre_hook(self, module, args):
        if len(self.layer0_in) < 1:
            self.layer0_in.append(args[0].detach().clone())

    def forward_generate(self, *a, **k):
        r = self._fg(*a, **k)
        if len(self.slow) < 2:
            self.slow.append((r.logits.detach().clone(), r.hidden_states.detach().clone()))
        return r

    def forward_generate_fast(self, *a, **k):
        r = self._ff(*a, **k)
        if len(self.fast) < NUM_CODEBOOKS:
            self.fast.append(r.detach().clone())
        return r

    def close(self):
        self.hook.remove()
        self.model.forward_generate = self._fg
        self.model.forward_generate_fast = self._ff


def run_case(model, decode_one_token, text, ref_text, ref_codes):
    import torch
    from fish_speech.conversation import Conversation  # noqa: F401 (imported by generate_long)
    from fish_speech.models.text2semantic import inference as inf

    torch.manual_seed(0)
    model._cache_setup_done = False
    # the prompt the reference builds (captured from encode_for_inference)
    captured = {}
    orig = inf.Conversation.encode_for_inference

    def enc(self, tokenizer, num_codebooks, metadata=None):
        r = orig(self, tokenizer, num_codebooks, metadata)
        captured.setdefault("prompt", r[0].clone())
        return r

    inf.Conversation.encode_for_inference = enc
    # whether the last token drawn was <|im_end|> (a stop on the cap's last step gives as many
    # frames as the cap itself: the frame count alone cannot tell them apart)
    orig_decode = inf.decode_n_tokens

    def decode(*a, **k):
        r = orig_decode(*a, **k)
        captured["last_main"] = int(r[0, -1])
        return r

    inf.decode_n_tokens = decode
    rec = Recorder(model)
    try:
        kwargs = {}
        if ref_text is not None:
            kwargs = dict(prompt_text=[ref_text], prompt_tokens=[ref_codes])
        outs = []
        for resp in inf.generate_long(
            model=model, device="cpu", decode_one_token=decode_one_token, text=text,
            max_new_tokens=MAX_NEW_TOKENS, top_k=1, top_p=0.9, temperature=0.7,
            chunk_length=512, **kwargs,
        ):
            if resp.action == "sample":
                outs.append(resp.codes)
    finally:
        inf.Conversation.encode_for_inference = orig
        inf.decode_n_tokens = orig_decode
        rec.close()
    assert len(outs) == 1, "every case is one batch"
    stopped = captured["last_main"] == model.tokenizer.get_token_id("<|im_end|>")
    return captured["prompt"], outs[0], rec, stopped


def semantic_probe_positions(prompt, sem_start, sem_end):
    idx = ((prompt[0] >= sem_start) & (prompt[0] <= sem_end)).nonzero().flatten().tolist()
    return idx


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--variant", choices=sorted(VARIANTS), default="s2",
                    help="s2: tests/fixtures/tiny-fish; alt: tests/fixtures/tiny-fish-alt")
    ap.add_argument("--out", default="tests/fixtures/tiny-fish")
    ap.add_argument("--im-end-scale", type=float, default=None,
                    help="scale of the <|im_end|> embedding row (default: searched so that one "
                    "case stops on <|im_end|> before the cap)")
    args = ap.parse_args()
    _import_reference()
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    torch.set_num_threads(1)  # one reduction order for the oracle
    out = Path(args.out)
    (out / "expected").mkdir(parents=True, exist_ok=True)

    from fish_speech.models.text2semantic.inference import decode_to_audio, encode_audio  # noqa
    from fish_speech.models.text2semantic.inference import logits_to_probs
    from fish_speech.models.text2semantic.llama import BaseModelArgs, DualARTransformer

    tk = build_tokenizer(out)
    variant = VARIANTS[args.variant]
    write_config(out, tk, variant)
    codec_sd = build_codec(out, variant)

    def make_llm(scale):
        cfg = BaseModelArgs.from_pretrained(str(out))
        cfg.semantic_begin_id, cfg.semantic_end_id = tk["semantic_start"], tk["semantic_end"]
        torch.manual_seed(0)
        m = DualARTransformer(cfg)
        randomise_llm(m, tk["ids"]["<|im_end|>"], scale)
        return m

    # The codec first: the clone cases need the reference audio's codes.
    scales = [args.im_end_scale] if args.im_end_scale else [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, -1.0, -1.5, -2.0, -2.5, -3.0, -3.5, -4.0]
    chosen = None
    for scale in scales:
        llm = make_llm(scale)
        llm_sd = hf_state_dict(llm)
        save_sharded(out, llm_sd)
        model, codec = check_reload(out, llm_sd, codec_sd)
        _, decode_one_token = (None, None)
        from fish_speech.models.text2semantic.inference import decode_one_token_ar

        decode_one_token = decode_one_token_ar
        audio = reference_audio()
        with torch.inference_mode():
            ref_codes, ref_lens = codec.encode(audio[None, None], torch.tensor([len(audio)]))
        ref_codes = ref_codes[0, :, : ref_lens[0]]
        results = {}
        for name, (text, ref_text) in PROMPTS.items():
            results[name] = run_case(
                model, decode_one_token, text, ref_text, ref_codes if ref_text else None
            )
        lens = {n: r[1].shape[1] for n, r in results.items()}
        print(f"im_end scale {scale}: frames {lens}", flush=True)
        if args.im_end_scale or any(0 < v < MAX_NEW_TOKENS - 1 for v in lens.values()):
            chosen = scale
            break
    assert chosen is not None, "no scale made a case stop on <|im_end|> before the cap"

    exp = out / "expected"
    tensors = {"ref_audio": audio.contiguous(), "ref_codes": ref_codes.to(torch.int64).contiguous()}
    cases = {}
    sem_start, sem_end = tk["semantic_start"], tk["semantic_end"]
    from fish_speech.tokenizer import FishTokenizer

    ftok = FishTokenizer(str(out))
    for name, (prompt, codes, rec, stopped) in results.items():
        text, ref_text = PROMPTS[name]
        with torch.inference_mode():
            wav = decode_to_audio(codes.clone(), codec)
        frames = codes.shape[1]
        assert wav.shape[0] == frames * 2048
        tensors[f"{name}.prompt"] = prompt.to(torch.int64).contiguous()
        tensors[f"{name}.codes"] = codes.to(torch.int64).contiguous()
        tensors[f"{name}.wav"] = wav.to(torch.float32).contiguous()
        logits0, hidden0 = rec.slow[0]
        tensors[f"{name}.prefill_logits"] = logits0[0, -1].contiguous()
        tensors[f"{name}.prefill_hidden"] = hidden0[0, -1].contiguous()
        # fast AR logits of the first frame, positions 1..9 (position 0's output is unused)
        if name == "en_clone":  # one case is enough (36 KB a case)
            tensors[f"{name}.fast_logits"] = torch.stack([f[0, -1] for f in rec.fast[1:]])
        x0 = rec.layer0_in[0][0]
        sem = semantic_probe_positions(prompt, sem_start, sem_end)
        probe = sem[0] if sem else prompt.shape[1] - 1
        tensors[f"{name}.embed_probe"] = x0[probe].clone()
        tensors[f"{name}.embed_last"] = x0[-1].clone()
        cases[name] = {
            "text": text,
            "ref_text": ref_text,
            "frames": frames,
            "stopped_on_im_end": stopped,
            "prompt_len": prompt.shape[1],
            "embed_probe_position": probe,
            "residual_codes_ge_1024": int((codes[1:] >= 1024).sum()),
            "prompt_text_ids": ftok.encode(text) if ref_text is None else None,
        }
    # the codec decode across its window: 140 frames of seeded codes, residuals >= 1024 included
    g = torch.Generator().manual_seed(5)
    long_codes = torch.cat(
        [
            torch.randint(0, 4096, (1, WINDOW_FRAMES), generator=g),
            torch.randint(0, 4096, (9, WINDOW_FRAMES), generator=g),
        ]
    )
    with torch.inference_mode():
        long_wav = decode_to_audio(long_codes.clone(), codec)
    tail = WINDOW_TAIL_FRAMES * 2048
    tensors["window.codes"] = long_codes.to(torch.int64).contiguous()
    tensors["window.wav_tail"] = long_wav[-tail:].contiguous()
    tensors["window.wav_sumsq"] = (long_wav.double() ** 2).sum().reshape(1).float()
    # RoPE tables of the slow model as the reference keeps them (bf16 values, as f32)
    tensors["slow_freqs_cis"] = model.freqs_cis[:64].float().contiguous()
    tensors["fast_freqs_cis"] = model.fast_freqs_cis.float().contiguous()
    # the sampler's filter order: probabilities for seeded logits and several settings
    gs = torch.Generator().manual_seed(11)
    sampler = []
    for i, (temp, top_p, top_k) in enumerate(
        [(0.7, 0.7, 30), (1.0, 0.9, 5), (0.3, 0.5, 300), (1.3, 1.0, 1024), (0.7, 0.05, 30)]
    ):
        logits = 2.0 * torch.randn(1024, generator=gs)
        probs = logits_to_probs(logits.clone(), torch.tensor(temp), torch.tensor(top_p), top_k)
        tensors[f"sampler.{i}.logits"] = logits.contiguous()
        tensors[f"sampler.{i}.probs"] = probs.contiguous()
        sampler.append({"temperature": temp, "top_p": top_p, "top_k": top_k})
    save_file(tensors, str(exp / "reference.safetensors"))
    meta = {
        "reference": {
            "repository": "https://github.com/fishaudio/fish-speech",
            "commit": reference_commit(),
            "license": "Fish Audio Research License",
            "torch": torch.__version__,
            "dtype": "float32",
            "device": "cpu",
        },
        "generation": {"top_k": 1, "max_new_tokens": MAX_NEW_TOKENS, "chunk_length": 512},
        "variant": args.variant,
        "im_end_embedding_scale": chosen,
        "tokenizer": {k: v for k, v in tk.items()},
        "cases": cases,
        "window": {"frames": WINDOW_FRAMES, "tail_frames": WINDOW_TAIL_FRAMES},
        "sampler": sampler,
        "ref_audio": {"samples": REF_AUDIO_SAMPLES, "rate": 44100,
                      "frames": int(ref_codes.shape[1])},
    }
    (exp / "reference.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False))
    print(json.dumps({n: {k: c[k] for k in ("frames", "stopped_on_im_end", "prompt_len",
                                           "residual_codes_ge_1024")} for n, c in cases.items()}))


if __name__ == "__main__":
    main()
