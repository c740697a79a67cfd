"""Cheap per-position features of a model's output distribution: what a PACER head reads besides hidden states.

Notation used in shapes: V = vocabulary.
"""

import torch

# Features of the processed draft distribution at a drafted position: log q(drafted token), log q(top-1) and the
# entropy of q. Their order is part of the saved-head format.
NUM_DISTRIBUTION_FEATURES = 3
ENTROPY_FEATURE = 2  # index of the entropy of q among them
# log q of a drafted token is floored here: under top-k/top-p processing q can be exactly 0 elsewhere, and the
# head must never see -inf.
LOGPROB_FLOOR = -30.0


def _entropy(logprobs: torch.Tensor) -> torch.Tensor:
    probs = logprobs.exp()
    return -torch.where(probs > 0, probs * logprobs, torch.zeros_like(probs)).sum(dim=-1)  # 0·log 0 = 0


def draft_distribution_features(scores: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Cheap features of the processed draft distribution at each drafted position.

    Args:
        scores (`torch.FloatTensor` of shape `(..., vocab_size)`):
            Processed draft logits (after the target's logits processors), the distribution a token was drawn from.
        tokens (`torch.LongTensor` of shape `(...)`):
            The drafted tokens.

    Returns:
        `torch.FloatTensor` of shape `(..., 3)`: log q(token), log q(top-1) and the entropy of q, in nats.
    """
    logq = scores.float().log_softmax(dim=-1)  # [..., V]
    token_logq = logq.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).clamp(min=LOGPROB_FLOOR)  # [...]
    top1_logq = logq.max(dim=-1).values  # [...]
    return torch.stack([token_logq, top1_logq, _entropy(logq)], dim=-1)


def target_distribution_features(scores: torch.Tensor) -> torch.Tensor:
    """Features of the target distribution a token was chosen from (at a round start: the bonus token's).

    Args:
        scores (`torch.FloatTensor` of shape `(..., vocab_size)`): target logits.

    Returns:
        `torch.FloatTensor` of shape `(..., 3)`: the entropy of p, log p(top-1) and log p(top-1) - log p(top-2),
        in nats. The margin is floored like a log-probability so that a one-hot p gives a finite value.
    """
    logp = scores.float().log_softmax(dim=-1)  # [..., V]
    top2 = logp.topk(2, dim=-1).values.clamp(min=LOGPROB_FLOOR)  # [..., 2]
    return torch.stack([_entropy(logp), top2[..., 0], top2[..., 0] - top2[..., 1]], dim=-1)
