#!/usr/bin/env bash
# Session 40 call 2 (H200): omnitts' closed loop (250 frames, greedy, 1 / 16 / 64 / 64 streams) and
# faster-qwen3-tts-batch 0.2.0 (B = 1, 16, 64) side by side on the same random weights, then issue 33's
# protocol for RUNS (proto.sh) in the time left of TOTAL.
set -uo pipefail
B=/tmp/o/bin T=tests/fixtures/tiny-customvoice R=/tmp/r
rm -rf /tmp/o $R /tmp/r-proto; mkdir -p $R /tmp/o && tar -C /tmp/o -xJf .gpu/bins.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
t0=$(date +%s); st() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
fin() { st done; tar -C /tmp -czf $OUT/s40c2.tgz r r-proto 2>/dev/null; }
trap fin EXIT
S="$B/bench_streams --model-dir /tmp/ckpt/1.7b --device cuda:0 --shared-only --decoder-dtype bfloat16"
st ckpt; $B/bench_gpu --build-only /tmp/ckpt --sizes 1.7b --template $T > $R/build.log 2>&1; echo rc $?
st warm-up; timeout 90 $S --streams 1,16 --frames 30 > $R/warm-up.log 2>&1; echo rc $?
i=0; for n in ${LONG_STREAMS:-1 16 64 64}; do
  i=$((i+1)); f=$R/long-greedy-$n-$i; st "long $n"; timeout 60 $S --greedy --streams $n --frames 250 --json $f.json > $f.log 2>&1; echo rc $?
  grep -v '^{' $f.log | grep -E "^  shared" | cut -c1-160
done
[ -n "${SKIP_BATCH:-}" ] || {
st batch; (cd .gpu/batch && INSTALL_REF=0 SIZES=1.7b BATCHES=${BATCHES:-1,16,64} SIZE_TIMEOUT=150 OUT=$R/batch timeout 200 bash bench/run_batch_gpu.sh > $R/batch-run.log 2>&1); echo rc $?
grep -E '^ +B=|audio-s/s aggregate' $R/batch/batch.log | cut -c1-200 | head -8
}
[ -n "${RUNS:-}" ] && BUDGET=$(( ${TOTAL:-500} - ($(date +%s) - t0) )) TAG=proto NO_WARMUP=1 bash .gpu/proto.sh
