#!/usr/bin/env bash
# Runs omnitts' CUDA checks and benchmark side by side with the official PyTorch reference, on a GPU
# machine that has no Rust toolchain (binaries built elsewhere with scripts/build-cuda.sh).
#
#   scripts/gpu-run.sh PACK_DIR OUT_DIR
#
# PACK_DIR (made by scripts/gpu-pack.sh) holds bins.tar.xz (gpu_parity, bench_gpu), fixtures.tar.xz
# (tests/fixtures subset), bench/ (ref_bench.py, tok/), whl/ (the reference's wheels) and
# bench_compare.py. Knobs: FRAMES (250), REPEATS (2), REF_REPEATS (1), SIZES (0.6b,1.7b),
# GRAPHS (both), STEPS ("parity bench ref"; also "kernels": the fused CUDA kernels against the
# unfused ops, "unfused": the benchmark again with OMNITTS_FUSED_KERNELS=0, graphs on, 1 repeat, and
# "v1": the same with OMNITTS_FUSED_KERNELS=1, the first fused kernel set only, limit V1_TIMEOUT;
# "sampled" / "sampled-unfused": the benchmark with sampled decoding (--sample), the second with
# OMNITTS_FUSED_SAMPLER=0, graphs on, 1 repeat, limit SAMPLED_TIMEOUT; "stack": the benchmark with
# OMNITTS_DECODE_STACK=1, one launch per decoder stack instead of per-layer kernels, limit V1_TIMEOUT),
# AR_DEVICE / DECODER_DEVICE (cuda:0), and per-step time limits KERNELS_TIMEOUT (60 s),
# PARITY_TIMEOUT (150 s), BENCH_TIMEOUT (330 s), UNFUSED_TIMEOUT (150 s), REF_TIMEOUT (120 s per size).
# PARITY_ARGS: extra gpu_parity arguments (e.g. "--checkpoints tiny-customvoice --max-cases 3");
# FIRST_CHUNKS (1,2): the streaming modes of the benchmark; step "perstep": the benchmark again with
# the code predictor as one graph per step and the codes picked on the host (OMNITTS_CP_FRAME_GRAPH=0;
# the default is one graph per frame with the codes chosen on the device), graphs on, 1 repeat, sizes
# PERSTEP_SIZES (default SIZES), limit PERSTEP_TIMEOUT (150 s); step "perstep-parity": gpu_parity
# with it (PARITY_ARGS, PARITY_TIMEOUT). Step "batch-parity": gpu_parity --batch-parity (batched
# frames of 1..64 streams, graphs and eager, against solo streams, on the random 0.6B checkpoint),
# modes BATCH_MODES (f32,bf16,sampled: all), limit BATCH_PARITY_TIMEOUT (300 s). Steps "streams" / "streams-eager" (for each size in STREAM_SIZES, e.g. "1.7b 0.6b"):
# bench_streams on a random checkpoint of that size (made by bench_gpu --build-only): closed loop
# STREAMS (1,4,16,64) with FRAMES per stream, GPU memory polled with nvidia-smi; then, in a second
# run (streams only, when RATES is set, e.g. RATES=1,10,20,40), the open loop as the serving
# benchmark measures it: Poisson arrivals at each rate for each of SEEDS (1), WARMUP s (10) not
# counted, DURATION s (30) measured, DRAIN s (10) for the last requests, 30-80 frames a request;
# OPEN_ARGS adds arguments (e.g. --greedy); e.g. RATES=1,10,20,40 SEEDS=1 WARMUP=10 DURATION=30
# takes about 3 min, RATES=1,10,20,40 SEEDS=1,2,3 WARMUP=30 DURATION=60 about 20 min (raise
# STREAMS_TIMEOUT and run fewer rates per call). "streams-eager" with the batched frame graphs off
# (OMNITTS_BATCH_GRAPHS=0); limit STREAMS_TIMEOUT (300 s) per run.
set -uo pipefail
pack=$1
out=$2
mkdir -p "$out" /tmp/omnitts
FRAMES=${FRAMES:-250} REPEATS=${REPEATS:-2} REF_REPEATS=${REF_REPEATS:-1} SIZES=${SIZES:-0.6b,1.7b}
GRAPHS=${GRAPHS:-both} STEPS=${STEPS:-parity bench ref}
AR_DEVICE=${AR_DEVICE:-cuda:0} DECODER_DEVICE=${DECODER_DEVICE:-$AR_DEVICE}
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
has_step() { [[ " $STEPS " == *" $1 "* ]]; }

nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used,clocks.sm --format=csv | tee "$out/gpu.txt"
stamp unpack
tar -C /tmp/omnitts -xJf "$pack/bins.tar.xz" || exit 3
tar -C /tmp/omnitts -xJf "$pack/fixtures.tar.xz" || exit 3
bin=/tmp/omnitts/bin fx=/tmp/omnitts/fixtures

if has_step kernels; then
    stamp kernels
    timeout "${KERNELS_TIMEOUT:-60}" "$bin/gpu_parity" --check-kernels --device "$AR_DEVICE" >"$out/kernels.log" 2>&1
    echo "gpu_parity --check-kernels exit $?"
    grep -E 'FAIL|kernel checks' "$out/kernels.log" | tail -20
fi
# parity NAME LIMIT_S [ENV=VALUE ...]: gpu_parity on the fixtures -> OUT/NAME.{log,json}
parity() {
    local name=$1 limit=$2; shift 2
    env "$@" timeout "$limit" "$bin/gpu_parity" --fixtures "$fx" --device "$AR_DEVICE" ${PARITY_ARGS:-} \
        --json "$out/$name.json" >"$out/$name.log" 2>&1
    echo "gpu_parity ($name) exit $?"
    grep -v '^{' "$out/$name.log" | tail -30
}
# bench NAME LIMIT_S SIZES REPEATS GRAPHS [ENV=VALUE ...]: bench_gpu -> OUT/NAME.{log,json}
bench() {
    local name=$1 limit=$2 sizes=$3 repeats=$4 graphs=$5; shift 5
    env "$@" timeout "$limit" "$bin/bench_gpu" --template "$fx/tiny-customvoice" --sizes "$sizes" --frames "$FRAMES" \
        --repeats "$repeats" --graphs "$graphs" --first-chunks "${FIRST_CHUNKS:-1,2}" --ar-device "$AR_DEVICE" \
        --decoder-device "$DECODER_DEVICE" --workdir /tmp --json "$out/$name.json" ${BENCH_EXTRA:-} >"$out/$name.log" 2>&1
    echo "bench_gpu ($name) exit $?"
    grep -v '^{' "$out/$name.log" | tail -32
}
if has_step parity; then
    stamp parity
    parity parity "${PARITY_TIMEOUT:-150}"
fi
if has_step bench; then
    stamp bench
    bench omnitts "${BENCH_TIMEOUT:-330}" "$SIZES" "$REPEATS" "$GRAPHS"
fi
if has_step unfused; then
    stamp "bench, fused kernels off"
    bench unfused "${UNFUSED_TIMEOUT:-150}" "$SIZES" 1 on OMNITTS_FUSED_KERNELS=0
fi
if has_step v1; then
    stamp "bench, first fused kernel set only (OMNITTS_FUSED_KERNELS=1)"
    bench v1 "${V1_TIMEOUT:-150}" "$SIZES" 1 on OMNITTS_FUSED_KERNELS=1
fi
if has_step stack; then
    stamp "bench, one launch per decoder stack (OMNITTS_DECODE_STACK=1)"
    bench stack "${V1_TIMEOUT:-150}" "$SIZES" 1 on OMNITTS_DECODE_STACK=1
fi
if has_step sampled; then
    stamp "bench, sampled decoding (--sample)"
    BENCH_EXTRA=--sample bench sampled "${SAMPLED_TIMEOUT:-150}" "$SIZES" 1 on
fi
if has_step sampled-unfused; then
    stamp "bench, sampled decoding without the fused sampler (OMNITTS_FUSED_SAMPLER=0)"
    BENCH_EXTRA=--sample bench sampled-unfused "${SAMPLED_TIMEOUT:-150}" "$SIZES" 1 on OMNITTS_FUSED_SAMPLER=0
fi
if has_step perstep-parity; then
    stamp "parity, code predictor graphs per step"
    parity perstep-parity "${PARITY_TIMEOUT:-150}" OMNITTS_CP_FRAME_GRAPH=0
fi
if has_step perstep; then
    stamp "bench, code predictor graphs per step"
    bench perstep "${PERSTEP_TIMEOUT:-150}" "${PERSTEP_SIZES:-$SIZES}" 1 on OMNITTS_CP_FRAME_GRAPH=0
fi
if has_step batch-parity; then
    stamp "batch parity: batched frames (graphs, eager) vs solo streams, B = 1..64"
    [ -d /tmp/ckpt/0.6b ] || "$bin/bench_gpu" --build-only /tmp/ckpt --sizes 0.6b \
        --template "$fx/tiny-customvoice" >"$out/build-0.6b.log" 2>&1 || { echo "build 0.6b failed"; tail -5 "$out/build-0.6b.log"; }
    timeout "${BATCH_PARITY_TIMEOUT:-300}" "$bin/gpu_parity" --batch-parity /tmp/ckpt/0.6b --device "$AR_DEVICE" ${BATCH_MODES:+--batch-modes "$BATCH_MODES"} \
        --json "$out/batch-parity.json" >"$out/batch-parity.log" 2>&1
    echo "gpu_parity --batch-parity exit $?"
    grep -v '^{' "$out/batch-parity.log" | tail -52
fi
# streams NAME LIMIT_S SIZE [ENV=VALUE ...]: bench_streams on a random checkpoint of SIZE, closed
# loop STREAMS -> OUT/NAME.{log,json}, GPU memory polled -> OUT/NAME.mem; with RATES also the open
# loop -> OUT/NAME-open.{log,json} (its GPU memory is in its own table)
streams() {
    local name=$1 limit=$2 size=$3; shift 3
    [ -d "/tmp/ckpt/$size" ] || "$bin/bench_gpu" --build-only /tmp/ckpt --sizes "$size" \
        --template "$fx/tiny-customvoice" >"$out/build-$size.log" 2>&1 || { echo "build $size failed"; tail -5 "$out/build-$size.log"; }
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$out/$name.mem" &
    local smi=$!
    env "$@" timeout "$limit" "$bin/bench_streams" --model-dir "/tmp/ckpt/$size" --device "$AR_DEVICE" --shared-only \
        --frames "$FRAMES" --streams "${STREAMS:-1,4,16,64}" --json "$out/$name.json" >"$out/$name.log" 2>&1
    echo "bench_streams ($name) exit $?"
    kill $smi 2>/dev/null
    grep -v '^{' "$out/$name.log" | tail -24
    echo "peak GPU memory (MiB): $(sort -n "$out/$name.mem" | tail -1)"
    [ -n "${RATES:-}" ] || return 0
    env "$@" timeout "$limit" "$bin/bench_streams" --model-dir "/tmp/ckpt/$size" --device "$AR_DEVICE" \
        --rates "$RATES" --seeds "${SEEDS:-1}" --warmup-s "${WARMUP:-10}" --duration "${DURATION:-30}" \
        --drain-s "${DRAIN:-10}" ${OPEN_ARGS:-} --json "$out/$name-open.json" >"$out/$name-open.log" 2>&1
    echo "bench_streams open loop ($name) exit $?"
    grep -v '^{' "$out/$name-open.log" | tail -40
}
for s in ${STREAM_SIZES:-}; do
    if has_step streams; then
        stamp "streams $s, batched frame graphs"
        streams "streams-$s" "${STREAMS_TIMEOUT:-300}" "$s"
    fi
    if has_step streams-eager; then
        stamp "streams $s, batched frames eager (OMNITTS_BATCH_GRAPHS=0)"
        RATES= streams "streams-eager-$s" "${STREAMS_TIMEOUT:-300}" "$s" OMNITTS_BATCH_GRAPHS=0
    fi
done
if has_step ref; then
    stamp reference
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$pack"/whl/*.whl >"$out/pip.log" 2>&1 || { echo "pip failed"; tail "$out/pip.log"; }
    for s in ${SIZES//,/ }; do
        PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout "${REF_TIMEOUT:-120}" python3 "$pack/bench/ref_bench.py" --size "$s" --device cuda \
            --dtype bf16 --frames "$FRAMES" --repeats "$REF_REPEATS" --warmup-frames 20 \
            --tokenizer-dir "$pack/bench/tok" --json-out "$out/ref.jsonl" >"$out/ref_$s.log" 2>&1
        echo "ref_bench $s exit $?"
        grep -v '^{' "$out/ref_$s.log" | tail -14
    done
    stamp compare
    python3 "$pack/bench_compare.py" "$out/omnitts.json" "$out/ref.jsonl" --json "$out/compare.json" | grep -v '^{'
fi
stamp done
