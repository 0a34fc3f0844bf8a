#!/usr/bin/env bash
# Attention blocks by the grid: checks, stage 0 alone, long closed loop, 40/s open loop (A/B with OMNITTS_ATTN_THREADS=256).
set -uo pipefail
B=/tmp/o/bin T=tests/fixtures/tiny-customvoice R=/tmp/r
rm -rf /tmp/o $R; mkdir -p $R /tmp/o && tar -C /tmp/o -xJf .gpu/bins-attn2.tar.xz
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s); st() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
envof() { [ "${1#*:}" = none ] && echo "OMNITTS_NONE=1" || echo "OMNITTS_ATTN_THREADS=${1#*:}"; }
st kernels; timeout 150 $B/gpu_parity --check-kernels --device cuda:0 > $R/kernels.log 2>&1; echo rc $?
grep -cE " ok$" $R/kernels.log; grep -E "FAIL|kernel checks" $R/kernels.log | head
[ -d /tmp/ckpt/1.7b ] || $B/bench_gpu --build-only /tmp/ckpt --sizes 1.7b --template $T > $R/build.log 2>&1
for v in new:none old:256 new2:none old2:256; do
  st "rows ${v%%:*}"; env $(envof $v) timeout 100 $B/bench_gpu --template $T --sizes 1.7b --sample --rows 1,16,64 --frames 60 --workdir /tmp --json $R/rows-${v%%:*}.json > $R/rows-${v%%:*}.log 2>&1
  grep "stage 0 alone" $R/rows-${v%%:*}.log
done
S="$B/bench_streams --model-dir /tmp/ckpt/1.7b --device cuda:0 --shared-only --decoder-dtype bfloat16"
for v in old:256 new:none old2:256 new2:none; do
  st "long ${v%%:*}"; env $(envof $v) timeout 100 $S --streams 1,64 --frames 250 --json $R/long-${v%%:*}.json > $R/long-${v%%:*}.log 2>&1
  grep -E "^  shared" $R/long-${v%%:*}.log
done
for v in new:none old:256; do
  st "open40 ${v%%:*}"; env $(envof $v) timeout 150 $S --rates 40 --seeds 1 --warmup-s 30 --duration 60 --drain-s 10 --json $R/open40-${v%%:*}.json > $R/open40-${v%%:*}.log 2>&1
  grep -v '^{' $R/open40-${v%%:*}.log | tail -14
done
st done; tar -C $R -czf $OUT/call2.tgz .
