"""Which copy rule pays, replayed offline: variants of pacer-hf's copy rounds (what a round offers to copy, how much
of it it sends, whether it may take a plain step) on a run's autoregressive outputs, priced by a full run's fitted
costs, against transformers' prompt lookup replayed the same way.

    python -m eval.research.copy_rules eval/results/phrase-tuning-ar-qwen-bf16.jsonl \
        --costs-from eval/results/planner-bar-amd.jsonl --out eval/results/copy-rules-tuning

The replay and the pricing are `eval.research.phrase_bound`'s (greedy verification accepts a candidate where it equals
the autoregressive output; seconds = the prompt's constant + target calls + candidate tokens at the fitted costs),
so a rule can be judged on tuning prompts before anyone benchmarks it. No draft: these are the copy rounds alone.
Writes `<out>.json` and `<out>.md`.
"""

import argparse
import json
from pathlib import Path

from eval.research.phrase_bound import (
    PlannedCopies, StepCosts, fit_costs, load_rows, predict, prefills_for, replay_rounds, speedup,
)
from pacer_hf.phrases import KEY_LENGTHS, Phrase
from pacer_hf.planner import MAX_COPY_TOKENS, Plan

# How many of the longest key's latest occurrences the "latest occurrences" offer adds (each a distinct continuation).
LATEST_OCCURRENCES = 16


class CopyVariant(PlannedCopies):
    """pacer-hf's copy rounds with another offer, a fixed length or no plain steps.

    Args:
        offer: `"shipped"` (the pool's copy options: the furthest-matching occurrence and the earliest),
            `"earliest"` (prompt lookup's occurrence only), `"furthest"` (the furthest-matching only) or `"latest"`
            (the shipped options plus the continuations of the longest key's `LATEST_OCCURRENCES` latest occurrences).
        fixed: send this many tokens of the first option, as prompt lookup does (no planner); `None`: the planner's.
        steps: whether the planner may take a plain step while a copy is on offer (else it copies the best option).
    """

    def __init__(self, prompt: list[int], costs: StepCosts, max_new_tokens: int, offer: str = "shipped",
                 fixed: int | None = None, steps: bool = True):
        super().__init__(prompt, costs, max_new_tokens)
        self.offer, self.fixed, self.steps = offer, fixed, steps

    def options(self, sequence: list[int]) -> list[Phrase]:
        pool = self.pool
        if self.offer == "earliest":
            return [p for p in (pool.lookup_earliest(sequence, MAX_COPY_TOKENS),) if p.tokens]
        if self.offer == "furthest":
            return [p for p in (pool.lookup(sequence, MAX_COPY_TOKENS),) if p.tokens and p.source == "sequence"]
        options = super().options(sequence)
        if self.offer == "latest":  # reads the pool's index directly: a variant to judge, not an API to keep
            for n in KEY_LENGTHS:
                starts = pool._positions.get(tuple(sequence[-n:])) if len(sequence) >= n else None
                if starts:
                    for start in reversed(starts[-LATEST_OCCURRENCES:]):
                        phrase = Phrase(pool._sequence[start : start + MAX_COPY_TOKENS], "sequence",
                                        pool._match_length(start, sequence, n))
                        if phrase.tokens and all(phrase.tokens != o.tokens for o in options):
                            options.append(phrase)
                    break
        return options

    def choose(self, options: list[Phrase]) -> Plan:
        if self.fixed is not None:  # the first option's first `fixed` tokens, as prompt lookup sends them
            return Plan("copy", 0.0, options[0], self.fixed) if options else Plan("step", 1.0)
        plan = super().choose(options)
        if plan.kind == "step" and not self.steps and options:
            length, expected = self.planner.copy_length(options[0])
            plan = Plan("copy", 1 + expected, options[0], max(length, 1))
        return plan

    def observe(self, sent: int, accepted: int) -> None:
        if self.fixed is None:  # a fixed-length rule learns nothing
            super().observe(sent, accepted)


VARIANTS = {
    "shipped": {},
    "shipped, no plain steps": {"steps": False},
    "earliest only": {"offer": "earliest"},
    "furthest match only": {"offer": "furthest"},
    f"shipped + {LATEST_OCCURRENCES} latest occurrences": {"offer": "latest"},
    "earliest, fixed 10": {"offer": "earliest", "fixed": 10},
    "furthest match, fixed 10": {"offer": "furthest", "fixed": 10},
    "furthest match, fixed 20": {"offer": "furthest", "fixed": 20},
}


def compare(rows: list[dict], costs: dict[str, StepCosts], prefill: dict[tuple, float]) -> dict:
    """Per prompt set: each rule's predicted speed-up over autoregressive decoding (as the bench report computes
    speed-ups: mean tokens/s over mean tokens/s) and its ratio to the best prompt lookup."""
    result = {}
    for set_name in dict.fromkeys(row["set"] for row in rows):
        c, prompts = costs[set_name], []
        for row in (row for row in rows if row["set"] == set_name):
            key, n = (set_name, row["prompt_id"]), len(row["output"])
            seconds = {"autoregressive": prefill[key] + c.round_s * n}
            rules = {**row["rules"], **{name: replay_rounds(row["prompt"], row["output"],
                                                            CopyVariant(row["prompt"], c, n, **settings))
                                        for name, settings in VARIANTS.items()}}
            seconds.update({name: predict(c, prefill[key], len(rounds), sum(rounds)) for name, rounds in rules.items()})
            prompts.append({"new_tokens": n, "predicted": seconds})
        rates = {m: speedup(prompts, lambda p, m=m: p["predicted"][m], lambda p: p["predicted"]["autoregressive"])
                 for m in prompts[0]["predicted"]}
        best = max((m for m in rates if m.startswith("prompt-lookup-k")), key=rates.get)
        result[set_name] = {"prompts": len(prompts), "best_prompt_lookup": best, "speedup": rates,
                            "over_best_prompt_lookup": {m: v / rates[best] for m, v in rates.items()}}
    return result


def markdown_table(result: dict, command: str) -> str:
    rules = [m for m in next(iter(result.values()))["speedup"] if m != "autoregressive"]
    lines = [f"`{command}`: predicted speed-up over autoregressive decoding of each copy rule alone (no draft), and "
             "its ratio to the set's best prompt lookup; prompts per set: "
             + ", ".join(f"{name} {s['prompts']}" for name, s in result.items()) + ".", "",
             "| rule | " + " | ".join(result) + " |", "|---|" + "---|" * len(result)]
    for rule in rules:
        lines.append(f"| {rule} | " + " | ".join(f"{s['speedup'][rule]:.2f}x ({s['over_best_prompt_lookup'][rule]:.3f})"
                                                 for s in result.values()) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("records", type=Path, help="a greedy `pacer-hf bench` run with autoregressive records")
    parser.add_argument("--costs-from", type=Path, required=True, help="a full greedy run on the same prompt sets")
    parser.add_argument("--out", type=Path, default=Path("eval/results/copy-rules"))
    args = parser.parse_args()
    rows, cost_rows = load_rows(args.records, args.costs_from, sources=False)
    costs, constants = fit_costs(cost_rows)
    result = compare(rows, costs, prefills_for(rows, cost_rows, constants))
    command = f"python -m eval.research.copy_rules {args.records} --costs-from {args.costs_from}"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"command": command, "sets": result}, indent=1))
    table = markdown_table(result, command)
    args.out.with_suffix(".md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
