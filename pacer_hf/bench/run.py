"""Runs every method on the same prompts, interleaved, in one process, and writes raw per-prompt records.

    OMP_WAIT_POLICY=PASSIVE pacer-hf bench --pair qwen2.5-coder --dtype bfloat16 \\
        --prompts humaneval:0:20 sharegpt:0:20 --max-new-tokens 128 --head hub_cards/<head> --out eval/results/run

For each prompt the methods run in a rotating order (so no method always runs first, after the same one, or on a
warmer cache); one short warm-up generation per method is excluded. `<out>.jsonl` gets one line per (prompt,
method), then `pacer_hf.bench.report` derives every figure from those records alone. On a machine whose speed moves
between runs (a shared CPU), `--repeat N` runs the methods N times per prompt, in the reverse order every other time,
and the report takes each one's median wall time. An interrupted run continues with the
same command and `--resume` (which may also add prompts); the records keep when each sitting started.
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

from pacer_hf.prompts import Prompt, load_prompt_set

from .flags import add_generation_flags, add_model_flags, field_default, load_models
from .methods import Pair, registry
from .report import finished_prompts, load_records, write_report


def _head_settings(head: PacerHead) -> dict:
    # A folder whose threshold was re-picked is another method, not the same one.
    return {k: v for k, v in head.config.to_dict().items() if k != "pacer_hf_version"}


def _cpu_flags() -> list[str]:
    """The CPU's vector and matrix extensions that decide its bfloat16 and float32 speed (Linux; empty elsewhere)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split("flags", 1)[1].split("\n", 1)[0].split()
    except (OSError, IndexError):
        return []
    return sorted(f for f in flags if f.startswith(("avx512", "amx")) or f in ("avx2", "avx_vnni", "avx_ne_convert"))


def _bfloat16_emulated(args: argparse.Namespace) -> bool:
    """Whether this run's bfloat16 matmuls run on a CPU that has no bfloat16 instructions (x86 Linux, where the flags
    are known): torch then converts to float32 in software, and a forward's cost grows with the tokens it feeds."""
    flags = _cpu_flags()
    on_cpu = args.device == "cpu" or (args.device == "auto" and not torch.cuda.is_available())
    return (args.dtype == "bfloat16" and on_cpu and bool(flags)
            and not {"avx512_bf16", "amx_bf16"} & set(flags))


def environment(args: argparse.Namespace, head: PacerHead | None = None,
                other_heads: dict[str, PacerHead] | None = None) -> dict:
    return {
        "torch": torch.__version__, "transformers": transformers.__version__, "pacer_hf": pacer_hf.__version__,
        "python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(), "threads": torch.get_num_threads(), "dtype": args.dtype, "pair": args.pair,
        "mode": "sampling" if args.sample else "greedy", "max_new_tokens": args.max_new_tokens,
        "prompts": args.prompts, "head": str(args.head) if args.head else None,
        "head_config": _head_settings(head) if head else None,
        # Only when set, so that records from before the option still resume.
        **({"compare_heads": args.compare_heads,
            "compare_head_configs": {name: _head_settings(h) for name, h in other_heads.items()}}
           if other_heads else {}),
        "pacer_thresholds": args.pacer_thresholds,
        "entropy_threshold": args.entropy_threshold, "seed": args.seed,
        # Only when set, so that records from before the option still resume.
        **({"prepack_linear_weights": True} if args.prepack else {}),
        **({"repeat": args.repeat} if args.repeat > 1 else {}),
        **({"device": args.device, "gpu": torch.cuda.get_device_name(args.device if args.device != "auto" else 0)}
           if args.device != "cpu" and torch.cuda.is_available() else {}),
        "cpu_flags": _cpu_flags(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


# Settings that may differ between the sittings of one resumed run; any other difference would mix two runs.
_RESUMABLE_KEYS = {"started", "resumed", "prompts", "pacer_hf"}


def _start_records(out: Path, env: dict, resume: bool) -> set[tuple[str, str]]:
    """Starts `out` with the environment line, or with `resume` continues it: keeps the prompts every method
    finished, drops a prompt cut short, and returns the finished `(set, prompt_id)` keys to skip."""
    if not out.exists() or not resume:
        if out.exists() and out.stat().st_size > 0:
            raise ValueError(
                f"`{out}` already holds records; pass `--resume` to continue that run, or choose another `--out`."
            )
        out.write_text(json.dumps({"environment": env}) + "\n", encoding="utf-8")
        return set()
    previous, records = load_records(out)
    changed = sorted(k for k in (previous.keys() | env.keys()) - _RESUMABLE_KEYS if previous.get(k) != env.get(k))
    if changed:
        raise ValueError(
            f"Cannot resume `{out}`: it was run with other settings ("
            + ", ".join(f"{k}: {previous.get(k)!r} there, {env.get(k)!r} now" for k in changed)
            + "). Use the same settings, or another `--out`."
        )
    done = finished_prompts(env, records)
    env = {**previous, "prompts": env["prompts"], "resumed": previous.get("resumed", []) + [env["started"]]}
    kept = [json.dumps({"environment": env})] + [json.dumps(r) for r in records if (r["set"], r["prompt_id"]) in done]
    # Rewritten beside and renamed over, so an interruption here leaves the old file whole.
    partial = out.with_suffix(".jsonl.tmp")
    partial.write_text("\n".join(kept) + "\n", encoding="utf-8")
    os.replace(partial, out)
    return done


def run(args: argparse.Namespace) -> Path:
    if args.pacer_thresholds and not args.head:
        raise ValueError("`--pacer-thresholds` runs the `--head` at other thresholds: pass `--head` too.")
    models = load_models(args)
    target, draft, encode, tokenizer = models.target, models.draft, models.encode, models.tokenizer
    def load_head(folder: str) -> PacerHead:
        return PacerHead.from_pretrained(folder).to(draft.device, getattr(torch, args.dtype))  # the draft's device

    head = load_head(args.head) if args.head else None
    other_heads = {}
    for spec in args.compare_heads:
        name, sep, folder = spec.partition("=")
        if not sep or not name or not folder or name in other_heads:
            raise ValueError(f"`--compare-heads` takes distinct NAME=FOLDER pairs, got {spec!r}.")
        other_heads[name] = load_head(folder)
    for threshold in args.pacer_thresholds:
        dataclasses.replace(head.config, threshold=threshold)  # validates it now, not after the warm-up
    pair = Pair(
        target, draft, head, max_new_tokens=args.max_new_tokens, do_sample=args.sample,
        entropy_threshold=args.entropy_threshold, fixed_draft_lengths=tuple(args.fixed),
        pacer_thresholds=tuple(args.pacer_thresholds), prompt_lookup_lengths=tuple(args.prompt_lookup),
        other_heads=other_heads, tokenizers=models.stock_tokenizers(),
    )
    methods = registry(pair)
    if args.methods:
        unknown = sorted(set(args.methods) - set(methods))
        if unknown:
            raise ValueError(f"Unknown `--methods` {unknown}; available: {sorted(methods)}.")
        methods = {name: methods[name] for name in methods if name in args.methods or name == "autoregressive"}
    prompts: list[Prompt] = [p for spec in args.prompts for p in load_prompt_set(spec)]

    # Before the warm-up, so that a refused overwrite or resume fails at once.
    out = args.out.with_suffix(".jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    names = list(methods)
    env = {**environment(args, head, other_heads), "pair": models.label(args), "methods": names}
    if pair.tokenizers:  # a padded pair: transformers' draft-model methods run as universal assisted generation
        env["stock_drafting"] = "universal assisted generation"
    done = _start_records(out, env, resume=args.resume)
    warm_up = dataclasses.replace(pair, max_new_tokens=8)
    for method in methods.values():
        method(warm_up, encode(prompts[0].text))

    with out.open("a", encoding="utf-8") as file:
        for index, prompt in enumerate(tqdm(prompts, desc="prompts", unit="prompt")):
            if (prompt.set_name, prompt.prompt_id) in done:
                continue
            ids = encode(prompt.text)
            order = names[index % len(names):] + names[: index % len(names)]
            for repeat in range(args.repeat):
                for name in order if repeat % 2 == 0 else order[::-1]:
                    torch.manual_seed(args.seed + index)  # sampling: each method draws from the same seed per prompt
                    record = methods[name](pair, ids)
                    row = {"set": prompt.set_name, "prompt_id": prompt.prompt_id, "prompt_tokens": ids.shape[1],
                           **({"repeat": repeat} if args.repeat > 1 else {}), **record.to_json(), "meta": prompt.meta}
                    if tokenizer is not None:
                        row["text"] = tokenizer.decode(record.tokens, skip_special_tokens=True)
                    file.write(json.dumps(row) + "\n")
                    file.flush()
    return out


def _at_least_one(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {number}")
    return number


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_flags(parser)
    add_generation_flags(parser)
    parser.add_argument("--prompts", nargs="+", default=["humaneval:0:4"], help="prompt sets, SOURCE[:START:COUNT]")
    parser.add_argument("--sample", action="store_true", help="sample at temperature 1 (default: greedy)")
    parser.add_argument("--head", type=str, default=None, help="PACER head folder or Hub id (adds the `pacer` method)")
    parser.add_argument("--methods", nargs="*", help="run only these methods (autoregressive always runs)")
    parser.add_argument("--compare-heads", nargs="+", default=[], metavar="NAME=FOLDER",
                        help="more heads (folders or Hub ids), each run at its own threshold as method `pacer-NAME`")
    parser.add_argument("--pacer-thresholds", type=float, nargs="+", default=[],
                        help="also run the head at these thresholds (methods `pacer@T`); choose them off these prompts")
    fixed, lookup = field_default(Pair, "fixed_draft_lengths"), field_default(Pair, "prompt_lookup_lengths")
    parser.add_argument("--fixed", type=int, nargs="+", default=list(fixed), help=f"k of the fixed-k methods "
                        f"(default: {' '.join(map(str, fixed))})")
    parser.add_argument("--prompt-lookup", type=int, nargs="*", default=list(lookup),
                        help="prompt_lookup_num_tokens of the prompt-lookup-kN methods (none: no prompt lookup; "
                        f"default: {' '.join(map(str, lookup))})")
    entropy = field_default(Pair, "entropy_threshold")
    parser.add_argument("--entropy-threshold", type=float, default=entropy,
                        help=f"nats; choose it on a separate split (default: {entropy})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=_at_least_one, default=1,
                        help="run every method this many times per prompt; the report takes each one's median wall "
                             "time (default: 1)")
    parser.add_argument("--out", type=Path, default=Path("eval/results/run"))
    parser.add_argument("--resume", action="store_true",
                        help="continue the records in OUT.jsonl: finished prompts are kept, a cut-short one is redone; "
                             "more prompts may be added")


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    if os.environ.get("OMP_WAIT_POLICY", "").upper() != "PASSIVE":
        print("warning: set OMP_WAIT_POLICY=PASSIVE before starting Python, or timings stall (docs/cpu.md)")
    if _bfloat16_emulated(args):
        print("warning: this CPU has no bfloat16 instructions (no avx512_bf16 or amx_bf16 flag), so a bfloat16 "
              "forward grows with its tokens and verifying candidates costs several plain steps; consider "
              "--dtype float32 --prepack (docs/cpu.md)")
    write_report(run(args), args.out)


if __name__ == "__main__":
    main()
