"""The distinct tests of several pytest junit files (one per device call), and which of the
locally collected tests none of them ran.

    python3 scripts/junit_union.py OUT1/pytest.xml OUT2/pytest.xml ... [--left FILE]

Prints the distinct counts (a test that failed in any file counts as failed), the tests that did
not pass, and per test file how many of its locally collected tests ran. With --left, writes the
node ids none of the files ran, one per line, for a follow-up call:
``mapfile -t ids < FILE; python3 -m pytest "${ids[@]}"`` (session 30's call 3).
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import xml.etree.ElementTree as ET


def node_id(case: ET.Element) -> str:
    """tests.python.test_x + name -> tests/python/test_x.py::name (pytest's node id)."""
    cls = case.get("classname") or ""
    return cls.replace(".", "/") + ".py::" + (case.get("name") or "")


def outcome(case: ET.Element) -> str:
    for child in case:
        if child.tag in ("failure", "error"):
            return "failed"
        if child.tag == "skipped":
            return "skipped"
    return "passed"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("xml", nargs="+")
    ap.add_argument("--left", help="write the collected node ids no file ran to this file")
    ap.add_argument("--paths", default="tests/python", help="what to collect locally (default: tests/python)")
    args = ap.parse_args()

    results: dict[str, str] = {}
    for path in args.xml:
        for case in ET.parse(path).iter("testcase"):
            key = node_id(case)
            if results.get(key) != "failed":
                results[key] = outcome(case)
    counts = collections.Counter(results.values())
    print(f"{len(results)} distinct tests: " + ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "skipped")))
    for key, state in sorted(results.items()):
        if state != "passed":
            print(f"  {state}: {key}")

    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                args.paths], capture_output=True, text=True).stdout
    ids = [line for line in collected.splitlines() if "::" in line]
    left = [i for i in ids if i not in results]
    per_file = collections.Counter(i.split("::")[0] for i in ids)
    left_file = collections.Counter(i.split("::")[0] for i in left)
    print(f"{len(ids)} collected here, {len(left)} not run")
    for f in sorted(left_file):
        print(f"  {f}: {per_file[f] - left_file[f]} of {per_file[f]} ran")
    if args.left:
        with open(args.left, "w") as fh:
            fh.write("".join(i + "\n" for i in left))
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
