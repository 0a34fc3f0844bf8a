#!/usr/bin/env bash
# Session 34 call 2: ranked stream priorities. Closed loop 64 x 250 with the lane above stage 0 above Code2Wav,
# then the open loop (protocol timing: 30 s warm-up + 60 s) at 40/s: none / ar,lane / lane>ar, seeds 1 and 2.
set -uo pipefail
B=/tmp/o/bin T=tests/fixtures/tiny-customvoice R=/tmp/r2
rm -rf /tmp/o $R; mkdir -p $R /tmp/o && tar -C /tmp/o -xJf .gpu/bins-s34.tar.xz
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
t0=$(date +%s); st() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
save() { tar -C $R -czf $OUT/call2.tgz .; }
$B/bench_gpu --build-only /tmp/ckpt --sizes 1.7b --template $T > $R/build.log 2>&1
S="$B/bench_streams --model-dir /tmp/ckpt/1.7b --device cuda:0 --shared-only --decoder-dtype bfloat16"
st "long lane>ar"; OMNITTS_STREAM_PRIORITY='lane>ar' timeout 60 $S --streams 1,64 --frames 250 --json $R/long-ranked.json > $R/long-ranked.log 2>&1
grep -E "^  shared|priority" $R/long-ranked.log; save
for v in none:1:none ranked:1:'lane>ar' equal:1:'ar,lane' ranked:2:'lane>ar' none:2:none; do
  IFS=: read n seed p <<< "$v"
  st "open $n ($p) 40/s seed $seed"; OMNITTS_STREAM_PRIORITY=$p timeout 108 $S --rates 40 --seeds $seed --warmup-s 30 --duration 60 --drain-s 8 --json $R/open-$n-s$seed.json > $R/open-$n-s$seed.log 2>&1
  grep -v '^{' $R/open-$n-s$seed.log | tail -6; save
done
st done
