"""The headroom probe's parts: the history and margin inputs, and a stack that must find an informative input."""

import numpy as np
import torch

from eval.headroom import HISTORY_PRIOR, HISTORY_WINDOW, ScoredSequence, acceptance_history, fit_stack, score
from eval.headroom import runner_up_margin
from pacer_hf import CostModel, PacerHeadConfig


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


def _sequences(seed: int, count: int = 12, n: int = 64, width: int = 8) -> list[ScoredSequence]:
    """Acceptance follows the `margin` input (noisily); the head's logit is noise."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        margin = rng.normal(size=n)
        position = np.minimum(np.arange(n)[:, None] + np.arange(width)[None, :], n - 1)
        accepted = rng.random(n) < 1 / (1 + np.exp(-3 * (margin + 1)))
        out.append(ScoredSequence(accepted.astype(float), rng.normal(size=(n, width)),
                                  {"margin": margin[position], "history": np.zeros((n, width))}))
    return out


def test_the_stack_finds_an_informative_input_and_it_pays_in_expected_speed():
    config = PacerHeadConfig(vocab_size=50, draft_hidden_size=8, block_size=1, max_draft=8, threshold=0.5)
    cost = CostModel(draft=0.3)
    fit, held = _sequences(0), _sequences(1)
    with_margin = fit_stack(fit, ("margin",), config.max_draft)
    alone = fit_stack(fit, (), config.max_draft)
    assert with_margin[1] > 1.0 and abs(with_margin[0]) < 0.5  # reads the input, ignores the noise
    auc_margin, report_margin = score(held, with_margin, ("margin",), config, cost)
    auc_alone, report_alone = score(held, alone, (), config, cost)
    assert auc_margin > 0.85 and auc_alone < 0.6
    assert report_margin.best_speedup > 1.05 * report_alone.best_speedup
