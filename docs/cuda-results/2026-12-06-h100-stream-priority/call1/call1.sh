#!/usr/bin/env bash
# Session 34 call 1: checks of main's unrun kernels, stage 0 alone at 1/64 rows against the binary before
# the attention blocks, and the 64-stream aggregate with stage 0's stream at the greatest priority (A/B).
set -uo pipefail
B=/tmp/o/bin O=/tmp/o/oldbin T=tests/fixtures/tiny-customvoice R=/tmp/r
rm -rf /tmp/o $R; mkdir -p $R /tmp/o && tar -C /tmp/o -xJf .gpu/bins-s34.tar.xz && tar -C /tmp/o -xJf .gpu/bins-old-gpu.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee $R/gpu.txt
t0=$(date +%s); st() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
st kernels; timeout 150 $B/gpu_parity --check-kernels --device cuda:0 > $R/kernels.log 2>&1; echo rc $?
grep -cE " ok$" $R/kernels.log; grep -E "FAIL|kernel checks" $R/kernels.log | head
$B/bench_gpu --build-only /tmp/ckpt --sizes 1.7b --template $T > $R/build.log 2>&1
for v in new old new2 old2; do
  bin=$B; case $v in old*) bin=$O;; esac
  st "rows $v"; timeout 90 $bin/bench_gpu --template $T --sizes 1.7b --sample --rows 1,64 --frames 60 --workdir /tmp --json $R/rows-$v.json > $R/rows-$v.log 2>&1
  grep "stage 0 alone" $R/rows-$v.log
done
S="$B/bench_streams --model-dir /tmp/ckpt/1.7b --device cuda:0 --shared-only --decoder-dtype bfloat16"
# NAME:PRIORITY:STANDING_PREFILL
for v in base:none:1 stand0:none:0 ar:ar:1 lane:ar,lane:1 base2:none:1 stand02:none:0 ar2:ar:1 lane2:ar,lane:1; do
  IFS=: read n p sp <<< "$v"
  st "long $n"; OMNITTS_STREAM_PRIORITY=$p OMNITTS_STANDING_PREFILL=$sp timeout 100 $S --streams 1,64 --frames 250 --json $R/long-$n.json > $R/long-$n.log 2>&1
  grep -E "^  shared" $R/long-$n.log
done
st done; tar -C $R -czf $OUT/call1.tgz .
