#!/usr/bin/env bash
# Session 40 call 1 (H200): stage 0's start burst alone (prompts built, then prefilled together, timed;
# Nsight Compute's per-kernel summary of the 64-prompt prefill), the 64-stream aggregate (the pool trim at
# stage end runs as each process ends), then issue 33's protocol for RUNS (proto.sh).
set -uo pipefail
B=/tmp/o/bin T=tests/fixtures/tiny-customvoice R=/tmp/r
rm -rf /tmp/o $R; mkdir -p $R /tmp/o && tar -C /tmp/o -xJf .gpu/bins.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
t0=$(date +%s); st() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
fin() { st done; tar -C /tmp -czf $OUT/s40c1.tgz r r-proto 2>/dev/null; }
trap fin EXIT
TEXT="The quick brown fox jumps over the lazy dog near the quiet river bank."
st ckpt; $B/bench_gpu --build-only /tmp/ckpt --sizes 1.7b --template $T > $R/build.log 2>&1; echo rc $?
st rows; timeout 90 $B/bench_gpu --template $T --sizes 1.7b --rows ${ROWS:-16,64,16,64} --frames 30 --sample --workdir /tmp --text "$TEXT" --json $R/rows.json > $R/rows.log 2>&1; echo rc $?
grep -E "stage 0 alone" $R/rows.log | cut -c1-260
[ -n "${SKIP_NCU:-}" ] || { st ncu-prefill; timeout 150 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --print-summary per-kernel $B/bench_gpu --template $T --sizes 1.7b --rows 16 --frames 2 --sample --workdir /tmp --text "$TEXT" --profile prefill > $R/ncu-prefill-16.log 2>&1; echo rc $?
python3 - $R/ncu-prefill-16.log <<'PY' | tee $R/ncu-prefill-16.summary
import re,sys
rows=[];name=None;count=1
for line in open(sys.argv[1]):
    m=re.match(r"\s+(\S.*?) \((\d+, \d+, \d+)\)x\((\d+, \d+, \d+)\), .*Invocations (\d+)", line)
    if m: name=f"{m.group(1)} ({m.group(2)})x({m.group(3)})"; count=int(m.group(4)); continue
    m=re.match(r"\s+gpu__time_duration\.sum\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)", line)
    if m and name:
        scale={'ns':1e-6,'us':1e-3,'ms':1.0}.get(m.group(1),1e-6)
        rows.append((name,count,float(m.group(4).replace(',',''))*scale)); name=None
tot=sum(c*a for _,c,a in rows)
print(f"kernels: {sum(c for _,c,_ in rows)} launches, {tot:.2f} ms GPU time summed")
for n,c,a in sorted(rows,key=lambda r:-r[1]*r[2])[:45]:
    print(f"{c*a:8.3f} ms {c:6d} x {a*1e3:9.1f} us  {n[:160]}")
PY
}
S="$B/bench_streams --model-dir /tmp/ckpt/1.7b --device cuda:0 --shared-only --decoder-dtype bfloat16"
st warm-up; timeout 90 $S --streams 1,16 --frames 30 > $R/warm-up.log 2>&1; echo rc $?
for i in $(seq 1 ${LONGS:-2}); do
  st "long $i"; timeout 50 $S --streams 64 --frames 250 --json $R/long-$i.json > $R/long-$i.log 2>&1; echo rc $?
  grep -v '^{' $R/long-$i.log | grep -E "^  shared|first audio|rror" | cut -c1-200
done
[ -n "${RUNS:-}" ] && BUDGET=$(( ${TOTAL:-560} - ($(date +%s) - t0) )) TAG=proto NO_WARMUP=1 bash .gpu/proto.sh
