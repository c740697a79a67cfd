"""The evaluation harness on tiny models: same greedy output from every method, metrics computed right on a
hand-checked case, the oracle never drafts a token the target rejects, prompt sets and pass@1 offline."""

import functools

import pytest
import torch

from pacer_hf.bench.methods import (
    ROUND_FIELDS, OracleCandidateGenerator, OracleProbe, Pair, _ForwardLog, _rule_head_config, registry,
)
from pacer_hf.bench.report import markdown_table, summarize
from pacer_hf import PacerHead, PacerStats
from pacer_hf.tiny_models import tiny_pair

from conftest import PROMPT, make_head


@pytest.fixture(scope="module")
def pair():
    target, draft = tiny_pair("llama", "noisy", seed=0)
    return Pair(target, draft, make_head(draft, "random"), max_new_tokens=30, entropy_threshold=2.0)


def test_every_method_gives_the_autoregressive_greedy_output(pair):
    records = {name: method(pair, PROMPT) for name, method in registry(pair).items()}
    assert set(records) >= {"autoregressive", "fixed-k4", "heuristic", "confidence", "prompt-lookup-k10", "entropy",
                            "entropy+phrases", "pacer", "pacer+phrases", "oracle"}
    reference = records["autoregressive"].tokens
    assert len(reference) == 30
    for name, record in records.items():
        assert record.tokens == reference, name
        assert record.wall_s > 0
    assert records["autoregressive"].target_calls == 30 and records["autoregressive"].draft_forwards == 0
    assert set(records["fixed-k4"].draft_lengths[:-3]) == {4}
    assert sum(records["fixed-k4"].draft_lengths) == records["fixed-k4"].draft_forwards
    # The head's own time is measured where the head runs: in pacer-hf's draft loop, and only there.
    assert records["pacer"].head_s > 0 and records["entropy"].head_s > 0
    assert records["oracle"].head_s == 0.0  # threshold 0: the oracle never asks its head
    assert records["confidence"].head_s is None and records["autoregressive"].head_s is None
    assert records["prompt-lookup-k10"].draft_forwards == 0  # copies tokens, no draft model
    for name in ("pacer+phrases", "entropy+phrases"):  # the planner's rounds, recorded
        rows = records[name].phrases["rounds"]
        assert sum(records[name].phrases["round_kinds"].values()) == len(records[name].draft_lengths) == len(rows)
        expected = ROUND_FIELDS.index("expected")
        assert all(len(row) == len(ROUND_FIELDS) and (row[0] == "limit") == (row[expected] is None) for row in rows)
    assert records["pacer"].phrases is None
    for name, record in records.items():  # the target's prefill is timed, once, inside the call
        assert 0 < record.prefill_s < record.wall_s + record.excluded_s, name


def test_pacer_at_other_thresholds_runs_the_same_head_with_other_stops(pair):
    import dataclasses

    methods = registry(dataclasses.replace(pair, pacer_thresholds=(0.0, 1.0)))
    records = {name: methods[name](pair, PROMPT) for name in ("autoregressive", "pacer@0", "pacer@1")}
    assert all(r.tokens == records["autoregressive"].tokens for r in records.values())
    # Threshold 0 never stops a round, threshold 1 stops after every first block (block 2, max_draft 8).
    assert set(records["pacer@0"].draft_lengths[:-3]) == {8}
    assert set(records["pacer@1"].draft_lengths[:-3]) == {2}
    assert pair.head.config.threshold == 0.5  # the head itself is untouched


def test_drafting_settings_are_restored_after_each_method(pair):
    config = pair.draft.generation_config
    before = (config.num_assistant_tokens, config.num_assistant_tokens_schedule, config.assistant_confidence_threshold)
    for method in registry(pair).values():
        method(pair, PROMPT)
    assert (config.num_assistant_tokens, config.num_assistant_tokens_schedule,
            config.assistant_confidence_threshold) == before


def test_oracle_never_drafts_past_a_rejection(pair):
    for draft_kind in ("noisy", "independent"):
        target, draft = tiny_pair("qwen2", draft_kind, seed=1)
        oracle_pair = Pair(target, draft, max_new_tokens=40)
        log = _ForwardLog(target, draft)
        probe, stats = OracleProbe(target, log), PacerStats()
        head = PacerHead(_rule_head_config(oracle_pair, block_size=16, max_draft=16, threshold=0.0))
        out = target.generate(PROMPT, assistant_model=draft, pacer_head=head, max_new_tokens=40, do_sample=False,
                              pacer_stats=stats,
                              pacer_candidate_generator=functools.partial(OracleCandidateGenerator, probe=probe))
        log.remove()
        assert torch.equal(out, target.generate(PROMPT, max_new_tokens=40, do_sample=False))
        assert stats.accepted_lengths == stats.draft_lengths  # every drafted token accepted
        if draft_kind == "noisy":  # and it drafted several tokens where the target agreed
            assert max(stats.draft_lengths) > 1
        assert probe.time_s > 0
        assert log.events.count("T") == stats.rounds  # probes are not counted as target calls


def test_metrics_on_a_hand_checked_case():
    environment = {"mode": "greedy", "methods": ["autoregressive", "fast"], "pair": "p", "dtype": "float32",
                   "max_new_tokens": 10, "threads": 2, "transformers": "x", "torch": "y"}
    tokens = list(range(10))
    records = [
        {"set": "s", "prompt_id": "a", "method": "autoregressive", "tokens": tokens, "wall_s": 1.0,
         "target_calls": 10, "draft_forwards": 0, "draft_lengths": []},
        {"set": "s", "prompt_id": "a", "method": "fast", "tokens": tokens, "wall_s": 0.5,
         "target_calls": 4, "draft_forwards": 9, "draft_lengths": [3, 3, 2, 1]},
        {"set": "s", "prompt_id": "b", "method": "autoregressive", "tokens": tokens, "wall_s": 2.0,
         "target_calls": 10, "draft_forwards": 0, "draft_lengths": []},
        {"set": "s", "prompt_id": "b", "method": "fast", "tokens": tokens[:9], "wall_s": 0.9,
         "target_calls": 5, "draft_forwards": 8, "draft_lengths": [2, 2, 2, 2, 0]},
    ]
    summary = summarize(environment, records, quality=False)["summary"]["s"]
    fast = summary["fast"]
    assert fast["tokens_per_s_mean"] == pytest.approx((20 + 10) / 2)
    assert fast["speedup"] == pytest.approx(15 / 7.5)  # AR: mean of 10 and 5 tokens/s
    assert fast["speedup_median"] == pytest.approx((2.0 + 2.0) / 2)
    assert fast["tau"] == pytest.approx(19 / 9)
    assert fast["draft_forwards_per_accepted"] == pytest.approx(17 / (19 - 9))
    assert fast["equal_to_autoregressive"] == 1  # prompt b is one token short: a mismatch
    assert fast["draft_length_histogram"] == {0: 1, 1: 1, 2: 5, 3: 2}
    table = markdown_table({"environment": environment, "summary": {"s": summary}})
    assert "| s | fast | 15.00 | 2.00x | 2.00x | 2.11 | 1.70 | 1/2 | - |" in table

    # A prompt that an interrupted run left without its `fast` record is left out of every figure.
    cut = {**records[0], "prompt_id": "c", "wall_s": 100.0}
    result = summarize(environment, records + [cut], quality=False)
    assert result["summary"]["s"] == summary and result["left_out"] == [["s", "c"]]
    assert "1 prompt(s) not finished by every method left out" in markdown_table(result)


def test_decode_speedups_leave_the_targets_prefill_out_and_need_it_in_every_record():
    environment = {"mode": "greedy", "methods": ["autoregressive", "prompt-lookup-k10", "entropy+phrases"],
                   "pair": "p", "dtype": "float32", "max_new_tokens": 11, "threads": 2, "transformers": "x",
                   "torch": "y"}
    # One prompt, a 4 s prefill: AR decodes 10 tokens after it in 2 s; prompt lookup in 1 s; ours ends 5 tokens early
    # (a near-tie) after 0.5 s, slower per call than prompt lookup (6/4.5 against 11/5 tokens/s) and faster per
    # decoded token (5/0.5 against 10/1).
    runs = {"autoregressive": (11, 6.0), "prompt-lookup-k10": (11, 5.0), "entropy+phrases": (6, 4.5)}
    records = [{"set": "s", "prompt_id": "a", "method": m, "tokens": list(range(n)), "wall_s": wall,
                "prefill_s": 4.0, "target_calls": 2, "draft_forwards": 0, "draft_lengths": []}
               for m, (n, wall) in runs.items()]
    result = summarize(environment, records, quality=False)
    ours = result["summary"]["s"]["entropy+phrases"]
    assert ours["decode_tokens_per_s_mean"] == pytest.approx(10.0) and ours["prefill_s_mean"] == 4.0
    assert ours["decode_speedup"] == pytest.approx(10.0 / 5.0)
    assert result["against_stock"]["per_set"]["s"]["entropy+phrases"] == pytest.approx((6 / 4.5) / (11 / 5))
    assert result["against_stock_decode"]["per_set"]["s"]["entropy+phrases"] == pytest.approx(1.0)
    table = markdown_table(result)
    assert "| s | entropy+phrases | 1.33 | 0.73x | 0.73x | 3.00 | 0.00 | 0/1 | - | 2.00x |" in table
    assert "The same on decode time" in table
    # Records written before the prefill was timed: no decode figures at all, the table as it was.
    old = summarize(environment, [{k: v for k, v in r.items() if k != "prefill_s"} for r in records], quality=False)
    assert "decode_speedup" not in old["summary"]["s"]["entropy+phrases"] and "against_stock_decode" not in old
    assert "decode" not in markdown_table(old)


def test_repeated_runs_count_once_per_prompt_with_their_median_wall_time():
    environment = {"mode": "greedy", "methods": ["autoregressive", "fast"], "repeat": 3}
    tokens = list(range(10))

    def run(method, wall, calls, forwards, lengths, out=tokens):
        return {"set": "s", "prompt_id": "a", "method": method, "tokens": out, "wall_s": wall,
                "target_calls": calls, "draft_forwards": forwards, "draft_lengths": lengths}

    records = [run("autoregressive", wall, 10, 0, []) for wall in (1.0, 3.0, 1.2)]
    records += [run("fast", 0.5, 4, 8, [2, 2, 2, 2]), run("fast", 0.4, 5, 7, [3, 2, 2, 0, 0]),
                run("fast", 2.0, 3, 9, [3, 3, 3])]
    fast = summarize(environment, records, quality=False)["summary"]["s"]["fast"]
    assert fast["prompts"] == 1
    assert fast["tokens_per_s_mean"] == pytest.approx(10 / 0.5)  # median of 0.5, 0.4 and 2.0 s
    assert fast["speedup"] == pytest.approx(1.2 / 0.5)  # against the autoregressive median, 1.2 s
    assert fast["target_calls"] == pytest.approx(4) and fast["draft_forwards"] == pytest.approx(8)  # means
    assert fast["draft_length_histogram"] == {0: 2, 2: 6, 3: 4}  # every run's rounds
    assert fast["equal_to_autoregressive"] == 1
    assert fast["wall_spread_median"] == pytest.approx((2.0 - 0.4) / 0.5)
    table = markdown_table({"environment": environment | {"pair": "p", "dtype": "float32", "max_new_tokens": 10,
                            "threads": 2, "transformers": "x", "torch": "y"},
                            "summary": summarize(environment, records, quality=False)["summary"]})
    assert "each method 3 times per prompt, median wall time" in table
    assert "| s | 1.67 | 3.20 |" in table  # the spread: autoregressive (3.0 - 1.0) / 1.2, fast (2.0 - 0.4) / 0.5

    # A repeat whose tokens differ from the others' is not counted equal, whichever run the others match.
    records[-1] = run("fast", 2.0, 3, 9, [3, 3, 3], out=tokens[:9] + [0])
    assert summarize(environment, records, quality=False)["summary"]["s"]["fast"]["equal_to_autoregressive"] == 0
    # A prompt with a repeat missing (an interrupted run) is left out.
    assert summarize(environment, records[:-1], quality=False)["left_out"] == [["s", "a"]]


def test_humaneval_pass_at_1_runs_tests_in_a_subprocess():
    from pacer_hf.bench.quality import humaneval_pass_at_1

    meta = {"prompt": "def add(a, b):\n", "test": "def check(f):\n    assert f(2, 3) == 5\n", "entry_point": "add"}
    result = humaneval_pass_at_1(
        ["```python\ndef add(a, b):\n    return a + b\n```", "    return a - b\n", "def add(a, b):\n    while True: pass"],
        [meta, meta, meta],
    )
    assert result["passed"] == [True, False, False]


def _bench_args(tmp_path, *extra: str):
    import argparse

    from pacer_hf.bench.run import add_arguments

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def add(a, b):\nclass Stack:\nimport os\n", encoding="utf-8")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--pair", "tiny", "--max-new-tokens", "5", "--fixed", "2", "--methods", "fixed-k2",
                              "--out", str(tmp_path / "run"), *extra])


def test_an_interrupted_bench_resumes_without_losing_or_mixing_records(tmp_path):
    import json

    from pacer_hf.bench.report import load_records
    from pacer_hf.bench.run import run

    prompts = str(tmp_path / "prompts.txt")
    out = run(_bench_args(tmp_path, "--prompts", f"{prompts}:0:2"))
    first = out.read_text().splitlines()
    assert len(first) == 1 + 2 * 2  # environment, then 2 prompts x (autoregressive, fixed-k2)
    with pytest.raises(ValueError, match="--resume"):  # a rerun must not wipe a finished run
        run(_bench_args(tmp_path, "--prompts", f"{prompts}:0:2"))
    with pytest.raises(ValueError, match="max_new_tokens: 5 there, 6 now"):
        run(_bench_args(tmp_path, "--prompts", f"{prompts}:0:3", "--max-new-tokens", "6", "--resume"))
    assert out.read_text().splitlines() == first

    # The run was cut short inside prompt 3: only one of its methods was written.
    cut = dict(json.loads(first[1]), prompt_id="3", wall_s=-1.0)
    out.write_text("\n".join(first + [json.dumps(cut)]) + "\n")
    run(_bench_args(tmp_path, "--prompts", f"{prompts}:0:3", "--resume"))
    lines = out.read_text().splitlines()
    assert lines[1:5] == first[1:5]  # finished prompts are kept as they were
    environment, records = load_records(out)
    assert environment["started"] == json.loads(first[0])["environment"]["started"]
    assert len(environment["resumed"]) == 1 and environment["prompts"] == [f"{prompts}:0:3"]
    assert sorted((r["prompt_id"], r["method"]) for r in records) == [
        (p, m) for p in ("1", "2", "3") for m in ("autoregressive", "fixed-k2")
    ]
    assert all(r["wall_s"] > 0 for r in records)  # the cut-short record was dropped and redone


def test_bench_repeats_each_method_in_alternating_order_and_resumes_only_with_the_same_repeat(tmp_path):
    import json

    from pacer_hf.bench.report import load_records
    from pacer_hf.bench.run import run

    prompts = str(tmp_path / "prompts.txt")
    with pytest.raises(SystemExit):  # argparse: --repeat 0 is refused
        _bench_args(tmp_path, "--prompts", f"{prompts}:0:1", "--repeat", "0")
    out = run(_bench_args(tmp_path, "--prompts", f"{prompts}:0:2", "--repeat", "2"))
    environment, records = load_records(out)
    assert environment["repeat"] == 2
    order = [(r["prompt_id"], r["repeat"], r["method"]) for r in records]
    assert order == [("1", 0, "autoregressive"), ("1", 0, "fixed-k2"), ("1", 1, "fixed-k2"), ("1", 1, "autoregressive"),
                     ("2", 0, "fixed-k2"), ("2", 0, "autoregressive"), ("2", 1, "autoregressive"), ("2", 1, "fixed-k2")]
    with pytest.raises(ValueError, match="repeat: 2 there, None now"):  # a plain run must not join a repeated one
        run(_bench_args(tmp_path, "--prompts", f"{prompts}:0:3", "--resume"))

    # Cut short inside prompt 3's second repeat: that prompt is redone whole.
    lines = out.read_text().splitlines()
    cut = [json.dumps(dict(json.loads(line), prompt_id="3", wall_s=-1.0)) for line in lines[1:4]]
    out.write_text("\n".join(lines + cut) + "\n")
    run(_bench_args(tmp_path, "--prompts", f"{prompts}:0:3", "--repeat", "2", "--resume"))
    _, records = load_records(out)
    assert sorted((r["prompt_id"], r["repeat"], r["method"]) for r in records) == [
        (p, k, m) for p in ("1", "2", "3") for k in (0, 1) for m in ("autoregressive", "fixed-k2")
    ]
    assert all(r["wall_s"] > 0 for r in records)


def test_bench_runs_a_head_at_extra_thresholds_and_refuses_to_resume_with_a_changed_head(tmp_path):
    import dataclasses

    from pacer_hf.bench.report import load_records
    from pacer_hf.bench.run import run

    _, draft = tiny_pair("qwen2", "noisy", seed=0)  # the harness's `tiny` pair
    folder = tmp_path / "head"
    make_head(draft, "random").save_pretrained(folder)
    prompts = str(tmp_path / "prompts.txt")
    PacerHead.entropy_stop(draft).save_pretrained(tmp_path / "rule")
    args = ("--prompts", f"{prompts}:0:2", "--head", str(folder), "--compare-heads", f"rule={tmp_path / 'rule'}",
            "--methods", "pacer", "pacer@0.9", "pacer-rule")
    with pytest.raises(ValueError, match="--head"):
        run(_bench_args(tmp_path, "--prompts", f"{prompts}:0:2", "--pacer-thresholds", "0.9"))
    with pytest.raises(ValueError, match="NAME=FOLDER"):
        run(_bench_args(tmp_path, "--prompts", f"{prompts}:0:2", "--compare-heads", str(folder)))
    out = run(_bench_args(tmp_path, *args, "--pacer-thresholds", "0.9"))
    environment, records = load_records(out)
    assert environment["methods"] == ["autoregressive", "pacer", "pacer@0.9", "pacer-rule"]
    assert environment["head_config"]["threshold"] == 0.5
    assert environment["compare_head_configs"]["rule"]["architecture"] == "entropy"
    assert {r["method"] for r in records} == {"autoregressive", "pacer", "pacer@0.9", "pacer-rule"}
    assert all(r["head_s"] is not None for r in records if r["method"] == "pacer-rule")  # it ran in pacer-hf's loop
    # The same folder with a re-picked threshold is another head: resuming would mix two methods under one name.
    head = make_head(draft, "random")
    head.save_pretrained(folder, config=dataclasses.replace(head.config, threshold=0.7))
    with pytest.raises(ValueError, match="head_config"):
        run(_bench_args(tmp_path, *args, "--pacer-thresholds", "0.9", "--resume"))


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")
def test_bench_prepack_runs_every_method_on_prepacked_models_and_does_not_mix_with_stock_runs(tmp_path):
    from pacer_hf.bench.report import load_records
    from pacer_hf.bench.run import run

    prompts = str(tmp_path / "prompts.txt")
    args = ("--prompts", f"{prompts}:0:2", "--methods", "fixed-k2", "heuristic")
    out = run(_bench_args(tmp_path, *args, "--prepack"))
    environment, records = load_records(out)
    assert environment["prepack_linear_weights"] is True
    tokens = {}
    for record in records:
        tokens.setdefault(record["prompt_id"], {})[record["method"]] = record["tokens"]
    assert all(len({tuple(t) for t in by_method.values()}) == 1 for by_method in tokens.values())
    with pytest.raises(ValueError, match="prepack_linear_weights"):  # stock kernels would be another run
        run(_bench_args(tmp_path, *args, "--resume"))


def test_bench_runs_a_padded_pair_with_universal_assisted_generation_as_the_stock_baseline(tmp_path, monkeypatch):
    """A pair whose embedding rows differ (`tiny-padded`): transformers' own draft-model methods get both tokenizers,
    so they run as its universal assisted generation; PACER's methods draft token by token; every output equals the
    autoregressive one (float32)."""
    from transformers.generation import candidate_generator

    from pacer_hf.bench.report import load_records
    from pacer_hf.bench.run import run

    used = []
    original = candidate_generator.AssistedCandidateGeneratorDifferentTokenizers.__init__

    def record(self, *args, **kwargs):
        used.append(type(self).__name__)
        original(self, *args, **kwargs)

    monkeypatch.setattr(candidate_generator.AssistedCandidateGeneratorDifferentTokenizers, "__init__", record)
    args = _bench_args(tmp_path, "--dtype", "float32", "--prompts", str(tmp_path / "prompts.txt") + ":0:2")
    args.pair, args.methods = "tiny-padded", ["fixed-k2", "entropy", "entropy+phrases"]
    environment, records = load_records(run(args))
    assert environment["pair"] == "tiny-padded"
    assert environment["stock_drafting"] == "universal assisted generation"
    assert used  # fixed-k2 went through transformers' different-tokenizers generator
    by_prompt = {}
    for r in records:
        by_prompt.setdefault(r["prompt_id"], {})[r["method"]] = r["tokens"]
    for outputs in by_prompt.values():
        assert set(outputs) == {"autoregressive", "fixed-k2", "entropy", "entropy+phrases"}
        assert all(tokens == outputs["autoregressive"] for tokens in outputs.values())


def test_the_report_compares_each_method_with_the_best_stock_method_per_set_and_over_all_sets():
    from pacer_hf.bench.report import against_stock

    def entry(speedup):
        return {"speedup": speedup}

    summary = {  # code: prompt lookup wins; chat: a fixed draft length wins; ours is level, then ahead
        "code": {"autoregressive": entry(1.0), "fixed-k4": entry(1.5), "prompt-lookup-k10": entry(4.0),
                 "entropy+phrases": entry(4.0), "oracle": entry(2.0)},
        "chat": {"autoregressive": entry(1.0), "fixed-k4": entry(1.6), "prompt-lookup-k10": entry(1.0),
                 "entropy+phrases": entry(2.0), "oracle": entry(2.5)},
    }
    result = against_stock(summary)
    assert result["per_set"]["code"] == {"best_stock": "prompt-lookup-k10", "best_stock_speedup": 4.0,
                                         "entropy+phrases": 1.0}
    assert result["per_set"]["chat"]["best_stock"] == "fixed-k4"
    assert result["per_set"]["chat"]["entropy+phrases"] == pytest.approx(1.25)
    assert result["best_single_stock"] == "prompt-lookup-k10"  # geomean 2.0 against fixed-k4's 1.55
    assert result["geomean_vs_best_single_stock"]["entropy+phrases"] == pytest.approx((4.0 * 2.0) ** 0.5 / 2.0)
    assert "oracle" not in result["geomean_speedup"]


def test_a_repeated_run_also_compares_each_run_alone_with_the_stock_methods():
    environment = {"mode": "greedy", "methods": ["autoregressive", "prompt-lookup-k10", "entropy+phrases"],
                   "repeat": 2, "pair": "p", "dtype": "float32", "max_new_tokens": 4, "threads": 2,
                   "transformers": "x", "torch": "y"}
    walls = {0: {"autoregressive": 2.0, "prompt-lookup-k10": 1.0, "entropy+phrases": 0.8},
             1: {"autoregressive": 2.0, "prompt-lookup-k10": 0.5, "entropy+phrases": 1.0}}
    records = [{"set": "s", "prompt_id": "a", "repeat": k, "method": m, "tokens": [1, 2, 3, 4], "wall_s": wall,
                "target_calls": 2, "draft_forwards": 0, "draft_lengths": []}
               for k, by_method in walls.items() for m, wall in by_method.items()]
    result = summarize(environment, records, quality=False)
    runs = [run["per_set"]["s"]["entropy+phrases"] for run in result["against_stock_single_runs"]]
    assert runs == [pytest.approx(2.5 / 2.0), pytest.approx(1.0 / 2.0)]  # each run: ours over prompt lookup
    assert result["against_stock"]["per_set"]["s"]["entropy+phrases"] == pytest.approx(0.75 / 0.9)  # the medians
    assert "| s | 1.250, 0.500 |" in markdown_table(result)


def test_bench_without_its_extra_names_the_extra(monkeypatch, capsys):
    import sys

    from pacer_hf.cli import main

    monkeypatch.setitem(sys.modules, "pacer_hf.bench.run", None)  # as if a dependency of the harness were missing
    assert main(["bench", "--pair", "tiny"]) != 0
    assert "pip install 'pacer-hf[bench]'" in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "dtype", "device", "warned"), [
    (["avx2", "avx512f"], "bfloat16", "cpu", True),  # bfloat16 emulated in software
    (["avx512_bf16", "avx512f"], "bfloat16", "cpu", False),
    (["amx_bf16", "amx_tile"], "bfloat16", "cpu", False),
    (["avx2", "avx512f"], "float32", "cpu", False),
    (["avx2", "avx512f"], "bfloat16", "cuda", False),
    ([], "bfloat16", "cpu", False),  # flags unknown (not x86 Linux): no guess
])
def test_bench_warns_of_bfloat16_on_a_cpu_without_bfloat16_instructions(monkeypatch, flags, dtype, device, warned):
    import argparse

    from pacer_hf.bench import run

    monkeypatch.setattr(run, "_cpu_flags", lambda: flags)
    assert run._bfloat16_emulated(argparse.Namespace(dtype=dtype, device=device)) is warned
