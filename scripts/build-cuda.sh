#!/usr/bin/env bash
# Build omnitts' CUDA binaries (feature `cuda`) on a machine WITHOUT a GPU or a system CUDA toolkit.
#
# With a normal CUDA toolkit installed (nvcc on PATH, a driver), this script is not needed:
#   cargo build --release --features cuda
#
# What it does (details: README.md, "GPU build"):
#  1. a Python venv with nvcc 13.0 and the CUDA 13 libraries from PyPI (pinned; nvcc must not be newer than
#     the target driver's CUDA version, 13.0 for driver 580, or the PTX will not load);
#  2. a link-only folder: unversioned symlinks to those libraries and a stub libcuda.so that exports the driver
#     symbols cudarc links against (the real libcuda.so.1 of the GPU machine's driver is used at run time);
#  3. cargo build --release --features cuda with sm_90 (H100/H200) kernels and an rpath to the CUDA libraries
#     on the GPU machine.
#
# Environment knobs:
#   OMNITTS_CUDA_DIR      work folder for the venv and link folder   (default: .cuda-build)
#   CUDA_COMPUTE_CAP      target compute capability                  (default: 90)
#   OMNITTS_CUDA_RPATH    CUDA library folder on the GPU machine     (default: the PyTorch venv of our GPU machines)
#   CARGO_TARGET_DIR      cargo's target folder                       (default: target-cuda)
#   CHECK=1               step 3 runs `cargo check --features cuda --lib --examples` instead (type-checks the
#                         CUDA code and compiles the kernels to PTX, without the slow release build);
#                         CHECK=clippy runs `cargo clippy` on the same targets
#   extra arguments are passed to cargo build (e.g. --example bench) or cargo check
set -euo pipefail
cd "$(dirname "$0")/.."

work=${OMNITTS_CUDA_DIR:-$PWD/.cuda-build}
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
rpath=${OMNITTS_CUDA_RPATH:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target-cuda}

mkdir -p "$work"
# The marker is written once the install has completed (an interrupted one is redone).
if [ ! -f "$work/venv/.installed" ]; then
    python3 -m venv "$work/venv"
    "$work/venv/bin/pip" install -q \
        nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-cuda-cccl==13.0.85 \
        nvidia-cuda-runtime==13.0.96 nvidia-cublas==13.1.0.3 nvidia-cuda-nvrtc==13.0.88 nvidia-curand==10.4.0.35
    touch "$work/venv/.installed"
fi
cu13=$("$work/venv/bin/python" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))')

cargo fetch -q
link="$work/cuda-link"
if [ ! -f "$link/lib/libcuda.so" ]; then
    mkdir -p "$link/lib"
    for l in libcublas.so.13 libcublasLt.so.13 libnvrtc.so.13 libcudart.so.13 libcurand.so.10; do
        ln -sf "$cu13/lib/$l" "$link/lib/${l%%.so.*}.so"
    done
    cudarc=$(cargo metadata --format-version 1 --features cuda | python3 -c \
        'import json,sys; print(next(p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"]=="cudarc").rsplit("/",1)[0])')
    grep -oE 'pub unsafe fn cu[A-Za-z0-9_]+' "$cudarc/src/driver/sys/mod.rs" | sort -u |
        sed -E 's/pub unsafe fn (.*)/void \1(void) {}/' > "$link/libcuda_stub.c"
    gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$link/lib/libcuda.so" "$link/libcuda_stub.c"
fi

export PATH="$cu13/bin:$PATH" NVCC="$cu13/bin/nvcc" CUDARC_CUDA_VERSION=13000 CUDA_ROOT="$link"
unset CUDA_HOME CUDA_PATH
export RUSTFLAGS="${RUSTFLAGS:-} -C link-arg=-Wl,-rpath,$rpath"
if [ "${CHECK:-0}" = 1 ]; then
    cargo check --features cuda --lib --examples "$@"
elif [ "${CHECK:-0}" = clippy ]; then
    cargo clippy --features cuda --lib --examples "$@"
else
    cargo build --release --features cuda "$@"
fi
