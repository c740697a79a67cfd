"""Which copy rule pays, replayed offline: variants of pacer-hf's copy rounds (what a round offers to copy, how much
of it it sends, whether it may take a plain step, how it learns acceptance) on a run's autoregressive outputs, priced
by a full run's fitted costs, against transformers' prompt lookup replayed the same way; and oracles that know the
output, to say where the headroom is: in the length sent (stopping where the copy will fail) or in the occurrence.

    python -m eval.research.copy_rules eval/results/phrase-tuning-ar-qwen-bf16.jsonl \
        --costs-from eval/results/planner-bar-amd.jsonl --out eval/results/copy-rules-tuning

The replay and the pricing are `eval.research.phrase_bound`'s (greedy verification accepts a candidate where it equals
the autoregressive output; seconds = the prompt's constant + target calls + candidate tokens at the fitted costs, or
with `--verify-curve` each call's candidates on a measured convex curve), so a rule can be judged on tuning prompts
before anyone benchmarks it. No draft: these are the copy rounds alone.
Writes `<out>.json` and `<out>.md`.
"""

import argparse
import dataclasses
import json
from pathlib import Path

from eval.research.phrase_bound import (
    PlannedCopies, StepCosts, accepted_prefix, fit_costs, load_rows, predict, prefills_for, replay_rounds,
    speedup,
)
from pacer_hf.phrases import KEY_LENGTHS, Phrase
from pacer_hf.planner import (
    COPY_POSITIONS, COPY_PRIOR, MAX_COPY_TOKENS, CopyAcceptance, Plan, match_bucket, position_bucket,
)

# How many of the longest key's latest occurrences the "latest occurrences" offer adds (each a distinct continuation).
LATEST_OCCURRENCES = 16


class OneNextRate(CopyAcceptance):
    """The estimate pacer-hf shipped before acceptance by position: every next token of a copy at one rate, learnt
    from every next token of every copy, so a few long accepted copies set it for all of them."""

    def hazards(self, option: Phrase, tokens: int) -> list[float]:
        cell = (option.source, match_bucket(option.match_length))
        pooled = self._blend(self._next.get(("all",)), COPY_PRIOR[cell[0]][cell[1]][1])
        return super().hazards(option, 1) + [self._blend(self._next.get(("all", *cell)), pooled)] * (tokens - 1)

    def observe(self, option: Phrase, sent: int, accepted: int) -> None:
        super().observe(option, sent, accepted)
        if 0 < min(accepted, sent):  # every next token of a copy whose first was accepted
            for key in (("all",), ("all", option.source, match_bucket(option.match_length))):
                counts = self._next.setdefault(key, [0.0, 0.0])
                counts[0] += min(sent, accepted + 1) - 1
                counts[1] += min(accepted, sent) - 1


class OwnPrior(CopyAcceptance):
    """Acceptance by position where a position no copy reached yet starts from the cell's prior, not from what the
    positions before it learnt (the shipped estimate chains them: one copy accepted for 7 tokens makes every later
    position 0.96-0.99 likely after a match of 5 tokens or more, since each position's estimate starts from the one
    before's)."""

    def hazards(self, option: Phrase, tokens: int) -> list[float]:
        cell = (option.source, match_bucket(option.match_length))
        prior_next = COPY_PRIOR[cell[0]][cell[1]][1]
        return super().hazards(option, 1) + [
            self._blend(self._next.get((position_bucket(i), *cell)),
                        self._blend(self._next.get((position_bucket(i),)), prior_next))
            for i in range(2, tokens + 1)]


def capped(cap: float, from_position: int = 2) -> type[CopyAcceptance]:
    """The shipped estimate with every next-token probability from `from_position` on at most `cap` (where the replay
    finds it over-confident: 0.97-0.98 predicted where 0.955 came true at positions 17 and on, on the tuning
    summaries with the convex pricing)."""

    class Capped(CopyAcceptance):
        def hazards(self, option: Phrase, tokens: int) -> list[float]:
            return [min(h, cap) if i + 1 >= from_position else h
                    for i, h in enumerate(super().hazards(option, tokens))]

    return Capped


def prior_weight(weight: float) -> type[CopyAcceptance]:
    """The shipped estimate with its priors weighing `weight` copies (`COPY_PRIOR_WEIGHT` ships)."""
    return type(f"PriorWeight{weight:g}", (CopyAcceptance,), {"prior_weight": weight})


ESTIMATES = {"shipped": CopyAcceptance, "one next-token rate": OneNextRate, "own prior": OwnPrior,
             "capped 0.96": capped(0.96), "capped 0.96 from 17": capped(0.96, 17),
             "prior weight 1.5": prior_weight(1.5), "prior weight 6": prior_weight(6.0)}


class CopyVariant(PlannedCopies):
    """pacer-hf's copy rounds with another offer, a fixed length, no plain steps or another acceptance estimate; or
    an oracle's choices.

    Args:
        offer: `"shipped"` (the pool's copy options: the furthest-matching occurrence and the earliest),
            `"earliest"` (prompt lookup's occurrence only), `"furthest"` (the furthest-matching only) or `"latest"`
            (the shipped options plus the continuations of the longest key's `LATEST_OCCURRENCES` latest occurrences).
        fixed: send this many tokens of the first option, as prompt lookup does (no planner); `None`: the planner's.
        steps: whether the planner may take a plain step while a copy is on offer (else it copies the best option).
        estimate: the copy acceptance estimate, a name of `ESTIMATES`: `"shipped"` (by position), `"one next-token
            rate"` (before), or a variant of the shipped one.
        free: whether a copy sends the verification's free candidates whatever its estimate says (shipped).
        oracle: knowing `output`, `"length"` sends exactly the accepted part of the planner's copy (a step where none
            would be), `"occurrence"` copies the offered occurrence with the most accepted tokens at the planner's
            length for it (where the planner copies), `"both"` the best occurrence's accepted part whenever there is
            one; `None`: no oracle.
        output: the autoregressive output being replayed (only the oracles read it).
    """

    def __init__(self, prompt: list[int], costs: StepCosts, max_new_tokens: int, offer: str = "shipped",
                 fixed: int | None = None, steps: bool = True, estimate: str = "shipped", free: bool = True,
                 oracle: str | None = None, output: list[int] | None = None):
        super().__init__(prompt, costs, max_new_tokens)
        self.planner.copies = ESTIMATES[estimate]()
        if not free:
            self.planner.costs.free_candidates = lambda: 0
        self.offer, self.fixed, self.steps, self.oracle = offer, fixed, steps, oracle
        self.prompt_length, self.output, self._sequence = len(prompt), output, []

    def propose(self, sequence: list[int]) -> list[int]:
        self._sequence = sequence  # where the oracles read the output from
        return super().propose(sequence)

    def _accepted(self, option: Phrase) -> int:
        """How many of `option`'s first tokens (at most a copy's) the target would accept here."""
        return accepted_prefix(option.tokens[:MAX_COPY_TOKENS], self.output, len(self._sequence) - self.prompt_length)

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
        return self._oracle(plan, options) if self.oracle else plan

    def _oracle(self, plan: Plan, options: list[Phrase]) -> Plan:
        best = max(options, key=self._accepted, default=None)
        if self.oracle == "occurrence":
            if plan.kind != "copy":
                return plan
            length, expected = self.planner.copy_length(best)
            return Plan("copy", 1 + expected, best, max(length, 1))
        option = best if self.oracle == "both" else plan.copy  # "length": the planner's copy (None: it steps)
        accepted = self._accepted(option) if option is not None else 0
        return Plan("copy", 1 + accepted, option, accepted) if accepted else Plan("step", 1.0)

    def observe(self, sent: int, accepted: int) -> None:
        if self.fixed is not None:  # a fixed-length rule learns nothing
            return
        super().observe(sent, accepted)


class Calibrated(CopyVariant):
    """The shipped rule, tallying per copied position that a copy sent and reached (every token before it accepted):
    the probability the estimate gave it when the copy was chosen, and whether it was accepted."""

    def __init__(self, *args, tally: dict[int, list[float]], **kwargs):
        super().__init__(*args, **kwargs)
        self.tally, self._hazards = tally, []

    def choose(self, options: list[Phrase]) -> Plan:
        plan = super().choose(options)
        self._hazards = self.planner.copies.hazards(plan.copy, plan.length) if plan.kind == "copy" else []
        return plan

    def observe(self, sent: int, accepted: int) -> None:
        for i in range(1, min(sent, accepted + 1) + 1) if self._hazards else ():
            cell = self.tally.setdefault(1 if i == 1 else COPY_POSITIONS[position_bucket(i)], [0, 0.0, 0])
            cell[0], cell[1], cell[2] = cell[0] + 1, cell[1] + self._hazards[i - 1], cell[2] + (i <= accepted)
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
    "no free candidates": {"free": False},
    "one next-token rate": {"estimate": "one next-token rate"},
    "one next-token rate, no free candidates (before)": {"estimate": "one next-token rate", "free": False},
    **{f"estimate: {name}": {"estimate": name} for name in ESTIMATES if name not in ("shipped", "one next-token rate")},
    "oracle: length": {"oracle": "length"},
    "oracle: occurrence": {"oracle": "occurrence"},
    "oracle: both": {"oracle": "both"},
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
                                                            CopyVariant(row["prompt"], c, n, output=row["output"],
                                                                        **settings))
                                        for name, settings in VARIANTS.items()}}
            seconds.update({name: predict(c, prefill[key], rounds) for name, rounds in rules.items()})
            prompts.append({"new_tokens": n, "predicted": seconds})
        rates = {m: speedup(prompts, lambda p, m=m: p["predicted"][m], lambda p: p["predicted"]["autoregressive"])
                 for m in prompts[0]["predicted"]}
        best = max((m for m in rates if m.startswith("prompt-lookup-k")), key=rates.get)
        result[set_name] = {"prompts": len(prompts), "best_prompt_lookup": best, "speedup": rates,
                            "over_best_prompt_lookup": {m: v / rates[best] for m, v in rates.items()}}
    return result


def calibration(rows: list[dict], costs: dict[str, StepCosts]) -> dict:
    """Per prompt set and copied position (`COPY_POSITIONS` buckets; 1: a copy's first token): how many copied tokens
    the shipped rule sent and reached there, the mean probability its estimate gave them, and the share accepted."""
    result = {}
    for row in rows:
        tally = result.setdefault(row["set"], {})
        replay_rounds(row["prompt"], row["output"],
                      Calibrated(row["prompt"], costs[row["set"]], len(row["output"]), tally=tally))
    return {name: {position: {"reached": n, "predicted": p / n, "accepted": a / n}
                   for position, (n, p, a) in sorted(tally.items())} for name, tally in result.items()}


def markdown_table(result: dict, calibration_result: dict, command: str) -> str:
    rules = [m for m in next(iter(result.values()))["speedup"] if m != "autoregressive"]
    lines = [f"`{command}`: predicted speed-up over autoregressive decoding of each copy rule alone (no draft), and "
             "its ratio to the set's best prompt lookup; prompts per set: "
             + ", ".join(f"{name} {s['prompts']}" for name, s in result.items()) + ".", "",
             "| rule | " + " | ".join(result) + " |", "|---|" + "---|" * len(result)]
    for rule in rules:
        lines.append(f"| {rule} | " + " | ".join(f"{s['speedup'][rule]:.2f}x ({s['over_best_prompt_lookup'][rule]:.3f})"
                                                 for s in result.values()) + " |")
    lines += ["", "The shipped rule's estimate against what came true, per copied position from there on (positions "
              "that a copy sent and reached, every token before them accepted):", "",
              "| set | position | reached | predicted | accepted |", "|---|---|---|---|---|"]
    for name, positions in calibration_result.items():
        lines += [f"| {name} | {position} | {c['reached']} | {c['predicted']:.3f} | {c['accepted']:.3f} |"
                  for position, c in positions.items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("records", type=Path, help="a greedy `pacer-hf bench` run with autoregressive records")
    parser.add_argument("--costs-from", type=Path, required=True, help="a full greedy run on the same prompt sets")
    parser.add_argument("--verify-curve", nargs=3, type=float, metavar=("KNEE", "SHORT", "LONG"),
                        help="price a verification of n candidates at SHORT of a target call each up to KNEE and LONG "
                             "each after, instead of the run's fitted line (measured: eval.research.costs --context)")
    parser.add_argument("--any-dtype", action="store_true",
                        help="price the records' texts with a run of the same pair in another dtype (a rule comparison "
                             "on other prompts' outputs; a dtype's greedy texts differ a little)")
    parser.add_argument("--out", type=Path, default=Path("eval/results/copy-rules"))
    args = parser.parse_args()
    rows, cost_rows = load_rows(args.records, args.costs_from, sources=False, any_dtype=args.any_dtype)
    costs, constants = fit_costs(cost_rows)
    curve = None
    if args.verify_curve:
        curve = (int(args.verify_curve[0]), args.verify_curve[1], args.verify_curve[2])
        costs = {name: dataclasses.replace(c, verify_curve=curve) for name, c in costs.items()}
    result = compare(rows, costs, prefills_for(rows, cost_rows, constants))
    calibrated = calibration(rows, costs)
    command = f"python -m eval.research.copy_rules {args.records} --costs-from {args.costs_from}" + (
        " --verify-curve {} {:g} {:g}".format(*curve) if curve else "") + (" --any-dtype" if args.any_dtype else "")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"command": command, "sets": result,
                                                         "calibration": calibrated}, indent=1))
    table = markdown_table(result, calibrated, command)
    args.out.with_suffix(".md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
