#!/usr/bin/env bash
# Fish S2 Pro on a GPU machine with omnitts (no Rust needed), beside the official reference:
#   scripts/gpu-fish.sh BIN_DIR BUNDLE OUT_DIR
# BIN_DIR holds gpu_parity, fish_check and bench_streams (scripts/build-cuda.sh --example gpu_parity
# --example fish_check --example bench_streams); BUNDLE is the reference bundle that
# scripts/gpu-fish-ref.sh takes (its wheels and fish_speech modules: the checkpoints are written
# with the reference's own classes, by scripts/fish/real_shape.py).
# Steps (STEPS, each cut to what is left of BUDGET_S, 560 s):
#  kernels  gpu_parity --check-kernels: every fused kernel against the candle ops it replaces (the
#           head-norm-free attention Fish's fast AR takes among them);
#  check    fish_check on a small checkpoint (real vocabulary, head width 64; /tmp/s2small): f32 on
#           the GPU = the CPU frame for frame (the CPU is what the parity tests hold to the
#           reference), batched = alone, bf16 agreement, the codec's decode, and the fast AR on its
#           CUDA graphs (OMNITTS_FISH_GRAPHS=1 for this check: alone = the CPU, batched vs eager);
#  closed   bench_streams closed loop on the real shapes (/tmp/s2pro, written once per machine):
#           STREAMS streams of CLOSED_FRAMES frames, greedy: ms per frame at 1 stream, first audio,
#           aggregate audio-s/s;
#  open     bench_streams open loop (RATES, SEEDS, WARMUP_S + DURATION_S): first audio under
#           Poisson arrivals as the serving engines are measured;
#  graphs   the closed loop at STREAMS again with the fast AR on its CUDA graphs
#           (OMNITTS_FISH_GRAPHS=1), beside `closed` in the same call;
#  graphs-prio  the same with stage 1's CUDA streams (its thread and the first-chunk lane) at the
#           greatest priority (OMNITTS_STREAM_PRIORITY=lane,decoder): whether the one-stream
#           first audio that came later with the graphs (docs/cuda.md) waited behind the replays.
# The reference's own timings on the same /tmp/s2pro: scripts/gpu-fish-ref.sh (a second call on the
# same warm machine skips the checkpoint).
# The working tree on the GPU machine needs scripts/ and tests/fixtures/tiny-fish's tokenizer files
# (tokenizer.json, tokenizer_config.json, special_tokens_map.json: scripts/fish/real_shape.py copies
# them into the checkpoints); a sparse checkout for the device tool must keep them.
set -uo pipefail
bin=$1 bundle=$2 out=$3
mkdir -p "$out"
STEPS=${STEPS:-"kernels check closed open"} STREAMS=${STREAMS:-1,16,64} CLOSED_FRAMES=${CLOSED_FRAMES:-200}
RATES=${RATES:-1,5} SEEDS=${SEEDS:-1} WARMUP_S=${WARMUP_S:-5} DURATION_S=${DURATION_S:-30}
BUDGET_S=${BUDGET_S:-560}
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
left() { echo $(( BUDGET_S - ($(date +%s) - t0) )); }
has() { [[ " $STEPS " == *" $1 "* ]]; }
run() { # NAME LIMIT CMD...: OUT/NAME.log, last lines shown
    local name=$1 limit=$2; shift 2
    local l; l=$(left); [ "$l" -lt "$limit" ] && limit=$l
    if [ "$limit" -le 15 ]; then echo "skipped $name: budget spent"; return; fi
    stamp "$name"
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    echo "exit $?"; grep -v '^{' "$out/$name.log" | tail -14
}
ckpt() { # SHAPE DIR: the checkpoint, with the reference's classes (skipped when already there)
    REF_BENCH=0 SHAPE=$1 CKPT=$2 bash scripts/gpu-fish-ref.sh "$bundle" "$out/ckpt-$1" >/dev/null 2>&1 \
        || { echo "writing the $1 checkpoint failed:"; tail -5 "$out/ckpt-$1/gpu-fish-ref.log"; }
}
has kernels && run kernels 150 "$bin/gpu_parity" --check-kernels --device cuda:0
if has check; then
    stamp "small checkpoint"; ckpt small /tmp/s2small
    OMNITTS_FISH_GRAPHS=1 run check 150 "$bin/fish_check" --model-dir /tmp/s2small --device cuda:0 \
        --frames 40
fi
if has closed || has open || has graphs || has graphs-prio; then
    stamp "real-shape checkpoint"; ckpt real /tmp/s2pro
fi
has closed && run closed 240 "$bin/bench_streams" --model-dir /tmp/s2pro --device cuda:0 --shared-only \
    --streams "$STREAMS" --frames "$CLOSED_FRAMES" --json "$out/closed.json"
has open && run open 200 "$bin/bench_streams" --model-dir /tmp/s2pro --device cuda:0 --rates "$RATES" \
    --seeds "$SEEDS" --warmup-s "$WARMUP_S" --duration "$DURATION_S" --json "$out/open.json"
has graphs-prio && OMNITTS_FISH_GRAPHS=1 OMNITTS_STREAM_PRIORITY=lane,decoder run closed-graphs-prio 240 \
    "$bin/bench_streams" --model-dir /tmp/s2pro --device cuda:0 --shared-only --streams "$STREAMS" \
    --frames "$CLOSED_FRAMES" --json "$out/closed-graphs-prio.json"
has graphs && OMNITTS_FISH_GRAPHS=1 run closed-graphs 240 "$bin/bench_streams" --model-dir /tmp/s2pro \
    --device cuda:0 --shared-only --streams "$STREAMS" --frames "$CLOSED_FRAMES" --json "$out/closed-graphs.json"
stamp done
