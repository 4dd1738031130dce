"""benchmarks/load_parts.py on the CPU with a one-layer random model and mixed steps: every step() call of a
short Poisson load is recorded with its parts, grouped by the kinds of step it finished (no async scheduling
on the CPU: nothing is launched ahead, and the forward is the call's own)."""

from __future__ import annotations

import json

import load_parts


def test_a_short_load_is_split_into_parts(tmp_path) -> None:
    got = load_parts.main(["--model", "random:smollm2-135m?layers=1", "--device", "cpu", "--rate", "10",
                           "--duration", "0.3", "--warmup-s", "0", "--engine-arg", "enable_mixed_steps=True",
                           "--engine-arg", "max_model_len=2048", "--out", str(tmp_path)])
    calls = got["calls"]
    assert calls == json.loads((tmp_path / "calls.json").read_text())
    kinds = {c["done"] for c in calls}
    assert {"decode", "mixed"} <= kinds and all(c["launched"] is None for c in calls)
    for c in calls:
        assert c["total"] >= c["forward"] > 0 and c["sample"] >= 0
        assert c["process"] == c["total"]  # no launch ahead, no wait for one
    assert "| mixed | None |" in got["table"]
    assert load_parts.load(20.0, 0.5, 0) == load_parts.load(20.0, 0.5, 0)
