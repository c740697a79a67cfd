"""How fast any mix of the draft model and copying could have decoded a harness run's prompts, with a perfect stop,
and how fast look-up rules alone do: an upper bound on phrase drafting and a replay of look-up rules, set against
transformers' prompt lookup and priced by a run's own timings.

    python -m eval.research.phrase_bound eval/results/phrases-qwen-bf16-prepack-v2.jsonl \
        --out eval/results/phrase-bound-qwen-bf16-prepack-v2
    python -m eval.research.phrase_bound TUNING.jsonl --costs-from eval/results/phrases-qwen-bf16-prepack-v2.jsonl ...

Reads a greedy run of `pacer-hf bench` (its pair, dtype and prompts come from the records' environment, so the prompts'
paths must still resolve) and, per prompt, the autoregressive output y: greedy verification accepts a candidate
token exactly where it equals y's token. Then:
- **What each source can offer.** One teacher-forced draft forward over prompt + y says where the draft's greedy
  token equals y's (a drafted run is accepted exactly as far as these agree, since an accepted prefix is y's own).
  y_t can be copied where the pair (y_{t-1}, y_t) occurred earlier in prompt + y: that is every token any look-up
  keyed on one or more tokens could offer there, from any earlier occurrence.
- **What each step costs, on the machine of the run.** Per prompt set, a least-squares fit over every record of the
  run: `wall = constant[prompt] + round_s * target calls + candidate_s * candidate tokens + draft_s * draft
  forwards + draft_prefill_s * prompt tokens (methods that run the draft)`. Candidate tokens come from the records
  (drafted plus phrase tokens) and, for prompt lookup, from replaying transformers' own
  `PromptLookupCandidateGenerator` on y. The check of the fit: prompt lookup priced by a fit that left it out.
  `--costs-from` prices another run's prompts (e.g. tuning prompts decoded autoregressively only) with these costs.
- **Look-up rules alone, replayed** on y and priced the same way: prompt lookup, and pacer-hf's copy rounds (its
  `PhrasePool`'s copy options on the live sequence, their length chosen by its `RoundPlanner` under the fitted costs,
  no draft), so that a rule can be judged on tuning prompts before anyone benchmarks it.
- **The fastest schedules**, by dynamic programming over rounds whose candidates are all accepted, each candidate a
  copy (free) or the draft's (one draft forward each; the draft's prefill once if it drafts at all), at most
  `MAX_CANDIDATES` a round (as many as prompt lookup k20 verifies):
  - `oracle-draft+copy`: the bound for PACER with phrases or any rule that mixes the draft and look-ups: a perfect
    stop, a perfect choice of what to copy and from where, and feeding copied tokens to the draft for free;
  - `oracle-free-draft+copy`: the same with draft forwards and the draft's prefill free;
  - `oracle-copy`: the best any look-up rule alone could do, splicing copies from any occurrences;
  - `oracle-one-phrase`: the best a look-up rule that sends one phrase a round could do (the best occurrence's).
The bound leaves out phrases that are not copies of the sequence (Ouroboros' target residues, earlier calls' text)
and tree verification, which transformers' assisted generation does not do.
"""

import argparse
import json
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy
import torch
from tqdm.auto import tqdm
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

from pacer_hf import PhrasePool
from pacer_hf.bench.report import finished_prompts, load_records
from pacer_hf.models import PAIRS, load_model
from pacer_hf.phrases import Phrase
from pacer_hf.planner import MAX_COPY_TOKENS, CallCosts, Plan, RoundPlanner
from pacer_hf.prompts import chat_input_ids, load_prompt_set

# The oracles' rounds hold at most prompt-lookup-k20's candidates: verifies that long are in every run's records, so
# their fitted price is an interpolation, not an extrapolation.
MAX_CANDIDATES = 20
ORACLES = ("oracle-one-phrase", "oracle-copy", "oracle-draft+copy", "oracle-free-draft+copy")
PROMPT_LOOKUP_LENGTHS = (10, 20)
# pacer-hf's copy rounds as shipped: the pool's copy options, sent as far as the planner finds worth.
POOL_REPLAY = "pacer-hf copy rounds (planner)"
# Pseudo-rounds that pin a replayed planner's costs to a run's fitted ones (the planner would otherwise learn them),
# at these candidate counts.
PINNED_COST_ROUNDS = 300
PINNED_CANDIDATES = (0, 1, 4, 8, 12, 16, 24, 32, 48, 64)


@dataclass
class StepCosts:
    """Seconds, fitted for one prompt set: a target call, each candidate token it verifies, a draft forward, and the
    draft's prefill per prompt token."""

    round_s: float
    candidate_s: float
    draft_s: float
    draft_prefill_s: float
    verify_curve: tuple[int, float, float] | None = None

    def round_seconds(self, candidates: int) -> float:
        """A target call that verifies `candidates`: at the fitted `candidate_s` each; or, with `verify_curve`
        `(knee, short, long)`, at `short` of a call each up to the knee and `long` after (verification is convex
        where the target's matrix units are busy only past some rows: a CPU with bfloat16 units, a GPU)."""
        if self.verify_curve is None:
            return self.round_s + self.candidate_s * candidates
        knee, short, long = self.verify_curve
        return self.round_s * (1 + short * min(candidates, knee) + long * max(candidates - knee, 0))


@torch.inference_mode()
def draft_agrees(draft, prompt: list[int], output: list[int]) -> list[bool]:
    """Per output token y_t: whether the draft's greedy token after prompt + y_<t equals y_t."""
    ids = torch.tensor([prompt + output], device=draft.device)
    logits = draft(input_ids=ids, logits_to_keep=len(output) + 1).logits[0, :-1]  # [N, V]
    return (logits.argmax(dim=-1).cpu() == torch.tensor(output)).tolist()


def copy_available(prompt: list[int], output: list[int]) -> list[bool]:
    """Per output token y_t: whether (y_{t-1}, y_t) occurred earlier in prompt + y_<t."""
    sequence = prompt + output
    seen = set(zip(prompt, prompt[1:]))
    available = []
    for i in range(len(prompt), len(sequence)):
        pair = (sequence[i - 1], sequence[i])
        available.append(pair in seen)
        seen.add(pair)
    return available


def copy_runs(prompt: list[int], output: list[int]) -> list[int]:
    """Per output position t: the longest run y_t, y_t+1, ... that one earlier occurrence of y_{t-1} in prompt + y_<t
    is followed by (in tokens already there, at most `MAX_CANDIDATES`): what one looked-up phrase could offer at
    the start of a round, from the best occurrence."""
    sequence, runs = prompt + output, []
    for t in range(len(output)):
        end = len(prompt) + t  # the sequence known at the round's start
        best = 0
        for i in range(end - 1):
            if sequence[i] != sequence[end - 1]:
                continue
            run = 0
            while run < MAX_CANDIDATES and i + 1 + run < end and t + run < len(output) \
                    and sequence[i + 1 + run] == output[t + run]:
                run += 1
            best = max(best, run)
        runs.append(best)
    return runs


class LookupRule:
    """A look-up rule to replay: `propose(sequence so far)` gives a round's candidates; `observe(sent, accepted)` is
    told how the round went (a rule that learns, as pacer-hf's planner does, reads it)."""

    def propose(self, sequence: list[int]) -> list[int]:
        raise NotImplementedError

    def observe(self, sent: int, accepted: int) -> None:
        pass


def accepted_prefix(candidates: list[int], output: list[int], t: int) -> int:
    """How many of a round's `candidates` from output position `t` greedy verification accepts: as far as they equal
    `output`, and, as in `_assisted_decoding`, at most the tokens left but one (the target adds that one itself)."""
    room, accepted = min(len(candidates), len(output) - t - 1), 0
    while accepted < room and candidates[accepted] == output[t + accepted]:
        accepted += 1
    return accepted


def replay_rounds(prompt: list[int], output: list[int], rule: LookupRule) -> list[int]:
    """The candidates of each round when a look-up rule decodes `output` greedily: the target accepts a round's
    candidates as far as they equal `output`, then adds its own token."""
    sequence, rounds, t = prompt + output, [], 0
    while t < len(output):
        candidates = rule.propose(sequence[: len(prompt) + t])
        accepted = accepted_prefix(candidates, output, t)
        rule.observe(len(candidates), accepted)
        rounds.append(len(candidates))
        t += accepted + 1
    return rounds


class PromptLookup(LookupRule):
    """transformers' prompt lookup (`prompt_lookup_num_tokens=num_tokens`): its own candidate generator."""

    def __init__(self, num_tokens: int, eos: list[int], max_length: int):
        self.generator = PromptLookupCandidateGenerator(
            eos_token_id=torch.tensor(eos) if eos else None, num_output_tokens=num_tokens, max_length=max_length
        )

    def propose(self, sequence: list[int]) -> list[int]:
        ids = torch.tensor([sequence])
        return self.generator.get_candidates(ids)[0][0, ids.shape[1] :].tolist()


class PlannedCopies(LookupRule):
    """pacer-hf's copy rounds alone: the pool's copy options on the live sequence (what the target's rejected
    branches would add is not known offline), chosen and cut by the library's `RoundPlanner` under `costs` (seconds
    of a target call and per candidate), learning acceptance as the generator does; no draft."""

    def __init__(self, prompt: list[int], costs: "StepCosts", max_new_tokens: int):
        self.pool = PhrasePool()
        self.pool.start_sequence(prompt)
        call_costs = CallCosts()
        for _ in range(PINNED_COST_ROUNDS):  # a round's cost as the run's fit prices it, whatever its length
            for n in PINNED_CANDIDATES:  # each next to a step: a verification's ratio is learnt from such pairs
                call_costs.observe_round(0, costs.round_seconds(0))
                call_costs.observe_round(n, costs.round_seconds(n))
        self.planner = RoundPlanner(call_costs, max_new_tokens)
        self._plan = None

    def options(self, sequence: list[int]) -> list[Phrase]:
        """The continuations a round may copy: the pool's copy options (`eval.research.copy_rules` offers others)."""
        return self.pool.copy_options(sequence, MAX_COPY_TOKENS)

    def choose(self, options: list[Phrase]) -> Plan:
        """The round's plan among `options`: the planner's (`eval.research.copy_rules` chooses otherwise)."""
        return self.planner.plan(options, MAX_COPY_TOKENS, 0, 0, False)

    def propose(self, sequence: list[int]) -> list[int]:
        self.pool.extend(sequence[self.pool.sequence_length :])
        self._plan = self.choose(self.options(sequence))
        return list(self._plan.copy.tokens[: self._plan.length]) if self._plan.kind == "copy" else []

    def observe(self, sent: int, accepted: int) -> None:
        plan, costs = self._plan, self.planner.costs
        if plan.kind == "copy":
            self.planner.copies.observe(plan.copy, sent, accepted)
        self.planner.observe_round(accepted + 1, costs.target(sent))


def look_up_rules(max_length: int, eos: list[int], lookup_lengths: tuple[int, ...] = ()) -> dict[str, LookupRule]:
    """transformers' prompt lookup at `PROMPT_LOOKUP_LENGTHS` and `lookup_lengths`: the rules whose replay prices the
    run's own prompt-lookup records (pacer-hf's copy rounds need the fitted costs: [`PlannedCopies`])."""
    return {f"prompt-lookup-k{k}": PromptLookup(k, eos, max_length)
            for k in sorted({*PROMPT_LOOKUP_LENGTHS, *lookup_lengths})}


def best_schedule(agrees: list[bool], copies: list[bool], costs: StepCosts, prompt_tokens: int,
                  draft: bool = True, free_draft: bool = False,
                  runs: list[int] | None = None) -> tuple[float, list[int], int]:
    """The fastest way (seconds past the target's prefill) to produce y in rounds whose candidates the target all
    accepts: `(seconds, candidates per round, draft forwards)`.

    Candidate y_t may be a copy where `copies[t]` (free) or, with `draft`, the draft's where `agrees[t]` (a draft
    forward each, and the draft's prefill once it drafts at all; both free with `free_draft`). With `runs`
    ([`copy_runs`]), copies come instead as one phrase at the start of a round: the first `runs[t]` candidates of a
    round from t. A round of j candidates from t costs a target call and j candidate tokens, and the target's own
    token takes it to t + j + 1.
    """
    n = len(agrees)
    draft_s = 0.0 if free_draft else costs.draft_s
    prefill = 0.0 if free_draft else costs.draft_prefill_s * prompt_tokens
    # best[used][t]: fastest time from y_t to the end, with (1) or without (0) the draft's prefill paid already
    best = [[0.0] * (n + 1) for _ in range(2)]
    choice: list[list[tuple[int, int, int]]] = [[(0, 0, 0)] * (n + 1) for _ in range(2)]
    for t in range(n - 1, -1, -1):
        for used in (1, 0):
            best[used][t] = float("inf")
            drafted = 0
            for j in range(min(MAX_CANDIDATES, n - 1 - t) + 1):
                if j:  # candidate y_{t + j - 1}: a copy, or else the draft's
                    copied = j <= runs[t] if runs is not None else copies[t + j - 1]
                    if not copied:
                        if not (draft and agrees[t + j - 1]):
                            break
                        drafted += 1
                now_used = int(used or drafted > 0)
                cost = costs.round_s + costs.candidate_s * j + draft_s * drafted + (prefill if now_used > used else 0)
                total = cost + best[now_used][min(t + j + 1, n)]
                if total < best[used][t]:
                    best[used][t], choice[used][t] = total, (j, now_used, drafted)
    rounds, forwards, t, used = [], 0, 0, 0
    while t < n:
        j, used, drafted = choice[used][t]
        rounds.append(j)
        forwards += drafted
        t += j + 1
    return best[0][0], rounds, forwards


def _candidates(record: dict, replayed: dict[str, list[int]]) -> int:
    """Candidate tokens a record's target calls verified (prompt lookup: replayed). `draft_lengths` counts draft
    forwards per round; with phrases, the confirmed phrase tokens and the tails come on top."""
    if record["method"] in replayed:
        return sum(replayed[record["method"]])
    phrases = record.get("phrases") or {}
    # records before the planner counted copied tokens as `tail_offered`
    copied = phrases.get("copied", phrases.get("tail_offered", 0))
    return sum(record["draft_lengths"]) + phrases.get("confirmed", 0) + copied


def fit_costs(rows: list[dict], leave_out: str | None = None) -> tuple[dict[str, StepCosts], dict[tuple, float]]:
    """One least-squares fit over every record of the run (`leave_out`: a method to fit without): per prompt set a
    target call, a candidate token and a draft forward; for the whole run the draft's prefill per prompt token
    (prompt lengths differ by set, which is what makes it identifiable); per prompt a constant (the target's
    prefill). Returns the step costs of each set and each `(set, prompt)`'s constant."""
    sets = list(dict.fromkeys(row["set"] for row in rows))
    prompts = [(row["set"], row["prompt_id"]) for row in rows]
    design, wall = [], []
    for index, row in enumerate(rows):
        for method, record in row["records"].items():
            if method == leave_out:
                continue
            features = [0.0] * (3 * len(sets) + 1 + len(prompts))
            at = 3 * sets.index(row["set"])
            features[at : at + 3] = [record["target_calls"], _candidates(record, row["rules"]),
                                     record["draft_forwards"]]
            if record["draft_forwards"] > 0 or method in row["draft_methods"]:
                features[3 * len(sets)] = row["prompt_tokens"]
            features[3 * len(sets) + 1 + index] = 1.0
            design.append(features)
            wall.append(record["wall_s"])
    solution, *_ = numpy.linalg.lstsq(numpy.array(design), numpy.array(wall), rcond=None)
    draft_prefill = float(solution[3 * len(sets)])
    costs = {name: StepCosts(*map(float, solution[3 * i : 3 * i + 3]), draft_prefill) for i, name in enumerate(sets)}
    return costs, dict(zip(prompts, map(float, solution[3 * len(sets) + 1 :])))


def predict(costs: StepCosts, prefill: float, rounds: list[int]) -> float:
    """Seconds of a schedule without the draft: the prompt's constant and its target calls, each verifying its
    round's candidates ([`StepCosts.round_seconds`])."""
    return prefill + sum(map(costs.round_seconds, rounds))


def prefills_for(rows: list[dict], cost_rows: list[dict], constants: dict[tuple, float]) -> dict[tuple, float]:
    """Each `(set, prompt)` constant of `rows` (decoded elsewhere) from the constants [`fit_costs`] found for
    `cost_rows`: a line in the prompt's length."""
    lengths = {(r["set"], r["prompt_id"]): r["prompt_tokens"] for r in cost_rows}
    slope, offset = numpy.polyfit([lengths[k] for k in constants], list(constants.values()), 1)
    return {(r["set"], r["prompt_id"]): slope * r["prompt_tokens"] + offset for r in rows}


def analyse(rows: list[dict], cost_rows: list[dict] | None = None) -> dict:
    """Per prompt set: the fitted costs, every replayed look-up rule's and each oracle's predicted time, and the
    measured ones. Costs come from `rows`' own records or, given, from `cost_rows` (another run on the machine to
    price for; then each prompt's constant is a line in its length, fitted to that run's prompts)."""
    own = cost_rows is None
    if own and all(set(row["records"]) == {"autoregressive"} for row in rows):
        raise ValueError("The run holds autoregressive records only, which price no draft or candidate token: "
                         "pass `--costs-from` a full run on the same prompt sets.")
    costs, constants = fit_costs(rows if own else cost_rows)
    if own:
        prefill = constants
        # Prompt lookup as it ran, priced by a fit that never saw it: the check of the fit.
        held_out = {m: fit_costs(rows, leave_out=m) for m in rows[0]["records"] if m.startswith("prompt-lookup-k")}
    else:
        prefill, held_out = prefills_for(rows, cost_rows, constants), {}
    result = {}
    for set_name in dict.fromkeys(row["set"] for row in rows):
        if set_name not in costs:
            raise ValueError(f"No costs for prompt set `{set_name}`: `--costs-from` must hold a run on that set.")
        c, per_prompt = costs[set_name], []
        for row in (row for row in rows if row["set"] == set_name):
            key, n = (set_name, row["prompt_id"]), len(row["output"])
            predicted = {"autoregressive": prefill[key] + c.round_s * n}
            rules = {**row["rules"], POOL_REPLAY: replay_rounds(
                row["prompt"], row["output"], PlannedCopies(row["prompt"], c, len(row["output"])))}
            predicted.update({name: predict(c, prefill[key], rounds) for name, rounds in rules.items()})
            checks = {m: predict(held[0][set_name], held[1][key], row["rules"][m])
                      for m, held in held_out.items()}
            schedules = {}
            for name, draft, free, runs in (("oracle-one-phrase", False, False, row["runs"]),
                                            ("oracle-copy", False, False, None),
                                            ("oracle-draft+copy", True, False, None),
                                            ("oracle-free-draft+copy", True, True, None)):
                seconds, rounds, forwards = best_schedule(row["agrees"], row["copies"], c, row["prompt_tokens"],
                                                          draft=draft, free_draft=free, runs=runs)
                predicted[name] = prefill[key] + seconds
                schedules[name] = {"rounds": len(rounds), "candidates": sum(rounds), "draft_forwards": forwards}
            per_prompt.append({"prompt_id": row["prompt_id"], "new_tokens": n,
                               "measured": {m: r["wall_s"] for m, r in row["records"].items()},
                               "predicted": predicted, "held_out_check": checks, "schedules": schedules,
                               "draft_agrees": sum(row["agrees"]), "copy_available": sum(row["copies"]),
                               "either": sum(a or b for a, b in zip(row["agrees"], row["copies"]))})
        result[set_name] = {"costs": asdict(c), "prompts": per_prompt, **_summary(per_prompt)}
    return result


def speedup(prompts: list[dict], seconds, base) -> float:
    """Ratio of mean tokens/s to that of `base` (autoregressive decoding), as `pacer_hf.bench.report` computes speed-ups."""
    rate = statistics.mean(p["new_tokens"] / seconds(p) for p in prompts)
    return rate / statistics.mean(p["new_tokens"] / base(p) for p in prompts)


def _summary(prompts: list[dict]) -> dict:
    """Speed-ups over autoregressive decoding: measured ones over the measured, predicted ones over the predicted."""
    def over(kind: str) -> dict[str, float]:
        return {m: speedup(prompts, lambda p, m=m: p[kind][m], lambda p: p[kind]["autoregressive"])
                for m in prompts[0][kind]}

    measured, predicted = over("measured"), over("predicted")
    checks = {m: speedup(prompts, lambda p, m=m: p["held_out_check"][m], lambda p: p["measured"]["autoregressive"])
              for m in prompts[0]["held_out_check"]}
    lookups = [m for m in predicted if m.startswith("prompt-lookup-k")]
    best = max(lookups, key=lambda m: predicted[m])
    tokens = sum(p["new_tokens"] for p in prompts)
    return {
        "measured": measured, "predicted": predicted, "held_out_check": checks, "best_prompt_lookup": best,
        "over_best_prompt_lookup": {m: v / predicted[best] for m, v in predicted.items()},
        "shares": {k: sum(p[k] for p in prompts) / tokens for k in ("draft_agrees", "copy_available", "either")},
        "tokens_per_call": {o: tokens / sum(p["schedules"][o]["rounds"] for p in prompts) for o in ORACLES},
    }


def load_run(records_path: Path) -> tuple[dict, list[dict]]:
    """A greedy run's environment and records."""
    env, records = load_records(records_path)
    if env["mode"] != "greedy":
        raise ValueError("The bound replays greedy verification: give the records of a greedy run.")
    return env, records


def collect(env: dict, records: list[dict], draft, tokenizer, per_set: int | None = None,
            sources: bool = True) -> list[dict]:
    """Per prompt: its records and the look-up rules replayed on y; with `sources`, also the draft's agreement and
    copy availability along y (what the oracles need; a run read only for its costs does without)."""
    finished = finished_prompts(env, records)
    by_prompt = defaultdict(dict)
    for record in records:
        if (record["set"], record["prompt_id"]) in finished:
            by_prompt[(record["set"], record["prompt_id"])][record["method"]] = record
    eos = draft.generation_config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    lookup_lengths = tuple(int(m.removeprefix("prompt-lookup-k")) for m in env["methods"]
                           if m.startswith("prompt-lookup-k"))
    # Methods that run the draft even on prompts where they drafted nothing (they still prefill it).
    draft_methods = {m for m in env["methods"] if m != "autoregressive" and not m.startswith("prompt-lookup-k")}
    rows = []
    prompts = [p for spec in env["prompts"] for p in load_prompt_set(spec)[:per_set]]
    for prompt in tqdm(prompts, unit="prompt"):
        key = (prompt.set_name, prompt.prompt_id)
        if key not in by_prompt:
            continue
        ids = chat_input_ids(tokenizer, prompt.text)[0].tolist()
        plain = by_prompt[key]["autoregressive"]
        if len(ids) != plain["prompt_tokens"]:
            raise ValueError(f"{key}: the prompt encodes to {len(ids)} tokens, the records say "
                             f"{plain['prompt_tokens']}: not the prompt of the run.")
        output = plain["tokens"]
        rows.append({
            "set": prompt.set_name, "prompt_id": prompt.prompt_id, "prompt_tokens": len(ids), "prompt": ids,
            "output": output, "eos": eos,
            "records": by_prompt[key], "draft_methods": draft_methods & set(by_prompt[key]),
            "rules": {name: replay_rounds(ids, output, rule)
                      for name, rule in look_up_rules(len(ids) + len(output), eos, lookup_lengths).items()},
        })
        if sources:
            rows[-1].update(agrees=draft_agrees(draft, ids, output), copies=copy_available(ids, output),
                            runs=copy_runs(ids, output))
    return rows


def load_rows(records: Path, costs_from: Path | None = None, per_set: int | None = None,
              sources: bool = True, any_dtype: bool = False) -> tuple[list[dict], list[dict] | None]:
    """The rows ([`collect`]) of a greedy run's prompts and, given `costs_from`, of the run whose costs price them
    (the same pair and dtype, or with `any_dtype` the same pair: texts of one dtype priced as another's run; its rows
    without sources)."""
    env, run_records = load_run(records)
    cost_run = load_run(costs_from) if costs_from else None
    if cost_run and (cost_run[0]["pair"] != env["pair"] or (not any_dtype and cost_run[0]["dtype"] != env["dtype"])):
        raise ValueError(f"`--costs-from` ran {cost_run[0]['pair']} in {cost_run[0]['dtype']}, the records "
                         f"{env['pair']} in {env['dtype']}: price a run with the costs of the same pair and dtype.")
    draft, tokenizer = load_model(PAIRS[env["pair"]][0], dtype=getattr(torch, env["dtype"]))
    rows = collect(env, run_records, draft, tokenizer, per_set, sources=sources)
    cost_rows = collect(*cost_run, draft, tokenizer, sources=False) if cost_run else None
    return rows, cost_rows


def write(result: dict, out: Path, records: Path, costs_from: Path | None) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(
        json.dumps({"records": str(records), "costs_from": str(costs_from or records), "sets": result}, indent=1),
        encoding="utf-8")
    priced = f"the costs fitted to `{costs_from or records}`"
    lines = [
        f"`python -m eval.research.phrase_bound {records}" + (f" --costs-from {costs_from}" if costs_from else "") + "`: "
        f"predicted speed-ups over predicted autoregressive decoding, every schedule priced by {priced}; measured "
        "ones (where the run has them) over the measured. Ratios are to the best prompt lookup, predicted.",
        "",
        "| set | best prompt lookup: predicted (measured; check) | pacer-hf look-up rounds alone | oracle, one "
        "phrase a round | oracle copy | oracle draft + copy | oracle, free draft | **draft + copy bound / best "
        "prompt lookup** | free-draft bound / it | measured PACER + phrases / oracle stop |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for set_name, s in result.items():
        best, m, p, r = s["best_prompt_lookup"], s["measured"], s["predicted"], s["over_best_prompt_lookup"]
        seen = [f"{m[best]:.2f}x"] if best in m else []
        seen += [f"check {s['held_out_check'][best]:.2f}x"] if best in s["held_out_check"] else []
        lines.append(
            f"| {set_name} | {best.removeprefix('prompt-lookup-')} {p[best]:.2f}x"
            + (f" ({'; '.join(seen)})" if seen else "") + " | "
            f"{p[POOL_REPLAY]:.2f}x ({r[POOL_REPLAY]:.2f}) | {p['oracle-one-phrase']:.2f}x "
            f"({r['oracle-one-phrase']:.2f}) | {p['oracle-copy']:.2f}x | {p['oracle-draft+copy']:.2f}x | "
            f"{p['oracle-free-draft+copy']:.2f}x | **{r['oracle-draft+copy']:.2f}x** | "
            f"{r['oracle-free-draft+copy']:.2f}x | {_fmt(m.get('pacer+phrases'))} / {_fmt(m.get('oracle'))} |"
        )
    lines += ["", "| set | draft agrees | copy available | either | tokens per target call: oracle copy / draft + "
              "copy / free draft | fitted ms: target call, candidate token, draft forward, draft prefill per prompt "
              "token |", "|---|---|---|---|---|---|"]
    for set_name, s in result.items():
        sh, tpc, c = s["shares"], s["tokens_per_call"], s["costs"]
        lines.append(
            f"| {set_name} | {sh['draft_agrees']:.0%} | {sh['copy_available']:.0%} | {sh['either']:.0%} | "
            f"{tpc['oracle-copy']:.1f} / {tpc['oracle-draft+copy']:.1f} / {tpc['oracle-free-draft+copy']:.1f} | "
            f"{1000 * c['round_s']:.0f}, {1000 * c['candidate_s']:.1f}, {1000 * c['draft_s']:.0f}, "
            f"{1000 * c['draft_prefill_s']:.2f} |"
        )
    rules = [name for name in next(iter(result.values()))["predicted"]
             if name.startswith("prompt-lookup") or name == POOL_REPLAY]
    lines += ["", "Look-up rules alone, replayed (predicted speed-up, and its ratio to the best prompt lookup):", "",
              "| rule | " + " | ".join(result) + " |", "|---|" + "---|" * len(result)]
    for name in rules:
        cells = [f"{s['predicted'][name]:.2f}x ({s['over_best_prompt_lookup'][name]:.3f})" for s in result.values()]
        lines.append(f"| {'**' + name + '**' if name == POOL_REPLAY else name} | " + " | ".join(cells) + " |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("records", type=Path, help="a greedy `pacer-hf bench` records file with autoregressive records")
    parser.add_argument("--costs-from", type=Path, default=None,
                        help="price schedules with the costs fitted to this run instead (e.g. to replay tuning prompts "
                        "decoded autoregressively only, for the machine of a full run)")
    parser.add_argument("--per-set", type=int, default=None, help="only the first N prompts of each set")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("eval/results/phrase-bound"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows, cost_rows = load_rows(args.records, args.costs_from, args.per_set)
    write(analyse(rows, cost_rows), args.out, args.records, args.costs_from)


if __name__ == "__main__":
    main()
