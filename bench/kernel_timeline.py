#!/usr/bin/env python3
"""Where a CUDA-graph decode step spends its time, from bench/kernel_timeline.cpp's rows (every
kernel's start and end as it ran).

Each graph's replays are split apart (a replay ends where a node repeats). For the chosen graph
(by default the one replayed most, then the one with the most nodes: `r3 bench
--synthetic` replays its main step, capture on and tokens drawn, more than any other), every node of every replay
after the first is placed on the step's clock:
- exposed: how far it moves the step's end, end - max(start, the latest end before it), at least 0
  (what removing the kernel could at most save; nodes that overlap their predecessor expose less
  than they last);
- gap: the idle time before it, start - the latest end before it, at least 0 (launch latency the
  programmatic launches did not hide).
Sums of exposed and gap over a replay make its span. Also counted: how often consecutive kernels ran
with different shared-memory carveouts (an SM reconfigures between them, so they cannot overlap).
The table sums them per kernel name for one replay (means over the replays), largest exposed
first.

Usage: kernel_timeline.py TIMELINE.csv [--graph ID] [--json OUT]
"""
import argparse
import csv
import json
import re
import statistics
from collections import defaultdict


def short_name(name):
    """The kernel's name without return type, namespaces and arguments; template arguments kept."""
    name = re.sub(r"\(anonymous namespace\)::|<unnamed>::", "", name.removeprefix("void "))
    name = name.split("(", 1)[0]
    name = re.sub(r"\br3::", "", name)
    name = re.sub(r"\b(ops|moe|cuda|experts_detail|draw_detail|models)::", "", name)
    return name if len(name) <= 90 else name[:87] + "..."


def replays_of(rows):
    """A graph's rows split into replays: start order, a new replay where a node repeats."""
    out, current, seen = [], [], set()
    for r in sorted(rows, key=lambda r: r["start"]):
        if r["node"] in seen:
            out.append(current)
            current, seen = [], set()
        current.append(r)
        seen.add(r["node"])
    if current:
        out.append(current)
    return out


def place(replay):
    """Each node's duration, exposed time and gap before it (ns), in start order."""
    placed, latest_end = [], None
    for r in replay:
        before = r["start"] if latest_end is None else latest_end
        exposed = max(0, r["end"] - max(r["start"], before))
        gap = max(0, r["start"] - before)
        placed.append((r, r["end"] - r["start"], exposed, gap))
        latest_end = r["end"] if latest_end is None else max(latest_end, r["end"])
    return placed


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("timeline")
    parser.add_argument("--graph", type=int, help="the graph to break down (default: most replays, then most nodes)")
    parser.add_argument("--json", help="also write the breakdown here")
    args = parser.parse_args()
    graphs = defaultdict(list)
    with open(args.timeline) as f:
        for row in csv.DictReader(f):
            if int(row["graph"]) == 0:
                continue
            graphs[int(row["graph"])].append({"start": int(row["start_ns"]), "end": int(row["end_ns"]),
                                              "node": int(row["node"]), "grid": int(row["grid"]),
                                              "carveout": int(row.get("carveout_bytes") or -1),
                                              "name": row["name"]})
    if not graphs:
        raise SystemExit("kernel_timeline.py: no kernels ran inside a graph")
    split = {g: replays_of(rows) for g, rows in graphs.items()}
    print("graph  nodes  replays  mean span (us)")
    for g, replays in sorted(split.items()):
        spans = [(max(r["end"] for r in rp) - min(r["start"] for r in rp)) / 1e3 for rp in replays[1:]] or [0.0]
        print(f"{g:5d}  {len(replays[0]):5d}  {len(replays):7d}  {statistics.mean(spans):14.1f}")
    chosen = args.graph if args.graph is not None else max(split, key=lambda g: (len(split[g]), len(split[g][0])))
    replays = [rp for rp in split[chosen][1:] if len(rp) == len(split[chosen][0])] or split[chosen]
    per_name = defaultdict(lambda: {"count": 0, "duration": 0.0, "exposed": 0.0, "gap": 0.0, "carveouts": set()})
    changes = 0  # consecutive kernels whose SMs ran with different shared-memory carveouts
    spans = []
    for rp in replays:
        spans.append(max(r["end"] for r in rp) - min(r["start"] for r in rp))
        changes += sum(a["carveout"] != b["carveout"] for a, b in zip(rp, rp[1:]))
        for r, duration, exposed, gap in place(rp):
            s = per_name[short_name(r["name"])]
            s["carveouts"].add(r["carveout"])
            s["count"] += 1
            s["duration"] += duration
            s["exposed"] += exposed
            s["gap"] += gap
    n = len(replays)
    span_us = statistics.mean(spans) / 1e3
    recorded = any(r["carveout"] >= 0 for r in replays[0])
    print(f"\ngraph {chosen}: {len(replays[0])} kernels a replay, {n} replays, span {span_us:.1f} us, " +
          (f"{changes / n:.0f} changes of shared-memory carveout a replay" if recorded else "carveouts not recorded"))
    print(" a replay: exposed us  gap us   kernels  mean us (alone)  carveout KB  kernel")
    table = []
    for name, s in sorted(per_name.items(), key=lambda kv: -kv[1]["exposed"]):
        line = {"kernel": name, "per_replay": s["count"] / n, "exposed_us": s["exposed"] / n / 1e3,
                "gap_us": s["gap"] / n / 1e3, "mean_duration_us": s["duration"] / s["count"] / 1e3,
                "carveout_kb": sorted(c // 1024 for c in s["carveouts"] if c >= 0)}
        table.append(line)
        print(f"{line['exposed_us']:19.1f} {line['gap_us']:7.1f} {line['per_replay']:9.0f} "
              f"{line['mean_duration_us']:16.2f}  {','.join(map(str, line['carveout_kb'])):>11}  {name}")
    total_exposed = sum(t["exposed_us"] for t in table)
    total_gap = sum(t["gap_us"] for t in table)
    print(f"{total_exposed:19.1f} {total_gap:7.1f}  (sums; exposed + gap = span)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"graph": chosen, "replays": n, "span_us": span_us, "carveout_changes_per_replay": changes / n,
                       "kernels": table}, f, indent=1)


if __name__ == "__main__":
    main()
