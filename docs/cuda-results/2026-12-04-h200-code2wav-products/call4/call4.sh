#!/usr/bin/env bash
# Call 4: the open loop at more seeds (1.7B), greedy, and 0.6B, on call 3's binaries.
set -uo pipefail
o=/tmp/o out=/tmp/res4; mkdir -p $out
[ -d /tmp/ckpt/1.7b ] && [ -d /tmp/ckpt/0.6b ] || $o/bin/bench_gpu --build-only /tmp/ckpt --sizes 0.6b,1.7b \
  --template $o/fx/tiny-customvoice > $out/build.log 2>&1
open() { # NAME SIZE LIMIT ARGS...
  local name=$1 size=$2 limit=$3; shift 3
  echo "== $name"
  timeout $limit $o/bin/bench_streams --model-dir /tmp/ckpt/$size --device cuda:0 --shared-only \
    --decoder-dtype bfloat16 --warmup-s 5 --duration 20 --drain-s 10 --json $out/$name.json "$@" > $out/$name.log 2>&1
  grep -v '^{' $out/$name.log | grep -E "^ +[0-9]|highest|every" | tail -8
}
open open-1.7b-seeds23 1.7b 230 --rates 1,10,20,40 --seeds 2,3
open open-1.7b-greedy 1.7b 120 --rates 1,10,20,40 --seeds 1 --greedy
open open-0.6b 0.6b 120 --rates 1,10,20,40 --seeds 1
