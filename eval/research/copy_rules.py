"""Which copy rule pays, replayed offline: variants of pacer-hf's copy rounds (what a round offers to copy, how much
of it it sends, whether it may take a plain step, how it learns acceptance) on a run's autoregressive outputs, priced
by a full run's fitted costs, against transformers' prompt lookup replayed the same way; and oracles that know the
output, to say where the headroom is: in the length sent (stopping where the copy will fail) or in the occurrence.

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
    PlannedCopies, StepCosts, accepted_prefix, fit_costs, load_rows, predict, prefills_for, replay_rounds,
    speedup,
)
from pacer_hf.phrases import KEY_LENGTHS, Phrase
from pacer_hf.planner import COPY_PRIOR, MAX_COPY_TOKENS, CopyAcceptance, Plan, RoundPlanner, match_bucket

# How many of the longest key's latest occurrences the "latest occurrences" offer adds (each a distinct continuation).
LATEST_OCCURRENCES = 16


# Positions of a copy's tokens whose acceptance the survival estimate learns apart (a token at position >= each).
SURVIVAL_POSITIONS = (2, 3, 4, 6, 9, 17, 33)


def _position_bucket(position: int) -> int:
    return max(i for i, low in enumerate(SURVIVAL_POSITIONS) if position >= low)


class SurvivalAcceptance(CopyAcceptance):
    """Copy acceptance by position: P(token i accepted | every token before it was), learned apart for positions
    2, 3, 4-5, 6-8, 9-16, 17-32 and 33+, each from the copies that sent token i and had i - 1 accepted (the
    shipped estimate pools every next token of every copy, so a few long accepted copies set it for all of them).
    Each (source, match bucket, position) estimate starts from the call's pooled one at that position, which starts
    from the cell's prior `p_next`; the first token as shipped."""

    def __init__(self) -> None:
        super().__init__()
        self._next: dict[tuple, list[float]] = {}  # (source, match bucket, position bucket) or position -> tries, hits

    def survival(self, source: str, match_length: int, tokens: int) -> list[float]:
        """P(token i accepted | all before it were) for i = 1..tokens (the first: `p_first`)."""
        bucket = match_bucket(match_length)
        p_first, _ = self.probabilities(source, match_length)
        prior_next = COPY_PRIOR[source][bucket][1]
        hazards = [p_first]
        for position in range(2, tokens + 1):
            k = _position_bucket(position)
            pooled = self._blend(*reversed(self._next.get(k, (0.0, 0.0))), prior_next)
            hazards.append(self._blend(*reversed(self._next.get((source, bucket, k), (0.0, 0.0))), pooled))
        return hazards

    def observe(self, source: str, match_length: int, sent: int, accepted: int) -> None:
        super().observe(source, match_length, sent, accepted)
        accepted = min(accepted, sent)
        for position in range(2, min(sent, accepted + 1) + 1):  # tokens reached (the one before accepted) and sent
            k = _position_bucket(position)
            for key in ((source, match_bucket(match_length), k), k):
                counts = self._next.setdefault(key, [0.0, 0.0])
                counts[0] += 1
                counts[1] += position <= accepted


class VariantPlanner(RoundPlanner):
    """The shipped planner with another acceptance estimate: by position ([`SurvivalAcceptance`]; token i of a copy
    goes while P(it and all before it accepted) is worth its verification time), and/or learned apart for copies
    whose key is ambiguous (its occurrences in the sequence go on with different tokens: `ambiguous` holds the ids
    of this round's options that are)."""

    def __init__(self, costs, max_new_tokens: int, survival: bool = False, ambiguity: bool = False):
        super().__init__(costs, max_new_tokens)
        estimate = SurvivalAcceptance if survival else CopyAcceptance
        self.survival, self.copies = survival, estimate()
        self.acceptance = {False: self.copies, True: estimate() if ambiguity else self.copies}
        self.ambiguous: set[int] = set()

    def acceptance_of(self, option: Phrase) -> CopyAcceptance:
        return self.acceptance[id(option) in self.ambiguous]

    def copy_length(self, option: Phrase, reach: float = 1.0, room: int = MAX_COPY_TOKENS) -> tuple[int, float]:
        self.copies = self.acceptance_of(option)
        if not self.survival:
            return super().copy_length(option, reach, room)
        tokens = min(len(option.tokens), room, MAX_COPY_TOKENS)
        length, expected, reach_i = 0, 0.0, reach
        for hazard in self.copies.survival(option.source, option.match_length, tokens):
            reach_i *= hazard
            if reach_i < self.rate * self.costs.verify_marginal(length + 1):
                break
            length += 1
            expected += reach_i
        return length, expected


def _ambiguous(pool, sequence: list[int]) -> bool:
    """Whether the occurrences of the longest key the sequence ends with go on with different tokens (reads the pool's
    index directly, as the latest-occurrences offer does)."""
    for n in KEY_LENGTHS:
        starts = pool._positions.get(tuple(sequence[-n:])) if len(sequence) >= n else None
        if starts:
            return len({pool._sequence[i] for i in starts if i < len(pool._sequence)}) > 1
    return False


class CopyVariant(PlannedCopies):
    """pacer-hf's copy rounds with another offer, a fixed length, no plain steps or another acceptance estimate; or
    an oracle's choices.

    Args:
        offer: `"shipped"` (the pool's copy options: the furthest-matching occurrence and the earliest),
            `"earliest"` (prompt lookup's occurrence only), `"furthest"` (the furthest-matching only) or `"latest"`
            (the shipped options plus the continuations of the longest key's `LATEST_OCCURRENCES` latest occurrences).
        fixed: send this many tokens of the first option, as prompt lookup does (no planner); `None`: the planner's.
        steps: whether the planner may take a plain step while a copy is on offer (else it copies the best option).
        survival: learn copy acceptance by position ([`VariantPlanner`]) instead of the shipped estimate.
        ambiguity: learn it apart for copies whose key's occurrences go on with different tokens.
        oracle: knowing `output`, `"length"` sends exactly the accepted part of the planner's copy (a step where none
            would be), `"occurrence"` copies the offered occurrence with the most accepted tokens at the planner's
            length for it (where the planner copies), `"both"` the best occurrence's accepted part whenever there is
            one; `None`: no oracle.
        output: the autoregressive output being replayed (only the oracles read it).
    """

    def __init__(self, prompt: list[int], costs: StepCosts, max_new_tokens: int, offer: str = "shipped",
                 fixed: int | None = None, steps: bool = True, survival: bool = False, ambiguity: bool = False,
                 oracle: str | None = None, output: list[int] | None = None):
        super().__init__(prompt, costs, max_new_tokens)
        if survival or ambiguity:
            self.planner = VariantPlanner(self.planner.costs, max_new_tokens, survival, ambiguity)
        self.offer, self.fixed, self.steps, self.oracle, self.ambiguity = offer, fixed, steps, oracle, ambiguity
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
        if self.ambiguity:
            self.planner.ambiguous = {id(o) for o in options if o.source != "stored"} if _ambiguous(pool, sequence) \
                else set()
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
        if self._plan.kind == "copy" and isinstance(self.planner, VariantPlanner):
            self.planner.copies = self.planner.acceptance_of(self._plan.copy)  # the estimate the copy came from
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
    "survival estimate": {"survival": True},
    "ambiguous keys apart": {"ambiguity": True},
    "ambiguous keys apart, survival estimate": {"ambiguity": True, "survival": True},
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
