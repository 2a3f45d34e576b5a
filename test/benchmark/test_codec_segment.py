"""benchmark/codec_segment.py: every mode's segment ops are timed and the docs' sentence names them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmark"))

import codec_segment  # noqa: E402


def test_each_mode_encodes_and_writes_a_segment_and_lynx_also_upgrades(tmp_path):
    out = tmp_path / "segment.json"
    assert codec_segment.main(["--tokens", "8", "--repeats", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [(r["op"], r["mode"]) for r in result["rows"]] == [
        ("encode", "int8"), ("write anchor", "int8"), ("encode", "int4"), ("write anchor", "int4"),
        ("encode", "lynx"), ("write anchor", "lynx"), ("upgrade", "lynx")]  # fmt: skip
    assert all(r["median_s"] > 0 for r in result["rows"]) and result["layers"] == 30
    text = codec_segment.sentence(result)
    assert text.startswith("One 8-token SmolLM2 segment of 30 layers") and "; upgrade `lynx` " in text
    assert "write the first stream (`lynx`'s anchor, the others' whole KV) `int8` " in text
