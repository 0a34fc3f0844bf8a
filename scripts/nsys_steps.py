#!/usr/bin/env python3
"""Where the GPU's and the host's time goes in an omnitts run, from an Nsight Systems trace.

    nsys profile -o RUN --trace=cuda --cuda-graph-trace=graph --sample=none CMD...
    nsys export --type sqlite -o RUN.sqlite RUN.nsys-rep
    python3 scripts/nsys_steps.py RUN.sqlite [--thread omnitts-stage0] [--top 25] [--skip-s 0]

Prints, for the traced window (from the first to the last GPU activity, after --skip-s seconds):
- the GPU's busy share (the union of every kernel, copy and memset), and per launching thread (the
  engine names its threads: omnitts-stage0-ar, omnitts-stage1-*; Linux keeps 15 characters) its own
  busy share, how much of it overlaps the other threads' work, and its kernels and copies;
- for the thread given with --thread (stage 0 by default): its graph launches as steps: the period
  between launches, the GPU span of each launch's work (first kernel start to last kernel end) and
  the host's part (period minus span), p50 / p95 in ms; the driver calls between two launches
  (count and time by name), and the kernels launched outside the graphs;
- the kernels with the most total time, by name and launching thread.
Only the standard library is used; the sqlite schema is the one `nsys export` writes (2023-2025
releases: CUPTI_ACTIVITY_KIND_KERNEL / _MEMCPY / _MEMSET / _RUNTIME, StringIds, ThreadNames).
"""
import argparse
import collections
import sqlite3
import statistics


def union_ns(intervals):
    """Total length of the union of (start, end) intervals, in ns."""
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def intersect_ns(a, b):
    """Length of (union of a) ∩ (union of b), in ns."""
    return union_ns(a) + union_ns(b) - union_ns(a + b)


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sqlite")
    ap.add_argument("--thread", default="omnitts-stage0", help="prefix of the stepping thread's name")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--skip-s", type=float, default=0.0, help="seconds of GPU activity left out at the start")
    a = ap.parse_args()

    db = sqlite3.connect(a.sqlite)
    tables = {r[0] for r in db.execute("select name from sqlite_master where type='table'")}
    strings = dict(db.execute("select id, value from StringIds"))
    tname = collections.defaultdict(lambda: "?")
    if "ThreadNames" in tables:
        for tid, nid in db.execute("select globalTid, nameId from ThreadNames"):
            tname[tid] = strings.get(nid, "?")
    api = db.execute(
        "select start, end, nameId, globalTid, correlationId from CUPTI_ACTIVITY_KIND_RUNTIME"
    ).fetchall()
    corr_tid = {c: t for (_, _, _, t, c) in api}

    gpu = []  # (start, end, kind, name, tid, correlationId)
    for s, e, c, n in db.execute(
        "select start, end, correlationId, shortName from CUPTI_ACTIVITY_KIND_KERNEL"
    ):
        gpu.append((s, e, "kernel", strings.get(n, "?"), corr_tid.get(c), c))
    if "CUPTI_ACTIVITY_KIND_GRAPH_TRACE" in tables:
        # --cuda-graph-trace=graph: a graph launch's work as one range (no kernels of its own).
        for s, e, c in db.execute(
            "select start, end, correlationId from CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
        ):
            gpu.append((s, e, "kernel", "graph", corr_tid.get(c), c))
    if "CUPTI_ACTIVITY_KIND_MEMCPY" in tables:
        for s, e, c, k, b in db.execute(
            "select start, end, correlationId, copyKind, bytes from CUPTI_ACTIVITY_KIND_MEMCPY"
        ):
            kind = {1: "HtoD", 2: "DtoH", 8: "DtoD"}.get(k, f"copy{k}")
            gpu.append((s, e, "copy", f"memcpy {kind}", corr_tid.get(c), c))
    if "CUPTI_ACTIVITY_KIND_MEMSET" in tables:
        for s, e, c in db.execute("select start, end, correlationId from CUPTI_ACTIVITY_KIND_MEMSET"):
            gpu.append((s, e, "copy", "memset", corr_tid.get(c), c))
    if not gpu:
        print("no GPU activity in the trace")
        return
    t0 = min(g[0] for g in gpu) + int(a.skip_s * 1e9)
    gpu = [g for g in gpu if g[0] >= t0]
    t_end = max(g[1] for g in gpu)
    window = t_end - t0
    print(f"window {window / 1e6:.1f} ms (after {a.skip_s} s skipped); GPU busy "
          f"{100 * union_ns([(g[0], g[1]) for g in gpu]) / window:.1f} %")

    by_tid = collections.defaultdict(list)
    for g in gpu:
        by_tid[g[4]].append(g)
    print("\nlaunching thread            busy %  overlapped by others %  kernels  kernel ms  copies  copy ms")
    for tid, gs in sorted(by_tid.items(), key=lambda kv: -len(kv[1])):
        mine = [(g[0], g[1]) for g in gs]
        others = [(g[0], g[1]) for t, o in by_tid.items() if t != tid for g in o]
        busy = union_ns(mine)
        ov = intersect_ns(mine, others) if others else 0
        k = [g for g in gs if g[2] == "kernel"]
        c = [g for g in gs if g[2] == "copy"]
        print(f"{tname[tid][:26]:26s} {100 * busy / window:7.1f}  {100 * ov / max(busy, 1):21.1f}  "
              f"{len(k):7d}  {sum(g[1] - g[0] for g in k) / 1e6:9.1f}  {len(c):6d}  "
              f"{sum(g[1] - g[0] for g in c) / 1e6:7.1f}")

    # Steps of the stepping thread: its graph launches.
    step_tids = [t for t in by_tid if tname[t].startswith(a.thread)]
    calls = sorted(
        (s, e, strings.get(n, "?"), c) for (s, e, n, t, c) in api if t in step_tids and s >= t0
    )
    launches = [x for x in calls if x[2].startswith(("cuGraphLaunch", "cudaGraphLaunch"))]
    span = {}
    for g in gpu:
        if g[4] in step_tids:
            lo, hi = span.get(g[5], (g[0], g[1]))
            span[g[5]] = (min(lo, g[0]), max(hi, g[1]))
    if len(launches) >= 2:
        periods, spans, host = [], [], []
        between = collections.defaultdict(lambda: [0, 0])
        outside = collections.Counter()
        graph_corr = {x[3] for x in launches}
        for (s, _, _, c), (s2, _, _, _) in zip(launches, launches[1:]):
            p = s2 - s
            periods.append(p / 1e6)
            if c in span:
                spans.append((span[c][1] - span[c][0]) / 1e6)
                host.append((p - (span[c][1] - span[c][0])) / 1e6)
        for x in calls:
            if launches[0][0] <= x[0] < launches[-1][0]:
                between[x[2]][0] += 1
                between[x[2]][1] += x[1] - x[0]
        for g in gpu:
            if g[4] in step_tids and g[5] not in graph_corr and launches[0][0] <= g[0] < launches[-1][0]:
                outside[g[3]] += 1
        n = len(launches) - 1
        print(f"\n{a.thread}*: {len(launches)} graph launches; per step p50 / p95 ms: period "
              f"{pct(periods, 50):.2f} / {pct(periods, 95):.2f}, GPU span of the graph "
              f"{pct(spans, 50):.2f} / {pct(spans, 95):.2f}, the rest {pct(host, 50):.2f} / "
              f"{pct(host, 95):.2f} (mean period {statistics.mean(periods):.2f})")
        print("driver/runtime calls between launches, per step: count, ms")
        for name, (cnt, ns) in sorted(between.items(), key=lambda kv: -kv[1][1])[:15]:
            print(f"  {name[:48]:48s} {cnt / n:8.1f} {ns / n / 1e6:8.3f}")
        print("GPU work launched outside the graphs, per step:")
        for name, cnt in outside.most_common(12):
            print(f"  {name[:60]:60s} {cnt / n:6.1f}")

    print(f"\nGPU work by total time (top {a.top}): thread, name, count, total ms, mean us")
    agg = collections.defaultdict(lambda: [0, 0])
    for g in gpu:
        key = (tname[g[4]][:15], g[3])
        agg[key][0] += 1
        agg[key][1] += g[1] - g[0]
    for (t, name), (cnt, ns) in sorted(agg.items(), key=lambda kv: -kv[1][1])[: a.top]:
        print(f"  {t:15s} {name[:56]:56s} {cnt:7d} {ns / 1e6:9.2f} {ns / cnt / 1e3:8.2f}")


if __name__ == "__main__":
    main()
