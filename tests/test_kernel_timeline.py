#!/usr/bin/env python3
"""bench/kernel_timeline.py on a made-up timeline whose answer is known: three replays of a graph
of three kernels (the second starts before the first ends, the third after an idle gap), a
graph replayed less, and a kernel outside any graph."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "bench", "kernel_timeline.py")
NAMES = ['void r3::ops::(anonymous namespace)::rows_kernel<1, ops::PlainMatrix<float>, 1, 8, 0>(const float*, long)',
         'void r3::moe::(anonymous namespace)::gate_up_by_pair<X, 1>(int)', 'r3::ops::<unnamed>::merge_chunks(float*)']


class KernelTimelineTest(unittest.TestCase):
    def test_exposed_time_and_gaps_add_up_to_the_span(self):
        rows = ["start_ns,end_ns,graph,node,stream,grid,block,shared_bytes,carveout_bytes,name",
                '5,6,0,0,1,1,1,0,0,"fill"']
        t = 0
        for _ in range(4):  # the first replay is left out
            t += 10_000
            for node, (start, end) in enumerate([(0, 1000), (800, 2500), (3000, 3500)]):
                carveout = 32768 if node == 1 else 8192  # the middle kernel's SMs reconfigured
                rows.append(f'{t + start},{t + end},7,{100 + node},1,132,256,0,{carveout},"{NAMES[node]}"')
            t += 3500
        for _ in range(2):
            t += 10_000
            rows.append(f"{t},{t + 100},9,5,1,1,32,0,0,\"other\"")
            t += 100
        with tempfile.TemporaryDirectory() as d:
            csv_path, json_path = os.path.join(d, "t.csv"), os.path.join(d, "t.json")
            with open(csv_path, "w") as f:
                f.write("\n".join(rows) + "\n")
            subprocess.run([sys.executable, SCRIPT, csv_path, "--json", json_path], check=True, capture_output=True)
            with open(json_path) as f:
                got = json.load(f)
        self.assertEqual(got["graph"], 7)
        self.assertEqual(got["replays"], 3)
        self.assertAlmostEqual(got["span_us"], 3.5)
        self.assertEqual(got["carveout_changes_per_replay"], 2)
        by_name = {k["kernel"]: k for k in got["kernels"]}
        self.assertEqual(set(by_name), {"rows_kernel<1, PlainMatrix<float>, 1, 8, 0>", "gate_up_by_pair<X, 1>",
                                        "merge_chunks"})
        self.assertAlmostEqual(by_name["rows_kernel<1, PlainMatrix<float>, 1, 8, 0>"]["exposed_us"], 1.0)
        self.assertAlmostEqual(by_name["gate_up_by_pair<X, 1>"]["exposed_us"], 1.5)  # 0.2 us under the first
        self.assertAlmostEqual(by_name["gate_up_by_pair<X, 1>"]["mean_duration_us"], 1.7)
        self.assertAlmostEqual(by_name["merge_chunks"]["gap_us"], 0.5)
        self.assertEqual(by_name["gate_up_by_pair<X, 1>"]["carveout_kb"], [32])
        total = sum(k["exposed_us"] + k["gap_us"] for k in got["kernels"])
        self.assertAlmostEqual(total, got["span_us"])


if __name__ == "__main__":
    unittest.main()
