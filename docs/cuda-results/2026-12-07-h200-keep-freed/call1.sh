#!/usr/bin/env bash
# Session 38 call 1 (H200): the 64-stream aggregate by default (base), with stage 0 above Code2Wav
# (OMNITTS_STREAM_PRIORITY=ar) and with the stage config's ranking (lane>ar), in turn, twice;
# faster-qwen3-tts-batch 0.2.0 side by side; then issue 33's protocol for RUNS (proto.sh).
set -uo pipefail
B=/tmp/o/bin T=tests/fixtures/tiny-customvoice R=/tmp/r
rm -rf /tmp/o $R; mkdir -p $R /tmp/o && tar -C /tmp/o -xJf .gpu/bins.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
grep -q H100 $R/gpu.txt && SKIP_BATCH=1
t0=$(date +%s); st() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
left() { echo $(( ${BUDGET:-480} - ($(date +%s) - t0) )); }
fin() { st done; tar -C /tmp -czf $OUT/call1.tgz r r-proto 2>/dev/null; }
trap fin EXIT
st ckpt; $B/bench_gpu --build-only /tmp/ckpt --sizes 1.7b --template $T > $R/build.log 2>&1; echo rc $?
S="$B/bench_streams --model-dir /tmp/ckpt/1.7b --device cuda:0 --shared-only --decoder-dtype bfloat16"
st warm-up; timeout 90 $S --streams 1,16 --frames 30 > $R/warm-up.log 2>&1; echo rc $?
for round in $(seq 1 ${ROUNDS:-2}); do
  for v in ${VARIANTS:-base ar lane-over-ar}; do
    e=(); case $v in ar) e=(OMNITTS_STREAM_PRIORITY=ar);; lane-over-ar) e=(OMNITTS_STREAM_PRIORITY='lane>ar');; nokeep) e=(OMNITTS_KEEP_FREED=0);; esac
    [ $(left) -lt ${LONG_RESERVE:-60} ] && { echo "skip $v $round"; continue; }
    st "long $v $round"; env "${e[@]}" timeout 50 $S --streams ${LONG_STREAMS:-64} --frames 250 --json $R/long-$v-$round.json > $R/long-$v-$round.log 2>&1; echo rc $?
    grep -v '^{' $R/long-$v-$round.log | grep -E "^  shared|GPU|MiB" | cut -c1-160
  done
done
[ -n "${RUNS:-}" ] && BUDGET=$(( ${TOTAL:-540} - ($(date +%s) - t0) )) TAG=proto NO_WARMUP=1 bash .gpu/proto.sh
[ -n "${SKIP_BATCH:-}" ] || [ $(( ${TOTAL:-540} - ($(date +%s) - t0) )) -lt 120 ] || {
st batch; (cd .gpu/batch && INSTALL_REF=0 SIZES=1.7b BATCHES=1,16,64 SIZE_TIMEOUT=150 OUT=$R/batch timeout 180 bash bench/run_batch_gpu.sh > /dev/null 2>&1); echo rc $?
grep -E '^ +(1|16|64) ' $R/batch/batch.log | head -4
}
