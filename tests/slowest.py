"""`python tests/slowest.py [build/junit.xml] [N]`: the N slowest tests of a run (25 by default)
and the run's total, from the JUnit XML that `make test` keeps in build/ (.ci/run prints it
after every run; tests/README.md keeps a table of it).

`python tests/slowest.py build/junit.xml --modules tests/durations.json` writes each test
module's seconds instead: tests/conftest.py hands the longest modules out first, so the two
workers finish together (a module missing from the file counts as a short one)."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET


def slowest(path: str, n: int = 25) -> str:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    cases = [(float(c.get("time", 0)), f"{c.get('classname', '')}::{c.get('name', '')}")
             for s in suites for c in s.iter("testcase")]
    total = sum(float(s.get("time", 0)) for s in suites)
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures",
                                                                  "errors", "skipped")}
    lines = [f"{counts['tests']} tests ({counts['failures']} failed, {counts['errors']} errors, "
             f"{counts['skipped']} skipped) in {total:.0f} s; the {n} slowest (setup + call "
             "+ teardown):"]
    lines += [f"{t:8.1f} s  {name}" for t, name in sorted(cases, reverse=True)[:n]]
    failed = counts["failures"] + counts["errors"]
    passed = counts["tests"] - failed - counts["skipped"]
    lines.append(f"{passed} passed, {failed} failed, {counts['skipped']} skipped")
    return "\n".join(lines)


def module_seconds(path: str) -> dict[str, float]:
    """Each test module's seconds (setup + call + teardown of its tests), by its path from the
    repository root: tests.app.test_pages -> tests/app/test_pages.py."""
    root = ET.parse(path).getroot()
    out: dict[str, float] = {}
    for case in root.iter("testcase"):
        module = case.get("classname", "").replace(".", "/") + ".py"
        out[module] = out.get(module, 0.0) + float(case.get("time", 0))
    return {m: round(t, 1) for m, t in sorted(out.items(), key=lambda kv: -kv[1])}


if __name__ == "__main__":
    if "--modules" in sys.argv:
        import json

        i = sys.argv.index("--modules")
        with open(sys.argv[i + 1], "w", encoding="utf-8") as f:
            json.dump(module_seconds(sys.argv[1] if i > 1 else "build/junit.xml"), f, indent=0)
            f.write("\n")
    else:
        print(slowest(sys.argv[1] if len(sys.argv) > 1 else "build/junit.xml",
                      int(sys.argv[2]) if len(sys.argv) > 2 else 25))
