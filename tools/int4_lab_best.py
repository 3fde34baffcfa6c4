#!/usr/bin/env python3
# Per shape (name, tokens, group) of a bench/int4_lab.cu output: "lib B" (the library in 8-row blocks)
# and the three fastest designs, from its final table. Usage: tools/int4_lab_best.py LAB_OUTPUT
import sys, re, collections
txt = open(sys.argv[1]).read()
part = txt.split("final table")[-1].splitlines()
best = collections.defaultdict(list)
for l in part[2:]:
    m = re.match(r"(.+?)\s+((?:l8b|q8b|q0\.6b|l70b)\.\S+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+(\d+)", l)
    if m:
        best[(m.group(2), m.group(3), m.group(4))].append((float(m.group(5)), m.group(1).strip()))
for k, v in best.items():
    v.sort()
    lib = [t for t, n in v if n == "lib B"]
    print(k, "lib B", lib, "best", v[:3], flush=True)
