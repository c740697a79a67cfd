"""Compares trained heads on the held-out prompts of their collection with the expected-speed model.

Every head is scored on the same validation prompts (the split of its training run) with both label kinds: greedy
(0/1 acceptance of the greedy token) and sampling (acceptance probability sum min(p, q) at the collection's
temperature). The threshold is chosen per head and mode as `pacer-hf train` chooses it; the oracle stop and the best
fixed draft length are the references under the same cost model, with the harness's training-free entropy stop
(no head cost). This is a model of speed, not a timing: it ranks heads without spending a benchmark run on each.

    python -m eval.research.ablations --data DATA_DIR --runs runs/block1 runs/block2 ... --cost-ratio 0.445 \
        --head-cost-ratio 0.0063 --sampling-cost-ratio 0.558 --sampling-head-cost-ratio 0.0103 \
        --out eval/results/ablations-qwen-bf16

A sampled draft token costs more than a greedy one (softmax and a draw over the vocabulary), so each mode is scored
under its own costs (`python -m eval.research.costs` measures both inside generate()).
"""

import argparse
import dataclasses
import json
from pathlib import Path

from pacer_core.head import ENTROPY_RULE_SETTINGS
from pacer_hf import PacerHead
from pacer_hf.collection import load_collection
from pacer_hf.threshold import CostModel
from pacer_hf.training import TrainingConfig
from pacer_hf.rounds import evaluate_head, head_metrics
from pacer_hf.training import RUN_NAME, split_sequences

from pacer_hf.bench.flags import add_cost_flags, cost_model

MODES = ("greedy", "sampling")


def score_head(
    name: str, head: PacerHead, collection, split: tuple[list[int], list[int]], costs: dict[str, CostModel]
) -> dict:
    """Training and validation AUC, and expected speed-ups on the validation sequences under both label kinds."""
    train_sequences, val_sequences = split
    row = {
        "run": name, "architecture": head.config.architecture, "block_size": head.config.block_size,
        "trained_on": head.config.decoding, "parameters": head.num_parameters(), "val_sequences": len(val_sequences),
        "train_auc": head_metrics(head, collection, train_sequences, decoding="greedy")["auc"],
    }
    for mode in MODES:
        metrics, report = evaluate_head(head, collection, val_sequences, costs[mode], decoding=mode)
        k, fixed = report.best_fixed
        row[mode] = {
            "auc": metrics["auc"], "ece": metrics["ece"], "threshold": report.best_threshold,
            "speedup": report.best_speedup, "oracle": report.oracle_speedup, "best_fixed_k": k, "best_fixed": fixed,
        }
    return row


def training_split(run_dir: Path, collection) -> tuple[list[int], list[int]]:
    """The training and validation sequences of the training run in `run_dir`."""
    run = json.loads((run_dir / RUN_NAME).read_text())
    return split_sequences(collection, TrainingConfig(**run["training_config"]))


def entropy_rows(reference: PacerHead, thresholds: list[float], collection, split, costs) -> list[dict]:
    """The training-free entropy stop of the harness (stop after a token whose draft entropy exceeds X nats)."""
    config = dataclasses.replace(reference.config, **ENTROPY_RULE_SETTINGS)  # score_head picks the pass-score threshold
    free = {mode: dataclasses.replace(cost, head=0.0) for mode, cost in costs.items()}  # features the loop has
    rows = []
    for threshold in thresholds:
        rule = PacerHead(dataclasses.replace(config, entropy_threshold=threshold)).eval()
        row = score_head(f"entropy > {threshold} nats", rule, collection, split, free)
        rows.append({**row, "trained_on": "-"})
    return rows


def to_markdown(rows: list[dict], costs: dict[str, CostModel], data_dir: str) -> str:
    lines = [
        f"Expected speed-up over autoregressive on the validation prompts of `{data_dir}`; costs per drafted token, "
        "head call and verified draft token, in rounds: "
        + "; ".join(f"{mode} c = {c.draft:.3f}, head {c.head:.4f}, verify {c.verify:.4f}" for mode, c in costs.items())
        + ". Threshold chosen per head and mode.",
        "",
        "| head | params | trained on | train AUC (greedy) | greedy: AUC | greedy: threshold | greedy: speed-up | "
        "sampling: AUC | sampling: threshold | sampling: speed-up |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        g, s = row["greedy"], row["sampling"]
        lines.append(
            f"| {row['run']} ({row['architecture']}, block {row['block_size']}) | {row['parameters']:,} | "
            f"{row['trained_on']} | {row['train_auc']:.3f} | {g['auc']:.3f} | {g['threshold']:.3f} | "
            f"{g['speedup']:.3f} | {s['auc']:.3f} | {s['threshold']:.3f} | {s['speedup']:.3f} |"
        )
    first = rows[0]
    for mode in MODES:
        ref = first[mode]
        lines.append(f"\n{mode}: oracle stop {ref['oracle']:.3f}; best fixed length ({ref['best_fixed_k']}) "
                     f"{ref['best_fixed']:.3f}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="the collection the heads were trained on")
    parser.add_argument("--runs", nargs="+", required=True, help="output folders of `pacer-hf train`")
    add_cost_flags(parser)  # greedy; --verify-cost-ratio for both modes
    parser.add_argument("--sampling-cost-ratio", type=float, default=None,
                        help="sampling: drafted token / round (default: --cost-ratio)")
    parser.add_argument("--sampling-head-cost-ratio", type=float, default=None,
                        help="sampling: head call / round (default: --head-cost-ratio)")
    parser.add_argument("--entropy-thresholds", type=float, nargs="*", default=[0.3, 0.6, 1.0, 1.5],
                        help="reference rows: the harness's training-free entropy stop at these thresholds (nats)")
    parser.add_argument("--out", required=True, help="output prefix: writes OUT.json and OUT.md")
    args = parser.parse_args(argv)
    greedy = cost_model(args)
    costs = {"greedy": greedy, "sampling": dataclasses.replace(
        greedy, **{k: v for k, v in (("draft", args.sampling_cost_ratio), ("head", args.sampling_head_cost_ratio))
                   if v is not None})}
    collection = load_collection(args.data)
    runs = [Path(run) for run in args.runs]
    split = training_split(runs[0], collection)
    for run in runs:
        if training_split(run, collection) != split:
            raise ValueError(f"`{run}` was validated on other prompts than `{runs[0]}`; compare runs of one split.")
    heads = [PacerHead.from_pretrained(run).eval() for run in runs]
    rows = [score_head(run.name, head, collection, split, costs) for run, head in zip(runs, heads)]
    rows += entropy_rows(heads[0], args.entropy_thresholds, collection, split, costs)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"costs": {mode: vars(cost) for mode, cost in costs.items()}, "data": args.data, "rows": rows}
    Path(f"{out}.json").write_text(json.dumps(result, indent=2))
    table = to_markdown(rows, costs, args.data)
    Path(f"{out}.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
