#!/usr/bin/env bash
# Same-call A/B of three bench_gpu builds: head (before this change), twopass (overlapped launches),
# onepass (overlapped launches + one-pass RMSNorm in the gemv kernels). Interleaved to spread drift.
set -uo pipefail
pack=$1 out=$2
mkdir -p "$out" /tmp/omnitts
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$out/gpu.txt"
tar -C /tmp/omnitts -xJf "$pack/bins.tar.xz" && tar -C /tmp/omnitts -xJf "$pack/fixtures.tar.xz" || exit 3
t0=$(date +%s)
for v in head twopass onepass onepass twopass head; do
    [ $(( $(date +%s) - t0 )) -gt 230 ] && { echo "stop: time"; break; }
    timeout 60 /tmp/omnitts/bin/bench_gpu_$v --template /tmp/omnitts/fixtures/tiny-customvoice --sizes 0.6b,1.7b \
        --frames 250 --repeats 1 --graphs on --first-chunks 1 --workdir /tmp --json "$out/$v-$(date +%s).json" >"$out/$v.log" 2>&1
    echo "== $v exit $?"; grep -E "^(0.6b|1.7b) +(batch|stream1)\+g|codes identical" "$out/$v.log"
done
