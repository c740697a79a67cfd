"""pacer-hf: lossless PACER speculative decoding for Hugging Face `generate()`.

PACER ("Blockwise Pre-verification for Speculative Decoding with Adaptive Length", arXiv 2602.01274) drafts in
blocks and lets a small trained head stop each draft as soon as a block is predicted to fail:

```python
import pacer_hf
from pacer_hf import PacerHead, PacerStats

head = PacerHead.from_pretrained("<org>/<head repo or local dir>")
stats = PacerStats()  # filled by this call only: safe when threads share the head
out = target.generate(**inputs, assistant_model=draft, pacer_head=head, pacer_stats=stats, max_new_tokens=256)
print(stats.summary())
```

`import pacer_hf` teaches every transformers model the `pacer_head=` argument (set `PACER_HF_NO_PATCH=1` before the
import to opt out and use `enable_pacer(model)` instead). Greedy output equals the target's own greedy output token
for token; sampling keeps the target's distribution exactly.
"""

import os

# the head, its config and features: torch only, shared with pacer-vllm (pacer-core/)
from pacer_core import PacerHead, PacerHeadConfig, __version__, draft_distribution_features
from pacer_core.pair import check_pair_compatible

from .candidate_generator import PacerCandidateGenerator
from .collection import CollectionConfig, collect, load_collection
from .cpu_linear import PrepackedLinear, prepack_linear_weights
from .generation import (
    disable_pacer,
    enable_pacer,
    is_transformers_patched,
    patch_transformers,
    unpatch_transformers,
)
from .cost_measurement import measure_cost_model
from .hub import push
from .phrases import PhrasePool
from .prompts import Prompt, encode_prompt, load_prompt_set
from .stats import PacerStats
from .threshold import CostModel, ThresholdReport, choose_threshold
from .training import TrainingConfig, TrainResult, train

if os.environ.get("PACER_HF_NO_PATCH", "").lower() not in ("1", "true", "yes"):
    patch_transformers()

__all__ = [
    "CollectionConfig",
    "CostModel",
    "PacerCandidateGenerator",
    "PacerHead",
    "PacerHeadConfig",
    "PacerStats",
    "PhrasePool",
    "PrepackedLinear",
    "Prompt",
    "ThresholdReport",
    "TrainResult",
    "TrainingConfig",
    "__version__",
    "check_pair_compatible",
    "choose_threshold",
    "collect",
    "disable_pacer",
    "draft_distribution_features",
    "enable_pacer",
    "encode_prompt",
    "is_transformers_patched",
    "load_collection",
    "load_prompt_set",
    "measure_cost_model",
    "patch_transformers",
    "prepack_linear_weights",
    "push",
    "train",
    "unpatch_transformers",
]
