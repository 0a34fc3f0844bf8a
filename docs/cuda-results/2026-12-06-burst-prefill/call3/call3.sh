#!/usr/bin/env bash
# Session 36 call 3: the batched prefill graphs. gpu_parity --batch-parity (streams joining together,
# prefilled on the batched graphs, against each alone); the 16/64-stream start with the batched
# prefill on its graphs (default) and eager (OMNITTS_BATCHED_PREFILL_GRAPHS=0), in turn, turns traced;
# 64 x 250; the protocol at 40 requests/s (1.7B seed 2, 0.6B seed 1).
set -uo pipefail
B=/tmp/o/bin T=tests/fixtures/tiny-customvoice R=/tmp/r
rm -rf /tmp/o $R; mkdir -p $R /tmp/o && tar -C /tmp/o -xJf .gpu/bins.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee $R/gpu.txt
t0=$(date +%s); st() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
left() { echo $(( 330 - ($(date +%s) - t0) )); }
fin() { st done; tar -C $R -czf $OUT/call3.tgz .; }
trap fin EXIT
st ckpt; $B/bench_gpu --build-only /tmp/ckpt --sizes 1.7b --template $T > $R/build.log 2>&1; echo rc $?
st batch-parity; timeout 100 $B/gpu_parity --batch-parity /tmp/ckpt/1.7b --device cuda:0 --batch-modes f32 --json $R/batch-parity.json > $R/batch-parity.log 2>&1; echo rc $?
grep -v '^{' $R/batch-parity.log | grep -iE "ok|fail|differ|==" | tail -8
S="$B/bench_streams --model-dir /tmp/ckpt/1.7b --device cuda:0 --shared-only --decoder-dtype bfloat16"
st warm-up; timeout 60 $S --streams 1,16 --frames 30 > $R/warm-up.log 2>&1; echo rc $?
for v in graphs eager graphs2 eager2; do
  g=1; case $v in eager*) g=0;; esac
  st "closed $v"; OMNITTS_BATCHED_PREFILL_GRAPHS=$g OMNITTS_STAGE0_TRACE=$R/turns-$v.tsv timeout 60 $S --streams 16,64 --rounds 3 --frames 100 --json $R/closed-$v.json > $R/closed-$v.log 2>&1; echo rc $?
  grep -v '^{' $R/closed-$v.log | grep -E "^  shared|first audio" | sed -n '1,12p' | cut -c1-150
done
for v in graphs eager; do
  g=1; case $v in eager*) g=0;; esac
  st "long $v"; OMNITTS_BATCHED_PREFILL_GRAPHS=$g timeout 40 $S --streams 64 --frames 250 --json $R/long-$v.json > $R/long-$v.log 2>&1; echo rc $?
  grep -v '^{' $R/long-$v.log | grep -E "^  shared|first audio"
done
l=$(left); [ $l -gt 110 ] && { st "protocol 40 seed 2"; timeout 110 $S --rates 40 --seeds 2 --warmup-s 30 --duration 60 --drain-s 10 --json $R/protocol-40-s2.json > $R/protocol-40-s2.log 2>&1; echo rc $?; grep -v '^{' $R/protocol-40-s2.log | tail -5; }
l=$(left); [ $l -gt 120 ] && { st "0.6b protocol 40 seed 1"; $B/bench_gpu --build-only /tmp/ckpt --sizes 0.6b --template $T > $R/build-0.6b.log 2>&1; timeout 110 $B/bench_streams --model-dir /tmp/ckpt/0.6b --device cuda:0 --shared-only --decoder-dtype bfloat16 --rates 40 --seeds 1 --warmup-s 30 --duration 60 --drain-s 10 --json $R/protocol-0.6b-40-s1.json > $R/protocol-0.6b-40-s1.log 2>&1; echo rc $?; grep -v '^{' $R/protocol-0.6b-40-s1.log | tail -5; }
