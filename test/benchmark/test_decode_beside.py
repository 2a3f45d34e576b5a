"""benchmark/decode_beside.py: the decoding request's rate per window and the docs' table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmark"))

import decode_beside  # noqa: E402


def test_the_rate_is_split_at_the_arrival_and_its_answer_and_counts_from_the_tenth_token():
    # 10 tokens/s until 2.0 s (token 20), 5 tokens/s while the other request is in flight (to 4.0 s),
    # then 10 tokens/s again to token 50.
    events = [(t / 10, t) for t in range(1, 21)] + [(2.0 + k / 5, 20 + k) for k in range(1, 11)]
    events += [(4.0 + k / 10, 30 + k) for k in range(1, 21)]
    rates = decode_beside.rates(events, sent=2.0, answered=4.0)
    assert rates == {"before": pytest.approx(10.0), "beside": pytest.approx(5.0), "after": pytest.approx(10.0)}


def test_the_table_names_every_window_and_what_the_arrival_drafted():
    run = {"rates": {"before": 9.0, "beside": 8.0, "after": 9.5}, "sent_s": 4.0, "answered_s": 10.0, "long_s": 30.0,
           "arriving": {"ttft_s": 3.5, "speculative_tokens": 6, "accepted_tokens": 5}}  # fmt: skip
    args = {"link_gbps": 0.02, "long_prompt_tokens": 256, "long_tokens": 240, "prompt_tokens": 1024, "max_tokens": 16,
            "beside_after": 40, "repeats": 1}  # fmt: skip
    document = {"date": "2026-12-07", "commit": "abc1234", "wall_s": 300, "args": args,
                "rows": [{"mode": "lynx", "runs": [run], "median_rates": run["rates"]}]}  # fmt: skip
    table = decode_beside.markdown(document)
    assert "| mode | before the arrival | beside it | after the arrival |" in table
    assert "| `lynx` | 9.00 (9.00-9.00) | 8.00 (8.00-8.00) | 9.50 (9.50-9.50) | 6.00 | 3.50 | 6 (5) |" in table
