"""Shared fixtures: tiny models from configs with fixed seeds (no Hub), heads with known behaviour."""

import os

# Set before torch is imported anywhere: OpenMP spin-waits make 2-core machines stall (see the README).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest
import torch

import pacer_hf  # noqa: F401  (teaches generate() the pacer_head= argument)
from pacer_hf import PacerHead, PacerHeadConfig

PROMPT = torch.tensor([[0, 11, 42, 7, 23, 5]])
HEAD_KINDS = ("always", "never", "random", "entropy")
# The tiny drafts' entropy is 3.7-4.2 nats (10th-90th percentile) on PROMPT: 4 nats stops some rounds, not all.
TINY_ENTROPY_THRESHOLD = 4.0


def make_head(draft, kind: str = "always", block_size: int = 2, max_draft: int = 8, seed: int = 0, **config) -> PacerHead:
    """A head for `draft`: "always" passes every block (threshold 0), "never" stops after the first block
    (threshold 1), "random" has random weights and threshold 0.5, so it stops at arbitrary blocks; "entropy" is the
    weightless entropy rule at 4 nats, about the median draft entropy of the tiny models (mixed stops too)."""
    threshold = {"always": 0.0, "never": 1.0, "random": 0.5, "entropy": 0.5}[kind]
    if kind == "entropy":
        config = {"architecture": "entropy", "entropy_threshold": TINY_ENTROPY_THRESHOLD, **config}
    torch.manual_seed(seed)
    head = PacerHead(
        PacerHeadConfig.for_draft(
            draft, draft_name_or_path=draft.config._name_or_path, block_size=block_size, max_draft=max_draft,
            threshold=threshold, **config,
        )
    )
    if kind == "random":
        torch.nn.init.normal_(head.classifier.weight, std=2.0)
        torch.nn.init.constant_(head.classifier.bias, 1.0)
    return head.eval()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
