"""eval.research.draft_vocab: the draft scoring part of its vocabulary, as more harness methods."""

import json

import torch

from eval.research.draft_vocab import VocabularyDraft, VocabularyHead, main
from pacer_hf.draft_model import DraftModel
from pacer_hf.tiny_models import tiny_pair


def test_the_draft_scores_ids_below_the_limit_and_the_sequences_ids_and_no_other():
    target, draft = tiny_pair("llama")
    vocab = target.config.vocab_size
    ids = torch.tensor([[3, 70, 5, 90, 7]])  # 70 and 90 lie past the limit
    full, _ = DraftModel(draft, None, vocab).forward(ids, [60])
    restricted, _ = VocabularyDraft(draft, None, vocab, VocabularyHead(draft.get_output_embeddings(), 32)).forward(
        ids, [60])
    allowed = torch.zeros(vocab, dtype=torch.bool)
    allowed[:32] = True
    allowed[[60, 70, 90]] = True
    assert restricted.shape == full.shape
    torch.testing.assert_close(restricted[..., allowed], full[..., allowed])
    assert torch.isinf(restricted[..., ~allowed]).all()
    assert isinstance(draft.get_output_embeddings(), torch.nn.Linear)  # the draft's own head is back


def test_the_variants_run_beside_the_shipped_method_and_equal_plain_greedy(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def add(a, b):\nclass Stack:\n", encoding="utf-8")
    main(["--vocab", "24", "4096", "--pair", "tiny", "--max-new-tokens", "16", "--prompts", f"{prompts}:0:2",
          "--methods", "entropy+phrases", "planned+vocab24", "planned+vocab4k", "--out", str(tmp_path / "ab")])
    records = [json.loads(line) for line in (tmp_path / "ab.jsonl").read_text().splitlines()][1:]
    by_method = {}
    for record in records:
        by_method.setdefault(record["method"], {})[record["prompt_id"]] = record
    assert set(by_method) == {"autoregressive", "entropy+phrases", "planned+vocab24", "planned+vocab4k"}
    for method in ("entropy+phrases", "planned+vocab24", "planned+vocab4k"):  # float32: each equals plain greedy
        for prompt_id, record in by_method[method].items():
            assert record["tokens"] == by_method["autoregressive"][prompt_id]["tokens"]
    assert sum(record["draft_forwards"] for record in by_method["planned+vocab24"].values()) > 0  # it drafted
