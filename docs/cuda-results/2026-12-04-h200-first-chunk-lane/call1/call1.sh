#!/usr/bin/env bash
# Call 1: the first-chunk lane off vs on, open loop 1.7B (1/10/20/40 req/s, seed 1) and closed loop.
set -uo pipefail
mkdir -p /tmp/o/bin /tmp/res && tar -C /tmp/o -xJf .gpu/bins.tar.xz
nvidia-smi --query-gpu=name,memory.used --format=csv | tail -1
STEPS=lane RATES=1,10,20,40 SEEDS=1 STREAMS=1,16,64 BUDGET_S=560 \
  bash scripts/gpu-first-audio.sh /tmp/o/bin tests/fixtures/tiny-customvoice /tmp/res 2>&1
