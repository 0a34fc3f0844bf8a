#!/usr/bin/env bash
# Packs what scripts/gpu-run.sh needs on a GPU machine without Rust or network into PACK_DIR:
#   scripts/gpu-pack.sh PACK_DIR [BIN_DIR]
# BIN_DIR: the CUDA build's binaries (default target-cuda/release/examples, from
# `scripts/build-cuda.sh --example gpu_parity --example bench_gpu --example bench_streams`). The reference's wheels are
# downloaded into PACK_DIR/whl unless already there (pip download, Python 3.12 manylinux); the
# reference bench is taken from $OMNITTS_REF_BENCH (default /work/shared/bench).
set -euo pipefail
cd "$(dirname "$0")/.."
pack=$1
bins=${2:-target-cuda/release/examples}
ref=${OMNITTS_REF_BENCH:-/work/shared/bench}
mkdir -p "$pack/bin-stage/bin" "$pack/fx-stage/fixtures/reference" "$pack/bench" "$pack/whl"
cp "$bins/gpu_parity" "$bins/bench_gpu" "$bins/bench_streams" "$pack/bin-stage/bin/"
tar -C "$pack/bin-stage" -cf - bin | xz -9 -T1 > "$pack/bins.tar.xz"
# Fixtures: the checkpoints with stage-0 reference cases (tiny-base's are voice-clone cases, which
# gpu_parity skips), without voicedesign's codec weights (not used by stage 0).
for c in tiny-customvoice tiny-voicedesign; do
    cp "tests/fixtures/reference/$c.json" "$pack/fx-stage/fixtures/reference/"
    cp -rL "tests/fixtures/$c" "$pack/fx-stage/fixtures/"
done
rm "$pack/fx-stage/fixtures/tiny-voicedesign/speech_tokenizer/model.safetensors"
tar -C "$pack/fx-stage" -cf - fixtures | xz -9 -T2 > "$pack/fixtures.tar.xz"
rm -rf "$pack/bin-stage" "$pack/fx-stage"
cp "$ref/ref_bench.py" "$pack/bench/"
cp -r "$ref/tok" "$pack/bench/"
cp scripts/bench_compare.py scripts/gpu-run.sh "$pack/"
if ! ls "$pack"/whl/*.whl >/dev/null 2>&1; then
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$pack/whl" transformers==4.57.3 accelerate==1.12.0 tokenizers==0.22.1 qwen-tts==0.1.1
fi
du -sh "$pack"/*
