#!/usr/bin/env bash
# Session 36 call 1 (H200): kernel checks, closed loop with the first audio in parts, 64 x 250 with and
# without stage 0 at the greatest priority, the protocol at 10 and 20 requests/s (seed 1).
set -uo pipefail
B=/tmp/o/bin T=tests/fixtures/tiny-customvoice R=/tmp/r
rm -rf /tmp/o $R; mkdir -p $R /tmp/o && tar -C /tmp/o -xJf .gpu/bins.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee $R/gpu.txt
t0=$(date +%s); st() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
fin() { st done; tar -C $R -czf $OUT/call1.tgz .; }
trap fin EXIT
st kernels; timeout 100 $B/gpu_parity --check-kernels --device cuda:0 > $R/kernels.log 2>&1; echo rc $?
grep -cE " ok$" $R/kernels.log; grep -E "FAIL|kernel checks" $R/kernels.log | head
st ckpt; $B/bench_gpu --build-only /tmp/ckpt --sizes 1.7b --template $T > $R/build.log 2>&1; echo rc $?
S="$B/bench_streams --model-dir /tmp/ckpt/1.7b --device cuda:0 --shared-only --decoder-dtype bfloat16"
st warm-up; timeout 100 $S --streams 1,16 --frames 30 > $R/warm-up.log 2>&1; echo rc $?
st closed; timeout 100 $S --streams 1,4,16,64 --frames 100 --json $R/closed.json > $R/closed.log 2>&1; echo rc $?
grep -v '^{' $R/closed.log | tail -22
for v in none ar none2 ar2; do
  p=${v%2}
  st "long $v"; OMNITTS_STREAM_PRIORITY=$p timeout 60 $S --streams 64 --frames 250 --json $R/long-$v.json > $R/long-$v.log 2>&1
  grep -v '^{' $R/long-$v.log | grep -E "^  shared|first audio|queue|prefill" | head -6
done
for rate in 10 20; do
  st "protocol $rate"; timeout 120 $S --rates $rate --seeds 1 --warmup-s 30 --duration 60 --drain-s 10 --json $R/protocol-$rate.json > $R/protocol-$rate.log 2>&1; echo rc $?
  grep -v '^{' $R/protocol-$rate.log | tail -14
done
