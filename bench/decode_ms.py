#!/usr/bin/env python3
"""One JSON line from an `r3 bench --json` result: its decode step times by batch and its prefill
rate (tokens/s, when the result has one), with the labels given as key=value arguments (integers
kept as numbers). bench/gpu.sh's A/B and
bench/gpu_vs_base.sh print their comparisons with it.

Usage: decode_ms.py RESULT.json [key=value ...]
"""
import json
import sys


def label(value):
    return int(value) if value.lstrip("-").isdigit() else value


def main():
    result = json.load(open(sys.argv[1]))
    line = {key: label(value) for key, value in (arg.split("=", 1) for arg in sys.argv[2:])}
    line["ms"] = {row["batch"]: row["ms"] for row in result["decode"]}
    if "prefill" in result:
        line["prefill_tokens_per_s"] = round(result["prefill"]["tokens_per_s"], 1)
    print(json.dumps(line))


if __name__ == "__main__":
    main()
