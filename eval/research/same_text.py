"""Each method of a greedy run against prompt lookup on the method's own text.

In bfloat16 a verification forward rounds otherwise than a plain step, so at a near-tie each method decodes a text
of its own (every speculative method of the bar's runs differs from plain decoding on 15-22 of 54 prompts). Measured
on an Intel Xeon with AVX-512 (no bfloat16 units): oneDNN's prepacked linear layer gives a row alone a different
result from the same row among 2 to 2,100 rows (which all agree), and attention over a block of queries differs from
attention over one now and then. A method's text then copies better or worse than prompt lookup's, and on a set of
six prompts one such text moves the set's ratio by several percent (the bar's summary 305: plain decoding and prompt
lookup wrote 100 tokens, the planned rounds 128, whose last 28 copy poorly).

This replays transformers' prompt lookup on each method's own output (as `generate()` runs it:
`eval.research.phrase_bound`'s replay, checked against `generate()` in its tests), prices its rounds with the costs
fitted to the run's own records (`phrase_bound.fit_costs`: per set a target call and a candidate token, per prompt
a constant), and compares the method's measured speed with prompt lookup's modelled speed on the same text:

    python -m eval.research.same_text eval/results/planner-bar-intel-v7.jsonl eval/results/planner-bar-intel-v6.jsonl \
        --sets summarization rag --out eval/results/same-text-bar-intel

Per set, method and prompt-lookup length: the measured ratio (the method's tokens/s over prompt lookup's, as the
bench report computes it), the same-text ratio (over prompt lookup modelled on the method's text) and the check
(prompt lookup modelled on its own text over its measured speed: the model's error, by which the same-text ratio is
also shown corrected). Writes `<out>.json` and `<out>.md`.
"""

import argparse
import json
import statistics
from pathlib import Path

import torch

from eval.research.phrase_bound import PromptLookup, StepCosts, fit_costs, load_rows, predict, replay_rounds

AUTOREGRESSIVE = "autoregressive"


def lookup_seconds(row: dict, tokens: list[int], num_tokens: int, costs: StepCosts, prefill: float) -> float:
    """Modelled seconds of prompt lookup (`num_tokens`) decoding `tokens` after the row's prompt."""
    name = f"prompt-lookup-k{num_tokens}"
    if tokens == row["output"] and name in row["rules"]:  # the autoregressive text, replayed already
        rounds = row["rules"][name]
    else:
        rule = PromptLookup(num_tokens, row["eos"], len(row["prompt"]) + len(tokens))
        rounds = replay_rounds(row["prompt"], tokens, rule)
    return predict(costs, prefill, rounds)


def _rate(prompts: list[dict], seconds: str) -> float:
    """Mean tokens/s over `prompts` ([`_timings`]) at their `seconds` ("measured" or "lookup"), as the bench report
    averages."""
    return statistics.mean(p["tokens"] / p[seconds] for p in prompts)


def _timings(rows: list[dict], method: str, num_tokens: int, costs: StepCosts,
             prefill: dict[tuple, float]) -> list[dict]:
    """Per prompt of one set: the method's new tokens, its measured seconds, and prompt lookup's modelled seconds on
    the method's text."""
    return [{"tokens": len(r["records"][method]["tokens"]), "measured": r["records"][method]["wall_s"],
             "lookup": lookup_seconds(r, r["records"][method]["tokens"], num_tokens, costs,
                                      prefill[(r["set"], r["prompt_id"])])} for r in rows]


def compare(rows: list[dict], costs: dict[str, StepCosts], prefill: dict[tuple, float],
            lookup_lengths: list[int]) -> dict:
    """Per set, method (every one but autoregressive decoding and prompt lookup) and prompt-lookup length: the
    measured ratio to prompt lookup, the same-text ratio, the check and the corrected same-text ratio; and how many
    of the method's texts equal plain decoding's and prompt lookup's."""
    result = {}
    for set_name in dict.fromkeys(row["set"] for row in rows):
        set_rows = [row for row in rows if row["set"] == set_name]
        methods = [m for m in set_rows[0]["records"] if m != AUTOREGRESSIVE and not m.startswith("prompt-lookup-k")]
        result[set_name] = {"prompts": len(set_rows), "check": {}, "methods": {}}
        for k in lookup_lengths:
            reference = f"prompt-lookup-k{k}"
            own = _timings(set_rows, reference, k, costs[set_name], prefill)
            check = result[set_name]["check"][reference] = _rate(own, "lookup") / _rate(own, "measured")
            for method in methods:
                timings = _timings(set_rows, method, k, costs[set_name], prefill)
                same_text = _rate(timings, "measured") / _rate(timings, "lookup")
                entry = result[set_name]["methods"].setdefault(method, {
                    "equal_to_autoregressive": sum(r["records"][method]["tokens"] == r["output"] for r in set_rows)})
                entry[reference] = {
                    "measured": _rate(timings, "measured") / _rate(own, "measured"),
                    "same_text": same_text, "same_text_corrected": same_text * check,
                    "equal_texts": sum(r["records"][method]["tokens"] == r["records"][reference]["tokens"]
                                       for r in set_rows),
                }
    return result


def markdown(runs: dict[str, dict], command: str) -> str:
    lines = [f"`{command}`: each method's speed over prompt lookup's, measured (each on its own text) and on the "
             "method's own text (prompt lookup replayed on it and priced by the run's fitted costs; corrected: times "
             "the check, prompt lookup modelled on its own texts over measured).", "",
             "| run | set | method | vs | measured | same text | check | same text, corrected | texts equal to it / "
             "to plain decoding |", "|---|---|---|---|---|---|---|---|---|"]
    for run, result in runs.items():
        for set_name, s in result.items():
            for method, entry in s["methods"].items():
                for reference, check in s["check"].items():
                    e = entry[reference]
                    lines.append(
                        f"| {run} | {set_name} | {method} | {reference.removeprefix('prompt-lookup-')} | "
                        f"{e['measured']:.3f} | {e['same_text']:.3f} | {check:.3f} | "
                        f"**{e['same_text_corrected']:.3f}** | {e['equal_texts']} / "
                        f"{entry['equal_to_autoregressive']} of {s['prompts']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("records", type=Path, nargs="+", help="greedy `pacer-hf bench` runs with autoregressive and "
                        "prompt-lookup records")
    parser.add_argument("--sets", nargs="+", default=None, help="only these prompt sets (default: every set)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("eval/results/same-text"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    runs = {}
    for records in args.records:
        rows, _ = load_rows(records, sources=False)
        lengths = sorted({int(m.removeprefix("prompt-lookup-k")) for m in rows[0]["records"]
                          if m.startswith("prompt-lookup-k")})
        if not lengths:
            raise ValueError(f"`{records}` has no prompt-lookup records to compare with.")
        costs, prefill = fit_costs(rows)  # fitted on every set of the run: the run's own costs
        if args.sets:
            rows = [row for row in rows if row["set"] in args.sets]
        runs[records.stem] = compare(rows, costs, prefill, lengths)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(runs, indent=1), encoding="utf-8")
    command = "python -m eval.research.same_text " + " ".join(map(str, args.records)) + (
        " --sets " + " ".join(args.sets) if args.sets else "") + f" --out {args.out}"
    text = markdown(runs, command)
    args.out.with_suffix(".md").write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
