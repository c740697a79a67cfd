"""The GPU check: PACER's exactness on CUDA, and what its draft loop costs there against transformers' own, in minutes.

    python eval/gpu_check.py --out eval/results/gpu-check            # on a machine with a CUDA GPU
    python eval/gpu_check.py --tiny --device cpu --out /tmp/smoke     # the same steps on tiny models, anywhere

1. The tiny equality grid on CUDA: `tests/test_cuda.py` (greedy equality over architectures, drafts, heads and
   planned rounds; a padded pair; sampling).
2. Random-weight models built from the Qwen2.5-0.5B and Qwen2.5-7B configs (no weights can be fetched), bfloat16:
   the seconds per round of PACER's loop against transformers' own assisted loop at the same constant draft length
   (PACER with threshold 0 never asks its head: the comparison is the loops alone, as `eval.research.overhead` does
   on the CPU), for the padded pair as it is (151,936 against 152,064 rows) and for the draft padded to the target's
   rows (transformers would route the former to universal assisted generation).
3. Host-device synchronisations per drafted token (`torch.cuda.set_sync_debug_mode`), PACER's loop against
   transformers'.
4. The README's call (planned rounds, the entropy stop) against plain greedy `generate()`, seconds per new token, and
   the kinds of rounds the planner chose: where drafts accept nothing, what its planning costs on this machine.
5. What a forward costs by tokens fed after a 1,000-token context, target and draft: the verification cost per
   candidate and the draft's cost that the planner weighs (on the CPU a 1.5B target's is flat to about 9 tokens).
Random weights accept nothing, so acceptance on a GPU is not measurable here; the loops' costs are.

On the device machines of this workplace (torch 2.11, transformers 5.17 installed): carry pacer-hf's pins as wheels
(`transformers==5.23.0 huggingface-hub==2.4.0 tokenizers==0.23.3`, see the device tool's README) and run
`PYTHONPATH=.:pacer-core python eval/gpu_check.py --out $OUT/gpu-check`.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

import pacer_hf
from pacer_hf import PacerHead, PacerHeadConfig, PacerStats
from pacer_hf.models import synchronize

# From the two models' config.json on the Hub (Qwen/Qwen2.5-0.5B-Instruct, Qwen/Qwen2.5-7B-Instruct).
QWEN_CONFIGS = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
}
TINY_CONFIGS = {
    "qwen2.5-0.5b": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=1000, tie_word_embeddings=True),
    "qwen2.5-7b": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=1024, tie_word_embeddings=False),
}
COMMON = dict(max_position_embeddings=32768, rope_theta=1_000_000.0, rms_norm_eps=1e-6, bos_token_id=None,
              eos_token_id=None, pad_token_id=None)
PROMPT_TOKENS, NEW_TOKENS, DRAFT_LENGTH, REPEATS = 128, 64, 4, 3
CONTEXT, FED, FORWARD_REPEATS = 1000, (1, 2, 4, 8, 16, 32), 5


class _SameVocabulary:
    """What the pair check reads of two copies of one tokenizer of `size` tokens (no tokenizer can be fetched)."""

    def __init__(self, size: int):
        self.size = size

    def get_vocab(self) -> dict[str, int]:
        return {str(i): i for i in range(self.size)}

    def __len__(self) -> int:
        return self.size


def build(name: str, configs: dict, device: str, dtype: torch.dtype, vocab_size: int | None = None):
    config = Qwen2Config(**{**configs[name], **COMMON, **({"vocab_size": vocab_size} if vocab_size else {})})
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype).eval()
    model.config._name_or_path = f"random-{name}" + (f"-rows{vocab_size}" if vocab_size else "")
    model.generation_config.eos_token_id = model.generation_config.pad_token_id = None
    return model


def _timed(target, ids, **kwargs) -> tuple[float, PacerStats | None]:
    stats = PacerStats() if "pacer_head" in kwargs else None
    if stats is not None:
        kwargs["pacer_stats"] = stats
    synchronize(ids.device)
    start = time.perf_counter()
    target.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, **kwargs)
    synchronize(ids.device)
    return time.perf_counter() - start, stats


def per_round(target, draft, ids, pacer: bool, tokenizers: dict) -> dict:
    """Median seconds per round at `DRAFT_LENGTH` drafts a round (prefill removed with a 1-token call), and the
    host-device synchronisations per drafted token."""
    draft.generation_config.num_assistant_tokens = DRAFT_LENGTH
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    kwargs = {"assistant_model": draft}
    if pacer:
        head = PacerHead(PacerHeadConfig.for_draft(draft, threshold=0.0, block_size=DRAFT_LENGTH,
                                                   max_draft=DRAFT_LENGTH)).to(draft.device)
        kwargs.update(pacer_head=head, pacer_phrases=False, **tokenizers)  # the paper's loop: every round drafts
    _timed(target, ids, **kwargs)  # warm-up
    rounds = NEW_TOKENS  # random weights: nothing is accepted, every round adds one token
    times = sorted(_timed(target, ids, **kwargs)[0] for _ in range(REPEATS))
    syncs = None
    if ids.device.type == "cuda":
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                _timed(target, ids, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs = sum("synchronizing" in str(w.message) for w in caught) / (rounds * DRAFT_LENGTH)
    return {"seconds_per_round": times[len(times) // 2] / rounds, "syncs_per_drafted_token": syncs}


def per_token(target, draft, ids, pacer: bool) -> dict:
    """Median seconds per new token of plain greedy `generate()` or of the README's call (planned rounds, the
    entropy stop), with the kinds of rounds the planner chose in the median call."""
    kwargs = {"assistant_model": draft, "pacer_head": PacerHead.entropy_stop(draft)} if pacer else {}
    _timed(target, ids, **kwargs)  # warm-up
    runs = sorted((_timed(target, ids, **kwargs) for _ in range(REPEATS)), key=lambda run: run[0])
    seconds, stats = runs[len(runs) // 2]
    return {"seconds_per_token": seconds / NEW_TOKENS, "round_kinds": stats.round_kinds if stats else None}


@torch.no_grad()
def forward_costs(model) -> dict[int, float]:
    """Median seconds of one cached forward that feeds k tokens after `CONTEXT` tokens, for each k of `FED`."""
    ids = torch.randint(1000, (1, CONTEXT + max(FED)), generator=torch.Generator().manual_seed(1)).to(model.device)
    cache = DynamicCache()
    model(ids[:, :CONTEXT], past_key_values=cache, use_cache=True, logits_to_keep=1)
    costs = {}
    for k in FED:
        times = []
        for _ in range(2 + FORWARD_REPEATS):  # the first two are warm-ups
            synchronize(model.device)
            start = time.perf_counter()
            model(ids[:, CONTEXT:CONTEXT + k], past_key_values=cache, use_cache=True, logits_to_keep=k)
            synchronize(model.device)
            times.append(time.perf_counter() - start)
            cache.crop(-k)  # drop what this forward fed
        costs[k] = statistics.median(times[2:])
    assert cache.get_seq_length() == CONTEXT, "each forward's tokens are dropped again"
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="output prefix (.json, .md)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny configs instead of the Qwen ones (a smoke test)")
    parser.add_argument("--skip-tests", action="store_true", help="skip step 1 (tests/test_cuda.py)")
    args = parser.parse_args()
    root = Path(__file__).resolve().parent.parent
    result = {"device": args.device, "torch": torch.__version__, "pacer_hf": pacer_hf.__version__,
              "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    if not args.skip_tests:
        tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_cuda.py"],
                               cwd=root, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        output = (tests.stdout + tests.stderr).strip().splitlines()
        result["cuda_tests"] = {"returncode": tests.returncode, "summary": output[-1:],
                                "failures": output[-60:] if tests.returncode else []}
    configs = TINY_CONFIGS if args.tiny else QWEN_CONFIGS
    dtype = torch.float32 if args.tiny else torch.bfloat16
    target = build("qwen2.5-7b", configs, args.device, dtype)
    rows = configs["qwen2.5-7b"]["vocab_size"]
    ids = torch.randint(1000, (1, PROMPT_TOKENS), generator=torch.Generator().manual_seed(0)).to(args.device)
    padded = build("qwen2.5-0.5b", configs, args.device, dtype)
    same_rows = build("qwen2.5-0.5b", configs, args.device, dtype, vocab_size=rows)
    tokenizers = {"tokenizer": _SameVocabulary(1000), "assistant_tokenizer": _SameVocabulary(1000)}
    result["calls"] = {  # before `per_round`, which sets the draft's assisted-generation schedule
        "plain greedy": per_token(target, same_rows, ids, pacer=False),
        "pacer-hf, the README's call": per_token(target, same_rows, ids, pacer=True),
    }
    result["rounds"] = {
        "transformers, same rows": per_round(target, same_rows, ids, pacer=False, tokenizers={}),
        "pacer-hf, same rows": per_round(target, same_rows, ids, pacer=True, tokenizers={}),
        "pacer-hf, padded pair": per_round(target, padded, ids, pacer=True, tokenizers=tokenizers),
    }
    result["forward_ms_by_tokens_fed"] = {name: {k: 1000 * t for k, t in forward_costs(model).items()}
                                          for name, model in (("target", target), ("draft", same_rows))}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"GPU check on {result['gpu'] or args.device} (`python eval/gpu_check.py`), "
             f"{'tiny' if args.tiny else 'Qwen2.5-0.5B / 7B'} configs, random weights, {DRAFT_LENGTH} drafts a round",
             "", f"CUDA tests: {result.get('cuda_tests', {}).get('summary')}", "",
             "| loop | ms per round | host-device syncs per drafted token |", "|---|---|---|"]
    for name, row in result["rounds"].items():
        syncs = "-" if row["syncs_per_drafted_token"] is None else f"{row['syncs_per_drafted_token']:.2f}"
        lines.append(f"| {name} | {1000 * row['seconds_per_round']:.1f} | {syncs} |")
    lines += ["", "| call (same-rows pair) | ms per new token | rounds by kind |", "|---|---|---|"]
    for name, row in result["calls"].items():
        lines.append(f"| {name} | {1000 * row['seconds_per_token']:.1f} | {row['round_kinds'] or '-'} |")
    lines += ["", f"| ms per forward after {CONTEXT} tokens, by tokens fed | " + " | ".join(map(str, FED)) + " |",
              "|---|" + "---|" * len(FED)]
    for name, costs in result["forward_ms_by_tokens_fed"].items():
        lines.append(f"| {name} | " + " | ".join(f"{costs[k]:.1f}" for k in FED) + " |")
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
