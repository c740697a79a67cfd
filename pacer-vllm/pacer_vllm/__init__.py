"""pacer-vllm: PACER heads inside vLLM's draft-model speculative decoding.

Installing this package registers a vLLM plugin; a head named in `additional_config` then stops each request's draft
with the same rule as pacer-hf's `generate()`:

```python
from vllm import LLM

llm = LLM(target, speculative_config={"method": "draft_model", "model": draft, "num_speculative_tokens": 8},
          additional_config={"pacer_head": "<Hub id or folder of a head trained with pacer-hf>"})
```

`additional_config` keys: `pacer_head` (a Hub id, a folder, or `"entropy"` for the training-free rule),
`pacer_head_revision`, and the per-engine overrides `pacer_threshold`, `pacer_block_size`, `pacer_score_mode`.
`num_speculative_tokens` is the longest draft (the head's `max_draft`).
"""

from pacer_core import __version__

from .proposer import PacerDraftModelProposer, load_pacer_head, recent_draft_lengths

__all__ = ["PacerDraftModelProposer", "__version__", "load_pacer_head", "recent_draft_lengths"]
