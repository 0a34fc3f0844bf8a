#!/usr/bin/env bash
# Attention blocks sized to the keys, add_rms_norm with held values: checks, stage 0 alone, ncu, closed loop.
set -uo pipefail
B=/tmp/o/bin T=tests/fixtures/tiny-customvoice R=/tmp/r
mkdir -p $R /tmp/o && tar -C /tmp/o -xJf .gpu/bins-attn.tar.xz
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s); st() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
st kernels; timeout 150 $B/gpu_parity --check-kernels --device cuda:0 > $R/kernels.log 2>&1; echo rc $?
grep -E "FAIL|decode_attention in blocks|decode_stack .* out|kernel checks" $R/kernels.log | head -30
$B/bench_gpu --build-only /tmp/ckpt --sizes 1.7b --template $T > $R/build.log 2>&1
for v in new:none old:256 new2:none t128:128; do
  name=${v%%:*} th=${v#*:}; envs=(); [ "$th" != none ] && envs=(OMNITTS_ATTN_THREADS=$th)
  st "rows $name"; env "${envs[@]}" timeout 120 $B/bench_gpu --template $T --sizes 1.7b --sample --rows 1,16,64 --frames 60 --workdir /tmp --json $R/rows-$name.json > $R/rows-$name.log 2>&1
  grep -E "rows|ms a step|audio-s/s" $R/rows-$name.log | grep -v '^{' | tail -6
done
for v in old:256 new:none; do
  name=${v%%:*} th=${v#*:}; envs=(); [ "$th" != none ] && envs=(OMNITTS_ATTN_THREADS=$th)
  st "ncu $name"; env "${envs[@]}" timeout 150 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --print-summary per-kernel -k regex:'rope_attention|rows_attention|add_rms_norm' $B/bench_gpu --template $T --sizes 1.7b --rows 64 --frames 6 --workdir /tmp --profile > $R/ncu-$name.log 2>&1
  grep -A6 -E "^  (rope|rows|add_rms)" $R/ncu-$name.log | grep -E "^  |Average|us " | head -30
done
for v in old:256 new:none old2:256 new2:none; do
  name=${v%%:*} th=${v#*:}; envs=(); [ "$th" != none ] && envs=(OMNITTS_ATTN_THREADS=$th)
  st "closed $name"; env "${envs[@]}" timeout 100 $B/bench_streams --model-dir /tmp/ckpt/1.7b --device cuda:0 --shared-only --decoder-dtype bfloat16 --streams 1,64 --frames 100 --json $R/closed-$name.json > $R/closed-$name.log 2>&1
  grep -v '^{' $R/closed-$name.log | tail -6
done
st done; tar -C $R -czf $OUT/call1.tgz .
