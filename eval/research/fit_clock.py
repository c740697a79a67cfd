"""Fits a `virtual_clock.ForwardCosts` to a machine's harness records, and says how well it prices them.

    python -m eval.research.fit_clock eval/results/planner-bar-intel-v{5,6,7}.jsonl \\
        eval/results/planner-bar-intel-v{5,6}-recheck-repeat3.jsonl eval/results/draft-vocab-bar-intel.jsonl

Greedy runs with `autoregressive` and planned rounds (`entropy+phrases`: each round's kind, tokens sent and drafted,
seconds) on one machine. The fit, each part from the rounds that isolate it, less the virtual clock's `--overhead-ms`
a forward (the records' seconds hold the Python around each forward; the deterministic clock adds it back):
- a plain step: the plain-decoding calls' seconds a token after the prefill, a line in the mean cache length;
- the target's prefill: their first forwards, a quadratic in the prompt's tokens;
- a verification of n tokens: the planned copy rounds (one target call, no draft) over the step at their cache, the
  median of n = 2 to `--short-tokens` as the short ratio, and a slope past it by least squares;
- a draft forward: the planned draft rounds after a call's first (one forward a drafted token, no copied tail) less
  their verification, over the step: the median;
- the draft's first forward (the prompt, on a fresh cache): each call's first draft round less its other forwards and
  its verification, a line through the origin in the tokens it fed (the cache: the prompt and the tokens so far).
Then each plain-decoding and drafting call (`fixed-k4`, `confidence`, `entropy`) of the records is priced from its
counts (its tokens spread evenly over its rounds), against its real seconds.
"""

import argparse
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np

from .phrase_bound import load_run
from .virtual_clock import ForwardCosts


def _load(paths: list[str]) -> list[dict]:
    """The records of every run in `paths` (each a greedy run's: its verifications are what the fit reads)."""
    return [record for path in paths for record in load_run(Path(path))[1]]


def _rounds(record: dict):
    """(kind, sent, drafted, seconds, cache, first draft round) of each round after a call's first."""
    cache, drafted_before = record["prompt_tokens"], False
    for i, (kind, sent, drafted, accepted, seconds, *_) in enumerate(record["phrases"]["rounds"]):
        if i:
            yield kind, sent, drafted, seconds, cache, kind == "draft" and not drafted_before
        drafted_before |= kind == "draft"
        cache += (accepted or 0) + 1


def fit(rows: list[dict], overhead_s: float, short_tokens: int, prefill_from: int = 64) -> ForwardCosts:
    plain = [r for r in rows if r["method"] == "autoregressive" and len(r["tokens"]) >= 8]
    caches = [r["prompt_tokens"] + len(r["tokens"]) / 2 for r in plain]
    seconds = [(r["wall_s"] - r["prefill_s"]) / (len(r["tokens"]) - 1) - overhead_s for r in plain]
    per_cached, step_s = np.polyfit(caches, seconds, 1)
    quadratic, per_token, prefill_s = np.polyfit([r["prompt_tokens"] for r in plain],
                                                 [r["prefill_s"] - overhead_s for r in plain], 2)

    def step(cache: float) -> float:
        return step_s + per_cached * cache

    planned = [round_ for r in rows if r.get("phrases") and r["phrases"].get("rounds") for round_ in _rounds(r)]
    copies = [(sent + 1, (s - overhead_s) / step(cache)) for kind, sent, _, s, cache, _ in planned
              if kind == "copy" and sent]
    short_ratio = statistics.median(ratio for n, ratio in copies if n <= short_tokens)
    past = np.array([(n - short_tokens, ratio / short_ratio - 1) for n, ratio in copies if n > short_tokens])
    slope = float((past[:, 0] * past[:, 1]).sum() / (past[:, 0] ** 2).sum())

    def verify(n: int, cache: float) -> float:
        return step(cache) * short_ratio * (1 + slope * max(0, n - short_tokens))

    drafts = [(sent, s, cache, first) for kind, sent, drafted, s, cache, first in planned
              if kind == "draft" and sent == drafted > 0]
    draft_ratio = statistics.median((s - overhead_s * (sent + 1) - verify(sent + 1, cache)) / (sent * step(cache))
                                    for sent, s, cache, first in drafts if not first)
    firsts = np.array([(cache, s - overhead_s * (sent + 1) - verify(sent + 1, cache)
                        - (sent - 1) * draft_ratio * step(cache)) for sent, s, cache, first in drafts if first])
    draft_per_token = float((firsts[:, 0] * firsts[:, 1]).sum() / (firsts[:, 0] ** 2).sum())
    return ForwardCosts(
        step_s=float(step_s), step_per_cached_s=float(per_cached), short_tokens=short_tokens,
        short_ratio=float(short_ratio), per_token_past_short=slope, prefill_from=prefill_from,
        prefill_s=float(prefill_s), prefill_per_token_s=float(per_token), prefill_quadratic_s=float(quadratic),
        draft_ratio=float(draft_ratio), draft_prefill_s=0.0, draft_prefill_per_token_s=draft_per_token,
        draft_per_token_past_short=0.0,
    )


def price(costs: ForwardCosts, record: dict, overhead_s: float) -> float | None:
    """Modelled seconds of a plain-decoding or drafting call, from its counts (`None` for other methods)."""
    prompt, tokens = record["prompt_tokens"], len(record["tokens"])
    method = record["method"]
    if method == "autoregressive":
        return costs.target(prompt, 0) + sum(costs.target(1, prompt + i) for i in range(1, tokens)) \
            + tokens * overhead_s
    if method not in ("fixed-k4", "confidence", "entropy"):
        return None  # prompt lookup's records do not say how many candidates each of its target calls verified
    rounds = record["draft_lengths"]
    per_round, total = tokens / len(rounds), 0.0
    for i, sent in enumerate(rounds):
        cache = prompt + i * per_round
        total += (costs.target(prompt + sent, 0) if i == 0 else costs.target(sent + 1, cache)) + overhead_s
        if sent:  # a forward a drafted token; the call's first also feeds the prompt, on a fresh cache
            total += (costs.draft(prompt, 0) if i == 0 else costs.draft(1, cache)) + sent * overhead_s
            total += (sent - 1) * costs.draft(1, cache)
    return total


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", nargs="+")
    parser.add_argument("--overhead-ms", type=float, default=2.0)
    parser.add_argument("--short-tokens", type=int, default=9)
    args = parser.parse_args(argv)
    rows, overhead_s = _load(args.records), args.overhead_ms / 1000
    costs = fit(rows, overhead_s, args.short_tokens)
    print(costs)
    ratios = defaultdict(list)
    for record in rows:
        modelled = price(costs, record, overhead_s)
        if modelled is not None:
            ratios[record["method"]].append(modelled / record["wall_s"])
    print("| method | calls | modelled / real seconds, median | quartiles |\n|---|---|---|---|")
    for method, values in sorted(ratios.items()):
        q1, q3 = np.percentile(values, [25, 75])
        print(f"| {method} | {len(values)} | {np.median(values):.3f} | {q1:.3f}-{q3:.3f} |")


if __name__ == "__main__":
    main()
