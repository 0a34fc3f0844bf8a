#!/usr/bin/env bash
# First audio through the engine on a GPU machine (no Rust needed): closed-loop runs of
# bench_streams under several environment settings, side by side (docs/cuda.md, "First audio
# under load").
#
#   scripts/gpu-ttfa.sh BIN_DIR TEMPLATE_DIR OUT_DIR
#
# BIN_DIR holds bench_streams and bench_gpu (scripts/build-cuda.sh --example bench_streams
# --example bench_gpu); TEMPLATE_DIR is tests/fixtures/tiny-customvoice (the random real-shape
# checkpoints are made from it). Knobs: SIZE (1.7b), STREAMS (1,4,16), FRAMES (100),
# VARIANTS (the runs, each "name:ENV=V,ENV=V"; default: device → host reads through pageable memory,
# then through the pinned buffer, the default), RATES / DURATION (an open-loop run, defaults only).
set -uo pipefail
bin=$1 template=$2 out=$3
mkdir -p "$out"
SIZE=${SIZE:-1.7b} STREAMS=${STREAMS:-1,4,16} FRAMES=${FRAMES:-100}
VARIANTS=${VARIANTS:-"pageable:OMNITTS_PINNED_READBACK=0 pinned:"}
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
ckpt=/tmp/ckpt/$SIZE
if [ ! -d "$ckpt" ]; then
    stamp "random $SIZE checkpoint"
    "$bin/bench_gpu" --build-only /tmp/ckpt --sizes "$SIZE" --template "$template" >"$out/build.log" 2>&1 \
        || { tail -5 "$out/build.log"; exit 3; }
fi
run() { # NAME ENVS [extra bench_streams args]
    local name=$1 envs=$2; shift 2
    stamp "$name ($envs)"
    env ${envs//,/ } timeout "${RUN_TIMEOUT:-240}" "$bin/bench_streams" --model-dir "$ckpt" --device cuda:0 --shared-only \
        --frames "$FRAMES" --streams "$STREAMS" --json "$out/$name.json" "$@" >"$out/$name.log" 2>&1
    echo "exit $?"; grep -v '^{' "$out/$name.log" | tail -8
}
for v in $VARIANTS; do
    run "${v%%:*}" "${v#*:}"
done
if [ -n "${RATES:-}" ]; then
    run open-loop "" --streams 1 --rates "$RATES" --duration "${DURATION:-20}"
fi
stamp done
