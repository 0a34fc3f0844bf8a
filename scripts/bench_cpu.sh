#!/usr/bin/env bash
# CPU benchmark of stage 0's weight forms (docs/cpu.md): random weights of the real 0.6B and 1.7B
# CustomVoice shapes, greedy, FRAMES frames, every form in its own process (so that each peak RSS is
# its own), and TrevorS/qwen3-tts-rs on the same checkpoint in the same run for the ratio.
#
#   bash scripts/bench_cpu.sh OUT_DIR
#
# Environment:
#   SIZES          checkpoint sizes                      (default "0.6b 1.7b")
#   FORMS          omnitts configurations, each DTYPE:QUANTIZATION
#                                                        (default "float32:none bfloat16:none auto:q8_0 auto:q4_k")
#   FRAMES         frames per utterance                  (default 40)
#   RUNS           measured runs after one warm-up       (default 1)
#   THREADS        RAYON_NUM_THREADS for every process   (default 2)
#   CKPT_ROOT      where the random checkpoints are kept (default OUT_DIR; ~2.3 GB / 4.9 GB)
#   BENCH          omnitts' bench binary                  (default target/release/examples/bench)
#   TREVORS_BIN    TrevorS' generate_audio, built with `cargo build --release --features cli
#                  --bin generate_audio` (skipped when unset or missing)
# Writes OUT_DIR/<size>-<form>.json (bench reports), OUT_DIR/<size>-trevors.txt, and prints a table.
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:?usage: bench_cpu.sh OUT_DIR}
mkdir -p "$out"
sizes=${SIZES:-"0.6b 1.7b"}
forms=${FORMS:-"float32:none bfloat16:none auto:q8_0 auto:q4_k"}
frames=${FRAMES:-40}
runs=${RUNS:-1}
threads=${THREADS:-2}
ckpt_root=${CKPT_ROOT:-$out}
bench=${BENCH:-target/release/examples/bench}
text="The quick brown fox jumps over the lazy dog, again and again."
export RAYON_NUM_THREADS=$threads

for size in $sizes; do
    ckpt="$ckpt_root/random-$size"
    if [ ! -f "$ckpt/model.safetensors" ]; then
        # Writes the checkpoint, then measures nothing (no mode given).
        "$bench" --only-random --size "$size" --random-dir "$ckpt" --keep --modes "" \
            --frames 1 --runs 0 >/dev/null 2>&1 || true
        [ -f "$ckpt/model.safetensors" ] || { echo "could not write $ckpt" >&2; exit 1; }
    fi
    for f in $forms; do
        dtype=${f%%:*}
        quant=${f##*:}
        "$bench" --model-dir "$ckpt" --greedy --frames "$frames" --runs "$runs" \
            --modes async,batch --dtype "$dtype" --quantization "$quant" --text "$text" \
            --json "$out/$size-$dtype-$quant.json" > "$out/$size-$dtype-$quant.log" 2>&1
        grep '^| ' "$out/$size-$dtype-$quant.log" | grep -v '^| model\|^|---' |
            sed "s/^| [^|]* |/| $size $dtype |/"
    done
    if [ -n "${TREVORS_BIN:-}" ] && [ -x "$TREVORS_BIN" ]; then
        side=$(mktemp -d)
        log="$out/$size-trevors.log"
        t0=$EPOCHREALTIME
        /usr/bin/time -v -o "$out/$size-trevors.time" "$TREVORS_BIN" \
            --model-dir "$ckpt" --output-dir "$side" --output "$side/out.wav" --device cpu \
            --text "$text" --frames "$frames" --temperature 0 --repetition-penalty 1.0 \
            --speaker ryan --language english --compare --reference-dir "$side/none" 2>&1 |
            while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done > "$log"
        # Stage times from the timestamps of its own progress lines.
        ts() { awk -v pat="$1" 'index($0, pat) { print $1; exit }' "$log"; }
        gen=$(ts "Generating $frames frames...")
        codes=$(ts "Codes tensor shape")
        dec=$(ts "Decoding to audio")
        aud=$(ts "Audio samples:")
        rss=$(awk -F': ' '/Maximum resident set size/ { print $2 }' "$out/$size-trevors.time")
        awk -v t0="$t0" -v g="$gen" -v c="$codes" -v d="$dec" -v e="$aud" -v r="$rss" -v n="$frames" \
            -v s="$size" 'BEGIN {
            printf "| %s TrevorS | f32 | batch | %d | | | %.2f | %.2f | %.3f | %.1f | %.0f |\n",
                s, n, (c - g) * 1000 / n, (e - d) * 1000 / n, (e - g) / (n * 0.08), g - t0, r / 1024 }' |
            tee "$out/$size-trevors.txt"
        rm -rf "$side"
    fi
done
