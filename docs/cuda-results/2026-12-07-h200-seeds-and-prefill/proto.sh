#!/usr/bin/env bash
# Session 37: issue 33's protocol on the GPU machine (30 s warm-up + 60 s measured a seed, sampled unless
# greedy, first audible audio, player without a buffer). RUNS: space-separated SIZE:MODE:RATE:SEEDS,
# e.g. "1.7b:sampled:10:1,2,3 0.6b:greedy:20:1 1.7b:sampled:20:1:lane" (a fifth field: OMNITTS_STREAM_PRIORITY, or ENV=V,ENV=V).
# TAG names the result tarball.
set -uo pipefail
B=/tmp/o/bin T=tests/fixtures/tiny-customvoice R=/tmp/r-$TAG
rm -rf $R; mkdir -p $R /tmp/o; [ -x $B/bench_streams ] || tar -C /tmp/o -xJf .gpu/bins.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
t0=$(date +%s); st() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
left() { echo $(( ${BUDGET:-560} - ($(date +%s) - t0) )); }
fin() { st done; tar -C $R -czf $OUT/$TAG.tgz .; }
trap fin EXIT
for size in $(for r in $RUNS; do echo ${r%%:*}; done | sort -u); do
  [ -d /tmp/ckpt/$size ] || { st "ckpt $size"; $B/bench_gpu --build-only /tmp/ckpt --sizes $size --template $T > $R/build-$size.log 2>&1; echo rc $?; }
done
[ -n "${NO_WARMUP:-}" ] || { st warm-up; timeout 60 $B/bench_streams --model-dir /tmp/ckpt/1.7b --device cuda:0 --shared-only --decoder-dtype bfloat16 --streams 1,16 --frames 30 > $R/warm-up.log 2>&1; echo rc $?; }
for r in $RUNS; do
  IFS=: read size mode rate seeds prio <<< "$r"
  e=(); case "$prio" in "") ;; *=*) IFS=, read -ra e <<< "$prio";; *) e=(OMNITTS_STREAM_PRIORITY="$prio");; esac
  n=$(echo $seeds | tr ',' ' ' | wc -w); need=$(( n * 96 + 10 ))
  [ $(left) -lt $need ] && { echo "skip $r: $(left) s left"; continue; }
  g=(); [ $mode = greedy ] && g=(--greedy)
  name=protocol-$size-$mode-$rate-s${seeds//,/}${prio:+-$(echo "$prio" | tr '>=,' '-_-')}
  st "$name ${e[*]}"; env "${e[@]}" timeout $need $B/bench_streams --model-dir /tmp/ckpt/$size --device cuda:0 --shared-only --decoder-dtype bfloat16 "${g[@]}" --rates $rate --seeds $seeds --warmup-s 30 --duration 60 --drain-s 10 --json $R/$name.json > $R/$name.log 2>&1; echo rc $?
  grep -v '^{' $R/$name.log | grep -vE '^(engine|open loop)' | tail -$(( n * 4 + 4 )) | cut -c1-200
done
