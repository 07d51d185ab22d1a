"""Summarises ncu's per-instruction warp-state samples (`ncu -i R --page source --csv --print-source sass`):
per block of 64 SASS instructions, the samples of every stall reason, and the instructions with the
most `no_instruction` samples (the warp waiting on its own code). Column names vary across ncu
versions: the script takes every numeric column whose name says "Samples" or a stall reason.
    python3 benchmarks/pc_stalls.py report.csv [block]"""

import csv
import re
import sys


def num(s):
    try:
        return float(str(s).replace(",", ""))
    except ValueError:
        return None


def main():
    path = sys.argv[1]
    block = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    rows = list(csv.reader(open(path, newline="")))
    # the header: the first row naming an address column
    h = next(i for i, r in enumerate(rows) if any(c.strip().lower() in ("address", "# address") for c in r))
    head = [c.strip() for c in rows[h]]
    body = [r for r in rows[h + 1:] if len(r) == len(head)]
    addr_i = next(i for i, c in enumerate(head) if c.lower() in ("address", "# address"))
    src_i = next((i for i, c in enumerate(head) if c.lower() == "source"), None)
    cols = [i for i, c in enumerate(head) if re.search(r"sampl|stall|no_instr", c, re.I)
            and any(num(r[i]) is not None for r in body[:50])]
    print("columns:", [head[i] for i in cols])
    ni = next((i for i in cols if re.search(r"no.?instr", head[i], re.I)), None)
    tot = next((i for i in cols if re.search(r"all samples|sampling \(all", head[i], re.I)), cols[0] if cols else None)
    blocks = {}
    for k, r in enumerate(body):
        b = k // block
        d = blocks.setdefault(b, [0.0] * len(cols) + [r[src_i] if src_i is not None else "", r[addr_i]])
        for j, i in enumerate(cols):
            d[j] += num(r[i]) or 0.0
    print(f"{'block':>5} {'first addr':>10} " + " ".join(f"{head[i][:14]:>14}" for i in cols) + "  first instruction")
    for b in sorted(blocks):
        d = blocks[b]
        if tot is not None and d[cols.index(tot)] == 0:
            continue
        print(f"{b:5d} {d[-1]:>10} " + " ".join(f"{v:14.0f}" for v in d[:len(cols)]) + "  " + d[-2][:50])
    if ni is not None:
        print("\nmost no_instruction samples:")
        top = sorted(range(len(body)), key=lambda k: -(num(body[k][ni]) or 0))[:25]
        for k in top:
            r = body[k]
            print(f"  #{k:5d} {r[addr_i]:>8} {num(r[ni]):8.0f}  total {num(r[tot]) if tot is not None else 0:8.0f}  "
                  f"{r[src_i][:70] if src_i is not None else ''}")
    if tot is not None:
        print("\nsample totals:", {head[i]: sum(num(r[i]) or 0 for r in body) for i in cols})


if __name__ == "__main__":
    main()
