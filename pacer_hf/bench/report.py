"""Derives every figure from the raw records of `pacer-hf bench`: JSON summary, Markdown table, plots.

    python -m pacer_hf.bench.report eval/results/run.jsonl

Per method and prompt set: new tokens/s (mean and median over prompts), speed-up over autoregressive decoding
(ratio of the mean tokens/s, Spec-Bench's convention, and the median of per-prompt ratios), tokens per target call
(tau), draft forwards per accepted draft token, target calls and draft forwards, in greedy mode the number of
prompts whose token ids equal the autoregressive ones (a length mismatch is a mismatch), and HumanEval pass@1.
A prompt that not every method finished (an interrupted run) is left out of every figure and listed in `left_out`.
A run with `--repeat N` counts each (prompt, method) once: the median of its N wall times, the mean of its counts
([`collapse_repeats`]).
"""

import argparse
import json
import math
import statistics
from collections import Counter, defaultdict
from pathlib import Path

from .quality import humaneval_pass_at_1


def load_records(path: Path) -> tuple[dict, list[dict]]:
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not lines or "environment" not in lines[0]:
        raise ValueError(f"`{path}` is not a records file written by `pacer-hf bench` (no environment line first).")
    return lines[0]["environment"], lines[1:]


def finished_prompts(environment: dict, records: list[dict]) -> set[tuple[str, str]]:
    """The `(set, prompt_id)` keys that every method of the run finished, as many times as it repeats them; an
    interrupted run leaves one prompt short."""
    runs: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for record in records:
        runs[(record["set"], record["prompt_id"])][record["method"]] += 1
    repeat = environment.get("repeat", 1)
    return {key for key, done in runs.items() if all(done[m] >= repeat for m in environment["methods"])}


def collapse_repeats(records: list[dict]) -> list[dict]:
    """One record per (set, prompt, method): a method that ran N times on a prompt (`--repeat N`) gets the median of
    its wall times (this machine's speed moves between runs; the median of a few is robust to one slow one and, unlike
    the fastest, does not favour a method whose choices vary with timings), the mean of its target calls and draft
    forwards, every run's draft lengths, and the first run's tokens and text, with `repeats_agree` false where the
    runs' tokens differ (a greedy run is then not counted equal to autoregressive decoding); `wall_spread` is how far
    its runs lie apart, (slowest - fastest) / median."""
    runs: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for record in records:
        runs[(record["set"], record["prompt_id"], record["method"])].append(record)
    collapsed = []
    for group in runs.values():
        first = group[0]
        if len(group) == 1:
            collapsed.append(first)
            continue
        walls = [r["wall_s"] for r in group]
        median = statistics.median(walls)
        collapsed.append({
            **first,
            "wall_s": median,
            "target_calls": statistics.mean(r["target_calls"] for r in group),
            "draft_forwards": statistics.mean(r["draft_forwards"] for r in group),
            "draft_lengths": [n for r in group for n in r["draft_lengths"]],
            "prefill_s": _median_or_none([r.get("prefill_s") for r in group]),
            "repeats_agree": all(r["tokens"] == first["tokens"] for r in group),
            "wall_spread": (max(walls) - min(walls)) / median,
        })
    return collapsed


def _median_or_none(values: list[float | None]) -> float | None:
    return None if None in values else statistics.median(values)


def decode_rate(record: dict) -> float:
    """New tokens after the first per second after the target's prefill (the call's first forward, which makes the
    first token and is the same work for every method): the speed of decoding itself. Where outputs differ in length
    (bfloat16 near-ties), the mean tokens/s of whole calls also moves with how much of a call the prefill is."""
    return (len(record["tokens"]) - 1) / (record["wall_s"] - record["prefill_s"])


def _has_decode_time(record: dict) -> bool:
    return record.get("prefill_s") is not None and len(record["tokens"]) > 1 and record["wall_s"] > record["prefill_s"]


def summarize(environment: dict, records: list[dict], quality: bool = True) -> dict:
    # Every figure compares methods on the same prompts, so a prompt that not every method finished is left out.
    finished = finished_prompts(environment, records)
    left_out = sorted({(r["set"], r["prompt_id"]) for r in records} - finished)
    records = [r for r in records if (r["set"], r["prompt_id"]) in finished]
    repeat = environment.get("repeat", 1)
    # With `--repeat`, also each run alone against the stock methods: how far one run's verdict can move.
    single_runs = [summarize({**environment, "repeat": 1}, [r for r in records if r.get("repeat") == k],
                             quality=False)["against_stock"] for k in range(repeat)] if repeat > 1 else []
    records = collapse_repeats(records)
    by_key: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for record in records:
        by_key[(record["set"], record["method"])].append(record)
    reference = {(r["set"], r["prompt_id"]): r["tokens"] for r in records if r["method"] == "autoregressive"}
    greedy = environment["mode"] == "greedy"
    summary: dict[str, dict[str, dict]] = defaultdict(dict)
    order = {method: index for index, method in enumerate(environment["methods"])}
    for (set_name, method), rows in sorted(by_key.items(), key=lambda item: (item[0][0], order[item[0][1]])):
        rates = [len(r["tokens"]) / r["wall_s"] for r in rows]
        new_tokens = sum(len(r["tokens"]) for r in rows)
        target_calls = sum(r["target_calls"] for r in rows)
        draft_forwards = sum(r["draft_forwards"] for r in rows)
        accepted = new_tokens - target_calls  # each target call adds one token of its own
        entry = {
            "prompts": len(rows),
            "tokens_per_s_mean": statistics.mean(rates),
            "tokens_per_s_median": statistics.median(rates),
            "tau": new_tokens / target_calls,
            "draft_forwards_per_accepted": draft_forwards / accepted if accepted > 0 else None,
            "target_calls": target_calls,
            "draft_forwards": draft_forwards,
            "draft_length_histogram": dict(sorted(Counter(n for r in rows for n in r["draft_lengths"]).items())),
        }
        if "wall_spread" in rows[0]:
            entry["wall_spread_median"] = statistics.median(r["wall_spread"] for r in rows)
        if greedy:
            entry["equal_to_autoregressive"] = sum(r["tokens"] == reference.get((set_name, r["prompt_id"]))
                                                   and r.get("repeats_agree", True) for r in rows)
        if quality and set_name == "humaneval" and "text" in rows[0]:
            entry["pass@1"] = humaneval_pass_at_1([r["text"] for r in rows], [r["meta"] for r in rows])["pass@1"]
        summary[set_name][method] = entry
    for set_name, methods in summary.items():
        base = methods["autoregressive"]
        base_rates = {r["prompt_id"]: len(r["tokens"]) / r["wall_s"]
                      for r in by_key[(set_name, "autoregressive")]}
        # Decode speed-ups only where every record of the set has a decode time, so that all compare the same prompts.
        timed = all(_has_decode_time(r) for method in methods for r in by_key[(set_name, method)])
        base_decode = statistics.mean(map(decode_rate, by_key[(set_name, "autoregressive")])) if timed else None
        for method, entry in methods.items():
            entry["speedup"] = entry["tokens_per_s_mean"] / base["tokens_per_s_mean"]
            entry["speedup_median"] = statistics.median(
                len(r["tokens"]) / r["wall_s"] / base_rates[r["prompt_id"]] for r in by_key[(set_name, method)]
            )
            if timed:
                entry["prefill_s_mean"] = statistics.mean(r["prefill_s"] for r in by_key[(set_name, method)])
                entry["decode_tokens_per_s_mean"] = statistics.mean(map(decode_rate, by_key[(set_name, method)]))
                entry["decode_speedup"] = entry["decode_tokens_per_s_mean"] / base_decode
    decode = all("decode_speedup" in entry for methods in summary.values() for entry in methods.values())
    return {"environment": environment, "summary": summary, "against_stock": against_stock(summary),
            **({"against_stock_decode": against_stock(summary, "decode_speedup")} if decode and summary else {}),
            **({"against_stock_single_runs": single_runs} if single_runs else {}),
            "left_out": [list(key) for key in left_out]}


def is_stock(method: str) -> bool:
    """transformers' own methods: its draft-model schedules and its prompt lookup."""
    return method.startswith(STOCK_PREFIXES) or method in ("heuristic", "confidence")


STOCK_PREFIXES = ("fixed-k", "prompt-lookup-k")


def against_stock(summary: dict[str, dict[str, dict]], speedup: str = "speedup") -> dict:
    """Each of pacer-hf's methods against what transformers already ships, from the speed-ups of `summary` (the
    entries' `speedup`, or `"decode_speedup"`): per set, its ratio to that set's best stock method; over all sets, its
    geometric-mean speed-up and the ratio of that to the geometric mean of the best *single* stock method (the one
    setting a user would otherwise pick for everything)."""
    sets = list(summary)
    common = set.intersection(*(set(summary[s]) for s in sets)) if sets else set()
    stock = sorted(m for m in common if is_stock(m))
    ours = [m for m in (summary[sets[0]] if sets else {}) if m in common and m != "autoregressive"
            and not is_stock(m) and m != "oracle"]
    if not stock or not ours:
        return {}
    geomean = {m: math.exp(statistics.mean(math.log(summary[s][m][speedup]) for s in sets)) for m in stock + ours}
    best_single = max(stock, key=geomean.get)
    per_set = {}
    for s in sets:
        best = max(stock, key=lambda m: summary[s][m][speedup])
        per_set[s] = {"best_stock": best, "best_stock_speedup": summary[s][best][speedup],
                      **{m: summary[s][m][speedup] / summary[s][best][speedup] for m in ours}}
    return {"per_set": per_set, "geomean_speedup": geomean, "best_single_stock": best_single,
            "geomean_vs_best_single_stock": {m: geomean[m] / geomean[best_single] for m in ours}}


def markdown_table(result: dict) -> str:
    env = result["environment"]
    decode = all("decode_speedup" in e for methods in result["summary"].values() for e in methods.values())
    lines = [
        f"Pair `{env['pair']}`, {env['dtype']}, {env['mode']}, {env['max_new_tokens']} new tokens, "
        f"{env['threads']} threads, transformers {env['transformers']}, torch {env['torch']}"
        + (f"; run in {1 + len(env['resumed'])} sittings (`--resume`)" if env.get("resumed") else "")
        + (f"; each method {env['repeat']} times per prompt, median wall time" if env.get("repeat", 1) > 1 else "")
        + (f"; {len(result['left_out'])} prompt(s) not finished by every method left out" if result.get("left_out")
           else "")
        + (f"; every forward timed by the cost model {env['virtual_clock']['model']} (`eval.research.virtual_clock`), "
           "not by this machine" if env.get("virtual_clock") else ""),
        "",
        "| prompt set | method | tokens/s (mean) | speed-up | speed-up (median) | tau | draft forwards/accepted | "
        "equal to AR | pass@1 |" + (" speed-up (decode) |" if decode else ""),
        "|---|---|---|---|---|---|---|---|---|" + ("---|" if decode else ""),
    ]
    for set_name, methods in result["summary"].items():
        for method, e in methods.items():
            drafted = (f"{e['draft_forwards_per_accepted']:.2f}" if e["draft_forwards_per_accepted"] is not None
                       else "-")
            equal = f"{e['equal_to_autoregressive']}/{e['prompts']}" if "equal_to_autoregressive" in e else "-"
            quality = f"{e['pass@1']:.2f}" if "pass@1" in e else "-"
            lines.append(
                f"| {set_name} | {method} | {e['tokens_per_s_mean']:.2f} | {e['speedup']:.2f}x | "
                f"{e['speedup_median']:.2f}x | {e['tau']:.2f} | {drafted} | {equal} | {quality} |"
                + (f" {e['decode_speedup']:.2f}x |" if decode else "")
            )
    lines += _spread_table(result["summary"])
    comparison = result.get("against_stock")
    if comparison:
        lines += _comparison_table(comparison, "Against transformers' own methods: each method's speed-up over the "
                                   "set's best stock method's, and over all sets the geometric mean")
        lines += _single_runs_table(comparison, result.get("against_stock_single_runs", []))
    if result.get("against_stock_decode"):
        lines += _comparison_table(result["against_stock_decode"], "The same on decode time: each call's time after "
                                   "the target's prefill, the same work for every method")
    return "\n".join(lines) + "\n"


def _comparison_table(comparison: dict, title: str) -> list[str]:
    """Markdown lines of an [`against_stock`] comparison under `title`."""
    ours = list(comparison["geomean_vs_best_single_stock"])
    lines = ["", f"{title} (best single stock method: {comparison['best_single_stock']}).", "",
             "| prompt set | best stock method | its speed-up | " + " | ".join(ours) + " |",
             "|---|---|---|" + "---|" * len(ours)]
    for set_name, row in comparison["per_set"].items():
        lines.append(f"| {set_name} | {row['best_stock']} | {row['best_stock_speedup']:.2f}x | "
                     + " | ".join(f"{row[m]:.3f}" for m in ours) + " |")
    geomean, best = comparison["geomean_speedup"], comparison["best_single_stock"]
    lines.append(f"| geometric mean | {best} | {geomean[best]:.2f}x | "
                 + " | ".join(f"{geomean[m]:.2f}x ({comparison['geomean_vs_best_single_stock'][m]:.3f})"
                              for m in ours) + " |")
    return lines


def _single_runs_table(comparison: dict, single_runs: list[dict]) -> list[str]:
    """With `--repeat`: the comparison with the best stock method in each run alone, per set (run 1, 2, ...)."""
    if not single_runs:
        return []
    ours = list(comparison["geomean_vs_best_single_stock"])
    lines = ["", "The same ratios in each run alone (the repeats' records taken one at a time; a run's best stock "
             "method can differ):", "", "| prompt set | " + " | ".join(ours) + " |", "|---|" + "---|" * len(ours)]
    for set_name in comparison["per_set"]:
        cells = [", ".join(f"{run['per_set'][set_name][m]:.3f}" for run in single_runs) for m in ours]
        lines.append(f"| {set_name} | " + " | ".join(cells) + " |")
    lines.append("| geometric mean, over the best single stock method | " + " | ".join(
        ", ".join(f"{run['geomean_vs_best_single_stock'][m]:.3f}" for run in single_runs) for m in ours) + " |")
    return lines


def _spread_table(summary: dict[str, dict[str, dict]]) -> list[str]:
    """With `--repeat`: how far each method's runs of one prompt lay apart (the machine's noise), per set."""
    methods = [m for m in next(iter(summary.values()), {}) if all("wall_spread_median" in summary[s].get(m, {})
                                                                  for s in summary)]
    if not methods:
        return []
    lines = ["", "Spread of the repeated runs of one prompt, (slowest - fastest) / median wall time, median over the "
             "set's prompts:", "", "| prompt set | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    for set_name, entries in summary.items():
        lines.append(f"| {set_name} | " + " | ".join(f"{entries[m]['wall_spread_median']:.2f}" for m in methods) + " |")
    return lines


def plot(result: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    sets = list(result["summary"])
    fig, axes = plt.subplots(1, len(sets), figsize=(5 * len(sets), 3.8), squeeze=False)
    for ax, set_name in zip(axes[0], sets):
        methods = result["summary"][set_name]
        ax.bar(list(methods), [m["speedup"] for m in methods.values()], color="tab:blue")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_title(f"{set_name}: speed-up over autoregressive")
        ax.tick_params(axis="x", rotation=60)
    fig.tight_layout()
    paths.append(out.with_name(out.name + "-speedup.png"))
    fig.savefig(paths[-1], dpi=120)

    fig, axes = plt.subplots(1, len(sets), figsize=(5 * len(sets), 3.8), squeeze=False)
    for ax, set_name in zip(axes[0], sets):
        for method, entry in result["summary"][set_name].items():
            histogram = entry["draft_length_histogram"]
            if not histogram:
                continue
            total = sum(histogram.values())
            lengths = sorted(histogram, key=int)  # JSON keys are strings
            ax.plot([int(k) for k in lengths], [histogram[k] / total for k in lengths],
                    marker="o", lw=2.5 if method == "oracle" else 1, label=method)
        ax.set_title(f"{set_name}: draft length per round")
        ax.set_xlabel("draft tokens")
        ax.set_ylabel("fraction of rounds")
        ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out.with_name(out.name + "-draft-lengths.png"))
    fig.savefig(paths[-1], dpi=120)
    return paths


def write_report(records_path: Path, out: Path | None = None, quality: bool = True) -> dict:
    environment, records = load_records(records_path)
    result = json.loads(json.dumps(summarize(environment, records, quality)))  # JSON keys, as a reader sees them
    out = out or records_path.with_suffix("")
    out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    table = markdown_table(result)
    out.with_suffix(".md").write_text(table)
    plot(result, out)
    print(table)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("records", type=Path)
    parser.add_argument("--no-quality", action="store_true", help="skip running HumanEval tests")
    args = parser.parse_args()
    write_report(args.records, quality=not args.no_quality)


if __name__ == "__main__":
    main()
