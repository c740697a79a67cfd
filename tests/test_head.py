"""PacerHead and PacerHeadConfig: shapes, initial behaviour, causality, save/load round trips and bad files."""

import dataclasses
import json
import os

import pytest
import torch

from pacer_core import EntropyRule, NeuralHead, StopRule, draft_distribution_features
from pacer_core.head import CONTINUE_LOGIT
from pacer_hf import PacerHead, PacerHeadConfig
from pacer_hf.tiny_models import tiny_model


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
    assert head.num_parameters() < 0.01 * 494_000_000  # Qwen2.5-0.5B


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
        ({"entropy_threshold": -1.0}, "entropy_threshold"),
        ({"target_vocab_size": 0}, "target_vocab_size"),
    ],
)
def test_config_rejects_bad_values(overrides, message):
    with pytest.raises(ValueError, match=message):
        _config(**overrides)


@pytest.mark.parametrize("overrides", [{"threshold": "high"}, {"block_size": 2.0}, {"vocab_size": True},
                                       {"max_draft": "16"}, {"temperature": None}, {"entropy_threshold": "1"}])
def test_config_rejects_the_wrong_type_with_a_type_error(overrides):
    with pytest.raises(TypeError, match=next(iter(overrides))):
        _config(**overrides)


def test_head_kinds_are_two_classes_behind_one_interface(tmp_path):
    neural, rule = PacerHead(_config()), PacerHead(_config(architecture="entropy"))
    assert type(neural) is NeuralHead and type(rule) is EntropyRule
    assert isinstance(neural, PacerHead) and isinstance(rule, PacerHead)
    for head in (neural, rule):
        head.save_pretrained(tmp_path / type(head).__name__)
        assert type(PacerHead.from_pretrained(tmp_path / type(head).__name__)) is type(head)
    with pytest.raises(ValueError, match="picks the kind"):
        NeuralHead(_config(architecture="entropy"))


def test_retired_keys_load_silently_and_unknown_keys_warn_by_version(tmp_path):
    import warnings

    from pacer_core import __version__

    head = PacerHead(_config())
    head.save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**data, "phrase_length": 8, "phrase_tail": 32}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PacerHead.from_pretrained(tmp_path)  # written by an earlier pacer-hf: nothing to say
    (tmp_path / "config.json").write_text(json.dumps({**data, "mystery": 1, "pacer_hf_version": __version__}))
    with pytest.warns(UserWarning, match="written by this same version.*by hand"):
        PacerHead.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**data, "mystery": 1, "pacer_hf_version": "99.0"}))
    with pytest.warns(UserWarning, match="newer pacer-hf .version 99.0.; upgrade"):
        PacerHead.from_pretrained(tmp_path)


def test_a_config_that_is_not_a_json_object_is_a_clear_error(tmp_path):
    PacerHead(_config()).save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="holds a JSON list, not an object"):
        PacerHead.from_pretrained(tmp_path)


def test_a_mistyped_relative_folder_fails_at_once_without_the_hub(monkeypatch):
    import huggingface_hub

    def no_network(*args, **kwargs):
        raise AssertionError("the Hub was asked")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_network)
    with pytest.raises(ValueError, match="`nope_rel` is neither an existing local folder nor a Hub repo id"):
        PacerHead.from_pretrained("nope_rel")


def test_entropy_stop_is_a_weightless_rule_that_saves_loads_and_casts(tmp_path):
    draft = tiny_model("qwen2", seed=1)
    head = PacerHead.entropy_stop(draft, 2.0)
    assert head.num_parameters() == 0 and isinstance(head, EntropyRule)
    assert (head.config.architecture, head.config.block_size, head.config.score_mode) == ("entropy", 1, "block")
    scores = torch.randn(1, 6, 96) * torch.tensor([0.1, 0.1, 5.0, 5.0, 1.0, 3.0]).view(1, 6, 1)  # flat to peaked
    features = draft_distribution_features(scores, scores.argmax(-1))  # [1, 6, 3]
    logits = head(torch.randn(1, 6, 32), features)
    assert torch.equal(logits > 0, features[..., 2] < 2.0)  # passes exactly the tokens with entropy < 2 nats
    assert (logits > 0).any() and (logits < 0).any()

    head.save_pretrained(tmp_path / "rule")
    loaded = PacerHead.from_pretrained(tmp_path / "rule")
    assert loaded.config == head.config and loaded.config.entropy_threshold == 2.0
    torch.testing.assert_close(loaded(torch.randn(1, 6, 32), features), logits)
    half = loaded.to(torch.bfloat16)
    assert half.dtype == torch.bfloat16 and half(torch.randn(1, 6, 32), features.bfloat16()).dtype == torch.bfloat16


def test_train_refuses_the_entropy_rule(tmp_path):
    from pacer_hf import train
    from pacer_hf.threshold import CostModel

    with pytest.raises(ValueError, match="nothing to train"):
        train(tmp_path / "data", tmp_path / "head", cost=CostModel(draft=0.3),
              head_config=_config(architecture="entropy"))


@pytest.mark.parametrize("score_mode", ["round", "block"])
def test_stop_rule_scores_rounds_in_a_batch_as_one_at_a_time(score_mode):
    head = PacerHead(_config(block_size=2, score_mode=score_mode))
    torch.nn.init.normal_(head.classifier.weight, std=0.1)
    torch.nn.init.constant_(head.classifier.bias, 2.0)
    hidden, features = torch.randn(5, 4, 32), torch.randn(5, 4, 3)  # 5 rounds of 4 drafted tokens (2 blocks)
    rule = StopRule(head, head.config)
    batched = rule.log_pass_scores(hidden, features)
    single = torch.cat([rule.log_pass_scores(hidden[i : i + 1], features[i : i + 1]) for i in range(5)])
    torch.testing.assert_close(batched, single)
    log_accept = torch.nn.functional.logsigmoid(head(hidden, features))  # [5, 4]
    expected = log_accept.sum(-1) if score_mode == "round" else log_accept[:, 2:].sum(-1)
    torch.testing.assert_close(batched, expected)
    # At the median pass score, rounds below it stop and the others draft on (per-call settings apply).
    config = dataclasses.replace(head.config, threshold=batched.exp().median().item())
    assert StopRule(head, config).says_stop(hidden, features).tolist() == (batched < batched.median()).tolist()
    assert StopRule(head, config).says_stop(hidden, features).sum() == 2
    never = StopRule(head, dataclasses.replace(config, threshold=0.0))
    assert not never.says_stop(hidden, features).any() and not never.asks_head(2)  # 0 never stops, never asks
    assert StopRule(head, config).asks_head(2) and not StopRule(head, config).asks_head(3)  # after full blocks only


def test_the_entropy_rule_is_placed_where_its_draft_is():
    """`PacerHead.entropy_stop(draft)` follows the draft's device (a GPU draft gets a GPU rule: `generate()` refuses
    a head on another device than its draft). The `meta` device stands in for a GPU here."""
    from pacer_hf.tiny_models import tiny_model

    draft = tiny_model("qwen2")
    assert PacerHead.entropy_stop(draft).device.type == "cpu"
    assert PacerHead.entropy_stop(draft.to("meta")).device.type == "meta"
