"""Step `tokenizer`: a byte-level BPE in the Qwen2 pipeline, trained on the training text, and its special ids."""
import json
import math
import os

from ..layout import load_json, write_json
from .common import log


QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
            "<tts_text_bos_single>"]


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
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
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
    write_json(os.path.join(out, "tokenizer_config.json"), cfg)
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
