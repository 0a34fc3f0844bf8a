#!/usr/bin/env bash
# Session 34 call 3: the 64-stream aggregate on a second machine, no priorities against stage 0 at the greatest and lane>ar.
set -uo pipefail
B=/tmp/o/bin T=tests/fixtures/tiny-customvoice R=/tmp/r3
mkdir -p $R /tmp/o; [ -x $B/bench_streams ] || tar -C /tmp/o -xJf .gpu/bins-s34.tar.xz
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
t0=$(date +%s); st() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
save() { tar -C $R -czf $OUT/call3.tgz .; }
[ -d /tmp/ckpt/1.7b ] || $B/bench_gpu --build-only /tmp/ckpt --sizes 1.7b --template $T > $R/build.log 2>&1
S="$B/bench_streams --model-dir /tmp/ckpt/1.7b --device cuda:0 --shared-only --decoder-dtype bfloat16"
for v in none:none ranked:'lane>ar' ar:ar none2:none ranked2:'lane>ar' ar2:ar; do
  IFS=: read n p <<< "$v"
  st "long $n ($p)"; OMNITTS_STREAM_PRIORITY=$p timeout 40 $S --streams 64 --frames 250 --json $R/long-$n.json > $R/long-$n.log 2>&1
  grep -E "^  shared" $R/long-$n.log; save
done
st done
