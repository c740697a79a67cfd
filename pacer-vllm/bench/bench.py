"""vLLM on the Qwen2.5-Coder pair: plain, the draft at a fixed K, and the draft stopped by PACER heads, on the same
prompts, at 1 and 4 concurrent requests. A vLLM CPU engine for the 1.5B target holds ~7 GB, so two fit beside each
other here, not four: the plain engine stays loaded and each speculative engine in turn is interleaved with it,
batch by batch (the order alternates). Each method's speed-up is against the plain runs of its own pass. Greedy,
`--max-tokens` new tokens each.

    python pacer-vllm/bench/bench.py runs/vllm-prompts.json --out eval/results/vllm-qwen-bf16

Writes OUT.json (every batch) and OUT.md (the table). Run it alone: two cores, nothing beside it.
"""

import argparse
import gc
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")  # the V1 runner, whose drafter pacer-vllm replaces
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

SPEC_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens")


def _engine_settings(data: dict, args: argparse.Namespace) -> dict:
    """Each method's `LLM` keyword arguments."""
    draft = lambda k: {"method": "draft_model", "model": data["draft"], "num_speculative_tokens": k}  # noqa: E731
    methods = {"plain": {}, f"draft-k{args.fixed_k}": {"speculative_config": draft(args.fixed_k)}}
    for spec in args.heads:
        name, _, head = spec.partition("=")
        methods[f"pacer-{name}"] = {"speculative_config": draft(args.max_draft),
                                    "additional_config": {"pacer_head": head}}
    return methods


def _close(llm) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def _counters(llm) -> dict:
    return {m.name: m.value for m in llm.get_metrics() if m.name in SPEC_COUNTERS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prompts", type=Path, help="written by export_prompts.py")
    parser.add_argument("--out", type=Path, required=True, help="OUT.json and OUT.md")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--fixed-k", type=int, default=4)
    parser.add_argument("--max-draft", type=int, default=16, help="num_speculative_tokens of the PACER engines")
    parser.add_argument("--heads", nargs="+", default=["entropy=entropy"], help="NAME=HEAD (Hub id, folder, entropy)")
    args = parser.parse_args()
    from vllm import LLM, SamplingParams

    data = json.loads(args.prompts.read_text())
    common = dict(model=data["target"], skip_tokenizer_init=True, dtype="bfloat16", max_model_len=4096,
                  enforce_eager=True, disable_log_stats=False, seed=0, max_num_seqs=max(args.concurrency))
    methods = _engine_settings(data, args)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    plain = LLM(**common)
    records = []
    for method, settings in list(methods.items())[1:]:
        engines = {"plain": plain, method: LLM(**common, **settings)}
        for concurrency in args.concurrency:
            for turn, batch in enumerate(_batches(data["prompts"], concurrency)):
                names = list(engines) if turn % 2 == 0 else list(engines)[::-1]
                for name in names:
                    records.append(_run_batch(engines[name], name, method, concurrency, batch, params))
                print(method, concurrency, batch[0]["id"], [round(r["seconds"], 2) for r in records[-2:]], flush=True)
        _close(engines.pop(method))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {k: v for k, v in vars(args).items() if k not in ("out", "prompts")}
    args.out.with_suffix(".json").write_text(json.dumps({"settings": meta, "records": records}, indent=1))
    args.out.with_suffix(".md").write_text(_table(records, list(methods)[1:]))
    print(_table(records, list(methods)[1:]))


def _batches(prompts: list[dict], size: int) -> list[list[dict]]:
    """Consecutive batches of `size` prompts, never mixing prompt sets (the table reports each set apart)."""
    by_set: dict[str, list[dict]] = {}
    for prompt in prompts:
        by_set.setdefault(prompt["set"], []).append(prompt)
    return [group[i:i + size] for group in by_set.values() for i in range(0, len(group), size)]


def _run_batch(llm, name: str, pass_name: str, concurrency: int, batch: list[dict], params) -> dict:
    before = _counters(llm)
    began = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p["prompt_token_ids"]} for p in batch], params, use_tqdm=False)
    seconds = time.perf_counter() - began
    after = _counters(llm)
    return {"method": name, "pass": pass_name, "concurrency": concurrency, "sets": [p["set"] for p in batch],
            "ids": [p["id"] for p in batch], "seconds": seconds, "tokens": [list(o.outputs[0].token_ids) for o in outs],
            **{k.split(":")[1]: after.get(k, 0) - before.get(k, 0) for k in SPEC_COUNTERS}}


def _table(records: list[dict], methods: list[str]) -> str:
    lines = ["| concurrency | set | method | tokens/s | speed-up (total) | median batch speed-up | mean draft | "
             "draft tokens / accepted | outputs equal to plain |", "|---|---|---|---|---|---|---|---|---|"]
    by = {}  # (pass, concurrency, set, first id) -> {method: record}
    for r in records:
        by.setdefault((r["pass"], r["concurrency"], r["sets"][0], r["ids"][0]), {})[r["method"]] = r
    for concurrency in sorted({r["concurrency"] for r in records}):
        for set_name in sorted({r["sets"][0] for r in records}):
            for method in ["plain", *methods]:
                passes = methods if method == "plain" else [method]
                groups = [g for (p, c, s, _), g in by.items() if p in passes and c == concurrency and s == set_name]
                rows = [g[method] for g in groups]
                tokens = sum(len(t) for r in rows for t in r["tokens"])
                seconds = sum(r["seconds"] for r in rows)
                plain_seconds = sum(g["plain"]["seconds"] for g in groups)
                ratio = statistics.median(g["plain"]["seconds"] / g[method]["seconds"] for g in groups)
                drafts = sum(r["spec_decode_num_drafts"] for r in rows)
                drafted = sum(r["spec_decode_num_draft_tokens"] for r in rows)
                accepted = sum(r["spec_decode_num_accepted_tokens"] for r in rows)
                equal = sum(a == b for g in groups for a, b in zip(g[method]["tokens"], g["plain"]["tokens"]))
                outputs = sum(len(g["plain"]["tokens"]) for g in groups)
                lines.append(f"| {concurrency} | {set_name} | {method} | {tokens / seconds:.1f} | "
                             f"{plain_seconds / seconds:.2f}x | {ratio:.2f}x | "
                             f"{drafted / drafts if drafts else 0:.1f} | "
                             f"{drafted / accepted if accepted else float('nan'):.2f} | {equal}/{outputs} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
