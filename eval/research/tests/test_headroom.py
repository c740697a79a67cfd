"""The headroom probe's parts: the history and margin inputs, and a stack that must find an informative input."""

import numpy as np
import torch

from eval.research.headroom import HISTORY_PRIOR, HISTORY_WINDOW, L2_GRID, ScoredSequence, acceptance_history, best_threshold
from eval.research.headroom import fit_stack, round_start_state, runner_up_margin, score
from pacer_hf import PacerHeadConfig
from pacer_hf.threshold import CostModel


def test_acceptance_history_reads_only_earlier_positions_of_its_window():
    labels = np.concatenate([np.zeros(40), np.ones(60)])
    history = acceptance_history(labels)
    rate, count = HISTORY_PRIOR
    assert history[0] == rate  # nothing seen yet: the prior
    assert history[40] == rate * count / (HISTORY_WINDOW + count)  # the last 32 positions were all rejected
    assert history[41] > history[40]  # position 40's acceptance is known from position 41 on
    assert history[99] == (HISTORY_WINDOW + rate * count) / (HISTORY_WINDOW + count)


def test_runner_up_margin_is_the_log_softmax_gap():
    generator = torch.Generator().manual_seed(0)
    hidden, lm_head = torch.randn(300, 8, generator=generator), torch.randn(50, 8, generator=generator)
    top2 = (hidden.bfloat16().float() @ lm_head.T).log_softmax(-1).topk(2, dim=-1).values  # [300, 2]
    np.testing.assert_allclose(runner_up_margin(hidden.bfloat16(), lm_head), (top2[:, 0] - top2[:, 1]).numpy(),
                               rtol=1e-5, atol=1e-5)


def test_a_round_reads_the_target_state_of_the_previous_position_only():
    values = np.arange(12.0).reshape(6, 2)
    state = round_start_state(values)
    np.testing.assert_array_equal(state[0], [0.0, 0.0])  # the first round follows no verification
    np.testing.assert_array_equal(state[1:], values[:-1])  # never the state that produced the round's own token


def _sequences(seed: int, count: int = 12, n: int = 64, width: int = 8, hidden_effect: bool = False,
               hidden_size: int = 16) -> list[ScoredSequence]:
    """Acceptance follows the `margin` input (noisily), and with `hidden_effect` a direction of the round-start
    hidden state too; the head's logit is noise."""
    rng = np.random.default_rng(seed)
    direction = np.random.default_rng(99).normal(size=hidden_size)
    out = []
    for _ in range(count):
        margin = rng.normal(size=n)
        hidden = rng.normal(size=(n, hidden_size))
        position = np.minimum(np.arange(n)[:, None] + np.arange(width)[None, :], n - 1)
        accepted = rng.random(n) < 1 / (1 + np.exp(-3 * (margin + 1)))
        # the hidden state at a round's start says whether the round's first token is accepted
        if hidden_effect:
            accepted[1:] = np.where(hidden[:-1] @ direction > 1.5, False, accepted[1:])
        out.append(ScoredSequence(accepted.astype(float), rng.normal(size=(n, width)),
                                  {"margin": margin[position], "history": np.zeros((n, width))},
                                  round_start_state(hidden)))
    return out


CONFIG = PacerHeadConfig(vocab_size=50, draft_hidden_size=8, block_size=1, max_draft=8, threshold=0.5)
COST = CostModel(draft=0.3)


def _scored(stack, fit, held):
    return score(held, stack, CONFIG, COST, best_threshold(fit, stack, CONFIG, COST))


def test_the_stack_finds_an_informative_input_and_it_pays_in_expected_speed():
    fit, held = _sequences(0), _sequences(1)
    with_margin = fit_stack(fit, ("margin",), CONFIG.max_draft)
    alone = fit_stack(fit, (), CONFIG.max_draft)
    assert with_margin.weights[1] > 1.0 and abs(with_margin.weights[0]) < 0.5  # reads the input, ignores the noise
    margin_scores, alone_scores = _scored(with_margin, fit, held), _scored(alone, fit, held)
    assert margin_scores["auc"] > 0.8 and alone_scores["auc"] < 0.6
    assert margin_scores["speedup"] > 1.05 * alone_scores["speedup"]
    assert margin_scores["speedup"] <= margin_scores["oracle"]


def test_the_hidden_projection_finds_the_informative_direction():
    fit, held = _sequences(0, count=24, hidden_effect=True), _sequences(1, hidden_effect=True)
    margin_only = fit_stack(fit, ("margin",), CONFIG.max_draft)
    with_hidden = fit_stack(fit, ("margin",), CONFIG.max_draft, hidden=True)
    assert with_hidden.l2 in L2_GRID
    direction = np.random.default_rng(99).normal(size=16)
    offset = with_hidden.projection[:, 0] / with_hidden.std
    assert np.dot(offset, direction) / np.linalg.norm(offset) / np.linalg.norm(direction) < -0.7  # predicts rejection
    assert _scored(with_hidden, fit, held)["auc"] > _scored(margin_only, fit, held)["auc"] + 0.01


def test_a_stack_without_the_head_ignores_its_logit():
    fit, held = _sequences(0), _sequences(1)
    stack = fit_stack(fit, ("margin",), CONFIG.max_draft, head=False)
    assert stack.weights[0] == 0.0 and stack.weights[1] > 1.0
    seq = held[0]
    shuffled = ScoredSequence(seq.labels, -seq.logits, seq.inputs)
    np.testing.assert_array_equal(stack.logprobs(seq, CONFIG.max_draft), stack.logprobs(shuffled, CONFIG.max_draft))
