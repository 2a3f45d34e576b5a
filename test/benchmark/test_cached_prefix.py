"""benchmark/cached_prefix.py: both variants' medians and the docs' table."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmark"))

import cached_prefix  # noqa: E402


def test_the_table_shows_what_the_prefill_held_and_that_every_token_was_sent():
    medians = {"whole": {"prefill_cached_tokens": 0, "transferred_tokens": 1072, "prefill_s": 2.1,
                         "anchor_ready_s": 3.5, "residual_ready_s": 5.5, "ttft_s": 3.6},
               "cached": {"prefill_cached_tokens": 530, "transferred_tokens": 1072, "prefill_s": 1.2,
                          "anchor_ready_s": 3.4, "residual_ready_s": 5.4, "ttft_s": 3.5}}  # fmt: skip
    args = {"link_gbps": 0.02, "prompt_tokens": 1024, "cached_tokens": 512, "repeats": 4}
    document = {"date": "2026-12-07", "commit": "abc1234", "wall_s": 420, "args": args,
                "rows": [{"mode": "lynx", "medians": medians, "same_tokens": 4, "prompts": 4,
                          "every_token_sent": True}]}  # fmt: skip
    table = cached_prefix.markdown(document)
    assert "| `lynx` | cached | 530 | 1072 | 1.20 | 3.40 | 5.40 | 3.50 |" in table
    assert table.rstrip().endswith("`lynx`: every prompt token's KV sent in every request, the same tokens in both "
                                   "variants for 4 of 4 prompts.")  # fmt: skip
