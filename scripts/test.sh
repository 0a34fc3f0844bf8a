#!/usr/bin/env bash
# Runs all of omnitts' tests (after scripts/setup-and-run.sh, or scripts/install-deps.sh, once):
#  1. builds the plugin (cargo test does not refresh the .so that gst-inspect/gst-launch load);
#  2. command-line checks against a private GST_REGISTRY: gst-inspect-1.0 omnittssrc and
#     omnittssynth, a gst-launch-1.0 pipeline into a WAV file whose length and buffer
#     timestamps are checked, and subtitles through omnittssynth into a WAV dub track;
#  3. scripts/install.sh into a temporary prefix, and the installed plugin speaking with the installed
#     bundled voice from another directory;
#  4. cargo test: every unit and integration test of the crate.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

target="${CARGO_TARGET_DIR:-$PWD/target}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "== cargo build"
cargo build

echo "== gst-inspect-1.0 omnittssrc (private registry)"
export GST_REGISTRY="$work/registry.bin"
GST_PLUGIN_PATH="$target/debug" gst-inspect-1.0 omnittssrc > "$work/inspect.txt"
for want in "Source/Audio" "omnitts" "push-text" "samples-per-buffer" "is-live" "(int)24000" "(int)44100"; do
    grep -q -- "$want" "$work/inspect.txt" || { echo "gst-inspect output lacks '$want'"; exit 1; }
done
echo "ok: omnittssrc registered ($(grep -m1 'Version' "$work/inspect.txt" | xargs))"

echo "== gst-inspect-1.0 omnittssynth (private registry)"
GST_PLUGIN_PATH="$target/debug" gst-inspect-1.0 omnittssynth > "$work/inspect-synth.txt"
for want in "Filter/Audio/Text" "text/x-raw" "pango-markup" "overflow" "latency" "speaker-map" \
        "max-new-tokens" "(int)24000" "(int)44100"; do
    grep -q -- "$want" "$work/inspect-synth.txt" \
        || { echo "gst-inspect omnittssynth output lacks '$want'"; exit 1; }
done
echo "ok: omnittssynth registered"

echo "== gst-launch-1.0: text -> WAV, timestamps checked"
wav="$work/out.wav"
GST_PLUGIN_PATH="$target/debug" gst-launch-1.0 -m -v \
    omnittssrc model=tests/fixtures/tiny-customvoice do-sample=false max-new-tokens=20 \
        text="Checking the command line." \
    ! tee name=t ! queue ! audioconvert ! wavenc ! filesink location="$wav" \
    t. ! queue ! fakesink silent=false > "$work/launch.txt" 2>&1 \
    || { tail -20 "$work/launch.txt"; exit 1; }
# Buffers: contiguous offsets, PTS = offset * 1e9 / 24000 (floor), duration = pts(end) - pts(start),
# DISCONT on the first buffer only. Prints "<buffers> <samples>".
summary=$(grep -E '^/GstPipeline:pipeline0/GstFakeSink:fakesink0: last-message = chain' "$work/launch.txt" | awk '
    function ns(t,   a, s) { split(t, a, ":"); split(a[3], s, ".");
        return ((a[1] * 60 + a[2]) * 60 + s[1]) * 1000000000 + s[2] }
    function pts(n) { return int(n * 1000000000 / 24000) }
    {
        match($0, /pts: [0-9:.]+/);        p = ns(substr($0, RSTART + 5, RLENGTH - 5))
        match($0, /duration: [0-9:.]+/);   d = ns(substr($0, RSTART + 10, RLENGTH - 10))
        match($0, /offset: [0-9]+/);       o = substr($0, RSTART + 8, RLENGTH - 8) + 0
        match($0, /offset_end: [0-9]+/);   e = substr($0, RSTART + 12, RLENGTH - 12) + 0
        disc = ($0 ~ /discont/)
        if (o != next_off) { print "buffer " NR ": offset " o ", expected " next_off > "/dev/stderr"; bad = 1 }
        if (p != pts(o)) { print "buffer " NR ": pts " p ", expected " pts(o) > "/dev/stderr"; bad = 1 }
        if (d != pts(e) - pts(o)) { print "buffer " NR ": duration " d > "/dev/stderr"; bad = 1 }
        if (disc != (NR == 1)) { print "buffer " NR ": discont flag " disc > "/dev/stderr"; bad = 1 }
        next_off = e; n = NR
    }
    END { if (bad || n == 0) exit 1; print n, next_off }')
read -r buffers samples <<< "$summary"
frames=$(grep -o 'omnitts/utterance-done.*frames=(guint64)[0-9]*' "$work/launch.txt" | grep -o '[0-9]*$')
wav_samples=$(soxi -s "$wav" 2>/dev/null)
echo "buffers=$buffers samples=$samples frames=$frames wav_samples=$wav_samples"
[ "$samples" -eq $((frames * 1920)) ] || { echo "samples != frames * 1920"; exit 1; }
[ "$wav_samples" -eq "$samples" ] || { echo "WAV length != samples pushed"; exit 1; }
[ "$(soxi -r "$wav" 2>/dev/null)" = 24000 ] && [ "$(soxi -c "$wav" 2>/dev/null)" = 1 ] \
    || { echo "WAV is not 24 kHz mono"; exit 1; }
echo "ok: WAV of $wav_samples samples = $frames frames x 1920, $buffers contiguous buffers"

echo "== gst-launch-1.0: subtitles -> WAV dub track (omnittssynth)"
cat > "$work/cues.srt" <<'SRT'
1
00:00:00,250 --> 00:00:01,000
First cue.

2
00:00:01,500 --> 00:00:03,000
<i>Second cue.</i>
SRT
GST_PLUGIN_PATH="$target/debug" gst-launch-1.0 -m \
    filesrc location="$work/cues.srt" ! subparse \
    ! omnittssynth model=tests/fixtures/tiny-customvoice do-sample=false max-new-tokens=10 \
    ! audioconvert ! wavenc ! filesink location="$work/dub.wav" > "$work/launch-synth.txt" 2>&1 \
    || { tail -20 "$work/launch-synth.txt"; exit 1; }
# Each cue's first audio sample at its SRT start; the WAV runs on past the second cue's start.
for start in 250000000 1500000000; do
    grep 'omnitts/cue' "$work/launch-synth.txt" | grep -q "start=(guint64)$start," \
        || { echo "no cue starting at $start ns"; grep 'omnitts/cue' "$work/launch-synth.txt"; exit 1; }
done
grep 'omnitts/cue' "$work/launch-synth.txt" | grep -q 'text=(string)"Second\\ cue."' \
    || { echo "the markup of cue 2 was not stripped"; exit 1; }
# The stream ends at the last cue's end, 3 s (its slot's end: the speech fits, silence follows).
last_cue=$(grep -o 'omnitts/cue, id=(guint64)2,.*' "$work/launch-synth.txt")
last_pts=$(grep -o 'pts=(guint64)[0-9]*' <<< "$last_cue" | grep -o '[0-9]*$')
last_slot=$(grep -o 'slot-duration=(guint64)[0-9]*' <<< "$last_cue" | grep -o '[0-9]*$')
last_speech_end=$(grep -o ' end=(guint64)[0-9]*' <<< "$last_cue" | grep -o '[0-9]*$')
last_end=$((last_pts + last_slot))
[ "$last_end" -eq 3000000000 ] && [ "$last_speech_end" -le "$last_end" ] \
    || { echo "the last cue: $last_cue"; exit 1; }
dub_samples=$(soxi -s "$work/dub.wav" 2>/dev/null)
[ "$dub_samples" -eq $((last_end * 24 / 1000000)) ] \
    || { echo "dub WAV of $dub_samples samples, the last cue ends at $last_end ns"; exit 1; }
[ "$(soxi -r "$work/dub.wav" 2>/dev/null)" = 24000 ] || { echo "dub WAV is not 24 kHz"; exit 1; }
echo "ok: dub WAV of $dub_samples samples, cues at 0.25 s and 1.5 s, ending with the last cue's end"

echo "== scripts/install.sh into a temporary prefix; the installed plugin speaks from another directory"
# The installed plugin must find the installed voice with no model set: GST_PLUGIN_PATH names only
# the prefix's plugin directory, the XDG data directories are empty, OMNITTS_VOICE_DIR is unset, and
# where user namespaces allow it the source tree's models/ is hidden under an empty tmpfs.
prefix="$work/prefix"
bash scripts/install.sh --prefix "$prefix" --debug --no-build > "$work/install.txt" \
    || { cat "$work/install.txt"; exit 1; }
plugindir="$prefix/lib/gstreamer-1.0"
voicedir="$prefix/share/omnitts/voices/omnitts-en"
[ -f "$plugindir/libgstomnitts.so" ] && [ -f "$voicedir/model.safetensors" ] \
    || { echo "install.sh did not install plugin and voice"; cat "$work/install.txt"; exit 1; }
hide=()
if unshare --user --map-root-user --mount sh -c 'mount -t tmpfs tmpfs "$0"' "$PWD/models" 2>/dev/null; then
    hide=(unshare --user --map-root-user --mount sh -c 'mount -t tmpfs tmpfs "$0" && exec "$@"' "$PWD/models")
    hidden="source tree's models/ hidden"
else
    hidden="no user namespaces: source tree not hidden, the voice's path is checked"
fi
mkdir -p "$work/elsewhere" "$work/empty"
(
    cd "$work/elsewhere"
    unset OMNITTS_VOICE_DIR
    export GST_PLUGIN_PATH="$plugindir" GST_REGISTRY="$work/installed-registry.bin" \
        XDG_DATA_HOME="$work/empty" XDG_DATA_DIRS="$work/empty"
    "${hide[@]}" gst-inspect-1.0 omnittssrc > inspect.txt
    grep -q "Filename *$plugindir/libgstomnitts.so" inspect.txt \
        || { echo "gst-inspect did not load the installed plugin"; grep Filename inspect.txt; exit 1; }
    "${hide[@]}" gst-launch-1.0 -m omnittssrc text="Spoken by the installed plugin." max-new-tokens=40 \
        ! audioconvert ! wavenc ! filesink location=installed.wav > launch.txt 2>&1 \
        || { tail -20 launch.txt; exit 1; }
    grep -q "($voicedir;" launch.txt \
        || { echo "the voice did not come from $voicedir"; grep -m1 "ready" launch.txt; exit 1; }
    [ "$(soxi -s installed.wav 2>/dev/null)" -gt 0 ] || { echo "no audio"; exit 1; }
    echo "ok: installed plugin + voice ($hidden): $(soxi -s installed.wav 2>/dev/null) samples from $voicedir"
)

echo "== cargo test"
# Tests register the plugin statically; GST_PLUGIN_PATH stays unset so the .so is not loaded too.
log="$work/cargo-test.log"
set +e
GST_REGISTRY="$work/test-registry.bin" cargo test --no-fail-fast 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
# One closing line over all test binaries (cargo's own last line is the doc-test binary's).
awk '/^test result:/ {
        for (i = 2; i <= NF; i++) {
            if ($i == "passed;") passed += $(i - 1)
            if ($i == "failed;") failed += $(i - 1)
        }
    }
    END { printf "total: %d passed, %d failed\n", passed, failed }' "$log"
exit "$status"
