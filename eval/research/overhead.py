"""What does the PACER code path cost when the head never stops a round?

Compares, in one process, interleaved prompt by prompt in rotating order, transformers' stock
`AssistedCandidateGenerator` drafting a constant k tokens per round (confidence stop off) with
`PacerCandidateGenerator` drafting with an untrained head (which always passes) and `max_draft = k`. Both produce the
same rounds and the same greedy tokens, so the time ratio is pure overhead (or saving) of our draft loop and head.

    OMP_WAIT_POLICY=PASSIVE python -m eval.research.overhead --pair qwen2.5-coder --dtype bfloat16 --out eval/results/overhead

Writes `<out>.json` (every record + environment), `<out>.md` (table) and `<out>.png` (per-prompt ratios).
"""

import argparse
import dataclasses
import json
import os
import platform
import statistics
from pathlib import Path

import torch
import transformers

import pacer_hf
from pacer_hf import PacerHead, PacerHeadConfig

from pacer_hf.bench.flags import add_generation_flags, add_model_flags, load_models
from pacer_hf.bench.methods import Pair, fixed, pacer

PROMPTS = (
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain in two sentences why the sky is blue.",
    "def merge_sorted(a: list[int], b: list[int]) -> list[int]:\n",
    "Give three tips for writing clear commit messages.",
    "class Stack:\n    \"\"\"A minimal LIFO stack.\"\"\"\n\n    def __init__(self):\n",
)


def run(args: argparse.Namespace) -> dict:
    dtype = getattr(torch, args.dtype)
    models = load_models(args)
    target, draft, encode = models.target, models.draft, models.encode
    records = []
    prompts = [encode(p) for p in PROMPTS[: args.num_prompts]]
    for k in args.draft_lengths:
        # An untrained head always passes (see CONTINUE_LOGIT); threshold 0.5 keeps it running after every block.
        head = PacerHead(
            PacerHeadConfig.for_draft(draft, block_size=args.block_size, max_draft=k, threshold=0.5)
        ).to(dtype=dtype)
        pair = Pair(target, draft, head, max_new_tokens=args.max_new_tokens)
        methods = {"stock": fixed(k), "pacer": pacer}
        for method in methods.values():  # warm-up, excluded
            method(dataclasses.replace(pair, max_new_tokens=8), prompts[0])
        for index, ids in enumerate(prompts):
            order = ("stock", "pacer") if index % 2 == 0 else ("pacer", "stock")
            result = {}
            for name in order:
                result[name] = methods[name](pair, ids)
            stock, paced = result["stock"], result["pacer"]
            stats = paced.stats
            round_time = stats.draft_time_s + stats.head_time_s + stats.target_time_s
            records.append(
                {
                    "k": k, "prompt": index, "stock_s": stock.wall_s, "pacer_s": paced.wall_s,
                    "ratio": paced.wall_s / stock.wall_s, "new_tokens": len(paced.tokens),
                    "equal": stock.tokens == paced.tokens, "rounds": stats.rounds, "head_calls": stats.head_calls,
                    "head_share": stats.head_time_s / round_time, "draft_s": stats.draft_time_s,
                    "head_s": stats.head_time_s, "target_s": stats.target_time_s,
                }
            )
            print(f"k={k} prompt={index} stock={stock.wall_s:.2f}s pacer={paced.wall_s:.2f}s "
                  f"ratio={records[-1]['ratio']:.3f} head share={records[-1]['head_share']:.3%} "
                  f"equal={records[-1]['equal']}")
    summary = {
        k: {
            "median_ratio": statistics.median(r["ratio"] for r in records if r["k"] == k),
            "ratio_of_totals": sum(r["pacer_s"] for r in records if r["k"] == k)
            / sum(r["stock_s"] for r in records if r["k"] == k),
            "median_head_share": statistics.median(r["head_share"] for r in records if r["k"] == k),
            "all_equal": all(r["equal"] for r in records if r["k"] == k),
        }
        for k in args.draft_lengths
    }
    environment = {
        "torch": torch.__version__, "transformers": transformers.__version__, "pacer_hf": pacer_hf.__version__,
        "dtype": args.dtype, "threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "pair": args.pair, "block_size": args.block_size,
        "max_new_tokens": args.max_new_tokens, "prepack_linear_weights": args.prepack,
    }
    return {"environment": environment, "summary": summary, "records": records}


def write_report(result: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    env = result["environment"]
    lines = [
        f"PACER code-path overhead, pair `{env['pair']}`, {env['dtype']}, {env['threads']} threads, block size "
        f"{env['block_size']}, {env['max_new_tokens']} new tokens, greedy",
        "",
        "| k | median time ratio PACER/stock | ratio of total times | median head share of round time | outputs equal |",
        "|---|---|---|---|---|",
    ]
    for k, s in result["summary"].items():
        lines.append(f"| {k} | {s['median_ratio']:.3f} | {s['ratio_of_totals']:.3f} | {s['median_head_share']:.2%} | "
                     f"{s['all_equal']} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for k in result["summary"]:
        ratios = [r["ratio"] for r in result["records"] if str(r["k"]) == str(k)]
        ax.plot(range(len(ratios)), ratios, marker="o", label=f"k={k}")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xlabel("prompt")
    ax.set_ylabel("time PACER (always-pass head) / stock")
    ax.set_title(f"PACER code-path overhead ({env['pair']}, {env['dtype']})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_flags(parser)
    add_generation_flags(parser)
    parser.add_argument("--draft-lengths", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--block-size", type=int, default=2)
    parser.add_argument("--num-prompts", type=int, default=len(PROMPTS))
    parser.add_argument("--out", type=Path, default=Path("eval/results/overhead"))
    args = parser.parse_args()
    if os.environ.get("OMP_WAIT_POLICY", "").upper() != "PASSIVE":
        print("warning: set OMP_WAIT_POLICY=PASSIVE before starting Python, or timings stall (see README)")
    write_report(run(args), args.out)


if __name__ == "__main__":
    main()
