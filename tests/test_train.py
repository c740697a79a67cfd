"""Training a head: a learnable synthetic task, kill-and-resume, the expected-speed model, the CLI pipeline."""

import importlib
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import pacer_hf  # noqa: F401  (teaches generate() the `pacer_head` argument)
from pacer_hf import PacerHead, PacerHeadConfig, PacerStats
from pacer_hf.cpu_linear import PrepackedLinear
from pacer_hf.cli import main
from pacer_hf.collection import FORMAT_NAME, FORMAT_VERSION, MANIFEST_NAME, CollectionConfig, collect, load_collection
from pacer_hf.collection import _totals, _write_shard, write_json_atomic
import pacer_hf.cost_measurement as cost_measurement
from pacer_hf.cost_measurement import measure_cost_model
from pacer_hf.threshold import CostModel, choose_threshold, head_draft_lengths, simulate_decoding
from pacer_hf.tiny_models import tiny_pair
from pacer_hf.rounds import RoundBatcher, round_starts, window_logprobs
from pacer_hf.training import TrainingConfig, train

HIDDEN = 16
HEAD = dict(head_hidden_size=32, num_attention_heads=4, block_size=2, max_draft=8)
FAST = dict(epochs=6, batch_size=32, learning_rate=3e-3)
COST = CostModel(draft=0.2, head=0.01)


def _synthetic_collection(folder, shuffle_labels: bool = False, sequences: int = 40, length: int = 48,
                          by_entropy: bool = False) -> None:
    """Acceptance is a function of the hidden state alone (the features are noise): a head that reads the hidden
    state can learn it; shuffled labels carry nothing to learn. With `by_entropy`, acceptance is instead exactly
    "the draft's entropy is below 1 nat" (the entropy feature), the rule's own form."""
    generator = torch.Generator().manual_seed(0)
    direction = torch.randn(HIDDEN, generator=generator)
    records = []
    for s in range(sequences):
        hidden = torch.randn(length, HIDDEN, generator=generator)
        features = torch.randn(length, 3, generator=generator).abs() * 1.5  # entropy-like: >= 0 nats
        score = 1.0 - features[:, 2] if by_entropy else hidden @ direction / HIDDEN**0.5 + 0.8  # ~75% accepted
        soft = torch.sigmoid(4 * score)
        records.append({
            "hidden": hidden.to(torch.bfloat16), "features": features,
            "sampling_features": features if by_entropy else torch.randn(length, 3, generator=generator),
            "greedy_label": (score > 0).to(torch.uint8), "soft_label": soft,
            "token": torch.zeros(length, dtype=torch.long),
            "prompt_index": torch.tensor([s]), "numerics_mismatches": 0,
            "target_hidden": torch.randn(length, HIDDEN, generator=generator).to(torch.bfloat16),
            "target_features": torch.randn(length, 3, generator=generator),
        })
    if shuffle_labels:
        labels = torch.cat([r["greedy_label"] for r in records])
        labels = labels[torch.randperm(labels.shape[0], generator=generator)]
        for r, chunk in zip(records, labels.split(length)):
            r["greedy_label"] = chunk
    folder.mkdir(parents=True)
    shards = [{**_write_shard(folder / "shard-00000.safetensors", records), "prompts": list(range(sequences)),
               "skipped": []}]
    identity = {"name_or_path": "synthetic-draft", "revision": None, "model_type": "llama", "vocab_size": 96,
                "hidden_size": HIDDEN, "dtype": "float32", "context_length": 256}
    write_json_atomic(folder / MANIFEST_NAME, {
        "format": FORMAT_NAME, "format_version": FORMAT_VERSION, "pacer_hf_version": "test",
        "draft": identity, "target": {**identity, "name_or_path": "synthetic-target"}, "hidden_dtype": "bfloat16",
        "prompt_source": "synthetic", "num_prompts": sequences,
        "collection": {"max_new_tokens": length, "temperature": 1.0, "batch_size": 1, "shard_size": sequences,
                       "chat_template": "off", "seed": 0},
        "prompts_sha256": "synthetic", "shards": shards, "totals": _totals(shards),
    })


def _head_config(**overrides) -> PacerHeadConfig:
    return PacerHeadConfig(vocab_size=96, draft_hidden_size=HIDDEN, **{**HEAD, **overrides})


def test_train_learns_synthetic_acceptance(tmp_path):
    _synthetic_collection(tmp_path / "data")
    result = train(tmp_path / "data", tmp_path / "head", cost=COST, head_config=_head_config(),
                   config=TrainingConfig(**FAST, val_fraction=0.25))
    assert result.metrics["val"]["auc"] > 0.9
    assert result.metrics["val"]["ece"] < 0.1  # logit adjustment keeps the weighted head calibrated
    report = result.metrics["threshold"]
    # stopping where the head predicts rejections beats always drafting max_draft, and never beats the oracle
    assert report["fixed_speedups"]["8"] < report["best_speedup"] <= report["oracle_speedup"]
    saved = PacerHead.from_pretrained(tmp_path / "head")
    assert saved.config.threshold == report["best_threshold"]
    assert saved.config.draft_name_or_path == "synthetic-draft"
    assert saved.config.target_name_or_path == "synthetic-target"
    assert (saved.config.block_size, saved.config.decoding) == (2, "greedy")
    assert (tmp_path / "head" / "threshold_curve.png").stat().st_size > 0
    assert json.loads((tmp_path / "head" / "training_metrics.json").read_text())["val"] == result.metrics["val"]


@pytest.mark.parametrize("by_entropy", [False, True])
def test_train_saves_the_faster_of_the_head_and_the_calibrated_entropy_rule(tmp_path, by_entropy):
    _synthetic_collection(tmp_path / "data", by_entropy=by_entropy)
    result = train(tmp_path / "data", tmp_path / "head", cost=COST, head_config=_head_config(),
                   config=TrainingConfig(**FAST, val_fraction=0.25))
    comparison = result.metrics["stop_comparison"]
    head_speed, rule = comparison["head"]["expected_speedup"], comparison["entropy_rule"]
    assert rule["expected_speedup"] == max(rule["curve"].values())
    saved, runner_up = PacerHead.from_pretrained(tmp_path / "head"), PacerHead.from_pretrained(tmp_path / "head" / "runner-up")
    winner_speed = rule["expected_speedup"] if comparison["saved"] == "entropy" else head_speed
    assert winner_speed >= max(head_speed, rule["expected_speedup"])  # never slower than the other by that measure
    assert saved.config.architecture == comparison["saved"] == result.head.config.architecture
    assert {saved.config.architecture, runner_up.config.architecture} == {"attention", "entropy"}
    if by_entropy:  # acceptance is the rule's own form: the rule finds its threshold, 1 nat, and wins
        assert rule["entropy_threshold"] == 1.0 and comparison["saved"] == "entropy"
    else:  # the entropy feature is noise, the hidden state holds the signal: only the head can read it
        assert comparison["saved"] == "attention" and head_speed > rule["expected_speedup"]
    rule_folder = tmp_path / "head" / ("." if comparison["saved"] == "entropy" else "runner-up")
    loaded = PacerHead.from_pretrained(rule_folder)
    assert (loaded.config.entropy_threshold, loaded.config.draft_name_or_path) == (rule["entropy_threshold"],
                                                                                   "synthetic-draft")
    card = (tmp_path / "head" / "README.md").read_text()
    assert "calibrated the training-free entropy rule" in card and f"{rule['entropy_threshold']} nats" in card


def test_train_cannot_learn_shuffled_labels(tmp_path):
    _synthetic_collection(tmp_path / "data", shuffle_labels=True)
    result = train(tmp_path / "data", tmp_path / "head", cost=COST, head_config=_head_config(),
                   config=TrainingConfig(**FAST, val_fraction=0.25))
    assert result.metrics["val"]["auc"] < 0.65


def test_train_sampling_mode_uses_soft_labels(tmp_path):
    _synthetic_collection(tmp_path / "data")
    result = train(tmp_path / "data", tmp_path / "head", cost=COST, head_config=_head_config(decoding="sampling"),
                   config=TrainingConfig(epochs=2, batch_size=32, val_fraction=0.25))
    assert result.head.config.decoding == "sampling" and result.head.config.temperature == 1.0
    assert result.metrics["val"]["auc"] > 0.8  # soft labels of the same hidden-state rule


def test_train_resume_after_kill_equals_uninterrupted(tmp_path, monkeypatch):
    _synthetic_collection(tmp_path / "data", sequences=12, length=32)
    config = TrainingConfig(epochs=3, batch_size=16, val_fraction=0.25)
    whole = train(tmp_path / "data", tmp_path / "whole", cost=COST, head_config=_head_config(), config=config)

    train_module = importlib.import_module("pacer_hf.training")
    steps_per_epoch = whole.metrics["global_step"] // 3
    calls = {"n": 0}
    original = train_module._round_loss

    def killed_in_second_epoch(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == steps_per_epoch + 2:
            raise KeyboardInterrupt("killed")
        return original(*args, **kwargs)

    monkeypatch.setattr(train_module, "_round_loss", killed_in_second_epoch)
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "data", tmp_path / "resumed", cost=COST, head_config=_head_config(), config=config)
    monkeypatch.setattr(train_module, "_round_loss", original)
    with pytest.raises(ValueError, match="already holds a training run; pass `resume=True`"):
        train(tmp_path / "data", tmp_path / "resumed", cost=COST, head_config=_head_config(), config=config)
    with pytest.raises(ValueError, match=r"different \['training_config'\]"):
        train(tmp_path / "data", tmp_path / "resumed", cost=COST, head_config=_head_config(),
              config=TrainingConfig(epochs=4, batch_size=16, val_fraction=0.25), resume=True)

    resumed = train(tmp_path / "data", tmp_path / "resumed", cost=COST, head_config=_head_config(), config=config,
                    resume=True)
    assert resumed.metrics["global_step"] == whole.metrics["global_step"]
    first = load_file(tmp_path / "whole" / "model.safetensors")
    second = load_file(tmp_path / "resumed" / "model.safetensors")
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name
    assert resumed.metrics["threshold"] == whole.metrics["threshold"]


# ---- the expected-speed model -----------------------------------------------------------------------------------


def test_round_starts_follow_always_pass_drafting():
    labels = np.array([1, 1, 0, 1, 1, 1, 1, 1, 1, 0, 0])
    # rejection at 2 -> next round at 3; 3..6 fully accepted with max_draft 4 -> next at 8 (7 is the target's token)
    assert round_starts(labels, max_draft=4) == [0, 3, 8, 10]


def test_simulation_by_hand():
    labels = np.array([1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    cost = CostModel(draft=0.5)
    # oracle: round 0 drafts 2 (accepts 2, +1) -> t=3; drafts 4 = cap min(4, 8-3-1) -> t=8: 8 tokens, cost 2 + 3
    oracle = simulate_decoding(labels, lambda t, cap, m: (m, 0), cost, max_draft=4)
    assert (oracle.tokens, oracle.cost, oracle.rounds) == (8, 1 + 2 * 0.5 + 1 + 4 * 0.5, 2)
    # fixed 3: t=0 accepts 2 -> t=3: accepts 3 -> t=7: cap 0 -> 1 token
    fixed = simulate_decoding(labels, lambda t, cap, m: (min(3, cap), 0), cost, max_draft=4)
    assert (fixed.tokens, fixed.cost, fixed.rounds) == (8, 3 * (1 + 1.5) - 1.5, 3)
    # soft labels: one round of one draft token accepted with probability 1/2 -> 1.5 tokens expected
    soft = simulate_decoding(np.array([0.5, 0.5]), lambda t, cap, m: (min(1, cap), 0), cost, max_draft=4)
    assert soft.tokens == pytest.approx(2.0) and soft.rounds == pytest.approx(1.5)
    # verification cost per draft token and head calls: the oracle's rounds draft 2 and 4 with one head call each
    costly = CostModel(draft=0.5, head=0.1, verify=0.05)
    oracle = simulate_decoding(labels, lambda t, cap, m: (m, 1), costly, max_draft=4)
    assert oracle.cost == pytest.approx((1 + 2 * 0.55 + 0.1) + (1 + 4 * 0.55 + 0.1))


def test_threshold_zero_equals_fixed_max_draft():
    rng = np.random.default_rng(0)
    labels = [(rng.random(30) < 0.7).astype(float) for _ in range(4)]
    windows = [np.log(rng.uniform(0.05, 1.0, size=(30, 8))) for _ in range(4)]
    report = choose_threshold(labels, windows, _head_config(), COST, thresholds=(0.0, 0.3, 0.6))
    assert report.speedups[0] == pytest.approx(report.fixed_speedups[8])
    assert report.best_threshold in (0.0, 0.3, 0.6)
    assert report.oracle_speedup >= max(report.speedups)


def test_measure_cost_model_on_tiny_models():
    target, draft = tiny_pair("llama", "noisy", seed=0)
    head = PacerHead(PacerHeadConfig(vocab_size=96, draft_hidden_size=32, block_size=2, max_draft=8))
    seen = []
    original = cost_measurement._timed_generate

    def recording(*args, **kwargs):
        seconds, rounds, drafted = original(*args, **kwargs)
        seen.append((rounds, drafted, args[-1]))
        return seconds, rounds, drafted

    cost_measurement._timed_generate = recording
    try:
        for attempt in range(3):  # tiny models take milliseconds: a busy machine can drown a fit in noise
            try:
                cost = measure_cost_model(draft, target, head, repeats=2)
                break
            except ValueError:
                if attempt == 2:
                    raise
    finally:
        cost_measurement._timed_generate = original
    assert 0 < cost.draft < 10 and 0 < cost.head < 10 and cost.verify == 0
    # The timed calls really drafted a constant length per round (threshold 0 never stops one).
    assert {length for _, _, length in seen} == {1, 4}
    assert all(drafted <= rounds * length for rounds, drafted, length in seen)


def _fake_generate(round_s: float, drafted_s: float, prefill_s: float, rounds_seen: list):
    """A `_timed_generate` whose wall time follows known costs: each round accepts nothing (random tokens)."""

    def timed(target, draft, head, ids, new_tokens, draft_length):
        rounds_seen.append(draft_length)
        return prefill_s + new_tokens * (round_s + draft_length * drafted_s), new_tokens, new_tokens * draft_length

    return timed


def test_measure_cost_model_fits_round_and_drafted_token_costs(monkeypatch):
    target, draft = tiny_pair("llama", "noisy", seed=0)
    head = PacerHead(PacerHeadConfig(vocab_size=96, draft_hidden_size=32, block_size=2, max_draft=8))
    lengths = []
    monkeypatch.setattr(cost_measurement, "_timed_generate", _fake_generate(0.2, 0.1, 0.8, lengths))
    cost = measure_cost_model(draft, target, head, repeats=2)
    assert cost.draft == pytest.approx(0.5) and cost.verify == 0
    assert sorted(set(lengths)) == [1, 4]  # a draft of 1 and of half of max_draft per round
    # Timings where drafting looks free are noise: refused with a clear error, not turned into a threshold.
    monkeypatch.setattr(cost_measurement, "_timed_generate", _fake_generate(0.2, -0.01, 0.8, []))
    with pytest.raises(ValueError, match="too noisy"):
        measure_cost_model(draft, target, head, repeats=1)


def test_simulated_draft_lengths_equal_generator_decisions(tmp_path):
    target, draft = tiny_pair("llama", "noisy", seed=0)
    prompts = [[0, 11, 42, 7, 23, 5]]
    collect(target, draft, prompts, tmp_path, config=CollectionConfig(max_new_tokens=48))
    collection = load_collection(tmp_path)
    torch.manual_seed(0)
    head = PacerHead(PacerHeadConfig(vocab_size=96, draft_hidden_size=32, block_size=2, max_draft=8, threshold=0.4))
    torch.nn.init.normal_(head.classifier.weight, std=2.0)  # a head that stops some rounds, not all
    torch.nn.init.constant_(head.classifier.bias, 1.0)
    head.eval()
    stats = PacerStats()
    target.generate(torch.tensor(prompts), assistant_model=draft, pacer_phrases=False, pacer_head=head, pacer_stats=stats,
                    max_new_tokens=48, do_sample=False)
    span = collection.sequence_slices()[0]
    draft_length, head_calls = head_draft_lengths(window_logprobs(head, RoundBatcher(collection, head.config), span),
                                                  head.config.threshold, head.config)
    start = 0
    for drafted, accepted in zip(stats.draft_lengths, stats.accepted_lengths):
        assert drafted == draft_length[start], f"round at {start}"
        start += accepted + 1
    assert 0 < stats.head_stops < stats.rounds
    labels = collection.greedy_label[span].double().numpy()
    simulated = simulate_decoding(labels, lambda t, cap, m: (int(draft_length[t]), int(head_calls[t])), COST, 8)
    assert (simulated.rounds, simulated.drafted) == (stats.rounds, stats.drafted_tokens)
    assert simulated.tokens == stats.new_tokens


# ---- the command line, end to end -------------------------------------------------------------------------------


def _save_tiny_pair_with_tokenizer(folder):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<s>": 0, **{f"w{i}": i for i in range(1, 96)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="w1"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", unk_token="w1")
    target, draft = tiny_pair("llama", "noisy", seed=0)  # for llama, AutoTokenizer keeps this word-level tokenizer
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(folder / name)
        tokenizer.save_pretrained(folder / name)


def test_cli_collect_train_push_pipeline(tmp_path, capsys, monkeypatch):
    _save_tiny_pair_with_tokenizer(tmp_path)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(" ".join(f"w{(7 * i + j) % 95 + 1}" for j in range(6)) for i in range(8)) + "\n")
    more = tmp_path / "more.txt"
    more.write_text("w3 w9 w27 w81\nw5 w25 w30 w60\n")
    common = ["--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"), "--prompts", str(prompts),
              str(more), "--output-dir", str(tmp_path / "data"), "--dtype", "float32", "--max-new-tokens", "24"]
    assert main(["collect", *common, "--chat-template", "off"]) == 0
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    assert manifest["totals"]["sequences"] == 10 and manifest["prompt_source"] == f"{prompts} {more}"
    assert main(["collect", *common, "--chat-template", "on"]) == 1  # no chat template: a clear error, exit 1
    assert "has no chat template" in capsys.readouterr().err

    assert main(["train", str(tmp_path / "data"), str(tmp_path / "head"), "--cost-ratio", "0.3", "--epochs", "2",
                 "--block-size", "2", "--max-draft", "8", "--head-hidden-size", "32", "--val-fraction", "0.25"]) == 0
    head = PacerHead.from_pretrained(tmp_path / "head")
    assert head.config.target_name_or_path == str(tmp_path / "target") and head.config.block_size == 2
    assert main(["train", str(tmp_path / "data"), str(tmp_path / "head"), "--cost-ratio", "0.3"]) == 1
    assert "already holds a training run" in capsys.readouterr().err
    # --prepack: the cost measurement (timed by the tests above) runs on both models' prepacked weights.
    if torch.backends.mkldnn.is_available():
        prepacked = []

        def measure(draft, target, head, **kwargs):
            prepacked.append([any(isinstance(m, PrepackedLinear) for m in model.modules())
                              for model in (draft, target)])
            return CostModel(draft=0.3)

        monkeypatch.setattr(cost_measurement, "measure_cost_model", measure)
        assert main(["train", str(tmp_path / "data"), str(tmp_path / "head-prepacked"), "--prepack", "--dtype",
                     "float32", "--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"), "--epochs",
                     "1", "--head-hidden-size", "32", "--val-fraction", "0.25"]) == 0
        assert prepacked == [[True, True]]
        metrics = json.loads((tmp_path / "head-prepacked" / "training_metrics.json").read_text())
        assert metrics["threshold"]["cost"]["draft"] == 0.3
    assert main(["train", str(tmp_path / "data"), str(tmp_path / "head-other"), "--cost-ratio", "0.3",
                 "--prepack"]) == 1
    assert "--prepack applies to the cost measurement" in capsys.readouterr().err

    assert main(["push", str(tmp_path / "head"), "org/pacer-tiny", "--dry-run", "--speedup", "humaneval=1.25"]) == 0
    out = capsys.readouterr()
    assert "library_name: pacer-hf" in out.out and "value: 1.25" in out.out
    assert "model.safetensors" in out.err and "README.md" in out.err
    assert main(["push", str(tmp_path / "head"), "org/pacer-tiny", "--stage", str(tmp_path / "staged"),
                 "--speedup", "humaneval=1.25"]) == 0
    staged = PacerHead.from_pretrained(tmp_path / "staged")
    assert staged.config == head.config and "value: 1.25" in (tmp_path / "staged" / "README.md").read_text()
