"""`pacer-hf demo`: generate with and without a PACER head, show the statistics, check losslessness."""

import time

import torch

from .config import PacerHeadConfig
from .head import PacerHead
from .tiny_models import tiny_pair


def _demo_head(draft, seed: int) -> PacerHead:
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


def run_demo(arch: str = "qwen2", max_new_tokens: int = 48, seed: int = 0) -> bool:
    """Runs the tiny-model demo and prints what happened. Returns whether PACER's output equals plain greedy."""
    target, draft = tiny_pair(arch, "noisy", seed=seed)
    head = _demo_head(draft, seed)
    prompt = torch.tensor([[0, 11, 42, 7, 23, 5]])
    print(f"target {target.config._name_or_path} ({target.num_parameters():,} params), draft "
          f"{draft.config._name_or_path}, head {head.num_parameters:,} params "
          f"(random weights: a demonstration of the mechanics, not of speed)")

    start = time.perf_counter()
    plain = target.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False)
    plain_s = time.perf_counter() - start
    start = time.perf_counter()
    pacer = target.generate(prompt, assistant_model=draft, pacer_head=head, max_new_tokens=max_new_tokens,
                            do_sample=False)
    pacer_s = time.perf_counter() - start

    equal = torch.equal(plain, pacer)
    print(f"plain greedy tokens: {plain[0, prompt.shape[1]:].tolist()}")
    print(f"PACER tokens:        {pacer[0, prompt.shape[1]:].tolist()}")
    print(f"PACER statistics: {head.last_stats.summary()}")
    print(f"time: plain {plain_s:.3f}s, PACER {pacer_s:.3f}s (tiny models: Python overhead dominates)")
    print(f"greedy output equals plain greedy output: {equal}")
    return equal
