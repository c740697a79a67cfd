"""The planned rounds with the draft's logits computed over part of its vocabulary, as more harness methods.

A draft with a large vocabulary spends much of a forward in its output layer: Qwen2.5-Coder-0.5B's 151,936 x 896
`lm_head` is about a quarter of its weights, and on the Intel Xeon with AMX (bf16 prepacked, 1 token on an 800-token
cache) a forward took 51 ms with it, 46 ms with its first 65,536 rows and 43 ms with its first 32,768. Method
`planned+vocab{K // 1024}k` is `entropy+phrases` whose draft scores only ids below K (for a byte-level BPE vocabulary
the earliest merges, the commonest tokens) and every id already in the call's sequence (the prompt and the text so
far: names, numbers and words of other scripts that the text reuses); every other id gets -inf, so the draft never
proposes it. The output stays the target's (greedy verification, and in sampling the candidate rows are the restricted
distribution the draft drew from); what changes is how fast the draft runs and how often it agrees with the target.

    python -m eval.research.draft_vocab --vocab 32768 65536 --pair qwen2.5-coder --dtype bfloat16 --prepack \
        --prompts sharegpt:1000:4 --methods entropy+phrases planned+vocab32k planned+vocab64k \
        --out eval/results/draft-vocab-ab

Every other argument is the harness's (`pacer-hf bench --help`). Each variant keeps its own cost estimate (its draft
forwards cost less than the shipped method's), as `eval.research.planner_ab`'s earlier planners do.
"""

import argparse
import sys

import torch
from torch import nn

from eval.research.planner_ab import bench_with
from pacer_hf.bench import methods
from pacer_hf.cpu_linear import PrepackedLinear
from pacer_hf.draft_model import DraftModel
from pacer_hf.phrase_drafting import PhraseCandidateGenerator
from pacer_hf.planner import CallCosts


class VocabularyHead(nn.Module):
    """The rows of an output layer for ids below `limit` (in the layer's own kernel: prepacked if it was) and for
    the ids `extra` (set per forward), the logits of all of them side by side: `[..., limit + len(extra)]`."""

    def __init__(self, head: nn.Module, limit: int):
        super().__init__()
        weight = head.weight
        self.dense = (weight.to_dense() if weight.layout == torch._mkldnn else weight).detach()  # [V, H]
        first = nn.Linear(self.dense.shape[1], limit, bias=False, dtype=self.dense.dtype, device=self.dense.device)
        first.weight.data = self.dense[:limit].clone()
        self.first = PrepackedLinear(first) if isinstance(head, PrepackedLinear) else first
        self.limit = limit
        self.extra = torch.zeros(0, dtype=torch.long)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.first(hidden)  # [..., limit]
        if not self.extra.numel():
            return logits
        return torch.cat([logits, nn.functional.linear(hidden, self.dense[self.extra])], dim=-1)


class VocabularyDraft(DraftModel):
    """A [`DraftModel`] whose logits cover ids below `limit` and the ids of the sequence it was fed; -inf elsewhere.
    The model's `lm_head` is swapped for a [`VocabularyHead`] during each forward (so the harness still counts the
    forward), then put back."""

    def __init__(self, model, prompt_mask, vocab_size: int, head: VocabularyHead):
        super().__init__(model, prompt_mask, vocab_size)
        self.head = head

    @torch.no_grad()
    def forward(self, ids: torch.LongTensor, guess: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        fed = torch.cat([ids, ids.new_tensor([guess])], dim=-1) if guess else ids  # [1, L + m]
        rows = self.head.dense.shape[0]
        extra = torch.unique(fed[0])
        self.head.extra = extra[(extra >= self.head.limit) & (extra < rows)]
        original = self.model.get_output_embeddings()
        self.model.set_output_embeddings(self.head)
        try:
            logits, hidden = super().forward(ids, guess)  # logits: [1, m + 1, limit + extra] at the target's width
        finally:
            self.model.set_output_embeddings(original)
        return self._spread(logits[..., : self.head.limit + self.head.extra.numel()]), hidden

    def _spread(self, logits: torch.Tensor) -> torch.Tensor:
        """`[1, m + 1, limit + extra]` -> `[1, m + 1, V]`: each column at its id, -inf at every other."""
        limit = self.head.limit
        full = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
        full[..., :limit] = logits[..., :limit]
        extra = self.head.extra[self.head.extra < self.vocab_size]
        full[..., extra] = logits[..., limit : limit + extra.numel()]
        return full


def vocab_method(limit: int):
    """The harness method `planned+vocab{limit // 1024}k`."""
    costs = CallCosts()
    heads: dict[int, VocabularyHead] = {}  # one per draft model, built at its first call

    class Generator(PhraseCandidateGenerator):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "costs": costs})
            model = self.draft.model
            if limit >= model.get_output_embeddings().weight.shape[0]:
                return  # the whole vocabulary: the shipped draft
            if id(model) not in heads:
                heads[id(model)] = VocabularyHead(model.get_output_embeddings(), limit)
            self.draft = VocabularyDraft(model, self.draft._prompt_mask, self.draft.vocab_size, heads[id(model)])

    name = f"planned+vocab{limit // 1024}k" if limit >= 1024 else f"planned+vocab{limit}"
    return name, methods.planned(name, Generator)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", required=True, nargs="+", type=int,
                        help="the vocabulary limits K to run, one method `planned+vocab{K // 1024}k` each")
    args, bench_argv = parser.parse_known_args(argv)
    variants = dict(vocab_method(limit) for limit in args.vocab)
    bench_with(variants, bench_argv, prog="python -m eval.research.draft_vocab")


if __name__ == "__main__":
    main(sys.argv[1:])
