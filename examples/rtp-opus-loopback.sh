#!/usr/bin/env bash
# Live omnittssrc -> Opus -> RTP -> udpsink 127.0.0.1, received by a second gst-launch into a WAV.
# Usage: examples/rtp-opus-loopback.sh [model] [text] [seconds]
#   model   default tests/fixtures/tiny-customvoice (random weights: sound, not speech)
#   text    default "Hello over RTP."
#   seconds how long the sender runs (default 4)
# Needs a build (cargo build); writes rtp-received.wav.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-tests/fixtures/tiny-customvoice}
text=${2:-"Hello over RTP."}
secs=${3:-4}
port=${OMNITTS_RTP_PORT:-5004}
export GST_PLUGIN_PATH="${CARGO_TARGET_DIR:-$PWD/target}/debug"

gst-launch-1.0 -q -e udpsrc address=127.0.0.1 port="$port" \
    caps="application/x-rtp,media=audio,clock-rate=48000,encoding-name=OPUS,payload=96" \
    ! rtpjitterbuffer ! rtpopusdepay ! opusdec ! audioconvert ! wavenc \
    ! filesink location=rtp-received.wav &
receiver=$!
sleep 0.5
timeout -s INT "$secs" gst-launch-1.0 -q -e omnittssrc is-live=true model="$model" text="$text" \
    ! audioconvert ! audioresample ! opusenc ! rtpopuspay pt=96 \
    ! udpsink host=127.0.0.1 port="$port" || true
sleep 0.5
kill -INT "$receiver"
wait "$receiver" || true
soxi rtp-received.wav
