#!/usr/bin/env python3
"""Side-by-side table of omnitts' GPU benchmark (examples/bench_gpu.rs, one JSON document) and the official
PyTorch reference (shared/bench/ref_bench.py --json-out, one JSON line per size), with ratios reference/omnitts
(> 1: omnitts is faster / smaller).

    python3 scripts/bench_compare.py omnitts.json ref.jsonl [--json out.json]
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("omnitts")
    ap.add_argument("ref")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    ours = json.load(open(a.omnitts))
    refs = {}
    for line in open(a.ref):
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            if r.get("bench") == "qwen3-tts-ref":
                refs[r["size"]] = r
    rows = []
    for res in ours["results"]:
        size = res["size"]
        ref = refs.get(size)
        modes = {m["mode"]: m for m in res["modes"]}
        batch = modes.get("batch")
        peak = res["memory"]["peak_model_gib"][0]
        for name, m in modes.items():
            row = {"size": size, "mode": name, "ttfa_ms": m["ttfa_ms"], "ar_ms_per_frame": m["ar_ms_per_frame"],
                   "cp_ms_per_frame": m["cp_ms_per_frame"], "talker_ms_per_frame": m["talker_ms_per_frame"],
                   "decoder_ms_total": m["decoder_ms_total"], "rtf": m["rtf"], "peak_gib": peak}
            if ref:
                # The reference does not stream: its first audio arrives with the whole utterance.
                row["ref"] = {"ttfa_ms": ref["total_ms"], "ar_ms_per_frame": ref["ar_ms_per_frame"],
                              "cp_ms_per_frame": ref["code_predictor_ms_per_frame"],
                              "talker_ms_per_frame": ref["talker_loop_ms_per_frame"],
                              "decoder_ms_total": ref["decode_ms"], "rtf": ref["rtf"], "peak_gib": ref["peak_gib"]}
                row["ratio_ref_over_omnitts"] = {k: (row["ref"][k] / row[k] if row[k] else None)
                                                 for k in row["ref"]}
            rows.append(row)
    hdr = f"{'size':<5} {'mode':<8} {'':<8} {'TTFA ms':>9} {'AR ms/f':>8} {'CP ms/f':>8} {'talk ms/f':>9} " \
          f"{'dec ms':>8} {'RTF':>7} {'peak GiB':>8}"
    print(hdr)
    for r in rows:
        def line(tag, d, fmt):
            print(f"{r['size']:<5} {r['mode']:<8} {tag:<8} " + " ".join(
                fmt[k].format(d[k]) if d.get(k) is not None else f"{'-':>{int(fmt[k][2:].split('.')[0])}}"
                for k in ("ttfa_ms", "ar_ms_per_frame", "cp_ms_per_frame", "talker_ms_per_frame",
                          "decoder_ms_total", "rtf", "peak_gib")))
        f = {"ttfa_ms": "{:9.1f}", "ar_ms_per_frame": "{:8.2f}", "cp_ms_per_frame": "{:8.2f}",
             "talker_ms_per_frame": "{:9.2f}", "decoder_ms_total": "{:8.1f}", "rtf": "{:7.3f}", "peak_gib": "{:8.2f}"}
        line("omnitts", r, f)
        if "ref" in r:
            line("ref", r["ref"], f)
            fr = {k: "{:8.2f}x".replace("8", str(int(v[2:].split('.')[0]) - 1)) for k, v in f.items()}
            line("ref/omni", r["ratio_ref_over_omnitts"], fr)
    doc = {"bench": "omnitts-vs-ref", "rows": rows}
    if a.json:
        json.dump(doc, open(a.json, "w"), indent=1)
    print(json.dumps(doc, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
