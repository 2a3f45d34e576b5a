"""benchmark/pair_cpu.py: per-route medians, the router's paired ratio and the docs' table."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmark"))

import pair_cpu  # noqa: E402


def _run(t1: float, cpu: float, tokens: list[int]) -> dict:
    return {"t1_s": t1, "t4_s": t1 + 1.0, "output_ids": tokens, "cpu": {p: cpu for p in pair_cpu.PARTS}}


def test_routes_are_summarized_per_prompt_pair_and_a_differing_answer_is_counted():
    runs = {"router": [_run(4.0, 0.2, [1, 2]), _run(5.0, 0.4, [3, 4]), _run(6.0, 0.6, [5, 6])],
            "direct": [_run(4.0, 0.1, [1, 2]), _run(4.0, 0.3, [3, 9]), _run(5.0, 0.5, [5, 6])]}  # fmt: skip
    summary = pair_cpu.summarize(runs, max_tokens=4)
    assert summary["routes"]["router"]["t1_s"] == 5.0 and summary["routes"]["direct"]["last_s"] == 5.0
    assert summary["routes"]["direct"]["cpu"]["prefill main"] == 0.3
    assert summary["router_over_direct_t1"] == 1.2 and summary["router_over_direct_t1_range"] == [1.0, 1.25]
    assert (summary["same_tokens"], summary["prompts"]) == (2, 3)
    args = {"link_gbps": 0.1, "prompt_tokens": 1024, "max_tokens": 4, "repeats": 3}
    document = {"date": "2026-12-07", "commit": "abc1234", "wall_s": 600, "args": args,
                "rows": [{"mode": "lynx", "runs": runs, **summary}]}  # fmt: skip
    table = pair_cpu.markdown(document)
    assert "| `lynx` | router | 5.00 | 6.00 | 0.40 |" in table
    assert table.startswith("2026-12-07, commit abc1234, 10 min: 0.1 Gbit/s, 1,024-token prompts")
    assert "`lynx` 1.200 (1.000-1.250), same tokens by both routes in 2 of 3." in table
