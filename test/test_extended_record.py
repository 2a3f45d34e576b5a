"""scripts/extended_record.py: an extended-tier record from pytest's JUnit XML, counts from every part."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "extended_record.py"
JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" timestamp="2026-12-06T07:36:36">
<testcase classname="test.lynx_patches.test_a" name="test_one[x]" time="90.5" />
<testcase classname="test.lynx_patches.test_a" name="test_two" time="3.0"><failure message="no" /></testcase>
<testcase classname="test.lynx_patches.test_b" name="test_three" time="1.0"><skipped message="later" /></testcase>
</testsuite></testsuites>"""


def test_every_part_is_counted_and_each_test_keeps_its_outcome_and_time(tmp_path):
    (tmp_path / "run.xml").write_text(JUNIT)
    (tmp_path / "seen.txt").write_text("test/lynx_patches/test_c.py::test_zero\n")
    out = tmp_path / "record.json"
    argv = ["--commit", "abc1234", "--junit", str(tmp_path / "run.xml"), "--passed-without-record",
            str(tmp_path / "seen.txt"), "--not-run", "soak: time", "--out", str(out)]
    subprocess.run([sys.executable, str(SCRIPT), *argv], check=True, capture_output=True)
    record = json.loads(out.read_text())
    assert record["commit"] == "abc1234" and record["not_run"] == ["soak: time"]
    assert record["counts"] == {"passed": 2, "failed": 1, "skipped": 1, "not_run": 1}
    assert record["recorded_seconds"] == 94
    first, second = record["parts"]
    assert first["tests"] == [{"test": "test/lynx_patches/test_c.py::test_zero", "outcome": "passed", "seconds": None}]
    assert second["started"] == "2026-12-06T07:36:36"
    one = {"test": "test/lynx_patches/test_a.py::test_one[x]", "outcome": "passed", "seconds": 90.5}
    assert second["tests"][0] == one
    assert [t["outcome"] for t in second["tests"]] == ["passed", "failed", "skipped"]


def test_a_test_rerun_in_a_later_part_on_other_code_counts_by_its_last_outcome(tmp_path):
    (tmp_path / "run.xml").write_text(JUNIT)
    rerun = JUNIT.replace('time="3.0"><failure message="no" /></testcase>', 'time="2.0" />')
    (tmp_path / "rerun.xml").write_text(rerun.replace("test_one[x]", "test_four"))
    out = tmp_path / "record.json"
    argv = ["--commit", "abc1234", "--junit", str(tmp_path / "run.xml"), "--junit", f"{tmp_path / 'rerun.xml'}@def5678",
            "--out", str(out)]  # fmt: skip
    subprocess.run([sys.executable, str(SCRIPT), *argv], check=True, capture_output=True)
    record = json.loads(out.read_text())
    assert [part["commit"] for part in record["parts"]] == ["abc1234", "def5678"]
    assert record["counts"] == {"passed": 3, "failed": 0, "skipped": 1, "not_run": 0}
    assert record["rerun"] == {"test/lynx_patches/test_a.py::test_two": ["failed", "passed"],
                               "test/lynx_patches/test_b.py::test_three": ["skipped", "skipped"]}  # fmt: skip


def test_a_part_added_to_a_record_keeps_the_parts_already_there(tmp_path):
    (tmp_path / "run.xml").write_text(JUNIT)
    (tmp_path / "later.xml").write_text(JUNIT.replace('time="3.0"><failure message="no" /></testcase>', 'time="2.0" />'))
    out = tmp_path / "record.json"
    first = ["--commit", "abc1234", "--junit", str(tmp_path / "run.xml"), "--out", str(out)]
    subprocess.run([sys.executable, str(SCRIPT), *first], check=True, capture_output=True)
    later = ["--commit", "def5678", "--junit", str(tmp_path / "later.xml"), "--out", str(out), "--add-to"]
    subprocess.run([sys.executable, str(SCRIPT), *later], check=True, capture_output=True)
    record = json.loads(out.read_text())
    assert [part["commit"] for part in record["parts"]] == ["abc1234", "def5678"]
    assert record["commit"] == "def5678" and record["counts"]["failed"] == 0
    assert record["rerun"]["test/lynx_patches/test_a.py::test_two"] == ["failed", "passed"]


def test_a_retired_test_stays_in_its_part_but_no_longer_counts(tmp_path):
    (tmp_path / "run.xml").write_text(JUNIT)
    out = tmp_path / "record.json"
    first = ["--commit", "abc1234", "--junit", str(tmp_path / "run.xml"), "--out", str(out)]
    subprocess.run([sys.executable, str(SCRIPT), *first], check=True, capture_output=True)
    (tmp_path / "later.xml").write_text(JUNIT.replace("test_two", "test_two_renamed").replace('<failure message="no" />', ""))
    later = ["--commit", "def5678", "--junit", str(tmp_path / "later.xml"), "--out", str(out), "--add-to",
             "--retired", "test/lynx_patches/test_a.py::test_two=renamed: test_two_renamed"]  # fmt: skip
    subprocess.run([sys.executable, str(SCRIPT), *later], check=True, capture_output=True)
    record = json.loads(out.read_text())
    assert record["retired"] == {"test/lynx_patches/test_a.py::test_two": "renamed: test_two_renamed"}
    assert record["counts"] == {"passed": 2, "failed": 0, "skipped": 1, "not_run": 0}
    assert "test/lynx_patches/test_a.py::test_two" in [t["test"] for t in record["parts"][0]["tests"]]
    again = ["--commit", "def5678", "--out", str(out), "--add-to"]  # a later addition keeps the retirement
    subprocess.run([sys.executable, str(SCRIPT), *again], check=True, capture_output=True)
    assert json.loads(out.read_text())["retired"] == record["retired"]
