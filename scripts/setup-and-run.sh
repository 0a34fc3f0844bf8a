#!/usr/bin/env bash
# One command on a fresh Debian/Ubuntu machine: install what is needed, build the plugin, and
# run the main job: text -> omnittssrc -> omnitts-demo.wav.
#
# The checkpoint used here is tests/fixtures/tiny-customvoice: a 12 MB Qwen3-TTS CustomVoice
# checkpoint with the real file layout, tokenizer and codec ids but tiny, RANDOM weights. It makes
# sound, not speech. For speech use the real weights (README.md, "Real weights").
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
export PATH="$HOME/.cargo/bin:$PATH"

target="${CARGO_TARGET_DIR:-$PWD/target}"
cargo build
export GST_PLUGIN_PATH="$target/debug"
export GST_REGISTRY="$target/gst-registry.bin"

text=${OMNITTS_TEXT:-"Hello from omnitts. This sentence goes from text to a WAV file through GStreamer."}
out=${OMNITTS_OUT:-omnitts-demo.wav}
gst-launch-1.0 -q omnittssrc model=tests/fixtures/tiny-customvoice text="$text" \
    ! audioconvert ! audio/x-raw,format=S16LE ! wavenc ! filesink location="$out"

soxi "$out"
echo
echo "Wrote $out ($(soxi -D "$out") s). The tiny checkpoint has random weights: the file contains"
echo "sound, not speech. Real speech: model=Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice (see README.md)."
