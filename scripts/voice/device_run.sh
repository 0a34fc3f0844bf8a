#!/bin/bash
# Device calls that train the bundled voice with the `mel` code scheme, on an nvidia-h200-x2 machine (2 GPUs,
# 32 CPU cores; 10 minutes a call). Everything that comes back is tarred and split into <= 15 MB parts under $OUT.
#
#   CALL=1  The CPUs render teacher audio (RENDER_S per process, NR processes). Then the quantizer (feature
#           statistics + residual k-means) on GPU 0; the decoder (Code2Wav, a vocoder from the fixed codes) on GPU 0
#           and, at the same time, the codes and the talker on GPU 1, both until DEADLINE; then export, official load
#           check, codec round trip of the 50 test sentences. Back: exp/ (the checkpoint), codes1.pt,
#           quantizer16.pt (centroids in f16, to extend the codes later), roundtrip/*.wav, log.txt.
#   CALL=2  The talker only, continued from an export (INIT=folder with model.safetensors) on the carried codes
#           (CODES="a.pt b.pt.xz"; TALKER_EXTRA e.g. "--resid-noise 1", TALKER_EXTRA0/1 for one variant only;
#           VAL=held-out codes file for the validation CE):
#           with DDP=1 one run data-parallel over both GPUs (torchrun; batch TB per GPU, learning rate TLR1), else two
#           variants at once: GPU 0 with TLR0, GPU 1 with TLR1. Back: model.safetensors of each run (t0/, t1/), with VAL
#           also best.safetensors (the weights of the best validation CE), with SNAP=N the weights every N steps
#           (snap-STEP.safetensors, ~16.3 MB each packed; what comes back is at most 64 MiB in all, so only the final
#           (and best) weights and each run's latest snapshots up to MAXW=4 weight files are packed), and log.txt.
#   CALL=3  More data only: the CPUs render teacher audio for the rows not in EXCLUDE (a file of ids), then GPU 0
#           encodes it with the carried quantizer (QUANT, e.g. quantizer16.pt) into codes2.pt.xz (the compact codes
#           format). With GPUPACK (a scripts/gpu-pack.sh folder, carried) GPU 1 meanwhile runs scripts/gpu-run.sh
#           (GPU_STEPS) on CPU cores 0-3 while the renderers keep to the others. Back: codes2.pt.xz, gpu/, log.txt.
#   CALL=4  Decoder fine-tune: the CPUs render the carried ids (RENDER_S; the rows not rendered before, say), GPU 0 encodes
#           them with QUANT into codes3.pt.xz (more talker data), then two decoder variants start from INIT's
#           speech_tokenizer (an export folder, bf16 is enough) on that audio until DEADLINE: GPU 0 with CODEC_EXTRA0
#           and CLR0 (e.g. the discriminator: --gan-start 0), GPU 1 with CODEC_EXTRA1 and CLR1. Back: the variants'
#           speech_tokenizer weights (c0/, c1/, f32), codes3.pt.xz, log.txt. CODES3=0 skips the encoding (the
#           decoders then get its time; for ids whose codes exist already). With GTA=folder (an export with the talker's
#           config.json + model.safetensors) both decoders learn from ground-truth-aligned codes: codebook 0 of the
#           audio, the residual codebooks as that talker's code predictor greedily predicts them (train.py gta_codes;
#           GTA_SHARE0/1: the share of utterances that get them, default 1; QUANT may then hold codebook 0 only).
#   CALL=5  The second-round voice on ONE GPU (`--scheme phone`, SIZE=voice16: 16 codebooks, codebook 0 clustered on
#           the teacher's phoneme alignment; the model joe-w16d.onnx has Piper's durations as a second output,
#           onnx_fp16_weights.py). All CPUs render for RENDER_S (every utterance after LEAD frames of silence) and the
#           120 val sentences (val-ids.jsonl); the quantizer is fitted on GPU; then at the same time until DEADLINE:
#           the decoder (from scratch, discriminators from GAN_START; cores 0-1), the codes of that audio and the
#           talker (INIT=folder with a first-round model.safetensors, carried over with --init-transfer, random
#           residual inputs; cores 2-3), and 12 more renderers (cores 4-15) whose audio is encoded at the end into
#           codesB.pt.xz for the next call's talker. Back: exp/ (the export, official load check), quantizer.pt,
#           codesA.pt.xz, codesB.pt.xz, val-codes.pt.xz, disc.safetensors (to continue the GAN), the logs.
#
# The folder it lives in (VP, carried) holds train.py and render_ids.py (copies of scripts/voice) and omnitts_py/ (a
# copy of scripts/omnitts_py, the package train.py runs), wheels/
# (transformers 4.57.3, accelerate 1.12.0, tokenizers 0.22.1, qwen-tts 0.1.1, einops, safetensors, huggingface_hub
# 0.36.2, regex, pyyaml, tqdm, filelock, packaging, requests + deps, fsspec, psutil: `pip download --no-deps
# --only-binary=:all: --python-version 3.12 ...`), tok/ (train.py's tokenizer step, run here) and, for CALL=1,
# joe-w16.onnx (onnx_fp16_weights.py), ids.jsonl.gz (every training row of teacher.py --ids-only, shuffled) and
# test-ids.jsonl (the 50 test sentences' ids). Device command: `CALL=1 bash VP/run.sh` (run tool timeout 600 s).
# Any FILE.xz in the folder (e.g. joe-w16.onnx.xz, init/model.safetensors.xz: bf16 weights pack to ~70 %) is
# unpacked next to it first, to fit the 64 MiB carry.
# CPU dry run: OUT=... W=... DEV=cpu AMP= WHEELS=0 NR=2 RENDER_S=30 DEADLINE=150 CB=4 TB=4 PYR=<venv with onnxruntime> \
#   KM="--kmeans-k 64 --kmeans-iters 2" PY=<venv with torch> CALL=1 bash run.sh
set -u
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
left_min() { python3 -c "print(max(0.2, ($1 - ($(date +%s) - $T0)) / 60))"; }
VP=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/vout}; mkdir -p "$OUT"
W=${W:-/tmp/vw}; rm -rf "$W"; mkdir -p "$W"
PY=${PY:-python3}; PYR=${PYR:-$PY}     # PYR: the Python with onnxruntime (render)
CALL=${CALL:-1}; DEV=${DEV:-cuda}; SIZE=${SIZE:-small}; AMP=${AMP---amp}
DEADLINE=${DEADLINE:-480}          # seconds after start by which everything is packed
NR=${NR:-30}; RENDER_S=${RENDER_S:-150}
KM=${KM:---kmeans-frames 400000 --kmeans-iters 20}
CB=${CB:-64}; CLR=${CLR:-1e-3}; TB=${TB:-128}; TLR=${TLR:-1e-3}; TLR0=${TLR0:-5e-4}; TLR1=${TLR1:-1e-3}
exec > >(tee "$OUT/log.txt") 2>&1
el start "$(hostname)" nproc=$(nproc) CALL=$CALL
nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv 2>/dev/null || true
if [ "${WHEELS:-1}" = 1 ]; then
  $PY -m pip install -q --no-index --no-deps --target /tmp/site "$VP"/wheels/*.whl 2>&1 | tail -3
  export PYTHONPATH=/tmp/site
fi
$PY -c "import torch, transformers; print('torch', torch.__version__, 'gpus', torch.cuda.device_count(), 'transformers', transformers.__version__)"
find "$VP" -name '*.xz' ! -name '*.pt.xz' | while read -r f; do     # codes files (*.pt.xz) are read packed
  [ -e "${f%.xz}" ] || $PY -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" "$f" "${f%.xz}"
done
cp -r "$VP/tok" "$W/tok"
gpu() { if [ "$DEV" = cuda ]; then echo "CUDA_VISIBLE_DEVICES=$1"; fi; }
pin() { local cpus=$1; shift; if command -v taskset > /dev/null; then taskset -c "$cpus" "$@"; else "$@"; fi; }
A=(--work "$W" --size "$SIZE" --device "$DEV" $AMP --log-every 100)

# Complete rows of the shard manifests written so far (a row is written after its WAV is closed), minus $2's rows.
snapshot() {     # snapshot OUT [MINUS [DIR]]: the rows rendered into DIR (default $W/teacher)
  $PY - "${3:-$W/teacher}" "$1" "${2:-}" <<'EOF'
import glob, json, os, sys
d, out, minus = sys.argv[1], sys.argv[2], sys.argv[3]
skip = set()
if minus:
    skip = {json.loads(l)["id"] for l in open(minus)}
n = 0
with open(out, "w") as f:
    for p in sorted(glob.glob(os.path.join(d, "manifest-*.jsonl"))):
        for l in open(p):
            try:
                r = json.loads(l)
            except ValueError:
                continue
            if r["id"] not in skip and os.path.exists(os.path.join(d, r["wav"])):
                # the whole row (the phone scheme reads its durations), the WAV by absolute path
                r["wav"] = os.path.join(d, r["wav"])
                f.write(json.dumps(r) + "\n")
                n += 1
print(f"{out}: {n} utterances", file=sys.stderr)
EOF
}

# render_teacher PIN [render_ids.py args]: NR renderers (each a shard of the carried ids, RENDER_S seconds, one
# thread, prefixed by PIN, e.g. a taskset) -> $W/teacher; waits for them and for the pids already in RP; then
# $W/a.jsonl lists what was rendered.
render_teacher() {
  local pin=$1; shift
  for k in $(seq 0 $((NR - 1))); do
    $pin $PYR "$VP/render_ids.py" --manifest "$VP/ids.jsonl.gz" --onnx "$VP/joe-w16.onnx" --out "$W/teacher" \
        "$@" --shard "$k/$NR" --max-seconds "$RENDER_S" --threads 1 > "$W/render-$k.log" 2>&1 &
    RP="$RP $!"
  done
  wait $RP
  el render done
  for f in "$W"/render-*.log; do echo "$(basename "$f"): $(tail -n 1 "$f")"; done
  snapshot "$W/a.jsonl"
}

if [ "$CALL" = 1 ]; then
  # --- teacher audio: the CPUs to themselves (Python data work beside 28 renderers was ~5x slower) --------------
  $PYR "$VP/render_ids.py" --manifest "$VP/test-ids.jsonl" --onnx "$VP/joe-w16.onnx" --out "$W/test" --threads 1 \
      > "$W/render-test.log" 2>&1 &
  RP="$!"
  render_teacher ""
  # --- quantizer; then codes + talker on GPU 1 and the decoder on GPU 0 at the same time --------------------------
  env $(gpu 0) $PY "$VP/train.py" quantizer "${A[@]}" --manifest "$W/a.jsonl" $KM
  el quantizer done
  DMIN=$(left_min $((DEADLINE - 70)))
  el decoder for "$DMIN" min
  env $(gpu 0) $PY "$VP/train.py" codec "${A[@]}" --manifest "$W/a.jsonl" --codec-batch "$CB" --codec-lr "$CLR" \
      --codec-steps 1000000 --max-minutes "$DMIN" ${CODEC_EXTRA:-} > "$W/codec.log" 2>&1 &
  DP=$!
  env $(gpu 1) $PY "$VP/train.py" codes "${A[@]}" --manifest "$W/a.jsonl" --codes-out "$W/codes1.pt"
  TMIN=$(left_min $((DEADLINE - 70)))
  el talker for "$TMIN" min
  env $(gpu 1) $PY "$VP/train.py" talker "${A[@]}" --codes "$W/codes1.pt" --talker-batch "$TB" --talker-lr "$TLR" \
      --warmup 200 --talker-steps 1000000 --max-minutes "$TMIN" ${TALKER_EXTRA:-} > "$W/talker.log" 2>&1 &
  TP=$!
  wait $DP; el decoder done; grep -v "^\*\|^ *$\|Warning" "$W/codec.log" | tail -n 25
  wait $TP; el talker done; grep -v "^\*\|^ *$\|Warning" "$W/talker.log" | tail -n 25
  $PY "$VP/train.py" export "${A[@]}" --out "$W/exp"
  el export done
  $PY "$VP/train.py" roundtrip "${A[@]}" --manifest "$W/test/manifest.jsonl"
  el roundtrip done
  $PY -c "import torch, sys; q = torch.load(sys.argv[1], weights_only=False); q['centroids'] = q['centroids'].half(); torch.save(q, sys.argv[2])" \
      "$W/quantizer.pt" "$W/quantizer16.pt"
  ITEMS="exp codes1.pt quantizer16.pt roundtrip export_check.wav"
elif [ "$CALL" = 3 ]; then
  # --- more teacher audio -> codes with the carried quantizer ------------------------------------------------------
  : "${EXCLUDE:?CALL=3 needs EXCLUDE (ids already rendered)}" "${QUANT:?CALL=3 needs QUANT (the quantizer file)}"
  cp "$VP/$QUANT" "$W/quantizer.pt"
  PIN=""; GP=""
  if [ -n "${GPUPACK:-}" ]; then
    GPIN=""
    if [ "$(nproc)" -ge 8 ]; then PIN="taskset -c 4-$(( $(nproc) - 1 ))"; GPIN="taskset -c 0-3"; fi
    env $(gpu 1) STEPS="${GPU_STEPS:-parity perstep-parity bench perstep}" $GPIN \
        bash "$VP/$GPUPACK/gpu-run.sh" \
        "$VP/$GPUPACK" "$OUT/gpu" > "$W/gpu-run.log" 2>&1 &
    GP=$!
  fi
  RP=""
  render_teacher "$PIN" --exclude "$VP/$EXCLUDE"
  env $(gpu 0) $PY "$VP/train.py" codes "${A[@]}" --manifest "$W/a.jsonl" --codes-out "$W/codes2.pt.xz"
  el codes done
  if [ -n "$GP" ]; then wait $GP; el gpu-run done; cat "$W/gpu-run.log"; fi
  ITEMS="codes2.pt.xz"
elif [ "$CALL" = 4 ]; then
  # --- teacher audio -> codes3 (talker data) and two decoder fine-tunes on it ---------------------------------------
  : "${INIT:?CALL=4 needs INIT (an export folder with speech_tokenizer/)}" "${QUANT:?CALL=4 needs QUANT}"
  cp "$VP/$QUANT" "$W/quantizer.pt"
  RP=""
  render_teacher ""
  ITEMS=""
  if [ "${CODES3:-1}" = 1 ]; then
    env $(gpu 0) $PY "$VP/train.py" codes "${A[@]}" --manifest "$W/a.jsonl" --codes-out "$W/codes3.pt.xz"
    el codes done
    ITEMS="codes3.pt.xz"
  fi
  DMIN=$(left_min $((DEADLINE - 30)))
  el decoders for "$DMIN" min
  for v in 0 1; do
    LR=CLR$v; EX=CODEC_EXTRA$v; GS=GTA_SHARE$v
    mkdir -p "$W/c$v"; cp "$W/quantizer.pt" "$W/c$v/"; cp -r "$W/tok" "$W/c$v/"
    env $(gpu $v) $PY "$VP/train.py" codec --work "$W/c$v" --size "$SIZE" --device "$DEV" $AMP --log-every 100 \
        --manifest "$W/a.jsonl" --init-from "$VP/$INIT" --codec-batch "$CB" --codec-lr "${!LR:-$CLR}" \
        ${GTA:+--gta-from "$VP/$GTA" --gta-share "${!GS:-1}"} \
        --codec-warmup 100 --codec-steps 1000000 --max-minutes "$DMIN" ${!EX:-} > "$W/codec$v.log" 2>&1 &
    eval "P$v=$!"
  done
  for v in 0 1; do P=P$v; wait "${!P}"; el decoder $v; grep -v "^\*\|^ *$\|Warning" "$W/codec$v.log" | tail -n 30; done
  $PY - "$W" <<'EOF'
import os, sys, torch
from safetensors.torch import save_file
w = sys.argv[1]
for v in (0, 1):
    st = torch.load(os.path.join(w, f"c{v}", "codec", "codec.pt"), map_location="cpu", weights_only=False)
    save_file({k: t.float().contiguous() for k, t in st["codec"].items()},
              os.path.join(w, f"c{v}", "model.safetensors"), metadata={"format": "pt", "step": str(st["step"])})
    print(f"c{v}: step {st['step']}")
EOF
  ITEMS="$ITEMS c0/model.safetensors c1/model.safetensors"
elif [ "$CALL" = 5 ]; then
  # --- second round, one GPU: render -> phone quantizer -> decoder | codes + talker | more renders -> codes ----------
  : "${INIT:?CALL=5 needs INIT (a folder with the first-round model.safetensors, for --init-transfer)}"
  SIZE=${SIZE_5:-voice16}; LEAD=${LEAD:-1}; ONNX5="$VP/${ONNX:-joe-w16d.onnx}"
  A=(--work "$W" --size "$SIZE" --device "$DEV" $AMP --log-every 100 --scheme phone)
  R=(--onnx "$ONNX5" --threads 1 --lead-frames "$LEAD")
  $PYR "$VP/render_ids.py" --manifest "$VP/val-ids.jsonl" --out "$W/val" "${R[@]}" > "$W/render-val.log" 2>&1 &
  RP="$!"
  for k in $(seq 0 $((NR - 1))); do
    $PYR "$VP/render_ids.py" --manifest "$VP/ids.jsonl.gz" --out "$W/teacher" "${R[@]}" --shard "$k/$NR" \
        --max-seconds "$RENDER_S" > "$W/render-$k.log" 2>&1 &
    RP="$RP $!"
  done
  wait $RP
  el render A done; tail -n 1 "$W/render-0.log"
  snapshot "$W/a.jsonl"
  $PY -c "import json, sys; [print(json.loads(l)['id']) for l in open(sys.argv[1])]" "$W/a.jsonl" > "$W/a-ids.txt"
  # more renders for the next call's talker, on cores 4.. while the GPU trains
  NC=$(nproc); NRB=${NRB:-$(( NC > 5 ? NC - 4 : 1 ))}; RB_S=$(( DEADLINE - 150 - ($(date +%s) - T0) ))
  mkdir -p "$W/tb"
  RBP=""
  for k in $(seq 0 $((NRB - 1))); do
    pin $(( (4 + k) % NC )) $PYR "$VP/render_ids.py" --manifest "$VP/ids.jsonl.gz" --out "$W/tb" "${R[@]}" \
        --exclude "$W/a-ids.txt" --shard "$k/$NRB" --max-seconds "$RB_S" > "$W/render-b$k.log" 2>&1 &
    RBP="$RBP $!"
  done
  pin 0-$(( NC > 5 ? 3 : NC - 1 )) $PY "$VP/train.py" quantizer "${A[@]}" --manifest "$W/a.jsonl" $KM
  el quantizer done
  pin 0-$(( NC > 5 ? 3 : NC - 1 )) $PY "$VP/train.py" codes "${A[@]}" --manifest "$W/val/manifest.jsonl" --codes-out "$W/val-codes.pt.xz"
  DMIN=$(left_min $((DEADLINE - 75)))
  el decoder for "$DMIN" min
  pin 0-$(( NC > 5 ? 1 : NC - 1 )) $PY "$VP/train.py" codec "${A[@]}" --manifest "$W/a.jsonl" --codec-batch "$CB" --codec-lr "$CLR" \
      --codec-steps 1000000 --gan-start "${GAN_START:-1000}" --max-minutes "$DMIN" ${CODEC_EXTRA:-} \
      > "$W/codec.log" 2>&1 &
  DP=$!
  pin $(( NC > 5 ? 2 : 0 ))-$(( NC > 5 ? 3 : NC - 1 )) $PY "$VP/train.py" codes "${A[@]}" --manifest "$W/a.jsonl" --codes-out "$W/codesA.pt.xz"
  TMIN=$(left_min $((DEADLINE - 75)))
  el talker for "$TMIN" min
  pin $(( NC > 5 ? 2 : 0 ))-$(( NC > 5 ? 3 : NC - 1 )) $PY "$VP/train.py" talker "${A[@]}" --codes "$W/codesA.pt.xz" --val-codes "$W/val-codes.pt.xz" \
      --init-from "$VP/$INIT" --init-transfer --resid-noise 1 --talker-batch "$TB" --talker-lr "$TLR" \
      --warmup 200 --talker-steps 1000000 --max-minutes "$TMIN" ${TALKER_EXTRA:-} > "$W/talker.log" 2>&1 &
  TP=$!
  wait $RBP
  el render B done; tail -n 1 "$W/render-b0.log"
  snapshot "$W/b.jsonl" "" "$W/tb"
  pin $(( NC > 5 ? 4 : 0 ))-$(( NC - 1 )) $PY "$VP/train.py" codes "${A[@]}" --manifest "$W/b.jsonl" --codes-out "$W/codesB.pt.xz"
  el codes B done
  wait $DP; el decoder done; grep -v "^\*\|^ *$\|Warning" "$W/codec.log" | tail -n 40
  wait $TP; el talker done; grep -v "^\*\|^ *$\|Warning" "$W/talker.log" | tail -n 40
  [ -f "$W/talker/talker-best.pt" ] && cp "$W/talker/talker.pt" "$W/talker/talker-last.pt" && \
      $PY -c "import torch, sys; b = torch.load(sys.argv[1], weights_only=False); l = torch.load(sys.argv[2], weights_only=False); l['model'] = b['model']; l['step'] = b['step']; torch.save(l, sys.argv[2])" \
      "$W/talker/talker-best.pt" "$W/talker/talker.pt"
  $PY "$VP/train.py" export "${A[@]}" --out "$W/exp"
  el export done
  $PY - "$W" <<'EOF2'
import os, sys, torch
from safetensors.torch import save_file
w = sys.argv[1]
st = torch.load(os.path.join(w, "codec", "codec.pt"), map_location="cpu", weights_only=False)
if "disc" in st:
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in st["disc"].items()}, os.path.join(w, "disc.safetensors"),
              metadata={"format": "pt", "step": str(st["step"])})
print("codec step", st["step"])
EOF2
  ITEMS="exp quantizer.pt codesA.pt.xz codesB.pt.xz val-codes.pt.xz disc.safetensors export_check.wav"
elif [ "$CALL" = 6 ]; then
  # --- phone scheme, one GPU: the decoder continued (INIT/speech_tokenizer, DISC) on fresh renders; more codes -------
  : "${INIT:?CALL=6 needs INIT (an export folder with speech_tokenizer/)}" "${QUANT:?CALL=6 needs QUANT}"
  SIZE=${SIZE_5:-voice16}; LEAD=${LEAD:-1}; ONNX5="$VP/${ONNX:-joe-w16d.onnx}"; NC=$(nproc)
  cp "$VP/$QUANT" "$W/quantizer.pt"
  A=(--work "$W" --size "$SIZE" --device "$DEV" $AMP --log-every 100 --scheme phone)
  R=(--onnx "$ONNX5" --threads 1 --lead-frames "$LEAD" ${EXCLUDE:+--exclude "$VP/$EXCLUDE"})
  # all cores render RENDER_S (the decoder's audio), then all but two go on until DEADLINE - 100 (the talker's)
  RP=""
  for k in $(seq 0 $((NC - 1))); do
    $PYR "$VP/render_ids.py" --manifest "$VP/ids.jsonl.gz" --out "$W/teacher" "${R[@]}" --shard "$k/$NC" \
        --max-seconds "$RENDER_S" > "$W/render-$k.log" 2>&1 &
    RP="$RP $!"
  done
  wait $RP
  el render A done; tail -n 1 "$W/render-0.log"
  snapshot "$W/a.jsonl"
  $PY -c "import json, sys; [print(json.loads(l)['id']) for l in open(sys.argv[1])]" "$W/a.jsonl" > "$W/a-ids.txt"
  [ -n "${EXCLUDE:-}" ] && cat "$VP/$EXCLUDE" >> "$W/a-ids.txt"
  NRB=$(( NC > 5 ? NC - 2 : 1 )); RB_S=$(( DEADLINE - 100 - ($(date +%s) - T0) ))
  mkdir -p "$W/tb"; RBP=""
  for k in $(seq 0 $((NRB - 1))); do
    pin $(( (2 + k) % NC )) $PYR "$VP/render_ids.py" --manifest "$VP/ids.jsonl.gz" --out "$W/tb" \
        --onnx "$ONNX5" --threads 1 --lead-frames "$LEAD" --exclude "$W/a-ids.txt" --shard "$k/$NRB" \
        --max-seconds "$RB_S" > "$W/render-b$k.log" 2>&1 &
    RBP="$RBP $!"
  done
  DMIN=$(left_min $((DEADLINE - 40)))
  el decoder for "$DMIN" min
  pin 0-$(( NC > 5 ? 1 : NC - 1 )) $PY "$VP/train.py" codec "${A[@]}" --manifest "$W/a.jsonl" --codec-batch "$CB" \
      --codec-lr "$CLR" --codec-warmup 100 --codec-steps 1000000 --gan-start 0 --init-from "$VP/$INIT" \
      ${DISC:+--disc-from "$VP/$DISC"} --max-minutes "$DMIN" ${CODEC_EXTRA:-} > "$W/codec.log" 2>&1 &
  DP=$!
  wait $RBP
  el render B done; tail -n 1 "$W/render-b0.log"
  snapshot "$W/b.jsonl" "" "$W/tb"
  cat "$W/a.jsonl" "$W/b.jsonl" > "$W/ab.jsonl"
  pin $(( NC > 5 ? 2 : 0 ))-$(( NC - 1 )) $PY "$VP/train.py" codes "${A[@]}" --manifest "$W/ab.jsonl" --codes-out "$W/codesC.pt.xz"
  el codes C done
  wait $DP; el decoder done; grep -v "^\*\|^ *$\|Warning" "$W/codec.log" | tail -n 40
  $PY - "$W" <<'EOF2'
import os, sys, torch
from safetensors.torch import save_file
w = sys.argv[1]
st = torch.load(os.path.join(w, "codec", "codec.pt"), map_location="cpu", weights_only=False)
meta = {"format": "pt", "step": str(st["step"])}
save_file({k: v.to(torch.bfloat16).contiguous() for k, v in st["codec"].items()}, os.path.join(w, "codec.safetensors"), metadata=meta)
save_file({k: v.to(torch.bfloat16).contiguous() for k, v in st["disc"].items()}, os.path.join(w, "disc.safetensors"), metadata=meta)
print("codec step", st["step"])
EOF2
  ITEMS="codec.safetensors disc.safetensors codesC.pt.xz"
else
  # --- talker: data parallel over both GPUs (DDP=1) or two variants ------------------------------------------------
  : "${CODES:?CALL=2 needs CODES (codes files in the carried folder)}" "${INIT:?CALL=2 needs INIT (an export folder)}"
  C=(); for c in ${CODES}; do C+=("$VP/$c"); done
  TMIN=$(left_min $((DEADLINE - 40)))
  el talkers for "$TMIN" min
  RUNS="0 1"; [ "${DDP:-0}" = 1 ] && RUNS=1
  for v in $RUNS; do
    LR=TLR$v; TX=TALKER_EXTRA$v
    mkdir -p "$W/t$v"; cp -r "$W/tok" "$W/t$v/"
    if [ "${DDP:-0}" = 1 ]; then LAUNCH=($PY -m torch.distributed.run --standalone --nproc_per_node=2); GPUS=""
    else LAUNCH=($PY); GPUS=$(gpu $(( v % ${NGPU:-2} ))); fi     # NGPU=1: both variants share one GPU
    env $GPUS "${LAUNCH[@]}" "$VP/train.py" talker --work "$W/t$v" --size "$SIZE" --device "$DEV" $AMP \
        --log-every 100 --codes "${C[@]}" --init-from "$VP/$INIT" --init-step "${INIT_STEP:-0}" \
        --talker-batch "$TB" --talker-lr "${!LR}" --warmup "${WARMUP:-100}" --talker-steps 1000000 \
        --max-minutes "$TMIN" ${VAL:+--val-codes "$VP/$VAL"} ${SNAP:+--snapshot-every "$SNAP"} ${TALKER_EXTRA:-} ${!TX:-} \
        > "$W/talker$v.log" 2>&1 &
    eval "P$v=$!"
  done
  for v in $RUNS; do P=P$v; wait "${!P}"; el talker $v; grep -v "^\*\|^ *$\|Warning" "$W/talker$v.log" | tail -n 30; done
  $PY - "$W" $RUNS <<'EOF'
import os, sys, torch
from safetensors.torch import save_file
w = sys.argv[1]
for v in map(int, sys.argv[2:]):
    d = os.path.join(w, f"t{v}", "talker")
    snaps = sorted((f for f in os.listdir(d) if f.startswith("snap-")), key=lambda f: int(f[5:-3]))
    for src, dst in [("talker.pt", "model.safetensors"), ("talker-best.pt", "best.safetensors")] + \
            [(f, f[:-3] + ".safetensors") for f in snaps]:
        p = os.path.join(d, src)
        if os.path.exists(p):
            st = torch.load(p, map_location="cpu", weights_only=False)
            save_file({k: t.to(torch.bfloat16).contiguous() for k, t in st["model"].items()},
                      os.path.join(w, f"t{v}", dst), metadata={"format": "pt", "step": str(st["step"])})
            print(f"t{v}/{dst}: step {st['step']}")
EOF
  # at most MAXW weight files come back (~16.3 MB each packed; $OUT's 64 MiB in all): the final (and best) weights,
  # then each run's latest snapshots
  MAXW=${MAXW:-4}; ITEMS=""; n=0; nr=$(echo $RUNS | wc -w)
  for v in $RUNS; do for f in ${BEST_ONLY:+best} ${BEST_ONLY:-model best}; do
    if [ -f "$W/t$v/$f.safetensors" ]; then ITEMS="$ITEMS t$v/$f.safetensors"; n=$((n + 1)); fi
  done; done
  k=$(( (MAXW - n) / nr )); [ "$k" -lt 0 ] && k=0
  for v in $RUNS; do
    ITEMS="$ITEMS $(ls "$W/t$v"/snap-*.safetensors 2>/dev/null | sort -V | tail -n "$k" | sed "s|^$W/||" | tr '\n' ' ')"
  done
  echo "packing:$ITEMS"
fi

# --- pack --------------------------------------------------------------------------------------------------------
if [ "$CALL" -ge 5 ]; then     # bf16 weights: xz packs them to ~70 % (gzip ~85 %), which the 64 MiB back needs
  tar cf - -C "$W" $ITEMS 2>/dev/null | xz -T0 -6 | split -b 15M -d - "$OUT/pack.txz."
else
  tar czf - -C "$W" $ITEMS 2>/dev/null | split -b 15M -d - "$OUT/pack.tgz."
fi
ls -la "$OUT"
el all done
