"""Can one reading of the machine's speed correct a call's wall time? Checked on a run's own records.

    python -m eval.research.speed_proxies eval/results/run.jsonl --out eval/results/run-speed-proxies

A shared CPU runs stretches at about half speed, and one such stretch over one method's calls moves a set's ratio as
much as a real difference would. A reading of the machine's speed taken with each call would correct its wall time
if it tracked the speed *during* the call. Readings a run's records can hold: the target's prefill of the prompt
(`prefill_s`, over the same prompt's in the run's other methods: the same work in every method) and, in records
written by the harness of e2a6e92 (reverted, see `docs/benchmarks.md`), one fixed 8-token target forward timed right
before and right after the call (`gauge_s`, over the run's median).

The test: between two methods, the log of their per-prompt wall-time ratio varies within a set by the prompts' real
differences plus the machine's noise. A reading that tracks the noise shrinks that spread once each wall time is
divided by it; one that does not adds its own noise and grows it. Per reading: the median over method pairs of the
within-set (pooled) standard deviation of the log ratio, and in how many pairs it fell below the raw one.
"""

import argparse
import itertools
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Callable

from pacer_hf.bench.report import finished_prompts, load_records

Reading = Callable[[dict, list[dict], float], float]  # (record, the prompt's records, the run's median gauge) -> speed

READINGS: dict[str, Reading] = {
    "none": lambda r, same_prompt, gauge: 1.0,
    "prefill": lambda r, same_prompt, gauge: r["prefill_s"] / statistics.median(x["prefill_s"] for x in same_prompt),
    "gauge before": lambda r, same_prompt, gauge: r["gauge_s"][0] / gauge,
    "gauge after": lambda r, same_prompt, gauge: r["gauge_s"][1] / gauge,
    "gauge mean": lambda r, same_prompt, gauge: statistics.mean(r["gauge_s"]) / gauge,
}


def _available(records: list[dict]) -> list[str]:
    needs = {"prefill": "prefill_s", "gauge before": "gauge_s", "gauge after": "gauge_s", "gauge mean": "gauge_s"}
    return [name for name in READINGS if name not in needs or all(r.get(needs[name]) for r in records)]


def _pooled_sd(by_set: dict[str, list[float]]) -> float:
    """The standard deviation within sets, pooled over them (a set's own level does not count)."""
    groups = [values for values in by_set.values() if len(values) > 1]
    dof = sum(len(values) - 1 for values in groups)
    return math.sqrt(sum(statistics.variance(values) * (len(values) - 1) for values in groups) / dof)


def spreads(environment: dict, records: list[dict]) -> dict:
    """Per reading and per pair of methods, the pooled within-set standard deviation of the per-prompt log wall ratio
    after dividing each wall time by the reading."""
    finished = finished_prompts(environment, records)
    # With `--repeat`, each repeat of a prompt is compared on its own: the methods' runs of one round of the rotation.
    by_prompt: dict[tuple[str, str, int], dict[str, dict]] = defaultdict(dict)
    for record in records:
        if (record["set"], record["prompt_id"]) in finished:
            by_prompt[(record["set"], record["prompt_id"], record.get("repeat", 0))][record["method"]] = record
    kept = [r for methods in by_prompt.values() for r in methods.values()]
    readings = _available(kept)
    gauge = statistics.median(statistics.mean(r["gauge_s"]) for r in kept) if "gauge mean" in readings else 1.0
    corrected = {(key, method): {name: r["wall_s"] / READINGS[name](r, list(methods.values()), gauge)
                                 for name in readings}
                 for key, methods in by_prompt.items() for method, r in methods.items()}
    pairs = {}
    for a, b in itertools.combinations(environment["methods"], 2):
        pairs[f"{a} / {b}"] = {}
        for name in readings:
            by_set: dict[str, list[float]] = defaultdict(list)
            for key in by_prompt:
                by_set[key[0]].append(math.log(corrected[(key, a)][name] / corrected[(key, b)][name]))
            pairs[f"{a} / {b}"][name] = _pooled_sd(by_set)
    summary = {name: {"median_sd": statistics.median(p[name] for p in pairs.values()),
                      "pairs_below_none": sum(p[name] < p["none"] for p in pairs.values())} for name in readings}
    return {"prompts": len(by_prompt), "pairs": pairs, "summary": summary}  # "prompts": (prompt, repeat) runs


def markdown_table(result: dict) -> str:
    lines = [f"{result['prompts']} prompts (each repeat counted), {len(result['pairs'])} pairs of methods. Within-set "
             "standard deviation of the per-prompt log wall-time ratio of two methods, each wall time divided by the "
             "reading (`none`: as measured); a reading that tracks the machine's speed during the call shrinks it.", "",
             "| reading | median over pairs | pairs below `none` |", "|---|---|---|"]
    for name, entry in result["summary"].items():
        lines.append(f"| {name} | {entry['median_sd']:.3f} | {entry['pairs_below_none']} of {len(result['pairs'])} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("records", type=Path)
    parser.add_argument("--out", type=Path, help="writes OUT.json and OUT.md")
    args = parser.parse_args()
    result = spreads(*load_records(args.records))
    table = markdown_table(result)
    if args.out:
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=2))
        args.out.with_suffix(".md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
