#!/usr/bin/env python3
"""Where a stage thread's time goes, from an nsys profile exported to SQLite.

    nsys profile -t cuda,osrt -o prof --export=sqlite CMD...
    python3 scripts/nsys_threads.py prof.sqlite [--window-ms 400]

Prints, per named thread (the engine names its stage threads `omnitts-stage0-ar` and
`omnitts-stage1-code2wav`): the CUDA API calls by total time (count, total, mean, max), then the
stage 1 thread's slowest calls in the first `--window-ms` after its first call, then the GPU
busy time per CUDA stream in that window. Used to find where the first audio chunk waits
(docs/cuda.md, "First audio under load").
"""
import argparse
import sqlite3
from collections import defaultdict


def table_names(db):
    return {r[0] for r in db.execute("select name from sqlite_master where type='table'")}


def strings(db):
    return dict(db.execute("select id, value from StringIds"))


def thread_names(db, s):
    names = {}
    if "ThreadNames" in table_names(db):
        for name_id, tid in db.execute("select nameId, globalTid from ThreadNames"):
            names[tid] = s.get(name_id, str(tid))
    return names


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sqlite")
    ap.add_argument("--window-ms", type=float, default=400.0)
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    db = sqlite3.connect(args.sqlite)
    s = strings(db)
    names = thread_names(db, s)
    tables = table_names(db)
    api = "CUPTI_ACTIVITY_KIND_RUNTIME"
    if api not in tables:
        print("no CUDA API trace in", args.sqlite)
        return
    calls = db.execute(f"select start, end, nameId, globalTid from {api} order by start").fetchall()
    by_thread = defaultdict(lambda: defaultdict(list))
    for start, end, name_id, tid in calls:
        by_thread[tid][s.get(name_id, "?")].append((start, end))
    for tid, per_name in sorted(by_thread.items(), key=lambda kv: names.get(kv[0], "")):
        total = sum(e - b for v in per_name.values() for b, e in v)
        print(f"\n== thread {names.get(tid, tid)}: {sum(len(v) for v in per_name.values())} calls, "
              f"{total / 1e6:.1f} ms in CUDA API calls")
        rows = sorted(per_name.items(), key=lambda kv: -sum(e - b for b, e in kv[1]))[: args.top]
        for name, v in rows:
            d = [e - b for b, e in v]
            print(f"  {name:40s} n={len(d):7d} total={sum(d) / 1e6:9.1f} ms "
                  f"mean={sum(d) / len(d) / 1e3:8.1f} us max={max(d) / 1e6:7.2f} ms")
    stage1 = [t for t, n in names.items() if "stage1" in n]
    window = None
    for tid in stage1:
        mine = [(b, e, s.get(n, "?")) for b, e, n, t in calls if t == tid]
        if not mine:
            continue
        # The first call after model load: skip the loading burst by taking the first call that
        # follows a gap of at least 50 ms (the stage idles until a request arrives).
        first = mine[0][0]
        for (b0, e0, _), (b1, _, _) in zip(mine, mine[1:]):
            if b1 - e0 > 50e6:
                first = b1
                break
        window = (first, first + args.window_ms * 1e6)
        inside = [(b, e, n) for b, e, n in mine if window[0] <= b < window[1]]
        busy = sum(e - b for b, e, _ in inside)
        print(f"\n== stage 1 ({names[tid]}), first {args.window_ms:.0f} ms after its first request: "
              f"{len(inside)} calls, {busy / 1e6:.1f} ms inside CUDA API calls")
        for b, e, n in sorted(inside, key=lambda x: x[0] - x[1])[:15]:
            print(f"  +{(b - first) / 1e6:8.2f} ms  {n:40s} {(e - b) / 1e6:7.2f} ms")
    if window and "CUPTI_ACTIVITY_KIND_KERNEL" in tables:
        print(f"\n== GPU work per stream in that window")
        per_stream = defaultdict(lambda: [0, 0])
        for start, end, stream in db.execute(
            "select start, end, streamId from CUPTI_ACTIVITY_KIND_KERNEL where start >= ? and start < ?",
            window,
        ):
            per_stream[stream][0] += 1
            per_stream[stream][1] += end - start
        for stream, (n, t) in sorted(per_stream.items()):
            print(f"  stream {stream}: {n} kernels, {t / 1e6:.1f} ms busy")


if __name__ == "__main__":
    main()
