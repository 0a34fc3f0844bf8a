#!/usr/bin/env bash
# The official Fish Audio S2 reference (fishaudio/fish-speech) timed on a random-weight S2 Pro
# checkpoint of the real shapes, in one call on a GPU machine with no network (one H200: Python
# 3.12 with PyTorch, transformers, safetensors, tokenizers, einops, click, tqdm, pyyaml already
# there). Run from the repository root:
#
#     bash scripts/gpu-fish-ref.sh BUNDLE OUTDIR
#
# BUNDLE: the unpacked bundle (README.md in it): wheels/ (hydra-core, omegaconf, antlr4 runtime,
#   loguru, descript-audio-codec, argbind, docstring-parser, loralib) and fish-speech/ (the
#   reference's fish_speech modules that these scripts import, and its LICENSE; research,
#   non-commercial licence: never commit it to this repository).
# OUTDIR: where the logs go: env.log, pip.log, imports.log, real_shape.log, bench.log,
#   bench.json (the reference's summary, one JSON line; rewritten after each stage, so a run cut
#   short keeps what it measured), gpu-fish-ref.log (all of it).
#
# Steps: install the wheels into $SITE (/tmp/site) with pip --no-index --no-deps --target; write
# the checkpoint into $CKPT (/tmp/s2pro; skipped when $CKPT/.complete exists, e.g. on a warm
# machine) with scripts/fish/real_shape.py on the GPU; run scripts/fish/ref_bench.py: eager,
# greedy and sampling, $FRAMES frames x $REPEATS repeats, then the codec decode, then eager greedy
# with a short KV cache ($SHORT_SEQ_LEN), then (COMPILE=1, the default) the reference's
# torch.compile path for greedy, all in one process so the model is loaded once; the whole bench
# is cut at $BENCH_TIMEOUT seconds (the device tool allows 600 s a command: checkpoint ~1 min,
# load ~1-2 min, eager runs ~1-2 min, codec ~0.5 min, compile minutes).
#
# Knobs (environment): FRAMES=200 REPEATS=2 MODE=both COMPILE=1 COMPILE_MODES=greedy
#   MAX_SEQ_LEN= (empty: the checkpoint's, 32768 from real_shape.py; the reference's decode step
#   attends over all max_seq_len cache positions, so its ms/frame grows with it: use the value
#   omnitts is run with) SHORT_SEQ_LEN=1024 (then eager greedy once more with the reference's KV
#   cache cut to that many positions, variant eager-seq1024; 0: off) SHAPE=real
#   BENCH_TIMEOUT=420 TOTAL_BUDGET=560 (the bench is cut to what is left of it)
#   PYTHON=python3 SITE=/tmp/site CKPT=/tmp/s2pro
#   BENCH_ARGS= (more ref_bench.py arguments, e.g. "--ref-frames 300" for a clone-sized prompt)
#   REF_BENCH=1 (0: stop after the checkpoint; scripts/gpu-fish.sh uses that for omnitts' own runs).
#
# Making the bundle (on a machine with PyPI and the reference checkout of scripts/fish/make_tiny.py):
#     mkdir -p /work/fishbundle/wheels && cd /work/fishbundle
#     pip wheel --no-deps -w wheels hydra-core==1.3.8 omegaconf==2.3.0 antlr4-python3-runtime==4.9.3 \
#         loguru==0.7.3 descript-audio-codec==1.0.0 argbind==0.3.9 docstring-parser==0.18.0 loralib==0.1.2
#     mkdir fish-speech && cp -r /work/fishref/fish-speech/{fish_speech,LICENSE} fish-speech/
#
# With the device tool (the bundle kept out of git, carried as an ignored folder):
#     cp -r /work/fishbundle .fishbundle && echo /.fishbundle/ >> "$(git rev-parse --git-common-dir)/info/exclude"
#     run(command="bash scripts/gpu-fish-ref.sh .fishbundle $OUT", carry=[".fishbundle"], timeout_s=600)
# ($OUT gets 7 files: within the tool's 8.)
set -uo pipefail

if [ $# -lt 2 ]; then
    sed -n "2,/^set -uo/p" "$0" | sed "\$d"
    exit 2
fi
BUNDLE=$(cd "$1" && pwd) || { echo "no bundle at $1"; exit 2; }
mkdir -p "$2" && OUT=$(cd "$2" && pwd) || exit 2
cd "$(dirname "$0")/.." || exit 2 # the repository root

PY=${PYTHON:-python3}
SITE=${SITE:-/tmp/site}
CKPT=${CKPT:-/tmp/s2pro}
SHAPE=${SHAPE:-real}
FRAMES=${FRAMES:-200}
REPEATS=${REPEATS:-2}
MODE=${MODE:-both}
COMPILE=${COMPILE:-1}
COMPILE_MODES=${COMPILE_MODES:-greedy}
MAX_SEQ_LEN=${MAX_SEQ_LEN:-}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-420}
TOTAL_BUDGET=${TOTAL_BUDGET:-560} # seconds for the whole script: the bench is cut to what is left
BENCH_ARGS=${BENCH_ARGS:-}
SHORT_SEQ_LEN=${SHORT_SEQ_LEN:-1024}

exec > >(tee -a "$OUT/gpu-fish-ref.log") 2>&1
stamp() { echo "== $(date -u +%H:%M:%S) $*"; }

stamp "environment"
{
    nvidia-smi 2>&1 | head -15
    "$PY" -c 'import sys, torch; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name())'
    "$PY" -m pip list 2>/dev/null | grep -i -E '^(torch|transformers|tokenizers|huggingface.hub|safetensors|einops|numpy|click|tqdm|pyyaml|triton) '
    df -h /tmp | tail -1
    free -g | head -2
} > "$OUT/env.log" 2>&1
cat "$OUT/env.log"

stamp "installing the bundle's wheels into $SITE"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$BUNDLE"/wheels/*.whl > "$OUT/pip.log" 2>&1
rc=$?
cat "$OUT/pip.log"
[ $rc -eq 0 ] || { stamp "pip failed ($rc)"; exit 1; }

export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
export FISH_SPEECH="$BUNDLE/fish-speech"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1

stamp "imports"
"$PY" - > "$OUT/imports.log" 2>&1 <<'EOF'
import sys
sys.path.insert(0, "scripts/fish")
import make_tiny as mt
mt._import_reference()
import hydra, omegaconf, loguru, loralib, dac, transformers, tokenizers, torch
from fish_speech.models.text2semantic import inference
from fish_speech.models.dac import modded_dac, rvq
for m in (hydra, omegaconf, transformers, tokenizers, torch):
    print(m.__name__, m.__version__, m.__file__)
print("fish_speech from", inference.__file__)
EOF
rc=$?
cat "$OUT/imports.log"
[ $rc -eq 0 ] || { stamp "imports failed"; exit 1; }

if [ -f "$CKPT/.complete" ] && [ "$(cat "$CKPT/.complete")" = "$SHAPE ${MAX_SEQ_LEN:-default}" ]; then
    stamp "checkpoint $CKPT already written"
else
    stamp "writing the $SHAPE-shape checkpoint to $CKPT"
    rm -rf "$CKPT"
    "$PY" scripts/fish/real_shape.py --shape "$SHAPE" --out "$CKPT" \
        ${MAX_SEQ_LEN:+--max-seq-len "$MAX_SEQ_LEN"} > "$OUT/real_shape.log" 2>&1
    rc=$?
    grep -v Warning "$OUT/real_shape.log" | tail -5
    [ $rc -eq 0 ] || { stamp "real_shape.py failed"; exit 1; }
    echo "$SHAPE ${MAX_SEQ_LEN:-default}" > "$CKPT/.complete"
    ls -la "$CKPT"
fi

[ "${REF_BENCH:-1}" = 1 ] || exit 0

left=$((TOTAL_BUDGET - SECONDS))
[ "$left" -lt "$BENCH_TIMEOUT" ] && BENCH_TIMEOUT=$left
[ "$BENCH_TIMEOUT" -gt 30 ] || { stamp "no time left for the bench (${SECONDS}s used)"; exit 1; }
stamp "reference bench (cut at ${BENCH_TIMEOUT}s; ${SECONDS}s used so far)"
compile_args=()
[ "$COMPILE" = 1 ] && compile_args=(--compile --compile-modes "$COMPILE_MODES")
# shellcheck disable=SC2086 # BENCH_ARGS is a list of words
timeout --signal=INT --kill-after=20 "$BENCH_TIMEOUT" \
    "$PY" scripts/fish/ref_bench.py --ckpt "$CKPT" --frames "$FRAMES" --repeats "$REPEATS" \
    --mode "$MODE" "${compile_args[@]}" --short-seq-len "$SHORT_SEQ_LEN" --json-out "$OUT/bench.json" $BENCH_ARGS \
    > "$OUT/bench.log" 2>&1
rc=$?
# the per-run lines and the summary, without the progress bars
grep -E '^\{|loaded |Traceback|Error|error' "$OUT/bench.log" | tail -40
stamp "bench exit $rc"
[ -f "$OUT/bench.json" ] && { echo "summary:"; cat "$OUT/bench.json"; }
exit $rc
