"""Runs every method on the same prompts, interleaved, in one process, and writes raw per-prompt records.

    OMP_WAIT_POLICY=PASSIVE python -m eval.run --pair qwen2.5-coder --dtype bfloat16 \\
        --prompts humaneval:0:20 sharegpt:0:20 --max-new-tokens 128 --head hub_cards/<head> --out eval/results/run

For each prompt the methods run in a rotating order (so no method always runs first, after the same one, or on a
warmer cache); one short warm-up generation per method is excluded. `<out>.jsonl` gets one line per (prompt,
method), then `eval.report` derives every figure from those records alone.
"""

import argparse
import dataclasses
import json
import os
import platform
import time
from pathlib import Path

import torch
import transformers
from tqdm.auto import tqdm

import pacer_hf
from pacer_hf import PacerHead

from .methods import Pair, registry
from pacer_hf.prompts import Prompt, chat_input_ids, load_prompt_set


def load_pair(name: str, dtype: torch.dtype):
    """Returns `(target, draft, encode, tokenizer)` for `tiny` (no tokenizer) or a pinned pair of `pacer_hf.models`."""
    if name == "tiny":
        from pacer_hf.tiny_models import tiny_pair

        target, draft = tiny_pair("qwen2", "noisy", seed=0)
        # A stand-in tokenizer for random models: characters to ids; only the token counts matter here.
        return target, draft, lambda text: torch.tensor([[0] + [ord(c) % 94 + 2 for c in text[:32]]]), None
    from pacer_hf.models import load_pair as load_pinned_pair

    target, draft, tokenizer = load_pinned_pair(name, dtype)
    return target, draft, lambda text: chat_input_ids(tokenizer, text), tokenizer


def environment(args: argparse.Namespace) -> dict:
    return {
        "torch": torch.__version__, "transformers": transformers.__version__, "pacer_hf": pacer_hf.__version__,
        "python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(), "threads": torch.get_num_threads(), "dtype": args.dtype, "pair": args.pair,
        "mode": "sampling" if args.sample else "greedy", "max_new_tokens": args.max_new_tokens,
        "prompts": args.prompts, "head": str(args.head) if args.head else None,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def run(args: argparse.Namespace) -> Path:
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    target, draft, encode, tokenizer = load_pair(args.pair, dtype)
    head = PacerHead.from_pretrained(args.head).to(dtype=dtype) if args.head else None
    pair = Pair(
        target, draft, head, max_new_tokens=args.max_new_tokens, do_sample=args.sample,
        entropy_threshold=args.entropy_threshold, fixed_draft_lengths=tuple(args.fixed),
    )
    methods = registry(pair)
    if args.methods:
        unknown = sorted(set(args.methods) - set(methods))
        if unknown:
            raise ValueError(f"Unknown `--methods` {unknown}; available: {sorted(methods)}.")
        methods = {name: methods[name] for name in methods if name in args.methods or name == "autoregressive"}
    prompts: list[Prompt] = [p for spec in args.prompts for p in load_prompt_set(spec)]

    warm_up = dataclasses.replace(pair, max_new_tokens=8)
    for method in methods.values():
        method(warm_up, encode(prompts[0].text))

    out = args.out.with_suffix(".jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    names = list(methods)
    with out.open("w", encoding="utf-8") as file:
        file.write(json.dumps({"environment": {**environment(args), "methods": names}}) + "\n")
        for index, prompt in enumerate(tqdm(prompts, desc="prompts", unit="prompt")):
            ids = encode(prompt.text)
            order = names[index % len(names):] + names[: index % len(names)]
            for name in order:
                torch.manual_seed(args.seed + index)  # sampling: each method draws from the same seed per prompt
                record = methods[name](pair, ids)
                row = {"set": prompt.set_name, "prompt_id": prompt.prompt_id, "prompt_tokens": ids.shape[1],
                       **dataclasses.asdict(record), "meta": prompt.meta}
                if tokenizer is not None:
                    row["text"] = tokenizer.decode(record.tokens, skip_special_tokens=True)
                file.write(json.dumps(row) + "\n")
                file.flush()
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pair", default="tiny", help="`tiny`, or a pinned pair name of `pacer_hf.models.PAIRS`")
    parser.add_argument("--prompts", nargs="+", default=["humaneval:0:4"], help="prompt sets, SOURCE[:START:COUNT]")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    parser.add_argument("--sample", action="store_true", help="sample at temperature 1 (default: greedy)")
    parser.add_argument("--head", type=str, default=None, help="PACER head folder or Hub id (adds the `pacer` method)")
    parser.add_argument("--methods", nargs="*", help="run only these methods (autoregressive always runs)")
    parser.add_argument("--fixed", type=int, nargs="+", default=[2, 4, 6, 8], help="k of the fixed-k methods")
    parser.add_argument("--entropy-threshold", type=float, default=1.0, help="nats; choose it on a separate split")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("eval/results/run"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args()
    if os.environ.get("OMP_WAIT_POLICY", "").upper() != "PASSIVE":
        print("warning: set OMP_WAIT_POLICY=PASSIVE before starting Python, or timings stall (see README)")
    records = run(args)
    from .report import write_report

    write_report(records, args.out)


if __name__ == "__main__":
    main()
