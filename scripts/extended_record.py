"""Write the record of an extended-tier run (docs/results/extended_tier.json) from pytest's JUnit XML.

    .venv/bin/python -m pytest --extended -m extended --junitxml=extended.xml
    python scripts/extended_record.py --commit $(git rev-parse --short HEAD) --junit extended.xml

A run made in parts gives one ``--junit`` per part, ``FILE@COMMIT`` where a
part ran other code than ``--commit`` (a rerun after a fix); a test run in
more than one part counts by its last part's outcome, and the record lists
it under ``rerun`` with every outcome it had. Tests of a part that left no
XML (stopped by hand) but whose passes pytest printed can be named with
``--passed-without-record FILE`` (one test id per line): they are recorded as
passed with no duration. ``--add-to`` keeps the parts of the record already
at ``--out`` (whose XML may be gone) and adds the new ones after them.
``--retired TEST=WHY`` names a test of an earlier part that no longer exists
as it ran (renamed, or asserting something else now): its rows stay in their
part but no longer count, and the record lists it under ``retired``.
"""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from pathlib import Path

OUTCOMES = {"failure": "failed", "error": "error", "skipped": "skipped"}  # JUnit's element: the outcome
OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "extended_tier.json"


def cases(junit: Path) -> tuple[str, list[dict]]:
    """The run's start time and each test case: id, outcome, seconds."""
    suite = ET.parse(junit).getroot().find("testsuite")
    rows = []
    for case in suite.iter("testcase"):
        path = case.get("classname").replace(".", "/") + ".py"
        outcome = next((name for tag, name in OUTCOMES.items() if case.find(tag) is not None), "passed")
        rows.append({"test": f"{path}::{case.get('name')}", "outcome": outcome, "seconds": float(case.get("time"))})
    return suite.get("timestamp"), rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", required=True, help="the commit whose code ran")
    parser.add_argument("--junit", action="append", default=[], help="a part's --junitxml file, FILE or FILE@COMMIT")
    parser.add_argument("--passed-without-record", type=Path, help="ids of tests seen passing in a part without XML")
    parser.add_argument("--not-run", action="append", default=[], help="an extended test left out of the run, why")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--add-to", action="store_true", help="keep the parts already recorded at --out")
    parser.add_argument("--retired", action="append", default=[], help="TEST=WHY: an earlier part's test that no longer exists")
    args = parser.parse_args(argv)
    previous = json.loads(args.out.read_text()) if args.add_to else {}
    parts = previous["parts"] if args.add_to else []
    if args.passed_without_record:
        ids = [line.strip() for line in args.passed_without_record.read_text().splitlines() if line.strip()]
        parts.append({"started": None, "commit": args.commit, "tests": [{"test": i, "outcome": "passed", "seconds": None} for i in ids]})
    for junit in args.junit:
        path, _, commit = junit.rpartition("@") if "@" in junit else (junit, "", "")
        started, rows = cases(Path(path))
        parts.append({"started": started, "commit": commit or args.commit, "tests": rows})
    retired = {**previous.get("retired", {}), **dict(entry.split("=", 1) for entry in args.retired)}
    tests = [row for part in parts for row in part["tests"]]
    seen: dict[str, list[str]] = {}  # each test's outcomes, part by part; the last one counts
    for row in (row for row in tests if row["test"] not in retired):
        seen.setdefault(row["test"], []).append(row["outcome"])
    outcomes = {o: sum(history[-1] == o for history in seen.values()) for o in ("passed", "failed", "error", "skipped")}
    outcomes["failed"] += outcomes.pop("error")
    record = {"commit": args.commit, "counts": {**outcomes, "not_run": len(args.not_run)}, "not_run": args.not_run,
              "retired": retired, "rerun": {test: history for test, history in seen.items() if len(history) > 1},
              "recorded_seconds": round(sum(row["seconds"] or 0 for row in tests)), "parts": parts}
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{args.out}: {record['counts']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
