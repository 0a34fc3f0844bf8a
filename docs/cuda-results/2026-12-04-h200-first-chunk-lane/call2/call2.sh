#!/usr/bin/env bash
# Call 6: the lane (consumer of stage 1's queue, holding a request until 0.5 s of audio, no lost
# wake-up) on vs off: closed loop 1/16/64, then the open loop 1/10/20/40 req/s, seed 1, 1.7B.
set -uo pipefail
mkdir -p /tmp/o/bin /tmp/res && tar -C /tmp/o -xJf .gpu/bins.tar.xz
out=/tmp/res; b=/tmp/o/bin
$b/bench_gpu --build-only /tmp/ckpt --sizes 1.7b --template tests/fixtures/tiny-customvoice > $out/build.log 2>&1
for l in on off; do
  timeout 70 $b/bench_streams --model-dir /tmp/ckpt/1.7b --device cuda:0 --shared-only --decoder-dtype bfloat16 \
    --streams 1,16,64 --frames 100 --first-chunk-lane $l --json $out/closed-lane-$l.json > $out/closed-lane-$l.log 2>&1
  echo "closed lane $l rc $?"; grep -E "shared" $out/closed-lane-$l.log
done
for l in on off; do
  echo "== open lane $l"
  timeout 175 $b/bench_streams --model-dir /tmp/ckpt/1.7b --device cuda:0 --shared-only --decoder-dtype bfloat16 \
    --rates 1,10,20,40 --seeds 1 --warmup-s 5 --duration 20 --drain-s 10 --first-chunk-lane $l \
    --json $out/open-lane-$l.json > $out/open-lane-$l.log 2>&1
  grep -v '^{' $out/open-lane-$l.log | grep -E "^ +[0-9]|first audio|highest|every"
done
