#!/usr/bin/env python3
"""One table from bench sweep outputs (scripts/gpu_sweep.sh, scripts/gpu_ab.sh): a row per case,
a column per config label, the median GPU us of every round joined by '/'.

    python3 scripts/sweep_table.py round1.txt round2.txt ...

Each input holds blocks that start with a line "== <label> (<assignments>)" followed by the
bench's table lines (routine, shape, dtype, gpu_us, ...)."""

from __future__ import annotations

import re
import sys
from collections import OrderedDict, defaultdict

_ROW = re.compile(r"^([a-z_]+)\s+(.*?)\s+(bfloat16|float16|float32|-)\s+([0-9.]+)\s")


def parse(paths):
    labels, cases = [], OrderedDict()
    for path in paths:
        label = None
        with open(path) as f:
            for line in f:
                if line.startswith("== "):
                    label = line[3:].split(" (")[0].strip()
                    if label not in labels:
                        labels.append(label)
                    continue
                m = _ROW.match(line)
                if label and m:
                    cases.setdefault((m.group(1), m.group(2)), defaultdict(list))[label].append(float(m.group(4)))
    return labels, cases


def main(argv):
    if not argv:
        print(__doc__.strip())
        return 2
    labels, cases = parse(argv)
    width = max([34] + [len(f"{r} {s}") + 1 for r, s in cases])
    print("case".ljust(width) + "".join(label[:18].rjust(19) for label in labels))
    for (routine, shape), by_label in cases.items():
        cells = ("/".join(f"{v:.2f}" for v in by_label.get(label, [])) for label in labels)
        print(f"{routine} {shape}".ljust(width) + "".join(c.rjust(19) for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
