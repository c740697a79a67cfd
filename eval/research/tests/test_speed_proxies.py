"""eval.research.speed_proxies: a reading that tracks the machine's speed shrinks the spread of method ratios, one
that does not grows it."""

import random

import pytest

from eval.research.speed_proxies import markdown_table, spreads

ENVIRONMENT = {"methods": ["autoregressive", "a", "b"]}
FACTOR = {"autoregressive": 1.0, "a": 0.5, "b": 0.25}  # each method's real time, the same on every prompt


def _records(speed, gauge):
    """Records whose wall time is the method's real time over the machine's speed during the call (`speed(i)`), and
    whose readings (prefill and gauges) are `gauge(i)`."""
    records, i = [], 0
    for set_name in ("x", "y"):
        for prompt in range(4):
            for method, factor in FACTOR.items():
                slow = 1 / speed(i)
                records.append({"set": set_name, "prompt_id": str(prompt), "method": method,
                                "wall_s": 10 * factor * slow, "prefill_s": 0.5 * gauge(i),
                                "gauge_s": [0.15 * gauge(i), 0.15 * gauge(i)]})
                i += 1
    return records


def test_a_reading_that_tracks_the_speed_during_the_call_removes_the_machines_noise():
    rng = random.Random(0)
    speeds = [rng.choice([1.0, 0.5]) for _ in range(24)]
    result = spreads(ENVIRONMENT, _records(lambda i: speeds[i], lambda i: 1 / speeds[i]))
    assert result["summary"]["none"]["median_sd"] > 0.2
    for name in ("prefill", "gauge before", "gauge after", "gauge mean"):
        assert result["summary"][name]["median_sd"] == pytest.approx(0.0, abs=1e-9)
        assert result["summary"][name]["pairs_below_none"] == 3
    assert "| gauge mean | 0.000 | 3 of 3 |" in markdown_table(result)


def test_a_reading_taken_outside_the_call_on_a_machine_whose_speed_moves_within_it_adds_noise():
    rng = random.Random(0)
    readings = [rng.choice([1.0, 2.0]) for _ in range(24)]  # slow at the call's edges, not during it
    result = spreads(ENVIRONMENT, _records(lambda i: 1.0, lambda i: readings[i]))
    assert result["summary"]["none"]["median_sd"] == pytest.approx(0.0, abs=1e-9)
    assert result["summary"]["gauge mean"]["median_sd"] > 0.2
    assert result["summary"]["gauge mean"]["pairs_below_none"] == 0


def test_records_without_gauges_are_checked_on_the_prefill_alone():
    records = [{k: v for k, v in r.items() if k != "gauge_s"} for r in _records(lambda i: 1.0, lambda i: 1.0)]
    assert list(spreads(ENVIRONMENT, records)["summary"]) == ["none", "prefill"]


def test_each_repeat_of_a_prompt_is_compared_on_its_own():
    once = _records(lambda i: 1.0, lambda i: 1.0)
    repeated = [dict(r, repeat=k) for k in (0, 1) for r in once]
    assert spreads({**ENVIRONMENT, "repeat": 2}, repeated)["prompts"] == 2 * spreads(ENVIRONMENT, once)["prompts"]
