"""The PACER stop rule, torch only: after a full block, the head's pass score for the round so far against the
threshold. One class for every draft loop that asks a head: pacer-hf's `PacerCandidateGenerator`, pacer-vllm's
`PacerDraftModelProposer`, and any other engine that can hand over the draft's post-norm hidden states and processed
logits. The whole threshold decision lives here: whether the head is asked at all, and what its score means.

Notation: B = rounds scored at once (requests), k = tokens drafted so far, H = draft hidden size, F = features.
"""

import math

import torch
import torch.nn.functional as F

from .config import PacerHeadConfig
from .head import PacerHead


def log_threshold(threshold: float) -> float:
    """The threshold in log space: a round stops when its log pass score is below this (-inf for 0: never)."""
    return math.log(threshold) if threshold > 0 else -math.inf


class StopRule:
    """A head with the settings of one call (or one engine): when to ask it, and whether a round stops.

    Args:
        head ([`PacerHead`]): a trained head or a rule.
        config ([`PacerHeadConfig`]): the settings in force (the head's config with any per-call overrides). Passed
            explicitly: a loop never falls back to `head.config` behind the caller's back.
    """

    def __init__(self, head: PacerHead, config: PacerHeadConfig):
        self.head, self.config = head, config
        self._log_threshold = log_threshold(config.threshold)

    def asks_head(self, drafted: int) -> bool:
        """Whether the head is asked after `drafted` tokens: at each full block, unless the threshold is 0 (a head
        that can never stop a round is not asked, which saves its features too)."""
        return drafted % self.config.block_size == 0 and self._log_threshold > -math.inf

    def log_pass_scores(self, hidden_states: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """Log pass score of each round after its latest full block.

        Args:
            hidden_states (`torch.Tensor` of shape `(B, k, H)`): the draft's post-norm hidden state that produced
                each drafted token of the round (k a multiple of `config.block_size`).
            features (`torch.Tensor` of shape `(B, k, F)`): [`draft_distribution_features`] of each drafted token.

        Returns:
            `torch.FloatTensor` of shape `(B,)`: log of the product of the predicted acceptance probabilities over
            the round so far (`score_mode="round"`) or over its last block (`"block"`).
        """
        inputs = {"device": self.head.device, "dtype": self.head.dtype}
        accept_logit = self.head(hidden_states.to(**inputs), features.to(**inputs)).float()  # [B, k]
        log_accept = F.logsigmoid(accept_logit)  # [B, k]: log P(accept token i | earlier tokens accepted)
        if self.config.score_mode == "block":
            log_accept = log_accept[:, -self.config.block_size:]
        return log_accept.sum(dim=-1)

    def says_stop(self, hidden_states: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """Whether each round stops drafting after its latest full block: its pass score fell below the threshold.

        Drafting may continue only while this is False; the block just scored is verified either way (stopping only
        ends drafting, so the draft length is a stopping time and speculative sampling stays exact).

        Returns:
            `torch.BoolTensor` of shape `(B,)`.
        """
        return self.log_pass_scores(hidden_states, features) < self._log_threshold
