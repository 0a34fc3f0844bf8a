#!/usr/bin/env bash
# First audio under load on a GPU machine (no Rust needed; docs/cuda.md, "First audio under load"):
#   scripts/gpu-first-audio.sh BIN_DIR TEMPLATE_DIR OUT_DIR
# BIN_DIR holds bench_streams and bench_gpu (scripts/build-cuda.sh --example bench_streams
# --example bench_gpu); TEMPLATE_DIR is tests/fixtures/tiny-customvoice (random checkpoints of the
# real shapes are made from it). Steps, each skipped once BUDGET_S (560) seconds have passed:
#  1. 1.7B: closed loop (STREAMS 1,4,16,64; 100 frames) and open loop (RATES 1,10,20,40, sampled
#     as the checkpoint says, seed SEEDS, WARMUP_S 10 + DURATION_S 30 s);
#  2. the A/B of device → host reads: stage 0 alone (bench_gpu, batch 1, 1.7B) and the closed loop
#     at N = 1 and 16, each through pageable memory (OMNITTS_PINNED_READBACK=0) and pinned (default);
#  3. 0.6B open loop, sampled (SHORT_WARMUP_S 5 + SHORT_DURATION_S 15 s);
#  4. 1.7B open loop, greedy (the same short windows).
set -uo pipefail
bin=$1 template=$2 out=$3
mkdir -p "$out"
STREAMS=${STREAMS:-1,4,16,64} RATES=${RATES:-1,10,20,40} SEEDS=${SEEDS:-1}
WARMUP_S=${WARMUP_S:-10} DURATION_S=${DURATION_S:-30} SHORT_WARMUP_S=${SHORT_WARMUP_S:-5}
SHORT_DURATION_S=${SHORT_DURATION_S:-15} BUDGET_S=${BUDGET_S:-560}
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
left() { echo $(( BUDGET_S - ($(date +%s) - t0) )); }
ckpt() { # SIZE: a random checkpoint of that size under /tmp/ckpt
    [ -d "/tmp/ckpt/$1" ] || "$bin/bench_gpu" --build-only /tmp/ckpt --sizes "$1" --template "$template" \
        >"$out/build-$1.log" 2>&1 || { echo "building $1 failed"; tail -5 "$out/build-$1.log"; }
}
streams() { # NAME SIZE [ENV=V ...] -- ARGS: bench_streams -> OUT/NAME.{log,json}
    local name=$1 size=$2; shift 2
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
    local limit; limit=$(left)
    if [ "$limit" -le 20 ]; then echo "skipped $name: budget spent"; return; fi
    stamp "$name"
    env "${envs[@]}" timeout "$limit" "$bin/bench_streams" --model-dir "/tmp/ckpt/$size" --device cuda:0 \
        --shared-only --json "$out/$name.json" "$@" >"$out/$name.log" 2>&1
    echo "exit $?"; grep -v '^{' "$out/$name.log" | tail -14
}
gpu() { # NAME [ENV=V ...]: bench_gpu, stage 0 alone at batch 1, 1.7B -> OUT/NAME.log
    local name=$1; shift
    stamp "$name"
    env "$@" timeout 120 "$bin/bench_gpu" --template "$template" --sizes 1.7b --frames 200 --repeats 2 \
        --graphs on --first-chunks 1 --workdir /tmp --json "$out/$name.json" >"$out/$name.log" 2>&1
    echo "exit $?"; grep -v '^{' "$out/$name.log" | tail -6
}
ckpt 1.7b
streams sampled-1.7b 1.7b -- --streams "$STREAMS" --frames 100 --rates "$RATES" --seeds "$SEEDS" \
    --warmup-s "$WARMUP_S" --duration "$DURATION_S" --drain-s 20
gpu stage0-pageable OMNITTS_PINNED_READBACK=0
gpu stage0-pinned OMNITTS_PINNED_READBACK=1
streams closed-pageable 1.7b OMNITTS_PINNED_READBACK=0 -- --streams 1,16 --frames 100
streams closed-pinned 1.7b OMNITTS_PINNED_READBACK=1 -- --streams 1,16 --frames 100
ckpt 0.6b
streams sampled-0.6b 0.6b -- --rates "$RATES" --seeds "$SEEDS" --warmup-s "$SHORT_WARMUP_S" \
    --duration "$SHORT_DURATION_S" --drain-s 10
streams greedy-1.7b 1.7b -- --greedy --rates "$RATES" --seeds "$SEEDS" --warmup-s "$SHORT_WARMUP_S" \
    --duration "$SHORT_DURATION_S" --drain-s 10
stamp done
