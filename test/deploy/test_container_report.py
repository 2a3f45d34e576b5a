"""DEPLOY's "Measured" table renders from the run records that `scripts/container_check.sh --json` writes.

The records here are small fakes of the shape the script's recorder writes; the
recorder itself (the Python inside the script) runs here too, without podman.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from benchmark_modules import load

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "container_check.sh"

HOST = {"cpus": 2, "cpu_model": "AMD EPYC 7B13", "memory_bytes": 24 << 30, "load_average": [5.1, 4.8, 4.2]}
LYNX = {"mode": "lynx", "transferred_tokens": 42, "manifest_s": 0.065, "anchor_ready_s": 0.35,
        "residual_ready_s": 0.35006, "speculative_tokens": 0, "accepted_tokens": 0}  # fmt: skip
ANSWER = "The capital of France is Paris."


def run_record(date: str, **fields) -> dict:
    """A passing run of separate containers, with `fields` replacing its defaults."""
    record = {
        "date": date, "commit": "61cc8c0", "host": HOST, "podman": "4.3.1", "podman_compose": None,
        "image": "localhost/lynx:cpu", "compose": False, "no_cache": False, "layer_cache_empty": False,
        "build_s": 12, "image_bytes": 11_430_000_000, "router_ready_s": 142, "first_answer_s": 150,
        "completion": {"answer": ANSWER, "answer_s": 1.14, "lynx": LYNX, "lynx_requests_total": 1.0},
        "total_s": 170, "passed": True, "failure": None,
    }  # fmt: skip
    record.update(fields)
    return record


RUNS = [
    run_record("2026-12-04", no_cache=True, layer_cache_empty=True, build_s=768, router_ready_s=176,
               first_answer_s=250, total_s=1030),
    run_record("2026-12-05"),
    run_record("2026-12-05", build_s=9, router_ready_s=None, first_answer_s=None, completion=None, total_s=920,
               passed=False, failure="router not ready after 900s"),
    run_record("2026-12-05", compose=True, podman_compose="1.6.0", build_s=9, router_ready_s=338,
               first_answer_s=347, total_s=360, completion={"answer": ANSWER, "answer_s": 1.3, "lynx": LYNX},
               host={**HOST, "load_average": [13.0, 12.2, 11.5]}, commit="7e5b49f"),
]  # fmt: skip


@pytest.fixture(scope="module")
def report():
    (module,) = load("container_report")
    return module


def rows(markdown: str) -> dict[str, str]:
    """The table's rows, figure -> value."""
    cells = [line.strip("|").split(" | ") for line in markdown.splitlines() if line.startswith("| ")]
    return {figure.strip(): value.strip() for figure, value in cells[2:]}  # after the head and its rule


def test_builds_split_by_whether_the_layer_cache_was_empty(report):
    table = rows(report.markdown({"runs": RUNS}))
    assert table["first build (empty layer cache, wheels from PyPI)"] == "768 s on 2026-12-04"
    assert table["build with podman's layer cache kept"] == "12, 9 and 9 s on 2026-12-05"
    assert "build, layer cache not known to be empty" not in table


def test_serving_figures_come_from_the_runs_of_separate_containers(report):
    table = rows(report.markdown({"runs": RUNS}))
    assert table["containers started to router ready"] == "176 s on 2026-12-04; 142 s on 2026-12-05"
    assert table["containers started to the first answer"] == "250 s on 2026-12-04; 150 s on 2026-12-05"
    assert table["chat completion through the router, once ready"] == "1.1 s on 2026-12-04; 1.1 s on 2026-12-05"
    assert table["answer (greedy, 48 tokens at most)"] == f'"{ANSWER}" (2026-12-04 and 2026-12-05)'
    assert table["image size (`podman image inspect`)"] == "11.43 GB (2026-12-04 and 2026-12-05)"


def test_each_compose_run_has_its_own_row(report):
    table = rows(report.markdown({"runs": RUNS}))
    assert table["`--compose`, 2026-12-05 (podman-compose 1.6.0)"] == (
        "passed, 360 s in all: build 9 s (layer cache kept), router ready 338 s after `up`, answer in 1.3 s"
    )


def test_failed_runs_are_counted_with_their_reason(report):
    table = rows(report.markdown({"runs": RUNS}))
    assert table["runs of the check"] == (
        "4 from 2026-12-04 to 2026-12-05, 3 passed; failed: router not ready after 900s (2026-12-05)"
    )


def test_the_last_completion_s_lynx_metrics_are_shown(report):
    table = rows(report.markdown({"runs": RUNS}))
    assert table['`meta_info["lynx"]` of the last completion (2026-12-05, `--compose`)'] == (
        "mode `lynx`, 42 tokens, prefill announced at 0.065 s, anchor landed at 0.35 s, residual 0.06 ms later"
    )


def test_the_lead_line_names_hosts_commits_and_load(report):
    lead = report.markdown({"runs": RUNS}).splitlines()[0]
    assert lead == (
        "4 runs of `scripts/container_check.sh --json` on 2 cores (AMD EPYC 7B13), 24 GiB RAM, podman 4.3.1; "
        "commits 61cc8c0, 7e5b49f; 15-minute load average at the end 4.2-11.5:"
    )


def test_a_run_that_failed_before_building_has_only_its_outcome(report):
    early = run_record("2026-12-06", layer_cache_empty=None, build_s=None, image_bytes=None, router_ready_s=None,
                       first_answer_s=None, completion=None, passed=False, failure="podman runc missing")  # fmt: skip
    table = rows(report.markdown({"runs": [early]}))
    assert table == {"runs of the check": "1 on 2026-12-06, 0 passed; failed: podman runc missing (2026-12-06)"}


def test_no_runs_is_an_error(report):
    with pytest.raises(ValueError, match="no runs"):
        report.markdown({"runs": []})


def test_from_json_prints_the_table(report, tmp_path, capsys):
    path = tmp_path / "container_check.json"
    path.write_text(json.dumps({"runs": RUNS}))
    assert report.main(["--from-json", str(path)]) == 0
    assert capsys.readouterr().out == report.markdown({"runs": RUNS})


# --- the script's side ------------------------------------------------------------------------


def recorder() -> str:
    """The Python program that container_check.sh runs to write its record."""
    found = re.search(r"recorder=\$\(cat <<'PY'\n(.*?)\nPY\n\)", SCRIPT.read_text(), re.S)
    assert found, "no recorder heredoc in container_check.sh"
    return found.group(1)


def record(path: Path, client: str, **given: str) -> subprocess.CompletedProcess:
    fields = {"commit": "61cc8c0", "podman": "4.3.1", "podman_compose": "", "image": "localhost/lynx:cpu",
              "compose": "0", "no_cache": "1", "layer_cache_empty": "1", "build_s": "768",
              "image_bytes": "11430000000", "router_ready_s": "176", "first_answer_s": "250", "total_s": "1030",
              "passed": "1", "failure": "", **given}  # fmt: skip
    pairs = [f"{key}={value}" for key, value in fields.items()]
    return subprocess.run([sys.executable, "-c", recorder(), "write", str(path), client, *pairs],
                          capture_output=True, text=True, timeout=30)  # fmt: skip


def test_the_recorder_appends_records_the_report_renders(report, tmp_path):
    path = tmp_path / "container_check.json"
    client = json.dumps({"answer": ANSWER, "answer_s": 1.14, "lynx": LYNX, "lynx_requests_total": 1.0})
    assert record(path, client).returncode == 0
    failed = record(path, "", layer_cache_empty="0", build_s="9", router_ready_s="", first_answer_s="",
                    passed="0", failure="router not ready after 900s")  # fmt: skip
    assert failed.returncode == 0, failed.stderr
    runs = json.loads(path.read_text())["runs"]
    assert [r["passed"] for r in runs] == [True, False]
    assert runs[0]["build_s"] == 768 and runs[0]["layer_cache_empty"] is True and runs[0]["compose"] is False
    assert runs[0]["completion"]["lynx"] == LYNX and runs[1]["completion"] is None
    assert runs[1]["router_ready_s"] is None and runs[1]["failure"] == "router not ready after 900s"
    assert runs[0]["host"]["cpus"] >= 1 and len(runs[0]["host"]["load_average"]) == 3
    table = rows(report.markdown({"runs": runs}))
    date = runs[0]["date"]
    assert table["first build (empty layer cache, wheels from PyPI)"] == f"768 s on {date}"
    assert table["build with podman's layer cache kept"] == f"9 s on {date}"


def test_the_recorder_refuses_a_file_that_is_not_a_run_list(tmp_path):
    path = tmp_path / "other.json"
    path.write_text('{"rows": []}')
    checked = subprocess.run([sys.executable, "-c", recorder(), "check", str(path)], capture_output=True, text=True)
    assert checked.returncode != 0 and "does not hold" in checked.stderr
    assert path.read_text() == '{"rows": []}'


def script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=30)


def test_help_describes_json():
    result = script("--help")
    assert result.returncode == 0, result.stderr
    assert "--json PATH" in result.stdout and "benchmark/container_report.py" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--json",), "--json needs a PATH"),
        (("--json", "--compose"), "--json needs a PATH"),
        (("--prepare", "--json", "runs.json"), "--prepare does not run"),
        (("--json", "no-such-directory/runs.json"), "no such directory"),
    ],
)
def test_json_misuse_is_refused_before_anything_runs(args, message):
    result = script(*args)
    assert result.returncode == 2 and message in result.stderr
