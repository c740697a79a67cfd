"""What a forward costs for each model of a pair on this machine: the numbers that decide whether drafting pays.

    OMP_WAIT_POLICY=PASSIVE python -m eval.research.costs --pair qwen2.5-coder --dtype bfloat16 --out eval/results/costs-qwen-bf16

Reports load time and peak memory, autoregressive tokens/s of each model alone, the median time of a k-token
forward on a KV cache of 200 tokens (`--context`; k = 1..9, `--max-k`), the cost ratio c = draft forward / target
forward at 1 token, and the target's time for k + 1 tokens against 1 token (what verifying k drafts costs); a first
forward of n prompt tokens on a fresh cache (`--prefill`, 150 and 800: the target's prefill, the draft's first
catch-up) and the draft's share of the target's (what the planner's price of a late draft start rests on). Then, with
both models loaded, the costs as `pacer-hf train` measures them to pick a threshold, inside generate() for greedy and
for sampling (`pacer_hf.cost_measurement.measure_cost_model`: a drafted token and a head call, in rounds). JSON +
Markdown table.
"""

import argparse
import json
import os
import platform
import resource
import statistics
import time
from pathlib import Path

import torch
import transformers
from transformers import DynamicCache

from pacer_hf import PacerHead, PacerHeadConfig, prepack_linear_weights
from pacer_hf.cost_measurement import measure_cost_model
from pacer_hf.models import PAIRS, load_model, load_pair
from pacer_hf.prompts import chat_input_ids
from pacer_hf.cost_measurement import BENCHMARK_CONTEXT

from pacer_hf.bench.flags import add_model_flags

# A typical code request: the autoregressive timing needs a realistic prompt, not random ids.
PROMPT_FOR_TIMING = "Write a Python function that returns the n-th prime number, with a docstring."


def median_forward_seconds(model: torch.nn.Module, ids: torch.LongTensor, new_tokens: int, repeats: int,
                           context: int = BENCHMARK_CONTEXT) -> float:
    """Median time of a `new_tokens`-token forward on top of a KV cache of `context` tokens."""
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids[:, :context], past_key_values=cache, use_cache=True)
        times = []
        for _ in range(repeats + 2):  # the first two are warm-up
            start = time.perf_counter()
            model(ids[:, context : context + new_tokens], past_key_values=cache, use_cache=True,
                  output_hidden_states=True)
            times.append(time.perf_counter() - start)
            cache.crop(-new_tokens)  # back to the context (crop takes a negative count in transformers 5)
    return statistics.median(times[2:])


def median_prefill_seconds(model: torch.nn.Module, ids: torch.LongTensor, tokens: int, repeats: int = 3) -> float:
    """Median time of a first forward of `tokens` prompt tokens on a fresh cache, the last position's logits only (what
    a call's first forward of each model costs: the target's prefill, the draft's first catch-up)."""
    kwargs = {"logits_to_keep": 1} if model._supports_logits_to_keep() else {}
    times = []
    with torch.no_grad():
        for _ in range(repeats + 1):  # the first is warm-up
            cache = DynamicCache(config=model.config)
            start = time.perf_counter()
            model(ids[:, :tokens], past_key_values=cache, use_cache=True, **kwargs)
            times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def _costs_in_generate(pair: str, dtype: torch.dtype, prepack: bool) -> dict[str, dict]:
    """The pair's costs per decoding mode as `pacer-hf train` measures them, for a head of the committed shape."""
    target, draft, _ = load_pair(pair, dtype)
    if prepack:
        prepack_linear_weights(target, draft)
    costs = {}
    for mode in ("greedy", "sampling"):
        head = PacerHead(PacerHeadConfig.for_draft(draft, block_size=1, decoding=mode))
        costs[mode] = vars(measure_cost_model(draft, target, head))
        print(mode, costs[mode])
    return costs


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_flags(parser, pair="qwen2.5-coder")
    parser.add_argument("--max-k", type=int, default=9)
    parser.add_argument("--context", type=int, default=BENCHMARK_CONTEXT,
                        help="tokens in the KV cache the k-token forwards run on (a long document: 1000)")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens of the autoregressive timing")
    parser.add_argument("--prefill", type=int, nargs="+", default=[150, 800],
                        help="prompt lengths whose first forward (fresh cache) is timed for each model")
    parser.add_argument("--out", type=Path, default=Path("eval/results/costs"))
    args = parser.parse_args()
    if args.pair not in PAIRS:
        parser.error(f"--pair must be a pinned pair ({sorted(PAIRS)}): each model is loaded and timed alone")
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    result = {"environment": {"torch": torch.__version__, "transformers": transformers.__version__,
                              "dtype": args.dtype, "threads": torch.get_num_threads(), "cpu": platform.machine(),
                              "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "context": args.context,
                              "prepack_linear_weights": args.prepack}}
    models = {}
    for role, name in zip(("draft", "target"), PAIRS[args.pair]):
        start = time.perf_counter()
        model, tokenizer = load_model(name, dtype=dtype)
        if args.prepack:
            prepack_linear_weights(model)
        entry = {"name": name, "load_s": time.perf_counter() - start, "peak_rss_gib": _peak_rss_gib()}
        ids = chat_input_ids(tokenizer, PROMPT_FOR_TIMING)
        model.generate(ids, max_new_tokens=4, do_sample=False)  # warm-up
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False)
        entry["autoregressive_tokens_per_s"] = (out.shape[1] - ids.shape[1]) / (time.perf_counter() - start)
        random_ids = torch.randint(model.config.vocab_size, (1, max(args.context + args.max_k, *args.prefill)),
                                   generator=torch.Generator().manual_seed(0))
        entry["forward_ms"] = {k: 1000 * median_forward_seconds(model, random_ids, k, repeats=10, context=args.context)
                               for k in range(1, args.max_k + 1)}
        entry["prefill_ms"] = {n: 1000 * median_prefill_seconds(model, random_ids, n) for n in args.prefill}
        models[role] = entry
        print(role, json.dumps(entry))
        del model  # one model in memory at a time: the peak RSS of each is then its own
    result["models"] = models
    result["in_generate"] = _costs_in_generate(args.pair, dtype, args.prepack)
    target_ms, draft_ms = models["target"]["forward_ms"], models["draft"]["forward_ms"]
    result["cost_ratio_c"] = draft_ms[1] / target_ms[1]
    result["target_verify_ratio"] = {k: target_ms[k + 1] / target_ms[1] for k in range(1, args.max_k)}
    target_prefill, draft_prefill = models["target"]["prefill_ms"], models["draft"]["prefill_ms"]
    result["prefill_ratio"] = {n: draft_prefill[n] / target_prefill[n] for n in args.prefill}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    shown = [k for k in (2, 3, 5, 9, 11, 13, 17, 25, 33) if k <= args.max_k]
    lines = [
        f"Pair `{args.pair}`, {args.dtype}, {torch.get_num_threads()} threads, KV cache of {args.context} tokens"
        + (", prepacked oneDNN linear weights" if args.prepack else ", torch's stock linear kernels"),
        "",
        "| model | load s | peak RSS GiB | AR tokens/s | fwd1 ms | " + " | ".join(f"fwd{k} ms" for k in shown) + " |",
        "|---|---|---|---|---|" + "---|" * len(shown),
    ]
    for role, e in models.items():
        lines.append(f"| {role} {e['name']} | {e['load_s']:.1f} | {e['peak_rss_gib']:.1f} | "
                     f"{e['autoregressive_tokens_per_s']:.2f} | {e['forward_ms'][1]:.1f} | "
                     + " | ".join(f"{e['forward_ms'][k]:.1f}" for k in shown) + " |")
    lines += ["", f"cost ratio c = draft fwd1 / target fwd1 = {result['cost_ratio_c']:.3f}; target fwd(k+1)/fwd1: "
              + ", ".join(f"k={k}: {v:.2f}" for k, v in result["target_verify_ratio"].items())]
    lines += ["", "a first forward of n prompt tokens (fresh cache, last logits only), ms (ms a token): "
              + "; ".join(f"{role} " + ", ".join(f"n={n}: {ms:.0f} ({ms / n:.2f})" for n, ms in e["prefill_ms"].items())
                          for role, e in models.items())
              + "; draft / target: " + ", ".join(f"n={n}: {r:.2f}" for n, r in result["prefill_ratio"].items())
              + "; in target steps (fwd1) a prompt token: draft "
              + ", ".join(f"{draft_prefill[n] / n / target_ms[1]:.4f}" for n in args.prefill)]
    lines += ["", "inside generate() (what `pacer-hf train` uses; in rounds): "
              + "; ".join(f"{mode}: a drafted token c = {c['draft']:.3f}, a head call {c['head']:.4f}"
                          for mode, c in result["in_generate"].items())]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
