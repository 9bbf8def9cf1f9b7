#!/usr/bin/env python3
"""bench/floor_shares.py on made-up timelines whose answer is worked out by hand: bf16's as
kernel_timeline.py's JSON, FP8's as the table kernel_timeline.py prints for a made-up CSV (so the
parser reads the printer's real format)."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

BENCH = os.path.join(os.path.dirname(__file__), "..", "bench")
TIMELINE, SHARES = os.path.join(BENCH, "kernel_timeline.py"), os.path.join(BENCH, "floor_shares.py")

# bf16: a 3.5 us span; gate/up (a projection) exposes 2.3 us, the float32 router rows 0.2 and
# attention 0.8, so the short links take 1.0 us.
BF16 = {"graph": 1, "replays": 3, "span_us": 3.5, "carveout_changes_per_replay": 0, "kernels": [
    {"kernel": "gate_up_by_pair<PlainMatrix<__nv_bfloat16>, true, Activation, false, 0, 1>", "exposed_us": 2.3},
    {"kernel": "rows_kernel<true, PlainMatrix<float>, 1, 8, false>", "exposed_us": 0.2},
    {"kernel": "attention_chunks_mma<8, 128, true>", "exposed_us": 0.8}]}
# FP8: three kernels one after another, no overlap or gap: gate/up 1.0 us, an RMSNorm 0.3 us, an
# FP8 projection 0.5 us (span 1.8 us, short links 0.3 us).
FP8_KERNELS = [("void r3::moe::(anonymous namespace)::gate_up_by_pair<Fp8Matrix, true>(int)", 1000),
               ("void r3::ops::cuda::(anonymous namespace)::rms_norm_rows<true>(float*)", 300),
               ("void r3::ops::cuda::(anonymous namespace)::rows_kernel<true, Fp8Matrix, 1, 2, true>(const float*)", 500)]


def fp8_csv():
    rows = ["start_ns,end_ns,graph,node,stream,grid,block,shared_bytes,carveout_bytes,name"]
    t = 0
    for _ in range(3):  # the first replay is left out
        t += 10_000
        for node, (name, length) in enumerate(FP8_KERNELS):
            rows.append(f'{t},{t + length},4,{node},1,132,256,0,16384,"{name}"')
            t += length
    return "\n".join(rows) + "\n"


class FloorSharesTest(unittest.TestCase):
    def run_shares(self, *extra, floors=("--floor-bf16", "0.002", "--floor-fp8", "0.001"), check=True):
        with tempfile.TemporaryDirectory() as d:
            for label, floor in (("bf16", 0.002), ("fp8", 0.001)):  # `r3 bench --json`'s shape, batch 1 first
                with open(os.path.join(d, f"bench_{label}.json"), "w") as f:
                    json.dump({"decode": [{"batch": 1, "floor_ms": floor}, {"batch": 8, "floor_ms": 9.0}]}, f)
            bf16, csv_path = os.path.join(d, "bf16.json"), os.path.join(d, "fp8.csv")
            with open(bf16, "w") as f:
                json.dump(BF16, f)
            with open(csv_path, "w") as f:
                f.write(fp8_csv())
            table = subprocess.run([sys.executable, TIMELINE, csv_path], check=True, capture_output=True, text=True)
            fp8 = os.path.join(d, "fp8.txt")
            with open(fp8, "w") as f:
                f.write(table.stdout)
            floors = [a.replace("DIR", d) for a in floors]
            run = subprocess.run([sys.executable, SHARES, bf16, fp8, *floors, *extra], capture_output=True, text=True)
        if not check:
            return run
        self.assertEqual(run.returncode, 0, run.stderr)
        return json.loads(run.stdout.strip().splitlines()[-1])

    def test_the_split_and_the_bound_from_the_spans(self):
        got = self.run_shares()
        self.assertAlmostEqual(got["bf16"]["share"], 2 / 3.5, places=9)
        self.assertAlmostEqual(got["bf16"]["shared_ms"], 0.0010, places=9)
        self.assertAlmostEqual(got["bf16"]["projections_above_bytes_ms"], 0.0035 - 0.002 - 0.001, places=9)
        self.assertAlmostEqual(got["fp8"]["step_ms"], 0.0018, places=9)
        self.assertAlmostEqual(got["fp8"]["shared_ms"], 0.0003, places=9)
        self.assertAlmostEqual(got["fp8"]["projections_above_bytes_ms"], 0.0018 - 0.001 - 0.0003, places=9)
        # FP8 at bf16's share: 0.001 / (2 / 3.5); the shared part at most r x_bf16 / (1 - r), r = 1/2.
        self.assertAlmostEqual(got["fp8_step_at_bf16_share_ms"], 0.00175, places=9)
        self.assertAlmostEqual(got["shared_max_ms"], 0.0005, places=9)

    def test_untraced_step_times_replace_the_spans(self):
        got = self.run_shares("--step-bf16", "0.004", "--step-fp8", "0.002")
        self.assertAlmostEqual(got["bf16"]["share"], 0.5, places=9)
        self.assertAlmostEqual(got["fp8"]["projections_above_bytes_ms"], 0.002 - 0.001 - 0.0003, places=9)
        self.assertAlmostEqual(got["shared_max_ms"], 0.001, places=9)  # x_bf16 = 0.004 - 0.002 - 0.001

    def test_floors_from_the_benches_json(self):
        got = self.run_shares(floors=("--floors-from", "DIR/bench_bf16.json", "DIR/bench_fp8.json"))
        self.assertAlmostEqual(got["bf16"]["floor_ms"], 0.002, places=12)
        self.assertAlmostEqual(got["fp8"]["floor_ms"], 0.001, places=12)
        self.assertAlmostEqual(got["shared_max_ms"], 0.0005, places=9)

    def test_a_missing_floor_is_refused(self):
        run = self.run_shares(floors=("--floor-bf16", "0.002"), check=False)
        self.assertEqual(run.returncode, 2)
        self.assertIn("give both floors", run.stderr)


if __name__ == "__main__":
    unittest.main()
