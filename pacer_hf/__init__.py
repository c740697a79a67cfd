"""pacer-hf: lossless PACER speculative decoding for Hugging Face `generate()`.

PACER ("Blockwise Pre-verification for Speculative Decoding with Adaptive Length", arXiv 2602.01274) drafts in
blocks and lets a small trained head stop each draft as soon as a block is predicted to fail:

```python
import pacer_hf
from pacer_hf import PacerHead, PacerStats

head = PacerHead.from_pretrained("<org>/<head repo or local dir>")  # or PacerHead.entropy_stop(draft)
stats = PacerStats()  # filled by this call only
out = target.generate(**inputs, assistant_model=draft, pacer_head=head, pacer_stats=stats, max_new_tokens=256)
print(stats.summary())
```

`import pacer_hf` teaches every transformers model the `pacer_head=` argument (set `PACER_HF_NO_PATCH=1` before the
import to opt out and use `enable_pacer(model)` instead). Greedy output equals the target's own greedy output token
for token; sampling keeps the target's distribution exactly.

The names below are the whole public surface; everything else is importable from its module
(`pacer_hf.collection`, `pacer_hf.training`, `pacer_hf.hub`, `pacer_hf.planner`, ...). `collect`, `train` and `push`
are imported on first use, so `import pacer_hf` loads no training, collection or Hub-upload code.
"""

import importlib
import os
from typing import Any

# the head, its config and the stop rule: torch only, shared with pacer-vllm (pacer-core/)
from pacer_core import PacerHead, PacerHeadConfig, __version__

from .candidate_generator import PacerCandidateGenerator
from .cpu_linear import prepack_linear_weights
from .generation import disable_pacer, enable_pacer, patch_transformers, unpatch_transformers
from .pair import DraftMismatchWarning
from .phrases import PhrasePool
from .stats import PacerStats

if os.environ.get("PACER_HF_NO_PATCH", "").lower() not in ("1", "true", "yes"):
    patch_transformers()

# public name -> module that defines it, imported on first use (PEP 562)
_LAZY = {"collect": ".collection", "train": ".training", "push": ".hub"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DraftMismatchWarning",
    "PacerCandidateGenerator",
    "PacerHead",
    "PacerHeadConfig",
    "PacerStats",
    "PhrasePool",
    "__version__",
    "collect",
    "disable_pacer",
    "enable_pacer",
    "patch_transformers",
    "prepack_linear_weights",
    "push",
    "train",
    "unpatch_transformers",
]
