"""Where the time goes, from the raw records of one `pacer-hf bench`: per round, per draft token, and what separates each
method from the oracle stop.

    python -m eval.research.breakdown eval/results/run.jsonl

Per prompt set, one least-squares fit over every (prompt, method) record of the speculative methods of the run:

    wall_s[p, m] = prefill[p] + round_s * target_calls[p, m] + draft_s * draft_forwards[p, m]
                   + draft_prefill_s * prompt_tokens[p] * drafts[m] + rest[p, m]

`round_s` is one target call with everything around it (verifying the drafts, logits processing, the generate
loop's Python), `draft_s` one draft forward with everything around it (the head included, on average over methods),
`prefill[p]` a per-prompt constant (the prompt's forwards), and `draft_prefill_s` what each prompt token adds to the
draft's first forward, paid by the methods that ran the draft (`drafts[m]`: 1 if the record has draft forwards) and
fitted only where the set has records with and without the draft and the fit finds it a cost (else it is part of
`prefill[p]` and the rest: short prompts of similar length do not tell it apart). Autoregressive decoding is left out of
the fit (its target calls verify nothing) and shown with its own seconds per step. The mean `rest` of a method is
what that model leaves unexplained, a cost or a saving. Then, against the oracle (which drafts exactly up to the
first rejection), each method's extra seconds per prompt split into extra target calls (stopping too
early), extra draft forwards (drafting too far) and its rest; and each of pacer-hf's methods against the set's best
stock method (transformers' own, by the report's speed-up), split the same way plus the draft's prefill, with what its
planned rounds did (copy rounds, plain steps, copied tokens sent and accepted: look-up misses). The rest is a
residual of the fit, not a measured cost; beside it, "head (measured)" is the stop rule's own time as `generate()`
measured it (`head_s` of the records of methods in pacer-hf's draft loop; "-" where a method's records lack it).
Only prompts every method finished are used.
Writes `<out>.json`, `<out>.md` and `<out>.png` (the modelled parts stacked, the measured time marked).
"""

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np

from pacer_hf.bench.report import is_stock, against_stock, finished_prompts, load_records, summarize

# The parts of a method's gap to a reference method.
GAP_PARTS = ("wall_s", "calls_s", "drafts_s", "draft_prefill_s", "rest_s")


def _draft_prefill_tokens(record: dict) -> float:
    """The prompt tokens a record's draft had to read: the prompt if the draft ran, else none."""
    return float(record["prompt_tokens"]) if record["draft_forwards"] > 0 else 0.0


def fit(records: list[dict]) -> dict:
    """The least-squares `round_s`, `draft_s`, `draft_prefill_per_token_s` and per-prompt prefill of records of one
    prompt set."""
    prompts = sorted({r["prompt_id"] for r in records})
    column = {prompt: index for index, prompt in enumerate(prompts)}
    # The draft's prefill is told apart from the prompt's only by records of the same prompt without the draft.
    with_draft = {r["draft_forwards"] > 0 for r in records}
    separable = with_draft == {True, False} and all("prompt_tokens" in r for r in records)
    # Design [N, 3 + P]: target calls, draft forwards, draft prefill tokens, then a one-hot prefill column per prompt.
    design = np.zeros((len(records), 3 + len(prompts)))
    for row, record in enumerate(records):
        design[row, 0] = record["target_calls"]
        design[row, 1] = record["draft_forwards"]
        design[row, 2] = _draft_prefill_tokens(record) if separable else 0.0
        design[row, 3 + column[record["prompt_id"]]] = 1.0
    wall = np.array([r["wall_s"] for r in records])
    solution, *_ = np.linalg.lstsq(design, wall, rcond=None)
    if separable and solution[2] < 0:
        # A prefill cannot save time: short prompts of similar length leave the column to fit noise, so it is dropped
        # (the draft's prefill stays in the rest) rather than reported as a negative cost.
        separable, design[:, 2] = False, 0.0
        solution, *_ = np.linalg.lstsq(design, wall, rcond=None)
    residual = wall - design @ solution
    return {
        "round_s": float(solution[0]), "draft_s": float(solution[1]),
        "draft_prefill_per_token_s": float(solution[2]) if separable else None,
        "prefill_s": dict(zip(prompts, map(float, solution[3:]))),
        "r2": float(1 - (residual**2).sum() / ((wall - wall.mean()) ** 2).sum()),
        "rest_s": [float(x) for x in residual],
    }


def _planned_rounds(record: dict) -> dict[str, float]:
    """What a planned call's rounds were, from its record's `phrases` (absent outside planned rounds)."""
    phrases = record["phrases"]
    kinds = phrases["round_kinds"]
    return {"copy_rounds": kinds.get("copy", 0), "step_rounds": kinds.get("step", 0),
            "draft_rounds": kinds.get("draft", 0), "copied": phrases["copied"],
            "copied_accepted": phrases["copied_accepted"]}


def _gap(mean: dict, reference: dict) -> dict[str, float]:
    return {part: mean[part] - reference[part] for part in GAP_PARTS}


def breakdown(environment: dict, records: list[dict]) -> dict:
    finished = finished_prompts(environment, records)
    records = [r for r in records if (r["set"], r["prompt_id"]) in finished]
    by_set: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        by_set[record["set"]].append(record)
    result: dict = {"environment": environment, "sets": {}}
    best_stock = {name: row["best_stock"]
                  for name, row in against_stock(summarize(environment, records, quality=False)["summary"])
                  .get("per_set", {}).items()}
    for set_name, rows in by_set.items():
        speculative = [r for r in rows if r["method"] != "autoregressive"]
        if not speculative:
            continue
        model = fit(speculative)
        plain = [r for r in rows if r["method"] == "autoregressive"]
        if plain:
            model["autoregressive_step_s"] = sum(r["wall_s"] for r in plain) / sum(r["target_calls"] for r in plain)
        per_method: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for record, rest in zip(speculative, model.pop("rest_s")):
            entry = per_method[record["method"]]
            entry["wall_s"].append(record["wall_s"])
            entry["calls_s"].append(model["round_s"] * record["target_calls"])
            entry["drafts_s"].append(model["draft_s"] * record["draft_forwards"])
            per_token = model["draft_prefill_per_token_s"]
            entry["draft_prefill_s"].append(per_token * _draft_prefill_tokens(record) if per_token is not None else 0.0)
            entry["rest_s"].append(rest)
            entry["prefill_s"].append(model["prefill_s"][record["prompt_id"]])
            entry["rounds"].append(len(record["draft_lengths"]))
            entry["drafted"].append(sum(record["draft_lengths"]))
            entry["tokens"].append(len(record["tokens"]))
            entry["head_s"].append(record.get("head_s"))  # None outside pacer-hf's loop and in older records
            if record.get("phrases"):
                for part, value in _planned_rounds(record).items():
                    entry[part].append(value)
        methods = {}
        for method in (m for m in environment["methods"] if m in per_method):
            entry = per_method[method]
            head = entry.pop("head_s")
            mean = {key: statistics.mean(values) for key, values in entry.items()}
            mean["head_s"] = None if None in head else statistics.mean(head)
            mean["mean_draft_length"] = mean["drafted"] / mean["rounds"] if mean["rounds"] else 0.0
            methods[method] = mean
        oracle = methods.get("oracle")
        if oracle is not None:
            for mean in methods.values():
                mean["vs_oracle_s"] = _gap(mean, oracle)
        best = best_stock.get(set_name)
        if best in methods:
            for method, mean in methods.items():
                if not is_stock(method) and method not in ("autoregressive", "oracle"):
                    mean["vs_best_stock_s"] = _gap(mean, methods[best])
        result["sets"][set_name] = {"model": model, "methods": methods, "best_stock": best}
    return result


def markdown_table(result: dict) -> str:
    env = result["environment"]
    lines = [f"Time breakdown, pair `{env['pair']}`, {env['dtype']}, {env['mode']}, {env['max_new_tokens']} new tokens, "
             f"{env['threads']} threads (seconds per prompt, mean over prompts; `python -m eval.research.breakdown`)", ""]
    for set_name, entry in result["sets"].items():
        model = entry["model"]
        per_token = model["draft_prefill_per_token_s"]
        draft_prefill = (f", the draft's prefill {1000 * per_token:.2f} ms per prompt token" if per_token is not None
                         else ", the draft's prefill not told apart from the rest")
        lines += [
            f"**{set_name}**: one target call with its round {1000 * model['round_s']:.0f} ms, one draft forward "
            f"{1000 * model['draft_s']:.0f} ms{draft_prefill}, prefill "
            f"{statistics.mean(model['prefill_s'].values()):.2f} s (fit R² {model['r2']:.3f}); autoregressive: "
            f"{1000 * model.get('autoregressive_step_s', float('nan')):.0f} ms per step", "",
            "| method | wall | target calls | draft forwards | draft prefill | rest | head (measured) | rounds | "
            "mean draft | vs oracle: wall | calls | drafts | draft prefill | rest |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for method, m in entry["methods"].items():
            lines.append(
                f"| {method} | {m['wall_s']:.2f} | {m['calls_s']:.2f} | {m['drafts_s']:.2f} | "
                f"{m['draft_prefill_s']:.2f} | {m['rest_s']:+.2f} | "
                f"{'-' if m['head_s'] is None else format(m['head_s'], '.2f')} | {m['rounds']:.1f} | "
                f"{m['mean_draft_length']:.2f} | {_gap_cells(m.get('vs_oracle_s'))} |"
            )
        lines += ["", *_versus_best_stock_table(entry), ""]
    return "\n".join(lines)


def _gap_cells(gap: dict | None) -> str:
    return " | ".join(f"{gap[part]:+.2f}" for part in GAP_PARTS) if gap else " | ".join("-" * len(GAP_PARTS))


def _versus_best_stock_table(entry: dict) -> list[str]:
    """pacer-hf's methods against the set's best stock method: the seconds per prompt they spend more (+) or less (-)
    in each part, and what their planned rounds did."""
    ours = {method: m for method, m in entry["methods"].items() if "vs_best_stock_s" in m}
    if not ours:
        return []
    lines = [f"Against the best stock method here, {entry['best_stock']} (seconds per prompt more than it; planned "
             "rounds: mean per prompt):", "",
             "| method | wall | target calls | draft forwards | draft prefill | rest | copy rounds | plain steps | "
             "draft rounds | copied tokens accepted / sent |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for method, m in ours.items():
        planned = (f"{m['copy_rounds']:.1f} | {m['step_rounds']:.1f} | {m['draft_rounds']:.1f} | "
                   f"{m['copied_accepted']:.1f} / {m['copied']:.1f}" if "copied" in m else "- | - | - | -")
        lines.append(f"| {method} | {_gap_cells(m['vs_best_stock_s'])} | {planned} |")
    return lines


def plot(result: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(result["sets"])
    fig, axes = plt.subplots(1, len(sets), figsize=(5.5 * len(sets), 4), squeeze=False)
    for ax, set_name in zip(axes[0], sets):
        methods = result["sets"][set_name]["methods"]
        names = list(methods)
        bottom = np.zeros(len(names))
        for part, label in (("prefill_s", "prefill"), ("draft_prefill_s", "draft prefill"), ("calls_s", "target calls"),
                            ("drafts_s", "draft forwards")):
            values = np.array([methods[name][part] for name in names])
            ax.bar(names, values, bottom=bottom, label=label)
            bottom += values
        # `rest` may be negative, so it is not stacked: the gap between the bar and the measured time is the rest.
        ax.plot(names, [methods[name]["wall_s"] for name in names], "kD", markersize=5, label="measured")
        ax.set_title(f"{set_name}: seconds per prompt")
        ax.tick_params(axis="x", rotation=60)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = out.with_suffix(".png")
    fig.savefig(path, dpi=120)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("records", type=Path)
    parser.add_argument("--out", type=Path, help="default: the records' path with `-breakdown`")
    args = parser.parse_args()
    out = args.out or args.records.with_name(args.records.stem + "-breakdown")
    result = breakdown(*load_records(args.records))
    out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    table = markdown_table(result)
    out.with_suffix(".md").write_text(table)
    plot(result, out)
    print(table)


if __name__ == "__main__":
    main()
