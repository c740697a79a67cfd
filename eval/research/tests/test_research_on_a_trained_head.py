"""The research scripts that read a collection and trained heads (eval.research.ablations, eval.research.headroom),
on a tiny collection and a head trained on it."""

import json

import pytest
import torch

import pacer_hf  # noqa: F401  (teaches generate() the `pacer_head` argument)
from pacer_hf import PacerHead, PacerHeadConfig
from pacer_hf.collection import CollectionConfig, collect
from pacer_hf.threshold import CostModel
from pacer_hf.tiny_models import tiny_pair, tiny_tokenizer
from pacer_hf.training import TrainingConfig, train

from eval.research import ablations, headroom


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("research")
    target, draft = tiny_pair("llama", "noisy", seed=0)
    draft.save_pretrained(root / "draft")
    tiny_tokenizer().save_pretrained(root / "draft")
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 96, (6,), generator=generator).tolist() for _ in range(10)]
    collect(target, draft, prompts, root / "data", config=CollectionConfig(max_new_tokens=24, batch_size=2))
    config = PacerHeadConfig(vocab_size=96, draft_hidden_size=32, block_size=2, max_draft=8, head_hidden_size=32)
    train(root / "data", root / "trained", cost=CostModel(draft=0.3), head_config=config,
          config=TrainingConfig(epochs=2, val_fraction=0.25))
    # the trained head: the folder itself, or its runner-up if the entropy rule won the comparison
    neural = next(f for f in (root / "trained", root / "trained" / "runner-up")
                  if PacerHead.from_pretrained(f).config.architecture == "attention")
    (root / "head").symlink_to(neural.resolve())
    return root


def test_ablations_score_the_head_as_training_did(trained):
    root = trained
    ablations.main(["--data", str(root / "data"), "--runs", str(root / "head"), "--cost-ratio", "0.3",
                    "--out", str(root / "ablations")])
    rows = json.loads((root / "ablations.json").read_text())["rows"]
    row = rows[0]
    assert [r["architecture"] for r in rows[1:]] == ["entropy"] * 4  # the entropy stop's reference rows
    head = PacerHead.from_pretrained(root / "head")
    trained_report = json.loads((root / "head" / "training_metrics.json").read_text())["threshold"]
    assert row["greedy"]["threshold"] == trained_report["best_threshold"] == head.config.threshold
    assert row["greedy"]["speedup"] == pytest.approx(trained_report["best_speedup"])
    assert 0.0 < row["sampling"]["speedup"] <= row["sampling"]["oracle"] + 1e-9
    assert "| head (attention, block 2) |" in (root / "ablations.md").read_text()
    # Sampled draft tokens cost more: the sampling columns use their own cost, the greedy ones are unchanged.
    ablations.main(["--data", str(root / "data"), "--runs", str(root / "head"), "--cost-ratio", "0.3",
                    "--sampling-cost-ratio", "0.6", "--out", str(root / "ablations-costly")])
    costly = json.loads((root / "ablations-costly.json").read_text())
    assert costly["costs"]["sampling"]["draft"] == 0.6 and costly["costs"]["greedy"]["draft"] == 0.3
    assert costly["rows"][0]["greedy"] == row["greedy"]
    assert costly["rows"][0]["sampling"]["oracle"] < row["sampling"]["oracle"]


def test_headroom_probe_scores_the_head_next_to_its_stacks(trained, capsys):
    root = trained
    headroom.main(["--data", str(root / "data"), "--head", str(root / "head"), "--draft", str(root / "draft"),
                   "--fit-prompts", "0:6", "--eval-prompts", "6:8", "rest=8:10", "--cost-ratio", "0.3",
                   "--out", str(root / "headroom")])
    probe = json.loads((root / "headroom.json").read_text())
    # a format-2 collection: the target's round-start candidates are scored too
    assert [r["candidate"] for r in probe["rows"]] == ["head as trained", *headroom.CANDIDATES]
    assert probe["rows"][0]["threshold"] == PacerHead.from_pretrained(root / "head").config.threshold
    assert probe["sequences"] == {"fit": 6, "6:8": 2, "rest": 2} and probe["eval_sets"] == ["6:8", "rest"]
    assert all(0.0 < r[name]["speedup"] <= r[name]["oracle"] + 1e-9 for r in probe["rows"] for name in ("6:8", "rest"))
    assert "| + target features + hidden |" in (root / "headroom.md").read_text()
    with pytest.raises(SystemExit):
        headroom.main(["--data", str(root / "data"), "--head", str(root / "head"), "--draft", str(root / "draft"),
                       "--fit-prompts", "0:6", "--eval-prompts", "5:10", "--cost-ratio", "0.3",
                       "--out", str(root / "overlap")])
    assert "overlap" in capsys.readouterr().err
