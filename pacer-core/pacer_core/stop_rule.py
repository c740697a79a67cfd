"""The PACER stop rule, torch only: after a full block, the head's pass score for the round so far against the
threshold. One function for every draft loop that asks a head: pacer-hf's `PacerCandidateGenerator`, pacer-vllm's
`PacerDraftModelProposer`, and any other engine that can hand over the draft's post-norm hidden states and processed
logits.

Notation: B = rounds scored at once (requests), k = tokens drafted so far, H = draft hidden size, F = features.
"""

import torch
import torch.nn.functional as F

from .config import PacerHeadConfig, log_threshold
from .head import PacerHead


def log_pass_scores(head: PacerHead, hidden_states: torch.Tensor, features: torch.Tensor,
                    config: PacerHeadConfig | None = None) -> torch.Tensor:
    """Log pass score of each round after its latest full block.

    Args:
        head ([`PacerHead`]): the head.
        hidden_states (`torch.Tensor` of shape `(B, k, H)`): the draft's post-norm hidden state that produced each
            drafted token of the round (k a multiple of `config.block_size`).
        features (`torch.Tensor` of shape `(B, k, F)`): [`draft_distribution_features`] of each drafted token.
        config ([`PacerHeadConfig`], *optional*): the settings in force (per-call overrides); `head.config` by default.

    Returns:
        `torch.FloatTensor` of shape `(B,)`: log of the product of the predicted acceptance probabilities over the
        round so far (`score_mode="round"`) or over its last block (`"block"`).
    """
    config = config if config is not None else head.config
    inputs = {"device": head.device, "dtype": head.dtype}
    accept_logit = head(hidden_states.to(**inputs), features.to(**inputs)).float()  # [B, k]
    log_accept = F.logsigmoid(accept_logit)  # [B, k]: log P(accept token i | earlier tokens accepted)
    if config.score_mode == "block":
        log_accept = log_accept[:, -config.block_size:]
    return log_accept.sum(dim=-1)


def says_stop(head: PacerHead, hidden_states: torch.Tensor, features: torch.Tensor,
              config: PacerHeadConfig | None = None) -> torch.Tensor:
    """Whether each round stops drafting after its latest full block: its pass score fell below the threshold.

    Drafting may continue only while this is False; the block just scored is verified either way (stopping only ends
    drafting, so the draft length is a stopping time and speculative sampling stays exact).

    Returns:
        `torch.BoolTensor` of shape `(B,)`.
    """
    config = config if config is not None else head.config
    return log_pass_scores(head, hidden_states, features, config) < log_threshold(config.threshold)
