#!/usr/bin/env python3
"""The official Fish Speech reference's prompts for many seeded texts, and its greedy codes for a
dialogue that spans several generation batches, on a tiny fixture made by make_tiny.py: the
oracle of omnitts' prompt builder on inputs beyond the fixture's five cases.

Usage (the reference and its venv as in make_tiny.py; from the repository root):

    FISH_SPEECH=/work/fishref/fish-speech /work/fishref/venv/bin/python \
        scripts/fish/prompt_cases.py --fixture tests/fixtures/tiny-fish

Run it after make_tiny.py (it reads the fixture's weights and expected/reference.safetensors'
ref_codes); tests/fixtures/tiny-fish-alt takes `--texts 0` (its tokenizer is tiny-fish's). It
writes <fixture>/expected/prompts.json:

- "texts": for each seeded text (English, Chinese, Japanese, Korean, digits, punctuation, emoji,
  odd whitespace, well-formed and malformed speaker tags, long runs of turns) and optional clone
  transcript, the reference's batches (`split_text_by_speaker` + `group_turns_into_batches` with
  generate_long's settings) and, for each batch, the token row of the prompt generate_long
  builds (`Conversation.encode_for_inference`, row 0) and a checksum of all its rows. Generation
  is replaced by a stand-in that returns fixed codes (`fake_codes` below), so that later batches'
  prompts hold earlier batches' codes as generate_long puts them;
- "dialogue": a speaker-tagged text of more turns than one batch holds, generated greedily by the
  reference on the fixture's weights (generate_long, top_k 1): each batch's codes.

Everything is seeded; two runs give the same file.
"""

import argparse
import json
import random
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tiny  # noqa: E402  (the reference's import path and its audiotools stand-in)

WORDS_EN = (
    "the quick brown fox jumps over lazy dog hello world speech test morning train harbour "
    "rain station it's we'll don't O'Neil Dr. Mr. e.g. U.S.A. COVID-19 3.14 1,000 42% $5 "
    "#tag @user http://x.io a/b C++ naïve café résumé"
).split()
WORDS_ZH = list("你好世界今天天气很好我们一起去公园吧这是一个语音合成的小测试谢谢帮助明天见请把文本转换成")
WORDS_JA = ["こんにちは", "世界", "カタカナ", "ひらがな", "東京", "です", "ます"]
WORDS_KO = ["안녕하세요", "세계", "음성", "합성", "테스트"]
PUNCT = [".", ",", "!", "?", ";", ":", "…", "—", "-", "\"", "'", "(", ")", "。", "，", "！",
         "？", "、", "「", "」", "《", "》", "～"]
EMOJI = ["😀", "🎉", "👍🏽", "❤️", "🇫🇷"]
SPACES = [" ", " ", " ", "  ", "\n", "\n\n", "\t", "\u00a0", "\u3000", " \n ", "\x1f", "\u200b"]
TAGS_OK = [f"<|speaker:{i}|>" for i in range(8)] + ["<|speaker:12|>", "<|speaker:007|>"]
TAGS_ODD = ["<|speaker:|>", "<|speaker:x|>", "<|speaker:3|", "<speaker:1>", "<|speaker:<|speaker:2|>",
            "<|speaker:\uff13|>", "<|speaker:\u0663|>", "<|speaker:\u00b2|>", "<|SPEAKER:1|>"]
MAX_SPEAKERS = 5  # generate_long's grouping settings
CHUNK_LENGTH = 512


def random_text(rng: random.Random) -> str:
    kind = rng.random()
    pool = [WORDS_EN] * 3 + [WORDS_ZH] * 2 + [WORDS_JA, WORDS_KO]
    n = rng.choice([1, 3, 8, 20, 60]) if kind > 0.1 else rng.choice([150, 300])
    out = []
    words = rng.choice(pool)
    for _ in range(n):
        r = rng.random()
        if r < 0.04:
            words = rng.choice(pool)
        if r < 0.10:
            out.append(rng.choice(PUNCT))
        elif r < 0.12:
            out.append(rng.choice(EMOJI))
        elif r < 0.16:
            out.append(str(rng.randint(0, 100000)))
        elif r < 0.22:
            out.append(rng.choice(TAGS_OK))
        elif r < 0.24:
            out.append(rng.choice(TAGS_ODD))
        else:
            out.append(rng.choice(words))
        out.append(rng.choice(SPACES) if words is WORDS_EN or rng.random() < 0.3 else "")
    text = "".join(out)
    if rng.random() < 0.2:
        text = rng.choice(SPACES) + text + rng.choice(SPACES)
    if rng.random() < 0.15:  # many short turns: several batches by the speaker count
        text = "".join(f"{rng.choice(TAGS_OK[:8])}{rng.choice(WORDS_EN)} {rng.choice(WORDS_EN)}."
                       for _ in range(rng.randint(6, 14)))
    return text


def fake_codes(batch: int, frames: int):
    """The stand-in generation's codes of batch `batch`: [10, frames] (rows: codebooks)."""
    import torch

    t = torch.arange(frames)
    rows = [(37 * batch + 11 * t + 5) % 4096] + [
        (13 * i + 7 * t + 3 * batch) % 1024 for i in range(1, 10)
    ]
    return torch.stack(rows).to(torch.long)


def checksum(prompt) -> int:
    """Σ (position + 1) · (row + 1) · value over the prompt's rows [11, T], mod 2^61 − 1."""
    total = 0
    for r, row in enumerate(prompt.tolist()):
        for p, v in enumerate(row):
            total = (total + (p + 1) * (r + 1) * int(v)) % (2**61 - 1)
    return total


class StandIn:
    """What generate_long reads of a model when generation itself is replaced."""

    def __init__(self, fixture: Path):
        import torch
        from fish_speech.tokenizer import FishTokenizer

        self.tokenizer = FishTokenizer(str(fixture))
        self.config = types.SimpleNamespace(max_seq_len=1 << 20, num_codebooks=10)
        self._p = torch.nn.Parameter(torch.zeros(1))

    def parameters(self):
        return [self._p]


def reference_prompts(model, text, ref_text, ref_codes):
    """generate_long's batches and prompts for `text`, generation replaced by fake_codes."""
    import torch
    from fish_speech.models.text2semantic import inference as inf

    prompts = []
    orig_enc = inf.Conversation.encode_for_inference
    orig_gen = inf.generate

    def enc(self, tokenizer, num_codebooks, metadata=None):
        r = orig_enc(self, tokenizer, num_codebooks, metadata)
        prompts.append(r[0].clone())
        return r

    def gen(*, model, prompt, **_):
        codes = fake_codes(len(prompts) - 1, 3 + (len(prompts) - 1) % 3)
        main = torch.full((1, codes.shape[1] + 1), 7, dtype=torch.long)
        tail = torch.cat([codes, torch.zeros(10, 1, dtype=torch.long)], dim=1)
        return torch.cat([prompt, torch.cat([main, tail], dim=0)], dim=1)

    inf.Conversation.encode_for_inference = enc
    inf.generate = gen
    try:
        kwargs = {}
        if ref_text is not None:
            kwargs = dict(prompt_text=[ref_text], prompt_tokens=[ref_codes])
        batches = [
            r.text
            for r in inf.generate_long(
                model=model, device="cpu", decode_one_token=None, text=text,
                max_new_tokens=8, top_k=1, chunk_length=CHUNK_LENGTH, **kwargs,
            )
            if r.action == "sample"
        ]
    finally:
        inf.Conversation.encode_for_inference = orig_enc
        inf.generate = orig_gen
    assert len(batches) == len(prompts)
    return batches, prompts


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--fixture", default="tests/fixtures/tiny-fish")
    ap.add_argument("--texts", type=int, default=160)
    args = ap.parse_args()
    make_tiny._import_reference()
    import torch
    from safetensors.torch import load_file

    fixture = Path(args.fixture)
    exp = load_file(str(fixture / "expected/reference.safetensors"))
    ref_codes = exp["ref_codes"]
    stand_in = StandIn(fixture)
    rng = random.Random(20261205)
    cases = []
    for i in range(args.texts):
        text = random_text(rng)
        if not text.strip():
            continue
        ref_text = random_text(rng) if rng.random() < 0.3 else None
        if ref_text is not None and not ref_text.strip():
            ref_text = None
        batches, prompts = reference_prompts(stand_in, text, ref_text, ref_codes)
        cases.append({
            "text": text,
            "ref_text": ref_text,
            "batches": batches,
            "tokens": [p[0].tolist() for p in prompts],
            "checksums": [str(checksum(p)) for p in prompts],
        })

    # A dialogue past one batch (more turns than MAX_SPEAKERS), generated by the reference.
    from fish_speech.models.text2semantic import inference as inf
    from fish_speech.models.text2semantic.inference import init_model

    model, decode_one_token = init_model(str(fixture), "cpu", torch.float32)
    model.eval()
    dialogue = "".join(
        f"<|speaker:{k % 3}|>{s}" for k, s in enumerate([
            "Hello world.", "Good morning!", "你好，世界。", "How are you today?",
            "I am fine, thank you.", "Let's go to the park.", "谢谢你的帮助。",
        ])
    )
    torch.manual_seed(0)
    torch.set_num_threads(1)
    with torch.inference_mode():
        out = [
            (r.text, r.codes.tolist())
            for r in inf.generate_long(
                model=model, device="cpu", decode_one_token=decode_one_token, text=dialogue,
                max_new_tokens=8, top_k=1, top_p=0.9, temperature=0.7,
                chunk_length=CHUNK_LENGTH,
            )
            if r.action == "sample"
        ]
    assert len(out) > 1, "the dialogue spans several batches"
    result = {
        "reference": {
            "repository": "https://github.com/fishaudio/fish-speech",
            "commit": make_tiny.reference_commit(),
            "license": "Fish Audio Research License",
        },
        "generation": {"max_speakers": MAX_SPEAKERS, "chunk_length": CHUNK_LENGTH},
        "texts": cases,
        "dialogue": {
            "text": dialogue,
            "max_new_tokens": 8,
            "batches": [{"text": t, "codes": c} for t, c in out],
        },
    }
    path = fixture / "expected/prompts.json"
    path.write_text(json.dumps(result, ensure_ascii=False, separators=(",", ":")) + "\n")
    multi = sum(len(c["batches"]) > 1 for c in cases)
    print(f"{path}: {len(cases)} texts ({multi} of several batches), dialogue of {len(out)} batches")


if __name__ == "__main__":
    main()
