"""`eval.research.virtual_clock`: a hooked forward advances the clock by its modelled seconds (not its real ones), the
cost model prices forwards as its docstring says, and a harness run on the clock records the modelled machine."""

import json
import time

import pytest
import torch

from eval.research import virtual_clock
from eval.research.virtual_clock import BAR_AMD_BF16, VirtualClock
from pacer_hf.tiny_models import tiny_model


def test_short_forwards_cost_a_step_that_grows_with_the_cache():
    costs = BAR_AMD_BF16
    assert costs.target(2, 0) == pytest.approx(costs.target(10, 0))
    assert costs.target(2, 0) == pytest.approx(costs.short_ratio * costs.target(1, 0))
    assert costs.target(1, 1000) > costs.target(1, 100)
    assert costs.target(33, 0) == pytest.approx(costs.target(10, 0) * (1 + 23 * costs.per_token_past_short))
    assert costs.draft(5, 300) == pytest.approx(costs.draft_ratio * costs.target(5, 300))


def test_prefills_are_priced_by_prompt_length_and_join_the_short_forwards_near_where_they_take_over():
    costs = BAR_AMD_BF16
    assert costs.target(500, 0) > costs.target(200, 0) > costs.target(65, 0)
    edge = costs.prefill_from
    assert costs.target(edge + 1, 0) == pytest.approx(costs.target(edge, 0), rel=0.1)
    assert costs.draft(edge + 1, 0) == pytest.approx(costs.draft(edge, 0), rel=0.1)
    assert costs.draft(500, 0) < costs.target(500, 0)


def test_a_hooked_forward_advances_the_clock_by_its_modelled_seconds():
    model, real = tiny_model("llama").eval(), time.perf_counter
    clock = VirtualClock(BAR_AMD_BF16)
    clock.attach(model, clock.costs.target)
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    clock.install()
    try:
        start = time.perf_counter()
        with torch.no_grad():
            out = model(input_ids=ids, use_cache=True)
            model(input_ids=ids[:, :1], past_key_values=out.past_key_values, use_cache=True)
        elapsed = time.perf_counter() - start
    finally:
        clock.uninstall()
    modelled = BAR_AMD_BF16.target(5, 0) + BAR_AMD_BF16.target(1, 5)
    assert clock.modelled_s == pytest.approx(modelled)
    assert modelled <= elapsed < modelled + 0.5  # the real seconds outside the forwards stay
    assert time.perf_counter is real


def test_a_harness_run_on_the_clock_is_timed_by_the_model(tmp_path):
    out, real = tmp_path / "run", time.perf_counter
    virtual_clock.main(["--pair", "tiny", "--dtype", "float32", "--prompts", "humaneval:0:1", "--max-new-tokens", "8",
                        "--methods", "autoregressive", "--out", str(out)])
    lines = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines()]
    assert lines[0]["environment"]["virtual_clock"]["model"] == "BAR_AMD_BF16"
    assert "timed by the cost model BAR_AMD_BF16" in out.with_suffix(".md").read_text()  # the report says so
    record = lines[1]
    steps = BAR_AMD_BF16.target(1, record["prompt_tokens"]) * (len(record["tokens"]) - 1)
    assert record["prefill_s"] == pytest.approx(BAR_AMD_BF16.target(record["prompt_tokens"], 0), rel=0.05)
    assert steps < record["wall_s"] - record["prefill_s"] < steps * 1.2 + 0.5
    assert time.perf_counter is real


def test_the_xeon_model_prices_verification_and_the_drafts_longer_forwards_as_its_cost_table_does():
    costs = virtual_clock.XEON_AVX512_FP32
    step = costs.target(1, 600)
    assert step == pytest.approx(0.283, rel=0.02)  # eval/results/costs-qwen-fp32-prepack-xeon-avx512.md
    assert costs.target(5, 600) / step == pytest.approx(1.6)
    assert costs.target(33, 600) / step == pytest.approx(3.47, rel=0.05)
    assert costs.draft(33, 600) == pytest.approx(0.300, rel=0.1)  # its own slope, not the target's
    assert costs.draft(800, 0) == pytest.approx(2.425, rel=0.05)
    assert costs.target(800, 0) == pytest.approx(11.94, rel=0.05)


def test_a_run_picks_its_cost_model_by_name(tmp_path):
    out = tmp_path / "run"
    virtual_clock.main(["--costs", "XEON_AVX512_FP32", "--pair", "tiny", "--dtype", "float32", "--prompts",
                        "humaneval:0:1", "--max-new-tokens", "4", "--methods", "autoregressive", "--out", str(out)])
    lines = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines()]
    assert lines[0]["environment"]["virtual_clock"]["model"] == "XEON_AVX512_FP32"
    assert lines[0]["environment"]["virtual_clock"]["step_s"] == virtual_clock.XEON_AVX512_FP32.step_s


def test_with_an_overhead_the_clock_moves_only_by_the_forwards():
    """`--overhead-ms`: each forward costs its modelled seconds plus the overhead, and the real seconds outside the
    forwards (here a sleep) do not count, so a run's timings do not depend on the machine."""
    model = tiny_model("llama").eval()
    clock = VirtualClock(BAR_AMD_BF16, overhead_s=0.002)
    clock.attach(model, clock.costs.target)
    clock.install()
    try:
        start = time.perf_counter()
        with torch.no_grad():
            out = model(input_ids=torch.tensor([[3, 4, 5, 6, 7]]), use_cache=True)
            time.sleep(0.05)
            model(input_ids=torch.tensor([[8]]), past_key_values=out.past_key_values, use_cache=True)
        elapsed = time.perf_counter() - start
    finally:
        clock.uninstall()
    assert elapsed == pytest.approx(BAR_AMD_BF16.target(5, 0) + BAR_AMD_BF16.target(1, 5) + 2 * 0.002)


def test_with_an_overhead_the_same_run_gives_the_same_records(tmp_path):
    """What makes A/Bs on the clock judge the change, not the machine: the planner's timing-based choices read the
    clock, so two runs of the same code on the same prompts plan every round alike and take the same seconds."""
    runs = []
    for name in ("first", "second"):
        out = tmp_path / name
        virtual_clock.main(["--overhead-ms", "2", "--pair", "tiny", "--dtype", "float32", "--prompts", "humaneval:0:2",
                            "--max-new-tokens", "16", "--methods", "autoregressive", "entropy+phrases",
                            "--out", str(out)])
        lines = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines()]
        assert lines[0]["environment"]["virtual_clock"]["overhead_s"] == 0.002
        runs.append([(r["method"], r["prompt_id"], r["wall_s"], r["phrases"]) for r in lines[1:]])
    assert any(phrases and phrases["rounds"] for *_, phrases in runs[0])  # planned rounds were timed
    assert runs[0] == runs[1]
