#!/bin/bash
# One device call: teacher renders -> codec -> codes -> talker -> export -> codec round trip of the test set;
# everything that comes back is split into <= 15 MB parts under $OUT.
#
# The folder it lives in (VP, carried to the device machine, ~53 MB) holds: train.py and render_ids.py (copies of
# scripts/voice), wheels/ (transformers 4.57.3, accelerate 1.12.0, tokenizers 0.22.1, qwen-tts 0.1.1, einops,
# safetensors, huggingface_hub 0.36.2, regex, pyyaml, tqdm, filelock, packaging, requests + deps, fsspec, psutil;
# `pip download --no-deps --only-binary=:all: --python-version 3.12 ...`), joe-w16.onnx (onnx_fp16_weights.py),
# ids.jsonl.gz (30,000 rows of teacher.py --ids-only's training manifest, shuffled with seed 0), test-ids.jsonl
# (the 50 test sentences' ids) and work/tok (train.py tokenizer, run here). Device command: `bash VP/run.sh`
# (timeout 590 s); dry run on a CPU: OUT=... W=... PYR=<python with onnxruntime> PYT=<python with torch> DEV=cpu
# SIZE=toy AMP= WHEELS=0 RENDER_S=5 NGPU=1 NCPU=1 CODEC_MIN=0.1 CB=4 TB=4 DEADLINE=90 bash run.sh
set -u
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
VP=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/vout}; mkdir -p "$OUT"
W=${W:-/tmp/vw}; rm -rf "$W"; mkdir -p "$W"
PYR=${PYR:-$(command -v python3 || command -v python)}    # render (onnxruntime)
PYT=${PYT:-$PYR}                                           # train (torch)
DEV=${DEV:-cuda}; SIZE=${SIZE:-small}; AMP=${AMP---amp}
DEADLINE=${DEADLINE:-565}          # seconds after start by which everything must be packed
RENDER_S=${RENDER_S:-65}; NGPU=${NGPU:-6}; NCPU=${NCPU:-9}
CODEC_MIN=${CODEC_MIN:-2.3}; CB=${CB:-32}; CLR=${CLR:-1e-3}
TB=${TB:-64}; TLR=${TLR:-1e-3}
exec > >(tee "$OUT/log.txt") 2>&1
el start "$(hostname)" nproc=$(nproc)
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv 2>/dev/null || true
if [ "${WHEELS:-1}" = 1 ]; then
  $PYT -m pip install -q --no-index --no-deps --target /tmp/site "$VP"/wheels/*.whl 2>&1 | tail -3
  export PYTHONPATH=/tmp/site
fi
$PYT -c "import torch, numpy, transformers, tokenizers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'numpy', numpy.__version__, 'transformers', transformers.__version__, 'tokenizers', tokenizers.__version__)"
$PYR -c "import onnxruntime as o; print('ort', o.__version__, o.get_available_providers())"
el wheels done

# --- teacher audio --------------------------------------------------------------------------------------------
$PYR "$VP/render_ids.py" --manifest "$VP/test-ids.jsonl" --onnx "$VP/joe-w16.onnx" --out "$W/test" --threads 1 \
    > "$W/render-test.log" 2>&1 &
PIDS="$!"
NP=$((NGPU + NCPU))
for k in $(seq 0 $((NP - 1))); do
  if [ "$k" -lt "$NGPU" ]; then P=CUDAExecutionProvider,CPUExecutionProvider; else P=CPUExecutionProvider; fi
  $PYR "$VP/render_ids.py" --manifest "$VP/ids.jsonl.gz" --onnx "$VP/joe-w16.onnx" --out "$W/teacher" \
      --shard "$k/$NP" --max-seconds "$RENDER_S" --threads 1 --providers "$P" > "$W/render-$k.log" 2>&1 &
  PIDS="$PIDS $!"
done
wait $PIDS
cat "$W"/teacher/manifest-*.jsonl > "$W/teacher/manifest.jsonl"
for f in "$W"/render-*.log; do echo "$(basename "$f"): $(tail -n 1 "$f")"; done
el render done: $(wc -l < "$W/teacher/manifest.jsonl") utterances

# --- training ---------------------------------------------------------------------------------------------------
cp -r "$VP/work/tok" "$W/tok"
A=(--work "$W" --manifest "$W/teacher/manifest.jsonl" --size "$SIZE" --device "$DEV" $AMP --log-every 100)
$PYT "$VP/train.py" codec "${A[@]}" --codec-batch "$CB" --codec-lr "$CLR" --codec-steps 1000000 \
    --max-minutes "$CODEC_MIN" ${CODEC_EXTRA:-}
el codec done
$PYT "$VP/train.py" codes "${A[@]}" --codes-batch 64
el codes done
TMIN=$(python3 -c "print(max(0.2, ($DEADLINE - ($(date +%s) - $T0) - 55) / 60))")
el talker for "$TMIN" min
$PYT "$VP/train.py" talker "${A[@]}" --talker-batch "$TB" --talker-lr "$TLR" --warmup 200 --talker-steps 1000000 \
    --max-minutes "$TMIN" ${TALKER_EXTRA:-}
el talker done
$PYT "$VP/train.py" export "${A[@]}" --out "$W/omnitts-en-joe"
el export done
$PYT "$VP/train.py" roundtrip "${A[@]}" --manifest "$W/test/manifest.jsonl"
el roundtrip done

# --- pack -------------------------------------------------------------------------------------------------------
mkdir -p "$W/pack"
cp -r "$W/omnitts-en-joe" "$W/roundtrip" "$W/pack/" 2>/dev/null
cp "$W"/*.wav "$W/pack/" 2>/dev/null
$PYT - "$W" > "$W/pack/data.json" <<'EOF' || true
import json, sys, torch
w = sys.argv[1]
d = torch.load(w + "/codes.pt", weights_only=False)
print(json.dumps({"utterances": len(d), "frames": sum(x["codes"].shape[0] for x in d),
                  "ids": [x["id"] for x in d]}))
EOF
tar cf - -C "$W" pack | split -b 15M -d - "$OUT/pack.tar."
ls -la "$OUT"
el all done
