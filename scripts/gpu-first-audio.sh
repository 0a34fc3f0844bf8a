#!/usr/bin/env bash
# First audio under load on a GPU machine (no Rust needed; docs/cuda.md, "First audio under load"
# and "Prefill graphs"):
#   scripts/gpu-first-audio.sh BIN_DIR TEMPLATE_DIR OUT_DIR [FIXTURES_DIR]
# BIN_DIR holds bench_streams, bench_gpu and gpu_parity (scripts/build-cuda.sh --example bench_streams
# --example bench_gpu --example gpu_parity); TEMPLATE_DIR is tests/fixtures/tiny-customvoice (random
# checkpoints of the real shapes are made from it); FIXTURES_DIR holds the tiny fixtures and
# reference/ (step parity). Steps (STEPS; each skipped once BUDGET_S, 560 s, have passed):
#  parity   gpu_parity on the fixtures: f32 graphs (prefill graphs included) equal to eager;
#  batch-parity  gpu_parity --batch-parity on the 1.7B shapes, f32: batched frames and the
#           prefills of streams that join together against each stream alone;
#  stage0   bench_gpu, stage 0 alone at batch 1 (1.7B): prefill and ms per frame, prefill graphs off
#           (OMNITTS_PREFILL_GRAPHS=0) and on;
#  closed   bench_streams closed loop (STREAMS 1,4,16,64; 100 frames; bf16 Code2Wav), prefill graphs
#           off and on;
#  long     the closed loop at STREAMS with LONG_FRAMES (250: 20 s a stream, as the issue's baseline)
#           frames a stream: the aggregate with the start less in it;
#  text     bench_streams --text-rates 20,50: an LLM reply streamed into one request (token mode);
#  open     bench_streams open loop (RATES 1,10,20,40, seed SEEDS, WARMUP_S 5 + DURATION_S 20 s,
#           sampled as the checkpoint says, bf16 Code2Wav), with where the first audio waited;
#  open-off the same at OFF_RATES (10,20) with the prefill graphs off;
#  pass     the open loop at PASS_RATES (10,20) with Code2Wav passes of at most PASS_FRAMES (128) frames;
#  greedy   the open loop at SHORT_RATES (1,10,20), greedy, 1.7B;
#  small    the open loop at SHORT_RATES, sampled, 0.6B;
#  lane     the first-chunk lane off and on (bench_streams --first-chunk-lane): the open loop at
#           RATES, then the closed loop at STREAMS (100 frames), each pair in one call;
#  prio     the open loop at RATES for each seed of SEEDS and each of VARIANTS (taking turns within a
#           seed), `PRIORITY:ALONE` pairs: PRIORITY the CUDA streams' ranks (OMNITTS_STREAM_PRIORITY:
#           none, or ranks separated by '>' of comma lists of ar, lane, decoder), ALONE stage 0's first
#           frame in a step of its own (--first-frame-alone on|off);
#  prio-closed  the closed loop at STREAMS (100 frames) for each of VARIANTS;
#  ab       the open loop at RATES for each seed of SEEDS and each variant of AB (taking turns within a
#           seed); AB is a space-separated list of NAME:ENV=V,ENV=V (the variant's environment; none
#           after the colon for the defaults), e.g. AB="eager:OMNITTS_DECODER_FIRST_GRAPH=0 graph:";
#  ab-closed  the closed loop at STREAMS (100 frames) for each variant of AB;
#  c2w-first  bench_code2wav --first-frame (BIN_DIR needs it): a fresh stream's one-frame first chunk
#           eager and on its CUDA graph, f32 and bf16, 1.7B codec shapes;
#  protocol the issue's measurement as the serving benchmark runs it: for each rate of RATES, seeds
#           1, 2 and 3, each with a 30 s warm-up at that rate and 60 s measured (~5 min a rate, so
#           one or two rates a call; SIZE=0.6b for the small model, GREEDY=1 for greedy); PROTO
#           ("RATE:SEEDS RATE:SEEDS", e.g. "20:1,2,3 40:1") picks the seeds of each rate instead;
#           PROTO_ARGS: more bench_streams arguments (e.g. --initial-chunk-frames 2), TAG: a name for them.
set -uo pipefail
bin=$1 template=$2 out=$3 fx=${4:-}
mkdir -p "$out"
STEPS=${STEPS:-"parity stage0 closed text"} STREAMS=${STREAMS:-1,4,16,64} RATES=${RATES:-1,10,20,40}
SEEDS=${SEEDS:-1} WARMUP_S=${WARMUP_S:-5} DURATION_S=${DURATION_S:-20} BUDGET_S=${BUDGET_S:-560}
OFF_RATES=${OFF_RATES:-10,20} PASS_RATES=${PASS_RATES:-10,20} PASS_FRAMES=${PASS_FRAMES:-128}
SHORT_RATES=${SHORT_RATES:-1,10,20} LONG_FRAMES=${LONG_FRAMES:-250}
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
left() { echo $(( BUDGET_S - ($(date +%s) - t0) )); }
has() { [[ " $STEPS " == *" $1 "* ]]; }
ckpt() { # SIZE: a random checkpoint of that size under /tmp/ckpt
    [ -d "/tmp/ckpt/$1" ] || "$bin/bench_gpu" --build-only /tmp/ckpt --sizes "$1" --template "$template" \
        >"$out/build-$1.log" 2>&1 || { echo "building $1 failed"; tail -5 "$out/build-$1.log"; }
}
limited() { # NAME LIMIT_S [ENV=V ...] -- CMD...: OUT/NAME.log, the last lines shown
    local name=$1 limit=$2; shift 2
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
    local l; l=$(left); [ "$l" -lt "$limit" ] && limit=$l
    if [ "$limit" -le 15 ]; then echo "skipped $name: budget spent"; return; fi
    stamp "$name"
    env "${envs[@]}" timeout "$limit" "$@" >"$out/$name.log" 2>&1
    echo "exit $?"; grep -v '^{' "$out/$name.log" | tail -16
}
streams() { # NAME LIMIT_S [ENV=V ...] -- ARGS: bench_streams on SIZE (1.7b) -> OUT/NAME.{log,json}
    local name=$1 limit=$2; shift 2
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
    limited "$name" "$limit" "${envs[@]}" -- "$bin/bench_streams" --model-dir "/tmp/ckpt/${SIZE:-1.7b}" \
        --device cuda:0 --shared-only --decoder-dtype bfloat16 --json "$out/$name.json" "$@"
}
ckpt 1.7b
# A first engine on a fresh machine compiles the kernels' PTX (~25 s, cached on disk after) and finds the
# checkpoint outside the page cache; the first measured run of a call came out slower than the same
# binary later in the call (docs/cuda.md, "The first frame alone, and stream priorities"), so one short
# run goes first and is not counted.
limited warm-up 120 -- "$bin/bench_streams" --model-dir /tmp/ckpt/1.7b --device cuda:0 --shared-only \
    --streams 1,16 --frames 30
if has parity && [ -n "$fx" ]; then
    limited parity 150 -- "$bin/gpu_parity" --fixtures "$fx" --device cuda:0 --json "$out/parity.json"
fi
if has batch-parity; then
    # Batched frames and batched prefills (the streams joining at one frame) against solo streams.
    limited batch-parity 200 -- "$bin/gpu_parity" --batch-parity /tmp/ckpt/1.7b --device cuda:0 \
        --batch-modes f32 --json "$out/batch-parity.json"
fi
if has stage0; then
    for g in 0 1; do
        limited "stage0-prefill-graphs-$g" 100 OMNITTS_PREFILL_GRAPHS=$g -- "$bin/bench_gpu" \
            --template "$template" --sizes 1.7b --frames 100 --repeats 3 --graphs on --first-chunks 1 \
            --workdir /tmp --json "$out/stage0-prefill-graphs-$g.json"
    done
fi
if has closed; then
    for g in 0 1; do
        streams "closed-prefill-graphs-$g" 100 OMNITTS_PREFILL_GRAPHS=$g -- --streams "$STREAMS" --frames 100
    done
fi
if has long; then
    streams "closed-frames-$LONG_FRAMES" 150 -- --streams "$STREAMS" --frames "$LONG_FRAMES"
fi
if has text; then
    streams text-stream 90 -- --text-rates 20,50 --text-rounds 3
fi
open_args=(--seeds "$SEEDS" --warmup-s "$WARMUP_S" --duration "$DURATION_S" --drain-s 10)
if has open; then
    streams open 300 -- --rates "$RATES" "${open_args[@]}"
fi
if has open-off; then
    streams open-prefill-graphs-0 150 OMNITTS_PREFILL_GRAPHS=0 -- --rates "$OFF_RATES" "${open_args[@]}"
fi
if has pass; then
    streams "open-pass-$PASS_FRAMES" 150 -- --rates "$PASS_RATES" --decoder-pass-frames "$PASS_FRAMES" \
        "${open_args[@]}"
fi
if has greedy; then
    streams open-greedy 120 -- --greedy --rates "$SHORT_RATES" "${open_args[@]}"
fi
if has small; then
    ckpt 0.6b
    SIZE=0.6b streams open-0.6b 120 -- --rates "$SHORT_RATES" "${open_args[@]}"
fi
if has lane; then
    for l in off on; do
        streams "open-lane-$l" 200 -- --rates "$RATES" --first-chunk-lane "$l" "${open_args[@]}"
    done
    for l in off on; do
        streams "closed-lane-$l" 90 -- --streams "$STREAMS" --frames 100 --first-chunk-lane "$l"
    done
fi
if has prio; then
    # Seeds outermost, variants inside: the variants take turns, so a drift of the machine over the
    # call falls on all of them alike.
    for seed in ${SEEDS//,/ }; do
        for v in ${VARIANTS:-none:off ar,lane:off ar,lane:on none:on}; do
            p=${v%%:*} a=${v##*:} n=${v%%:*}; n=${n//,/+}; n=${n//>/-over-}
            streams "open-prio-$n-alone-$a-seed$seed" "${PRIO_LIMIT_S:-150}" \
                OMNITTS_STREAM_PRIORITY="$p" -- --rates "$RATES" --first-frame-alone "$a" \
                --seeds "$seed" --warmup-s "$WARMUP_S" --duration "$DURATION_S" --drain-s 10
        done
    done
fi
if has prio-closed; then
    for v in ${VARIANTS:-none:off ar,lane:on}; do
        p=${v%%:*} a=${v##*:} n=${v%%:*}; n=${n//,/+}; n=${n//>/-over-}
        streams "closed-prio-$n-alone-$a" 90 OMNITTS_STREAM_PRIORITY="$p" -- \
            --streams "$STREAMS" --frames 100 --first-frame-alone "$a"
    done
fi
ab_env() { # VARIANT -> the ENV=V words of NAME:ENV=V,ENV=V
    local e=${1#*:}; [ -n "$e" ] && echo "${e//,/ }"
}
if has c2w-first; then
    limited c2w-first 150 -- "$bin/bench_code2wav" --model-dir /tmp/ckpt/1.7b --device cuda:0 \
        --precisions f32,bf16 --rows 1,16 --first-frame --json "$out/c2w-first.json"
fi
if has ab; then
    for seed in ${SEEDS//,/ }; do
        for v in ${AB:-default:}; do
            # shellcheck disable=SC2046
            streams "open-ab-${v%%:*}-seed$seed" "${AB_LIMIT_S:-150}" $(ab_env "$v") -- --rates "$RATES" \
                --seeds "$seed" --warmup-s "$WARMUP_S" --duration "$DURATION_S" --drain-s 10
        done
    done
fi
if has ab-closed; then
    for v in ${AB:-default:}; do
        # shellcheck disable=SC2046
        streams "closed-ab-${v%%:*}" 90 $(ab_env "$v") -- --streams "$STREAMS" --frames 100
    done
fi
if has protocol; then
    [ "${SIZE:-1.7b}" = 1.7b ] || ckpt "$SIZE"
    greedy=(); [ "${GREEDY:-0}" = 1 ] && greedy=(--greedy)
    # PROTO: RATE:SEEDS entries (e.g. "20:1,2,3 40:1"), one bench_streams run each; by default every
    # rate of RATES with seeds 1, 2 and 3.
    proto=${PROTO:-}
    [ -n "$proto" ] || for rate in ${RATES//,/ }; do proto+=" $rate:1,2,3"; done
    for entry in $proto; do
        rate=${entry%%:*} seeds=${entry#*:}
        # shellcheck disable=SC2086
        streams "protocol-${SIZE:-1.7b}${greedy:+-greedy}${TAG:+-$TAG}-$rate-seeds${seeds//,/}" 560 -- \
            --rates "$rate" --seeds "$seeds" --warmup-s 30 --duration 60 --drain-s 10 "${greedy[@]}" \
            ${PROTO_ARGS:-}
    done
fi
stamp done
