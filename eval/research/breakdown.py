"""Where the time goes, from the raw records of one `pacer-hf bench`: per round, per draft token, and what separates each
method from the oracle stop.

    python -m eval.research.breakdown eval/results/run.jsonl

Per prompt set, one least-squares fit over every (prompt, method) record of the speculative methods of the run:

    wall_s[p, m] = prefill[p] + round_s * target_calls[p, m] + draft_s * draft_forwards[p, m] + rest[p, m]

`round_s` is one target call with everything around it (verifying the drafts, logits processing, the generate
loop's Python), `draft_s` one draft forward with everything around it (the head included, on average over methods),
and `prefill[p]` a per-prompt constant (the prompt's forwards in both models). Autoregressive decoding is left out of
the fit (its target calls verify nothing) and shown with its own seconds per step. The mean `rest` of a method is
what that model leaves unexplained, a cost or a saving. Then, against the oracle (which drafts exactly up to the
first rejection), each method's extra seconds per prompt split into extra target calls (stopping too
early), extra draft forwards (drafting too far) and its rest. The rest is a residual of the fit, not a measured
cost; beside it, "head (measured)" is the stop rule's own time as `generate()` measured it (`head_s` of the
records of methods in pacer-hf's draft loop; "-" where a method's records lack it). Only prompts every method
finished are used.
Writes `<out>.json`, `<out>.md` and `<out>.png` (the modelled parts stacked, the measured time marked).
"""

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np

from pacer_hf.bench.report import finished_prompts, load_records


def fit(records: list[dict]) -> dict:
    """The least-squares `round_s`, `draft_s` and per-prompt prefill of records of one prompt set."""
    prompts = sorted({r["prompt_id"] for r in records})
    column = {prompt: index for index, prompt in enumerate(prompts)}
    # Design [N, 2 + P]: target calls, draft forwards, then a one-hot prefill column per prompt.
    design = np.zeros((len(records), 2 + len(prompts)))
    for row, record in enumerate(records):
        design[row, 0] = record["target_calls"]
        design[row, 1] = record["draft_forwards"]
        design[row, 2 + column[record["prompt_id"]]] = 1.0
    wall = np.array([r["wall_s"] for r in records])
    solution, *_ = np.linalg.lstsq(design, wall, rcond=None)
    residual = wall - design @ solution
    return {
        "round_s": float(solution[0]), "draft_s": float(solution[1]),
        "prefill_s": dict(zip(prompts, map(float, solution[2:]))),
        "r2": float(1 - (residual**2).sum() / ((wall - wall.mean()) ** 2).sum()),
        "rest_s": [float(x) for x in residual],
    }


def breakdown(environment: dict, records: list[dict]) -> dict:
    finished = finished_prompts(environment, records)
    records = [r for r in records if (r["set"], r["prompt_id"]) in finished]
    by_set: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        by_set[record["set"]].append(record)
    result: dict = {"environment": environment, "sets": {}}
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
            entry["rest_s"].append(rest)
            entry["prefill_s"].append(model["prefill_s"][record["prompt_id"]])
            entry["rounds"].append(len(record["draft_lengths"]))
            entry["drafted"].append(sum(record["draft_lengths"]))
            entry["tokens"].append(len(record["tokens"]))
            entry["head_s"].append(record.get("head_s"))  # None outside pacer-hf's loop and in older records
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
                mean["vs_oracle_s"] = {
                    part: mean[part] - oracle[part] for part in ("wall_s", "calls_s", "drafts_s", "rest_s")
                }
        result["sets"][set_name] = {"model": model, "methods": methods}
    return result


def markdown_table(result: dict) -> str:
    env = result["environment"]
    lines = [f"Time breakdown, pair `{env['pair']}`, {env['dtype']}, {env['mode']}, {env['max_new_tokens']} new tokens, "
             f"{env['threads']} threads (seconds per prompt, mean over prompts; `python -m eval.research.breakdown`)", ""]
    for set_name, entry in result["sets"].items():
        model = entry["model"]
        lines += [
            f"**{set_name}**: one target call with its round {1000 * model['round_s']:.0f} ms, one draft forward "
            f"{1000 * model['draft_s']:.0f} ms, prefill {statistics.mean(model['prefill_s'].values()):.2f} s "
            f"(fit R² {model['r2']:.3f}); autoregressive: "
            f"{1000 * model.get('autoregressive_step_s', float('nan')):.0f} ms per step", "",
            "| method | wall | target calls | draft forwards | rest | head (measured) | rounds | mean draft | "
            "vs oracle: wall | calls | drafts | rest |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for method, m in entry["methods"].items():
            versus = m.get("vs_oracle_s")
            gap = " | ".join(f"{versus[k]:+.2f}" for k in ("wall_s", "calls_s", "drafts_s", "rest_s")) if versus \
                else "- | - | - | -"
            lines.append(
                f"| {method} | {m['wall_s']:.2f} | {m['calls_s']:.2f} | {m['drafts_s']:.2f} | {m['rest_s']:+.2f} | "
                f"{'-' if m['head_s'] is None else format(m['head_s'], '.2f')} | {m['rounds']:.1f} | "
                f"{m['mean_draft_length']:.2f} | {gap} |"
            )
        lines.append("")
    return "\n".join(lines)


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
        for part, label in (("prefill_s", "prefill"), ("calls_s", "target calls"), ("drafts_s", "draft forwards")):
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
