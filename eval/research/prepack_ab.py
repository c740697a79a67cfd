"""Does prepacking the linear weights pay on this CPU? One process, two copies of the target (torch's stock kernels
and `pacer_hf.prepack_linear_weights`), their 1-token and k-token forwards on a KV cache timed in alternation.

    OMP_WAIT_POLICY=PASSIVE python -m eval.research.prepack_ab --dtypes bfloat16 float32 --out eval/results/prepack-ab-qwen

The separate `eval.research.costs` runs with and without `--prepack` answer the same question a process apart; on a
shared machine only the interleaved comparison is worth a ratio.
"""

import argparse
import json
import statistics
from pathlib import Path

import torch

from eval.research.costs import median_forward_seconds
from pacer_hf import prepack_linear_weights
from pacer_hf.models import load_model


def compare(name: str, dtype: torch.dtype, tokens: list[int], rounds: int, repeats: int) -> dict[str, dict[int, float]]:
    """Median forward milliseconds per kernel kind and token count, over `rounds` alternations."""
    models = {"stock": load_model(name, dtype)[0], "prepacked": load_model(name, dtype)[0]}
    prepack_linear_weights(models["prepacked"])
    ids = torch.randint(100, 20000, (1, 256), generator=torch.Generator().manual_seed(0))
    times: dict[str, dict[int, list[float]]] = {kind: {k: [] for k in tokens} for kind in models}
    for r in range(rounds):
        for kind in (("stock", "prepacked") if r % 2 == 0 else ("prepacked", "stock")):  # alternate who goes first
            for k in tokens:
                times[kind][k].append(1000 * median_forward_seconds(models[kind], ids, k, repeats))
    return {kind: {k: statistics.median(v) for k, v in per.items()} for kind, per in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct", help="pinned name, Hub id or folder")
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"], choices=["bfloat16", "float32"])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 9], help="tokens per timed forward")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the two copies")
    parser.add_argument("--repeats", type=int, default=5, help="forwards per timing (their median)")
    parser.add_argument("--out", type=Path, default=Path("eval/results/prepack-ab"))
    args = parser.parse_args()
    torch.set_num_threads(2)
    result = {dtype: compare(args.model, getattr(torch, dtype), args.tokens, args.rounds, args.repeats)
              for dtype in args.dtypes}
    lines = [f"`{args.model}`, 2 threads, median ms of a forward on a KV cache, {args.rounds} alternations", "",
             "| dtype | kernels | " + " | ".join(f"{k} tokens" for k in args.tokens) + " |",
             "|---|---|" + "---|" * len(args.tokens)]
    for dtype, kinds in result.items():
        for kind, per in kinds.items():
            lines.append(f"| {dtype} | {kind} | " + " | ".join(f"{per[k]:.0f}" for k in args.tokens) + " |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"model": args.model, "ms": result}, indent=2))
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
