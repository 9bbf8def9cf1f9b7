#!/usr/bin/env python3
"""Per-kernel time of a profiled run: reads the CSV that Nsight Compute writes with
`ncu --csv --metrics gpu__time_duration.sum` and prints each kernel's total, count and mean,
largest first (bench/gpu.sh runs it on one decode step of the synthetic model)."""
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
hdr = None
agg = collections.OrderedDict()
for r in rows:
    if 'Kernel Name' in r and 'Metric Value' in r:
        hdr = r; continue
    if hdr is None or len(r) != len(hdr): continue
    d = dict(zip(hdr, r))
    if d.get('Metric Name') != 'gpu__time_duration.sum': continue
    name = d['Kernel Name'].split('(')[0][:90]
    v = float(d['Metric Value'].replace(',', ''))
    unit = d.get('Metric Unit', 'nsecond')
    if unit.startswith('us'): v *= 1e3
    if unit.startswith('ms'): v *= 1e6
    a = agg.setdefault(name, [0, 0.0]); a[0] += 1; a[1] += v
tot = sum(a[1] for a in agg.values())
for n, (c, t) in sorted(agg.items(), key=lambda x: -x[1][1]):
    print(f"{t/1e3:9.1f} us  {c:5d}x  {t/c/1e3:7.2f} us avg  {n}")
print(f"total {tot/1e3:.1f} us over {sum(a[0] for a in agg.values())} kernels")
