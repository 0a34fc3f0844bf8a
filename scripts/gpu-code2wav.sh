#!/usr/bin/env bash
# Code2Wav throughput and reduced precision on a GPU machine (no Rust needed; docs/cuda.md,
# "Code2Wav in reduced precision"):
#   scripts/gpu-code2wav.sh BIN_DIR TEMPLATE_DIR VOICE_DIR OUT_DIR
# BIN_DIR holds bench_code2wav, bench_streams and bench_gpu (scripts/build-cuda.sh --example
# bench_code2wav --example bench_streams --example bench_gpu); TEMPLATE_DIR is
# tests/fixtures/tiny-customvoice (random checkpoints of the real shapes are made from it); VOICE_DIR
# holds the bundled voice's speech_tokenizer/ (a trained decoder, for the deviation figures).
# Steps (STEPS, each skipped once BUDGET_S (560) seconds have passed):
#  kernels  gpu_parity --check-kernels (needs gpu_parity in BIN_DIR): every fused kernel against the
#           candle ops it replaces, the implicit-GEMM convolutions among them;
#  c2w      bench_code2wav, 1.7B shapes: f32 / tf32 / bf16 at 1, 16, 64 streams, f32 without the
#           decoder's CUDA kernels (OMNITTS_DECODER_KERNELS=0, the code before them), and bf16 and
#           f32 with the convolutions as candle's (OMNITTS_DECODER_CONV=candle);
#  rows     bench_gpu --rows ROWS: stage 0 alone stepping 1 … 64 streams together (no Code2Wav);
#  ncu-rows Nsight Compute: time per kernel of one batched stage-0 step at 64 rows;
#  voice    bench_code2wav on the bundled voice: deviation of tf32 / bf16 from f32;
#  ncu      Nsight Compute: time per kernel of the f32 decoder's passes (64 streams);
#  closed   bench_streams closed loop (STREAMS, 100 frames, greedy) for each PRECISIONS entry;
#  closed-candle  the same with the convolutions as candle's (OMNITTS_DECODER_CONV=candle);
#  open     bench_streams open loop (RATES, SEEDS, WARMUP_S + DURATION_S) with OPEN_PRECISION;
#  fqb      faster-qwen3-tts-batch 0.2.0 on the same shapes (1.7B, B = 1, 16, 64, 250 frames) for the
#           aggregate side by side: needs FQB_DIR, a folder with bench/ (the anchors' benchmark scripts)
#           and .whl/fast/ (its wheels); pair it with closed at CLOSED_FRAMES=250.
set -uo pipefail
bin=$1 template=$2 voice=$3 out=$4
mkdir -p "$out"
STEPS=${STEPS:-"c2w voice ncu closed"} STREAMS=${STREAMS:-1,16,64} PRECISIONS=${PRECISIONS:-"f32 tf32 bf16"}
RATES=${RATES:-1,10,20,40} SEEDS=${SEEDS:-1} WARMUP_S=${WARMUP_S:-10} DURATION_S=${DURATION_S:-30}
OPEN_PRECISION=${OPEN_PRECISION:-bf16} ROWS=${ROWS:-1,16,64} BUDGET_S=${BUDGET_S:-560} CLOSED_FRAMES=${CLOSED_FRAMES:-100}
FQB_DIR=${FQB_DIR:-}
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
left() { echo $(( BUDGET_S - ($(date +%s) - t0) )); }
has() { [[ " $STEPS " == *" $1 "* ]]; }
flags() { # PRECISION -> bench_streams decoder flags
    case $1 in f32) echo "--decoder-dtype float32";; tf32) echo "--decoder-dtype float32 --allow-tf32";;
        bf16) echo "--decoder-dtype bfloat16";; esac
}
run() { # NAME LIMIT CMD...: OUT/NAME.log, last lines shown
    local name=$1 limit=$2; shift 2
    local l; l=$(left); [ "$l" -lt "$limit" ] && limit=$l
    if [ "$limit" -le 15 ]; then echo "skipped $name: budget spent"; return; fi
    stamp "$name"
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    echo "exit $?"; grep -v '^{' "$out/$name.log" | tail -12
}
[ -d /tmp/ckpt/1.7b ] || "$bin/bench_gpu" --build-only /tmp/ckpt --sizes 1.7b --template "$template" \
    >"$out/build.log" 2>&1 || { echo "building 1.7b failed"; tail -5 "$out/build.log"; }
if has kernels; then
    run kernels 120 "$bin/gpu_parity" --check-kernels --device cuda:0
fi
if has c2w; then
    run c2w-1.7b 150 "$bin/bench_code2wav" --model-dir /tmp/ckpt/1.7b --json "$out/c2w-1.7b.json"
    run c2w-1.7b-conv-candle 90 env OMNITTS_DECODER_CONV=candle "$bin/bench_code2wav" \
        --model-dir /tmp/ckpt/1.7b --precisions bf16,f32 --json "$out/c2w-1.7b-conv-candle.json"
    run c2w-1.7b-nokernels 90 env OMNITTS_DECODER_KERNELS=0 "$bin/bench_code2wav" --model-dir /tmp/ckpt/1.7b \
        --precisions f32 --json "$out/c2w-1.7b-nokernels.json"
fi
if has rows; then
    run rows 120 "$bin/bench_gpu" --template "$template" --sizes 1.7b --rows "$ROWS" --frames 40 \
        --workdir /tmp --json "$out/rows.json"
fi
if has ncu-rows; then
    run ncu-rows 200 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum \
        --print-summary per-kernel "$bin/bench_gpu" --template "$template" --sizes 1.7b --rows 64 --frames 6 \
        --workdir /tmp --profile
fi
if has voice; then
    run c2w-voice 60 "$bin/bench_code2wav" --model-dir "$voice" --rows 1,64 --json "$out/c2w-voice.json"
fi
if has ncu; then
    # Two passes of 64 streams (the first is the warm-up); the accuracy part kept tiny.
    # One timed pass of 64 streams (bench_code2wav --profile marks it), per precision in PRECISIONS.
    for p in $PRECISIONS; do
        run "ncu-$p" 120 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum \
            --print-summary per-kernel "$bin/bench_code2wav" --model-dir /tmp/ckpt/1.7b --precisions "$p" \
            --rows 64 --rounds 1 --accuracy-frames 2 --profile
    done
fi
if has closed; then
    for p in $PRECISIONS; do
        # shellcheck disable=SC2046
        run "closed-$p" 120 "$bin/bench_streams" --model-dir /tmp/ckpt/1.7b --device cuda:0 --shared-only \
            --streams "$STREAMS" --frames "$CLOSED_FRAMES" $(flags "$p") --json "$out/closed-$p.json"
    done
fi
if has closed-candle; then
    for p in $PRECISIONS; do
        # shellcheck disable=SC2046
        run "closed-$p-conv-candle" 120 env OMNITTS_DECODER_CONV=candle "$bin/bench_streams" \
            --model-dir /tmp/ckpt/1.7b --device cuda:0 --shared-only --streams "$STREAMS" \
            --frames "$CLOSED_FRAMES" $(flags "$p") --json "$out/closed-$p-conv-candle.json"
    done
fi
if has open; then
    # shellcheck disable=SC2046
    run "open-$OPEN_PRECISION" 400 "$bin/bench_streams" --model-dir /tmp/ckpt/1.7b --device cuda:0 --shared-only \
        --rates "$RATES" --seeds "$SEEDS" --warmup-s "$WARMUP_S" --duration "$DURATION_S" --drain-s 20 \
        $(flags "$OPEN_PRECISION") --json "$out/open-$OPEN_PRECISION.json"
fi
if has fqb && [ -n "$FQB_DIR" ]; then
    l=$(left)
    if [ "$l" -gt 60 ]; then
        stamp fqb
        (cd "$FQB_DIR" && OUT="$out/fqb" SIZES=1.7b BATCHES=1,16,64 INSTALL_REF=0 SIZE_TIMEOUT=$((l - 10)) \
            timeout "$l" bash bench/run_batch_gpu.sh >/dev/null 2>&1)
        echo "exit $?"; sed -n '/== summary/,$p' "$out/fqb/batch.log" | head -12
        rm -rf "$out/fqb/codes"
    else
        echo "skipped fqb: budget spent"
    fi
fi
stamp done
