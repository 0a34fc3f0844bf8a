#!/usr/bin/env bash
# One command on a fresh Debian/Ubuntu machine: install what is needed, build the plugin, and
# run the main job: text -> omnittssrc -> omnitts-demo.wav.
#
# The checkpoint used here is the element's default, the bundled voice models/omnitts-en: a small
# (46 MB) English single-speaker Qwen3-TTS CustomVoice checkpoint in the real layout, trained by
# scripts/voice/ from a Piper teacher. It speaks, but far less clearly than the released models
# (README.md, "Bundled voice"; real weights: "Real weights").
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
export PATH="$HOME/.cargo/bin:$PATH"

target="${CARGO_TARGET_DIR:-$PWD/target}"
cargo build
export GST_PLUGIN_PATH="$target/debug"
export GST_REGISTRY="$target/gst-registry.bin"

text=${OMNITTS_TEXT:-"Hello. This voice was trained for the plugin, and it speaks plain English."}
out=${OMNITTS_OUT:-omnitts-demo.wav}
gst-launch-1.0 -q omnittssrc text="$text" split-sentences=true \
    ! audioconvert ! audio/x-raw,format=S16LE ! wavenc ! filesink location="$out"

soxi "$out"
echo
echo "Wrote $out ($(soxi -D "$out") s), spoken by the bundled small English voice (models/omnitts-en;"
echo "intelligible in part, see README.md). Released weights: model=Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice."
