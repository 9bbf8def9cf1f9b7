#!/usr/bin/env python3
"""What equal shares of the bandwidth floor ask of a bf16 and an FP8 decode step (issue 15's GPU
criterion), from two kernel timelines of the same step (bench/kernel_timeline.py's --json output
or its printed table) and the two floors.

A step takes its floor F plus X, the time that is not weight bytes at the copy bandwidth; its
share is F / (F + X). X splits into C, the exposed time of the kernels whose work does not depend
on the weights' type (attention, norms, the q/k prepare, the router's float32 rows, the routing,
gathers: every kernel that is not a projection), and x = X - C, what the projections add to their
bytes. Equal shares need X_fp8 = r X_bf16 with r = F_fp8 / F_bf16. The part both types share
moves both steps alike, so with FP8's projections at exactly the copy bandwidth (x_fp8 = 0) it may
be at most C_max = r x_bf16 / (1 - r) (C + 0 <= r (C + x_bf16)).

The floors come from --floor-bf16 / --floor-fp8 (ms) or from `r3 bench --json` outputs of the
same runs (--floors-from BF16.json FP8.json: the first decode batch's floor_ms). The steps' times
default to the timelines' spans; --step-bf16 / --step-fp8 give untraced ones (ms).

Usage: floor_shares.py BF16_TIMELINE FP8_TIMELINE (--floor-bf16 MS --floor-fp8 MS | --floors-from BF16.json FP8.json)
                       [--step-bf16 MS] [--step-fp8 MS]
"""
import argparse
import json
import re

# Kernels that stream a projection's weights (their bytes are the weights' type): the experts'
# gate/up and down, and the rows kernels over bf16, FP8 or MXFP4 matrices. The router's float32
# rows are the same in both types, so they count with the short links.
PROJECTION = re.compile(r"gate_up|down_|Fp8Matrix|Mxfp4Matrix|PlainMatrix<__nv_bfloat16>")


def read_timeline(path):
    """(span in us, [(kernel, exposed us)]) from kernel_timeline.py's JSON or printed table."""
    with open(path) as f:
        text = f.read()
    if text.lstrip().startswith("{"):
        d = json.loads(text)
        return d["span_us"], [(k["kernel"], k["exposed_us"]) for k in d["kernels"]]
    # The printed table: the chosen graph's header, then "exposed gap kernels mean carveout name".
    span = float(re.search(r"graph \d+: .*? span ([0-9.]+) us", text).group(1))
    kernels = []
    for line in text[text.index(" a replay:"):].splitlines()[1:]:
        # exposed, gap, count, mean, then the carveouts (digits and commas, or nothing) and the name
        fields = line.split(None, 4)
        if len(fields) < 5 or "(sums" in line:
            break
        kernels.append((re.sub(r"^[0-9,]+\s+", "", fields[4]), float(fields[0])))
    return span, kernels


def shares(bf16, fp8, floor_bf16_ms, floor_fp8_ms, step_bf16_ms=None, step_fp8_ms=None):
    """The split of each step and the largest shared part that equal shares allow (ms)."""
    out = {}
    for label, (span_us, kernels), floor, step in (("bf16", bf16, floor_bf16_ms, step_bf16_ms),
                                                   ("fp8", fp8, floor_fp8_ms, step_fp8_ms)):
        step = span_us / 1e3 if step is None else step
        shared = sum(exposed for name, exposed in kernels if not PROJECTION.search(name)) / 1e3
        out[label] = {"step_ms": step, "floor_ms": floor, "share": floor / step, "above_floor_ms": step - floor,
                      "shared_ms": shared, "projections_above_bytes_ms": step - floor - shared}
    r = floor_fp8_ms / floor_bf16_ms
    out["fp8_step_at_bf16_share_ms"] = floor_fp8_ms / out["bf16"]["share"]
    out["shared_max_ms"] = r * out["bf16"]["projections_above_bytes_ms"] / (1 - r)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bf16_timeline")
    parser.add_argument("fp8_timeline")
    parser.add_argument("--floor-bf16", type=float)
    parser.add_argument("--floor-fp8", type=float)
    parser.add_argument("--floors-from", nargs=2, metavar=("BF16_JSON", "FP8_JSON"))
    parser.add_argument("--step-bf16", type=float)
    parser.add_argument("--step-fp8", type=float)
    args = parser.parse_args()
    floors = [args.floor_bf16, args.floor_fp8]
    if args.floors_from:
        floors = []
        for path in args.floors_from:
            with open(path) as f:
                floors.append(json.load(f)["decode"][0]["floor_ms"])
    if None in floors:
        parser.error("give both floors: --floor-bf16 and --floor-fp8, or --floors-from")
    got = shares(read_timeline(args.bf16_timeline), read_timeline(args.fp8_timeline), *floors, args.step_bf16,
                 args.step_fp8)
    for label in ("bf16", "fp8"):
        s = got[label]
        print(f"{label}: step {s['step_ms']:.3f} ms, floor {s['floor_ms']:.3f} ({100 * s['share']:.1f}%), "
              f"above the floor {s['above_floor_ms']:.3f}: short links {s['shared_ms']:.3f}, "
              f"projections over their bytes {s['projections_above_bytes_ms']:.3f}")
    print(f"FP8 at bf16's share needs {got['fp8_step_at_bf16_share_ms']:.3f} ms; with FP8's projections at the "
          f"copy bandwidth the short links may take at most {got['shared_max_ms']:.3f} ms "
          f"(today {got['bf16']['shared_ms']:.3f} bf16, {got['fp8']['shared_ms']:.3f} FP8)")
    print(json.dumps(got))


if __name__ == "__main__":
    main()
