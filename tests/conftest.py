"""Shared fixtures: tiny models from configs with fixed seeds (no Hub), heads with known behaviour."""

import functools
import itertools
import os
import random

# Set before torch is imported anywhere: OpenMP spin-waits make 2-core machines stall (see the README).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest
import torch

import pacer_hf  # noqa: F401  (teaches generate() the pacer_head= argument)
from pacer_hf import PacerHead, PacerHeadConfig
from pacer_hf.phrase_drafting import PhraseCandidateGenerator
from pacer_hf.planner import Plan, RoundPlanner

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
    ScriptedPlanner.calls = itertools.count()  # a test's planned rounds do not depend on the tests before it


class ScriptedPlanner(RoundPlanner):
    """A planner whose choices are seeded coin flips among what a round allows: copy one of the look-up's options
    (a random length), draft (feeding phrases of random lengths for confirmation, then a random tail), or a plain
    step. It covers every planner choice, and rounds that switch source mid-call, whatever the costs; exactness must
    hold for all of them."""

    calls = itertools.count()  # each call's planner draws its own choices, reproducibly over a test

    def __init__(self, costs, max_new_tokens, seed: int = 0, kinds: tuple[str, ...] = ("copy", "draft", "step")):
        super().__init__(costs, max_new_tokens)
        call = seed * 100_003 + next(self.calls)
        self.rng, self.kinds = random.Random(call), kinds
        self.confirm_rng = random.Random(f"confirm-{call}")  # its own draws: the rounds' choices stay as they were

    def plan(self, options, room, draft_room, draft_missing, draft_started):
        kinds = [k for k in self.kinds if (k != "copy" or options) and (k != "draft" or draft_room > 0)] or ["step"]
        kind = self.rng.choice(kinds)
        if kind == "copy":
            option = self.rng.choice(options)
            return Plan("copy", 1.0, option, self.rng.randint(1, min(len(option.tokens), room)))
        return Plan(kind, 1.0)

    def confirm_length(self, phrase_length):
        rng = self.confirm_rng
        return phrase_length if rng.random() < 0.5 else rng.randint(0, phrase_length)

    def tail_length(self, option, room, end, drafted):
        if option is None or room <= 0 or self.rng.random() < 0.5:
            return 0, 0.0
        return self.rng.randint(1, min(len(option.tokens), room)), 0.0


def scripted_rounds(seed: int = 0, kinds: tuple[str, ...] = ("copy", "draft", "step"), base=None):
    """A `PhraseCandidateGenerator` subclass (or of `base`) whose rounds a [`ScriptedPlanner`] chooses."""
    base = base if base is not None else PhraseCandidateGenerator
    return type(f"Scripted{base.__name__}", (base,),
                {"planner_class": functools.partial(ScriptedPlanner, seed=seed, kinds=kinds)})
