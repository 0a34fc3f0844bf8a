#!/usr/bin/env bash
# Session 36 call 2: the 64-stream start cold and warm with stage 0's turns traced, the prefill budget
# 512 (default) against 2048 positions a step, and the protocol at 40 (both budgets) and 1 request/s.
set -uo pipefail
B=/tmp/o/bin T=tests/fixtures/tiny-customvoice R=/tmp/r
rm -rf /tmp/o $R; mkdir -p $R /tmp/o && tar -C /tmp/o -xJf .gpu/bins.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee $R/gpu.txt
t0=$(date +%s); st() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
fin() { st done; tar -C $R -czf $OUT/call2.tgz .; }
trap fin EXIT
[ -d /tmp/ckpt/1.7b ] || { st ckpt; $B/bench_gpu --build-only /tmp/ckpt --sizes 1.7b --template $T > $R/build.log 2>&1; echo rc $?; }
S="$B/bench_streams --model-dir /tmp/ckpt/1.7b --device cuda:0 --shared-only --decoder-dtype bfloat16"
st warm-up; timeout 100 $S --streams 1,16 --frames 30 > $R/warm-up.log 2>&1; echo rc $?
for v in b512 b2048 b512x b2048x; do
  b=${v#b}; b=${b%x}
  st "closed $v"; OMNITTS_PREFILL_BUDGET=$b OMNITTS_STAGE0_TRACE=$R/turns-$v.tsv timeout 80 $S --streams 16,64 --rounds 3 --frames 100 --json $R/closed-$v.json > $R/closed-$v.log 2>&1; echo rc $?
  grep -v '^{' $R/closed-$v.log | grep -E "^  shared|first audio|round" | head -16
done
for v in b512 b2048; do
  b=${v#b}
  st "protocol 40 $v"; OMNITTS_PREFILL_BUDGET=$b timeout 125 $S --rates 40 --seeds 1 --warmup-s 30 --duration 60 --drain-s 10 --json $R/protocol-40-$v.json > $R/protocol-40-$v.log 2>&1; echo rc $?
  grep -v '^{' $R/protocol-40-$v.log | tail -6
done
st "protocol 1"; timeout 115 $S --rates 1 --seeds 1 --warmup-s 30 --duration 60 --drain-s 10 --json $R/protocol-1.json > $R/protocol-1.log 2>&1; echo rc $?
grep -v '^{' $R/protocol-1.log | tail -6
