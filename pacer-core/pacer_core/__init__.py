"""pacer-core: the PACER head, its config, its features and its stop rule, with nothing but torch, safetensors and
huggingface_hub (and Jinja2, through it, for the head's model card).

pacer-hf (transformers' `generate()`) and pacer-vllm (vLLM's draft-model proposer) both stop drafts with
[`StopRule`], so one head from the Hub behaves the same in a notebook and in a server. Users of pacer-hf import
these names from `pacer_hf`.
"""

from ._version import __version__
from .config import PacerHeadConfig
from .features import draft_distribution_features
from .head import EntropyRule, NeuralHead, PacerHead
from .pair import check_head_sizes, check_max_draft
from .stop_rule import StopRule

__all__ = [
    "EntropyRule",
    "NeuralHead",
    "PacerHead",
    "PacerHeadConfig",
    "StopRule",
    "__version__",
    "check_head_sizes",
    "check_max_draft",
    "draft_distribution_features",
]
