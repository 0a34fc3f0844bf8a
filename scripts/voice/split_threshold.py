#!/usr/bin/env python3
"""How long a text the bundled voice speaks well as one utterance: the measurement behind
`split_sentences_above_chars` in models/omnitts-en/omnitts.json (see models/omnitts-en/README.md).

Texts of 2 or more held-out sentences (val_sentences.txt, test_sentences.txt) are spoken greedily by omnitts'
`synth` example twice: as one utterance, and sentence by sentence. A voice that keeps its place speaks the text
in about the frames of its sentences (ratio one / split near 1; a little under, as every utterance has its own
onset and close); one that skips text or loses its place falls far short or runs long. Prints one JSON line per
text and a table of the ratios by text length.

    cargo build --example synth            # CARGO_TARGET_DIR honoured
    python3 scripts/voice/split_threshold.py --per-bucket 8 --seed 1
"""
import argparse
import json
import os
import random
import re
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
# Text lengths in characters; each bucket gets --per-bucket texts.
BUCKETS = [(60, 100), (101, 140), (141, 160), (161, 200), (201, 300), (301, 500)]


def synth(binary, model, text, max_new_tokens):
    out = subprocess.run([binary, "--model", model, "--text", text, "--greedy",
                          "--max-new-tokens", str(max_new_tokens)],
                         capture_output=True, text=True, check=True).stdout
    frames = int(re.search(r"frames: (\d+)", out).group(1))
    reason = re.search(r"finish reason: (\w+)", out).group(1)
    return frames, reason


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(REPO, "models", "omnitts-en"))
    ap.add_argument("--synth", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target")),
                                                    "debug", "examples", "synth"))
    ap.add_argument("--per-bucket", type=int, default=8, help="texts per length bucket")
    ap.add_argument("--max-new-tokens", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    sentences = []
    for name in ("val_sentences.txt", "test_sentences.txt"):
        with open(os.path.join(HERE, name)) as f:
            sentences += [line.strip() for line in f if line.strip()]
    rng = random.Random(args.seed)
    alone = {}
    rows = []
    for lo, hi in BUCKETS:
        done = 0
        while done < args.per_bucket:
            # Whole sentences, drawn until the text reaches a length picked in the bucket.
            target = rng.randint(lo, hi)
            group = []
            while len(" ".join(group)) < target:
                group.append(rng.choice(sentences))
            text = " ".join(group)
            if len(group) < 2 or not lo <= len(text) <= hi:
                continue
            frames, reason = synth(args.synth, args.model, text, args.max_new_tokens)
            for s in group:
                if s not in alone:
                    alone[s] = synth(args.synth, args.model, s, args.max_new_tokens)[0]
            split = sum(alone[s] for s in group)
            row = {"sentences": len(group), "chars": len(text), "frames_one": frames, "reason_one": reason,
                   "frames_split": split, "ratio": round(frames / split, 2)}
            print(json.dumps(row), flush=True)
            rows.append(row)
            done += 1

    print(f"{'characters':>12} {'texts':>6} {'off by >15 %':>13} {'min':>6} {'median':>7} {'max':>6}")
    for lo, hi in BUCKETS:
        rs = sorted(r["ratio"] for r in rows if lo <= r["chars"] <= hi)
        if rs:
            off = sum(1 for x in rs if not 0.85 <= x <= 1.15)
            span = f"{lo}-{hi}"
            print(f"{span:>12} {len(rs):>6} {off:>13} {rs[0]:>6.2f} {rs[len(rs) // 2]:>7.2f} {rs[-1]:>6.2f}")


if __name__ == "__main__":
    main()
