#!/usr/bin/env python3
"""Text corpus for the bundled omnitts voice: English sentences from Debian packages, cleaned, deduplicated and
split deterministically into a training list and a 50-sentence held-out test list.

Sources (both Debian main; see README.md next to this file for licences):
  * r-cran-janeaustenr 1.0.0-1 -- the full texts of Jane Austen's six novels (public domain; package MIT).
    Stored as an R lazy-load database (data/Rdata.rdx + Rdata.rdb); read here with the PyPI package `rdata`.
  * wordnet-base 1:3.0-37 -- the quoted example sentences of WordNet 3.0 (WordNet 3.0 licence, permissive,
    notice required). Optional (--no-wordnet); they add modern everyday vocabulary. Never used for the test set.

The .deb files are fetched with `apt-get download` (no installation) unless --debs DIR already holds them.

    python scripts/voice/corpus.py --out /work/voice-data/corpus
      -> OUT/train.txt, OUT/test.txt (== scripts/voice/test_sentences.txt), OUT/stats.json

Rules: a sentence is 3..25 words, ASCII letters plus , . ; : ! ? ' - and spaces after cleaning; sentences with
digits, Roman-numeral chapter headings or other symbols are dropped (nothing to spell out: Austen writes numbers
in words); duplicates are removed case- and punctuation-insensitively. The split is by SHA-1 of the normalised
sentence, so it does not depend on the order of the input or on the package iteration order.
"""
import argparse
import gzip
import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import warnings
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
DEBS = {"austen": ("r-cran-janeaustenr", "1.0.0-1"), "wordnet": ("wordnet-base", "1:3.0-37")}
N_TEST = 50
TEST_MIN_WORDS, TEST_MAX_WORDS = 5, 20
MIN_WORDS, MAX_WORDS = 3, 25

ABBREV = ["Mr.", "Mrs.", "Dr.", "St.", "Messrs.", "Col.", "Capt.", "Lt.", "Gen.", "Rev.", "Sir.", "Esq."]
ABBREV_FULL = {"Mr.": "Mister", "Mrs.": "Missus", "Dr.": "Doctor", "St.": "Saint", "Messrs.": "Messieurs",
               "Col.": "Colonel", "Capt.": "Captain", "Lt.": "Lieutenant", "Gen.": "General", "Rev.": "Reverend",
               "Esq.": "Esquire"}
ALLOWED = re.compile(r"^[A-Za-z][A-Za-z ,.;:!?'\-]*[.!?]$")


# ------------------------------------------------------------------------------------------------------------
def fetch_debs(deb_dir):
    os.makedirs(deb_dir, exist_ok=True)
    paths = {}
    for key, (pkg, ver) in DEBS.items():
        have = [f for f in os.listdir(deb_dir) if f.startswith(pkg + "_") and f.endswith(".deb")]
        if not have:
            subprocess.run(["apt-get", "download", f"{pkg}={ver}"], cwd=deb_dir, check=True,
                           stdout=subprocess.DEVNULL)
            have = [f for f in os.listdir(deb_dir) if f.startswith(pkg + "_") and f.endswith(".deb")]
        paths[key] = os.path.join(deb_dir, sorted(have)[-1])
    return paths


def extract_deb(deb, dest):
    subprocess.run(["dpkg-deb", "-x", deb, dest], check=True)
    return dest


# ------------------------------------------------------------------------------------------------------------
def austen_texts(root):
    """{title: [lines]} from the R lazy-load database (rdx: gzip'd serialised index of byte ranges; rdb: per
    object 4-byte big-endian raw length + zlib stream of an XDR serialisation)."""
    import rdata
    warnings.simplefilter("ignore")
    d = os.path.join(root, "usr/lib/R/site-library/janeaustenr/data")
    with open(os.path.join(d, "Rdata.rdx"), "rb") as f:
        idx = rdata.conversion.convert(rdata.parser.parse_data(gzip.decompress(f.read())))
    with open(os.path.join(d, "Rdata.rdb"), "rb") as f:
        rdb = f.read()
    out = {}
    for name, rng in idx["variables"].items():
        off, n = int(rng[0]), int(rng[1])
        blob = rdb[off:off + n]
        raw = zlib.decompress(blob[4:])
        assert len(raw) == struct.unpack(">I", blob[:4])[0]
        lines = rdata.conversion.convert(rdata.parser.parse_data(raw))
        lines = [str(x) for x in lines]
        out[lines[0].strip()] = lines
    return out


def paragraphs(lines):
    para = []
    for ln in lines:
        if ln.strip():
            para.append(ln.strip())
        elif para:
            yield " ".join(para)
            para = []
    if para:
        yield " ".join(para)


_SPLIT = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]*[A-Z])")


def split_sentences(par):
    prot = par
    for a in ABBREV:
        prot = prot.replace(a + " ", a[:-1] + "<DOT> ")
    prot = re.sub(r"\b([A-Z])\. (?=[A-Z])", r"\1<DOT> ", prot)      # initials
    for s in _SPLIT.split(prot):
        yield s.replace("<DOT>", ".")


def clean(s):
    """Normalise one sentence; None if it does not qualify."""
    s = s.replace("\u2019", "'").replace("\u2018", "'").replace("\u201c", '"').replace("\u201d", '"')
    s = s.replace("_", "")                      # _emphasis_
    s = re.sub(r"\b([Tt])o-(day|morrow|night)\b", r"\1o\2", s)   # to-morrow -> tomorrow (modern spelling)
    s = s.replace('"', "")                      # dialogue quotes: the student reads plain text
    s = re.sub(r"\s*--+\s*", ", ", s)           # Austen's dashes -> comma pause
    s = re.sub(r"\s*\u2014\s*", ", ", s)
    s = re.sub(r"\(([^)]*)\)", r", \1,", s)     # parentheses -> commas
    s = re.sub(r"\s+", " ", s).strip()
    s = re.sub(r"^[,;:' ]+", "", s)
    s = re.sub(r"\s+([,.;:!?])", r"\1", s)
    s = re.sub(r",\s*([,.;:!?])", r"\1", s)
    s = re.sub(r"([,;:])(?=\S)", r"\1 ", s)
    s = re.sub(r"(?<![A-Za-z])'|(?<=[^A-Za-z]|[A-Za-rt-z])'(?![A-Za-z])", "", s)   # single quotes, not apostrophes
    s = re.sub(r"\s+", " ", s).strip()
    for a, full in ABBREV_FULL.items():
        s = re.sub(r"(?<![A-Za-z])" + re.escape(a), full, s)
        s = re.sub(r"(?<![A-Za-z])" + re.escape(a[:-1]) + r"(?= [A-Z])", full, s)   # Persuasion: "Mr Elliot"
    if not s:
        return None
    s = s[0].upper() + s[1:]
    if s[-1] not in ".!?":
        if s[-1] in ",;:":
            s = s[:-1]
        s += "."
    if re.search(r"\d", s) or not ALLOWED.match(s):
        return None
    if re.search(r"\b[A-Z]\.", s):              # leftover initials / abbreviations
        return None
    if re.search(r"[.!?][,;:]|\.\s", s):        # two sentences glued together (a missed split)
        return None
    if re.match(r"^(Chapter|Volume|CHAPTER|VOLUME)\b", s) or re.fullmatch(r"[IVXLC]+\.", s):
        return None
    if sum(c.isupper() for c in s) > 0.3 * sum(c.isalpha() for c in s):   # headings in capitals
        return None
    n = len(s.split())
    if not (MIN_WORDS <= n <= MAX_WORDS):
        return None
    return s


def key(s):
    return re.sub(r"[^a-z ]", "", s.lower().replace("-", " ")).strip()


def austen_sentences(root):
    out = []
    for title, lines in sorted(austen_texts(root).items()):
        for par in paragraphs(lines[1:]):
            for raw in split_sentences(par):
                c = clean(raw)
                if c:
                    out.append(c)
    return out


def wordnet_sentences(root):
    d = os.path.join(root, "usr/share/wordnet")
    out = []
    for pos in ("noun", "verb", "adj", "adv"):
        with open(os.path.join(d, "data." + pos), encoding="latin-1") as f:
            for ln in f:
                if ln.startswith("  ") or "|" not in ln:
                    continue                       # licence header
                gloss = ln.split("|", 1)[1]
                for ex in re.findall(r'"([^"]+)"', gloss):
                    c = clean(ex)
                    if c and len(c.split()) >= 4:   # WordNet examples are often fragments: keep the longer ones
                        out.append(c)
    return out


# ------------------------------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory (train.txt, test.txt, stats.json)")
    ap.add_argument("--debs", default=None, help="directory with the .deb files (default: OUT/debs, fetched)")
    ap.add_argument("--no-wordnet", action="store_true", help="Austen only")
    ap.add_argument("--write-test", action="store_true",
                    help="also write scripts/voice/test_sentences.txt (the committed held-out list)")
    a = ap.parse_args()

    os.makedirs(a.out, exist_ok=True)
    debs = fetch_debs(a.debs or os.path.join(a.out, "debs"))
    with tempfile.TemporaryDirectory() as tmp:
        aroot = extract_deb(debs["austen"], os.path.join(tmp, "austen"))
        austen = austen_sentences(aroot)
        wn = []
        if not a.no_wordnet:
            wroot = extract_deb(debs["wordnet"], os.path.join(tmp, "wordnet"))
            wn = wordnet_sentences(wroot)

    def dedup(xs, seen):
        out = []
        for s in xs:
            k = key(s)
            if k and k not in seen:
                seen.add(k)
                out.append(s)
        return out

    seen = set()
    austen = dedup(austen, seen)
    wn = dedup(wn, seen)

    def h(s):
        return hashlib.sha1(key(s).encode()).hexdigest()

    # Test: the 50 Austen sentences of 5..20 words with the smallest hashes. Train: everything else.
    cands = sorted((s for s in austen if TEST_MIN_WORDS <= len(s.split()) <= TEST_MAX_WORDS), key=h)
    test = cands[:N_TEST]
    test_keys = {key(s) for s in test}
    test_words = {w for s in test for w in key(s).split()}
    train = sorted((s for s in austen + wn if key(s) not in test_keys), key=h)

    with open(os.path.join(a.out, "train.txt"), "w") as f:
        f.write("\n".join(train) + "\n")
    with open(os.path.join(a.out, "test.txt"), "w") as f:
        f.write("\n".join(test) + "\n")
    if a.write_test:
        with open(os.path.join(HERE, "test_sentences.txt"), "w") as f:
            f.write("\n".join(test) + "\n")
    train_words = {w for s in train for w in key(s).split()}
    stats = dict(
        sources={k: os.path.basename(v) for k, v in debs.items() if k == "austen" or not a.no_wordnet},
        austen_sentences=len(austen), wordnet_sentences=len(wn), train=len(train), test=len(test),
        train_words=sum(len(s.split()) for s in train), train_vocab=len(train_words),
        test_words=sum(len(s.split()) for s in test),
        test_oov_words=sorted(test_words - train_words),
        train_sha1=hashlib.sha1("\n".join(train).encode()).hexdigest(),
        test_sha1=hashlib.sha1("\n".join(test).encode()).hexdigest())
    with open(os.path.join(a.out, "stats.json"), "w") as f:
        json.dump(stats, f, indent=2)
    json.dump({k: v for k, v in stats.items()}, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
