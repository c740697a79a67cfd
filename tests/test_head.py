"""PacerHead and PacerHeadConfig: shapes, initial behaviour, causality, save/load round trips and bad files."""

import json
import os

import pytest
import torch

from pacer_hf import PacerHead, PacerHeadConfig, draft_distribution_features
from pacer_hf.head import CONTINUE_LOGIT


def _config(**overrides) -> PacerHeadConfig:
    return PacerHeadConfig(**{"vocab_size": 96, "draft_hidden_size": 32, **overrides})


@pytest.mark.parametrize("architecture", ["attention", "mlp"])
def test_forward_shapes_and_untrained_head_predicts_accept(architecture):
    head = PacerHead(_config(architecture=architecture))
    logits = head(torch.randn(2, 5, 32), torch.randn(2, 5, 3))
    assert logits.shape == (2, 5)
    torch.testing.assert_close(logits, torch.full((2, 5), CONTINUE_LOGIT))


def test_attention_head_is_causal_over_the_round():
    head = PacerHead(_config())
    torch.nn.init.normal_(head.classifier.weight)
    hidden, features = torch.randn(1, 6, 32), torch.randn(1, 6, 3)
    full = head(hidden, features)
    changed = hidden.clone()
    changed[:, 4:] = torch.randn(1, 2, 32)  # later tokens must not change earlier scores
    torch.testing.assert_close(head(changed, features)[:, :4], full[:, :4])
    assert not torch.allclose(head(changed, features)[:, 4:], full[:, 4:])


def test_head_is_well_under_one_percent_of_a_small_draft():
    head = PacerHead(_config(draft_hidden_size=896, vocab_size=151936))
    assert head.num_parameters < 0.01 * 494_000_000  # Qwen2.5-0.5B


def test_draft_distribution_features_match_definitions():
    scores = torch.tensor([[2.0, 1.0, 0.0, float("-inf")]])
    tokens = torch.tensor([1])
    q = scores.softmax(-1)
    features = draft_distribution_features(scores, tokens)
    expected_entropy = -(q[:, :3] * q[:, :3].log()).sum()
    torch.testing.assert_close(features[0], torch.stack([q[0, 1].log(), q[0, 0].log(), expected_entropy]))


def test_save_and_load_round_trip(tmp_path):
    head = PacerHead(_config(threshold=0.3, block_size=2, draft_name_or_path="org/draft", target_name_or_path="org/t"))
    torch.nn.init.normal_(head.classifier.weight)
    head.save_pretrained(tmp_path / "head")
    assert sorted(os.listdir(tmp_path / "head")) == ["README.md", "config.json", "model.safetensors"]
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no temporary folder left behind
    loaded = PacerHead.from_pretrained(tmp_path / "head")
    assert loaded.config == head.config
    hidden, features = torch.randn(1, 4, 32), torch.randn(1, 4, 3)
    torch.testing.assert_close(loaded(hidden, features), head(hidden, features))
    saved = json.loads((tmp_path / "head" / "config.json").read_text())
    assert saved["draft_name_or_path"] == "org/draft" and saved["threshold"] == 0.3


def test_save_keeps_a_user_edited_card(tmp_path):
    head = PacerHead(_config())
    head.save_pretrained(tmp_path)
    (tmp_path / "README.md").write_text("my card")
    head.save_pretrained(tmp_path)
    assert (tmp_path / "README.md").read_text() == "my card"


def test_from_pretrained_forward_compatible_warns_on_unknown_keys(tmp_path):
    PacerHead(_config()).save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data["future_option"] = 1
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.warns(UserWarning, match="future_option"):
        PacerHead.from_pretrained(tmp_path)


def test_from_pretrained_missing_required_key_is_an_error(tmp_path):
    PacerHead(_config()).save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    del data["draft_hidden_size"]
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="draft_hidden_size"):
        PacerHead.from_pretrained(tmp_path)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "delete"])
def test_from_pretrained_corrupt_weights_is_a_clear_error(tmp_path, damage):
    PacerHead(_config()).save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "garbage":
        weights.write_bytes(b"\x00" * 100)
    else:
        weights.unlink()
    with pytest.raises(ValueError, match="model.safetensors"):
        PacerHead.from_pretrained(tmp_path)


def test_from_pretrained_corrupt_or_missing_config_is_a_clear_error(tmp_path):
    PacerHead(_config()).save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        PacerHead.from_pretrained(tmp_path)
    (tmp_path / "config.json").unlink()
    with pytest.raises(ValueError, match="config.json"):
        PacerHead.from_pretrained(tmp_path)


def test_from_pretrained_weights_of_another_shape_is_an_error(tmp_path):
    PacerHead(_config(head_hidden_size=64)).save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data["head_hidden_size"] = 128
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="do not match"):
        PacerHead.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"threshold": 1.5}, "threshold"),
        ({"threshold": -0.1}, "threshold"),
        ({"block_size": 0}, "block_size"),
        ({"block_size": 4, "max_draft": 3}, "max_draft"),
        ({"architecture": "lstm"}, "architecture"),
        ({"score_mode": "mean"}, "score_mode"),
        ({"decoding": "beam"}, "decoding"),
        ({"head_hidden_size": 30, "num_attention_heads": 4}, "divisible"),
    ],
)
def test_config_rejects_bad_values(overrides, message):
    with pytest.raises(ValueError, match=message):
        _config(**overrides)


def test_config_rejects_non_numeric_threshold():
    with pytest.raises(TypeError, match="threshold"):
        _config(threshold="high")
