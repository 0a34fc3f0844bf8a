#!/usr/bin/env bash
# Call 3: final figures with the products over the history (vectorised shift_cols) and the model seam,
# and the seam's A/B for Qwen3-TTS speed: the binaries before the seam (call 2's) against after, one run.
set -uo pipefail
o=/tmp/o out=/tmp/res3; mkdir -p $out
STEPS="kernels c2w" PRECISIONS="bf16 f32" BUDGET_S=200 bash .gpu/gpu-code2wav.sh $o/bin $o/fx/tiny-customvoice $o/voice $out
for v in before after; do
  b=$o/bin; [ $v = before ] && b=$o/old
  echo "== stage 0 batch 1, $v the seam"
  timeout 100 $b/bench_gpu --template $o/fx/tiny-customvoice --sizes 1.7b --frames 100 --repeats 3 --graphs on \
    --first-chunks 1 --workdir /tmp --json $out/stage0-$v.json > $out/stage0-$v.log 2>&1; tail -4 $out/stage0-$v.log
  echo "== closed loop, $v the seam"
  timeout 100 $b/bench_streams --model-dir /tmp/ckpt/1.7b --device cuda:0 --shared-only --decoder-dtype bfloat16 \
    --streams 1,16,64 --frames 100 --json $out/closed-$v.json > $out/closed-$v.log 2>&1; grep shared $out/closed-$v.log
done
echo "== open loop"
timeout 200 $o/bin/bench_streams --model-dir /tmp/ckpt/1.7b --device cuda:0 --shared-only --decoder-dtype bfloat16 \
  --rates 1,10,20,40 --seeds 1 --warmup-s 5 --duration 20 --drain-s 15 --json $out/open.json > $out/open.log 2>&1
grep -v '^{' $out/open.log | tail -12
echo "== open loop, Code2Wav passes of at most 128 frames"
timeout 150 $o/bin/bench_streams --model-dir /tmp/ckpt/1.7b --device cuda:0 --shared-only --decoder-dtype bfloat16 \
  --rates 10,20,40 --seeds 1 --warmup-s 5 --duration 20 --drain-s 15 --decoder-pass-frames 128 \
  --json $out/open-pass128.json > $out/open-pass128.log 2>&1
grep -v '^{' $out/open-pass128.log | tail -9
echo "== closed loop 64, passes of at most 128 frames"
timeout 60 $o/bin/bench_streams --model-dir /tmp/ckpt/1.7b --device cuda:0 --shared-only --decoder-dtype bfloat16 \
  --streams 64 --frames 100 --decoder-pass-frames 128 --json $out/closed-pass128.json > $out/closed-pass128.log 2>&1
grep shared $out/closed-pass128.log
