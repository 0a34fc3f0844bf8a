#!/usr/bin/env bash
# Installs what building and testing omnitts needs on Debian/Ubuntu: a C toolchain, pkg-config,
# GStreamer 1.22+ development files, gst-launch/gst-inspect, the base and good plugins (audioconvert,
# audioresample, opusenc/opusdec, wavenc, rtpopuspay, udpsink/udpsrc, autoaudiosink), sox (soxi),
# libsoxr (the resampler of voice-clone references, as the reference's librosa uses it), libclang
# (bindgen, at build time, for the signalsmith-stretch crate of omnittssynth's overflow=compress),
# and Rust through rustup when no cargo is on PATH.
set -euo pipefail

sudo=""
if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends \
    build-essential pkg-config ca-certificates curl \
    libgstreamer1.0-dev libgstreamer-plugins-base1.0-dev libsoxr-dev libclang-dev \
    gstreamer1.0-tools gstreamer1.0-plugins-base gstreamer1.0-plugins-good \
    sox

if ! command -v cargo >/dev/null 2>&1; then
    if [ ! -x "$HOME/.cargo/bin/cargo" ]; then
        # The crate needs Rust >= 1.92 (edition 2024); distribution packages are older.
        curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
    fi
    echo "Rust is in \$HOME/.cargo/bin; the scripts add it to PATH themselves."
fi
