#!/usr/bin/env bash
# First audio through the engine on a GPU machine (no Rust needed): where the first chunk waits,
# and the engine's CUDA settings A/B (docs/cuda.md, "First audio under load").
#
#   scripts/gpu-ttfa.sh BIN_DIR TEMPLATE_DIR OUT_DIR
#
# BIN_DIR holds bench_streams and bench_gpu (scripts/build-cuda.sh --example bench_streams
# --example bench_gpu); TEMPLATE_DIR is tests/fixtures/tiny-customvoice (the random real-shape
# checkpoints are made from it). Knobs: SIZE (1.7b), STREAMS (1,4,16), FRAMES (100),
# VARIANTS (the runs, each "name:ENV=V,ENV=V"; default: every CUDA setting off, each alone on,
# all on), NSYS=1 (profile the all-off run with Nsight Systems when `nsys` is found, and print
# scripts/nsys_threads.py's summary), RATES / DURATION (open loop, all-on only).
set -uo pipefail
bin=$1 template=$2 out=$3
mkdir -p "$out"
SIZE=${SIZE:-1.7b} STREAMS=${STREAMS:-1,4,16} FRAMES=${FRAMES:-100}
off="OMNITTS_STAGE1_PRIORITY=0,OMNITTS_POOL_KEEP=0,OMNITTS_PINNED_READBACK=0"
VARIANTS=${VARIANTS:-"off:$off pinned:OMNITTS_STAGE1_PRIORITY=0,OMNITTS_POOL_KEEP=0 priority:OMNITTS_POOL_KEEP=0,OMNITTS_PINNED_READBACK=0 pool:OMNITTS_STAGE1_PRIORITY=0,OMNITTS_PINNED_READBACK=0 on:"}
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
if [ "${NSYS:-0}" = 1 ]; then
    nsys=$(command -v nsys || ls /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda*/bin/nsys 2>/dev/null | head -1)
    if [ -n "$nsys" ]; then
        stamp "nsys profile, all settings off ($nsys)"
        env ${off//,/ } timeout 300 "$nsys" profile -t cuda,osrt -s none --cpuctxsw=none -o "$out/prof" --force-overwrite true \
            --export sqlite "$bin/bench_streams" --model-dir "$ckpt" --device cuda:0 --shared-only --frames 60 \
            --streams 1 >"$out/nsys.log" 2>&1
        echo "nsys exit $?"; tail -3 "$out/nsys.log"
        [ -f "$out/prof.sqlite" ] && python3 "$(dirname "$0")/nsys_threads.py" "$out/prof.sqlite" | tee "$out/nsys-threads.txt"
        rm -f "$out/prof.sqlite"
    else
        echo "nsys not found"
    fi
fi
for v in $VARIANTS; do
    run "${v%%:*}" "${v#*:}"
done
if [ -n "${RATES:-}" ]; then
    run open-loop "" --streams 1 --rates "$RATES" --duration "${DURATION:-20}"
fi
stamp done
