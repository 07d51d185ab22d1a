#!/usr/bin/env python3
"""Summarise `nvcc -Xptxas -v` output (a build log on stdin): one line per kernel with
registers, stack, spills. Usage: cmake --build build 2>&1 | python3 scripts/ptxas_report.py"""
import re
import subprocess
import sys

entries, cur = {}, None
for line in sys.stdin:
    m = re.search(r"Compiling entry function '(\S+)' for '(\S+)'", line)
    if m:
        cur = (m.group(1), m.group(2))
        entries[cur] = {}
        continue
    if cur is None:
        continue
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m:
        entries[cur].update(stack=int(m.group(1)), spill=int(m.group(2)) + int(m.group(3)))
    m = re.search(r"Used (\d+) registers", line)
    if m:
        entries[cur]["regs"] = int(m.group(1))
names = [k[0] for k in entries]
demangled = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
rows = sorted((d, k[1], v) for d, (k, v) in zip(demangled, entries.items()))
bad = 0
for d, arch, v in rows:
    d = re.sub(r"\(flashinfer::\w+::\w+\)", "", d).replace("flashinfer::", "")
    d = re.sub(r"\(.*\)$", "", d)
    flag = "  <-- SPILLS" if v.get("spill", 0) else ""
    bad += bool(flag)
    print(f"{arch:7s} regs={v.get('regs', '?'):>3} stack={v.get('stack', 0):>3} spill={v.get('spill', 0):>3}  {d}{flag}")
print(f"{len(rows)} kernels, {bad} spilling")
sys.exit(1 if bad else 0)
