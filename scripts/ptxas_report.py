#!/usr/bin/env python3
"""Summarise `nvcc -Xptxas -v` output (a build log on stdin): one line per kernel with
registers, stack, spills. Usage: cmake --build build 2>&1 | python3 scripts/ptxas_report.py"""
import re
import subprocess
import sys

# Stack and spill lines follow "Function properties for <name>": they belong to the entry only
# when <name> is the entry itself (device functions such as __internal_accurate_pow have their
# own properties block after the entry's, which must not overwrite it).
entries, cur, props_of_entry = {}, None, False
for line in sys.stdin:
    m = re.search(r"Compiling entry function '(\S+)' for '(\S+)'", line)
    if m:
        cur = (m.group(1), m.group(2))
        entries[cur] = {}
        props_of_entry = False
        continue
    if cur is None:
        continue
    m = re.search(r"Function properties for (\S+)", line)
    if m:
        props_of_entry = m.group(1) == cur[0]
        continue
    if not props_of_entry:
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
