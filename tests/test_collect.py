"""Teacher-forced data collection: labels equal what drafting meets, exact soft labels, resume, bad input."""

import errno
import importlib
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import pacer_hf  # noqa: F401  (teaches generate() the `pacer_head` argument)
from pacer_hf import PacerHead, PacerHeadConfig, PacerStats
from pacer_hf.collection import FORMAT_NAME, MANIFEST_NAME, CollectionConfig, collect, load_collection
from pacer_hf.tiny_models import tiny_model, tiny_pair

MAX_NEW_TOKENS = 40


def _prompts(count: int, length: int = 6, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 96, (length,), generator=generator).tolist() for _ in range(count)]


def _accepted_run(labels: torch.Tensor) -> int:
    rejected = (labels == 0).nonzero()
    return int(rejected[0]) if len(rejected) else labels.shape[0]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_greedy_labels_equal_drafting_rounds(tmp_path, arch):
    target, draft = tiny_pair(arch, "noisy", seed=0)
    prompts = _prompts(3)
    collect(target, draft, prompts, tmp_path, config=CollectionConfig(max_new_tokens=MAX_NEW_TOKENS, batch_size=2))
    collection = load_collection(tmp_path)
    # an always-pass head with short rounds, so that a sequence holds many rounds of every kind
    head = PacerHead(PacerHeadConfig(vocab_size=96, draft_hidden_size=32, threshold=0.0, block_size=1, max_draft=5))
    mixed = 0
    for s, span in enumerate(collection.sequence_slices()):
        prompt = torch.tensor([prompts[int(collection.prompt_index[s])]])
        stats = PacerStats()
        out = target.generate(prompt, assistant_model=draft, pacer_phrases=False, pacer_head=head, pacer_stats=stats,
                              max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
        assert torch.equal(out[0, prompt.shape[1] :], collection.token[span])
        labels, start = collection.greedy_label[span], 0
        for drafted, accepted in zip(stats.draft_lengths, stats.accepted_lengths):
            assert accepted == min(_accepted_run(labels[start:]), drafted), f"round at {start}"
            mixed += 0 < accepted < drafted
            start += accepted + 1
        assert start == labels.shape[0]
    assert mixed > 0  # rounds that ended inside the draft: the case that makes the check meaningful


def test_soft_labels_and_features_equal_independent_recomputation(tmp_path):
    target, draft = tiny_pair("qwen2", "noisy", seed=1)
    temperature = 0.7
    prompts = _prompts(3, seed=1)
    collect(target, draft, prompts, tmp_path,
            config=CollectionConfig(max_new_tokens=24, temperature=temperature, batch_size=3))
    collection = load_collection(tmp_path)
    for s, span in enumerate(collection.sequence_slices()):
        prompt = prompts[int(collection.prompt_index[s])]
        ids = torch.tensor([prompt + collection.token[span].tolist()])
        with torch.no_grad():
            target_out = target(ids, output_hidden_states=True)
            p_logits = target_out.logits[0, len(prompt) - 1 : -1]
            draft_out = draft(ids, output_hidden_states=True)
        q_logits = draft_out.logits[0, len(prompt) - 1 : -1]
        p, q = (p_logits / temperature).softmax(-1), (q_logits / temperature).softmax(-1)
        # sum_x min(p, q) = 1 - total variation distance
        expected = 1 - 0.5 * (p - q).abs().sum(-1)
        torch.testing.assert_close(collection.soft_label[span], expected, atol=1e-5, rtol=0)
        greedy = (q_logits.argmax(-1) == p_logits.argmax(-1)).float()
        assert torch.equal(collection.greedy_label[span], greedy)
        expected_hidden = draft_out.hidden_states[-1][0, len(prompt) - 1 : -1].to(torch.bfloat16).float()
        torch.testing.assert_close(collection.hidden[span].float(), expected_hidden, atol=2e-2, rtol=1e-2)
        logq = q_logits.log_softmax(-1)
        torch.testing.assert_close(collection.features[span][:, 0], logq.max(-1).values, atol=1e-5, rtol=0)
        torch.testing.assert_close(collection.features[span][:, 1], logq.max(-1).values, atol=1e-5, rtol=0)
        sampled_logq = collection.sampling_features[span][:, 0]
        assert (sampled_logq <= collection.sampling_features[span][:, 1] + 1e-6).all()
        # the entropy feature, from its definition
        torch.testing.assert_close(collection.features[span][:, 2], -(logq.exp() * logq).sum(-1), atol=1e-4, rtol=0)
        # the target's side: its hidden state at t - 1 and entropy / top-1 / margin of p_t at temperature 1
        expected_hidden = target_out.hidden_states[-1][0, len(prompt) - 1 : -1].to(torch.bfloat16).float()
        torch.testing.assert_close(collection.target_hidden[span].float(), expected_hidden, atol=2e-2, rtol=1e-2)
        logp = p_logits.log_softmax(-1)
        top2 = logp.topk(2, dim=-1).values
        expected_features = torch.stack([-(logp.exp() * logp).sum(-1), top2[:, 0], top2[:, 0] - top2[:, 1]], -1)
        torch.testing.assert_close(collection.target_features[span], expected_features, atol=1e-4, rtol=0)
        assert collection.target_hidden.shape[1] == target.config.hidden_size


def _downgrade_to_version_1(folder) -> None:
    """Rewrites a collection as pacer-hf 0.x wrote it: no target tensors, format version 1."""
    for path in folder.glob("shard-*.safetensors"):
        tensors = {k: v for k, v in load_file(path).items() if not k.startswith("target_")}
        save_file(tensors, path, metadata={"format": FORMAT_NAME})
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    shards = [{k: v for k, v in shard.items() if k != "sha256"} for shard in manifest["shards"]]  # none in version 1
    (folder / MANIFEST_NAME).write_text(json.dumps({**manifest, "format_version": 1, "shards": shards}))


def test_version_1_collection_loads_without_target_state_and_is_never_extended(tmp_path):
    target, draft = tiny_pair("llama", "noisy", seed=0)
    config = CollectionConfig(max_new_tokens=8, shard_size=1)
    collect(target, draft, _prompts(2), tmp_path, config=config)
    before = load_collection(tmp_path)
    _downgrade_to_version_1(tmp_path)
    old = load_collection(tmp_path)
    assert old.target_hidden is None and old.target_features is None
    assert torch.equal(old.greedy_label, before.greedy_label) and torch.equal(old.hidden, before.hidden)
    assert before.target_hidden is not None and before.target_features.shape == (before.token.shape[0], 3)
    with pytest.raises(ValueError, match="format version 1 collection.*never mixed.*another directory"):
        collect(target, draft, _prompts(3), tmp_path, config=config)


def _shards(folder) -> dict[str, dict[str, torch.Tensor]]:
    return {path.name: load_file(path) for path in sorted(folder.glob("shard-*.safetensors"))}


def test_collect_resume_after_kill_equals_uninterrupted(tmp_path, monkeypatch):
    target, draft = tiny_pair("llama", "noisy", seed=0)
    prompts = _prompts(5)
    config = CollectionConfig(max_new_tokens=16, batch_size=1, shard_size=2)
    collect(target, draft, prompts, tmp_path / "whole", config=config)

    collect_module = importlib.import_module("pacer_hf.collection")
    calls = {"n": 0}
    original = collect_module._teacher_forced

    def killed_on_third_batch(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # inside the second shard
            raise KeyboardInterrupt("killed")
        return original(*args, **kwargs)

    monkeypatch.setattr(collect_module, "_teacher_forced", killed_on_third_batch)
    with pytest.raises(KeyboardInterrupt):
        collect(target, draft, prompts, tmp_path / "resumed", config=config)
    manifest = json.loads((tmp_path / "resumed" / "manifest.json").read_text())
    assert [s["prompts"] for s in manifest["shards"]] == [[0, 1]]  # the finished shard is intact and recorded
    monkeypatch.setattr(collect_module, "_teacher_forced", original)

    resumed = collect(target, draft, prompts, tmp_path / "resumed", config=config)
    assert resumed == json.loads((tmp_path / "whole" / "manifest.json").read_text())
    whole, again = _shards(tmp_path / "whole"), _shards(tmp_path / "resumed")
    assert whole.keys() == again.keys() and len(whole) == 3
    for name in whole:
        for key in whole[name]:
            assert torch.equal(whole[name][key], again[name][key]), (name, key)


def test_collect_full_disk_keeps_finished_shards_and_resumes(tmp_path, monkeypatch):
    target, draft = tiny_pair("llama", "noisy", seed=0)
    prompts = _prompts(3)
    config = CollectionConfig(max_new_tokens=8, shard_size=1)

    collect_module = importlib.import_module("pacer_hf.collection")
    original, calls = collect_module.save_file, {"n": 0}

    def disk_full_on_second_shard(tensors, path, metadata=None):
        calls["n"] += 1
        if calls["n"] == 2:
            with open(path, "wb") as partial:
                partial.write(b"half a shard")
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(tensors, path, metadata=metadata)

    monkeypatch.setattr(collect_module, "save_file", disk_full_on_second_shard)
    with pytest.raises(OSError, match="No space left.*intact; fix the cause .e.g. free disk space. and run the same command again"):
        collect(target, draft, prompts, tmp_path, config=config)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json", "shard-00000.safetensors"]
    monkeypatch.setattr(collect_module, "save_file", original)
    manifest = collect(target, draft, prompts, tmp_path, config=config)
    assert [s["prompts"] for s in manifest["shards"]] == [[0], [1], [2]]
    assert load_collection(tmp_path).num_sequences == 3


@pytest.mark.parametrize("damage", ["same-size", "truncate", "delete"])
def test_a_damaged_shard_is_named_before_training_and_collect_repairs_it(tmp_path, damage):
    target, draft = tiny_pair("llama", "noisy", seed=0)
    prompts, config = _prompts(5), CollectionConfig(max_new_tokens=12, batch_size=1, shard_size=2)
    collect(target, draft, prompts, tmp_path / "whole", config=config)
    collect(target, draft, prompts, tmp_path / "data", config=config)
    shard = tmp_path / "data" / "shard-00001.safetensors"
    data = bytearray(shard.read_bytes())
    if damage == "same-size":  # flip bytes deep in the tensors: the size, the header and the shapes stay valid
        data[-64:-32] = bytes(255 - b for b in data[-64:-32])
        shard.write_bytes(bytes(data))
    elif damage == "truncate":
        shard.write_bytes(bytes(data[: len(data) // 2]))
    else:
        shard.unlink()
    with pytest.raises(ValueError, match="shard-00001.safetensors` is (damaged|missing|unreadable).*`pacer-hf collect`"):
        load_collection(tmp_path / "data")
    from pacer_hf.training import TrainingConfig, train
    from pacer_hf.threshold import CostModel

    with pytest.raises(ValueError, match="shard-00001"):  # before any training: no epoch, no checkpoint
        train(tmp_path / "data", tmp_path / "head", cost=CostModel(draft=0.3), config=TrainingConfig(epochs=1))
    assert not (tmp_path / "head" / "checkpoints").exists()
    repaired = collect(target, draft, prompts, tmp_path / "data", config=config)  # the same command repairs it
    assert repaired == json.loads((tmp_path / "whole" / "manifest.json").read_text())
    whole, again = _shards(tmp_path / "whole"), _shards(tmp_path / "data")
    for name in whole:
        for key in whole[name]:
            assert torch.equal(whole[name][key], again[name][key]), (name, key)


def test_collect_max_prompts_grows_on_resume(tmp_path):
    target, draft = tiny_pair("llama", "noisy", seed=0)
    prompts = _prompts(3)
    collect(target, draft, prompts, tmp_path, config=CollectionConfig(max_new_tokens=8, max_prompts=2))
    manifest = collect(target, draft, prompts, tmp_path, config=CollectionConfig(max_new_tokens=8))
    assert [s["prompts"] for s in manifest["shards"]] == [[0, 1], [2]]


def test_collect_refuses_another_pair_or_settings(tmp_path):
    target, draft = tiny_pair("llama", "noisy", seed=0)
    collect(target, draft, _prompts(1), tmp_path, config=CollectionConfig(max_new_tokens=8))
    other_target, other_draft = tiny_pair("llama", "independent", seed=0)
    with pytest.raises(ValueError, match="different `draft`.*never mixed"):
        collect(other_target, other_draft, _prompts(1), tmp_path, config=CollectionConfig(max_new_tokens=8))
    with pytest.raises(ValueError, match="different `collection`"):
        collect(target, draft, _prompts(1), tmp_path, config=CollectionConfig(max_new_tokens=9))
    with pytest.raises(ValueError, match="different `prompts_sha256`"):
        collect(target, draft, _prompts(1, seed=5), tmp_path, config=CollectionConfig(max_new_tokens=8))
    assert len(load_collection(tmp_path).token) == 8  # the first collection is untouched


def test_collect_refuses_different_vocabularies(tmp_path):
    target = tiny_model("llama", seed=0, vocab_size=96)
    draft = tiny_model("llama", seed=1, vocab_size=100)
    with pytest.raises(ValueError, match="draft has 100 embedding rows and the target 96.*pass both"):
        collect(target, draft, _prompts(1), tmp_path)
    assert not (tmp_path / "manifest.json").exists()


def test_collect_skips_prompts_longer_than_the_context(tmp_path):
    target, draft = tiny_pair("gpt2", "noisy", seed=0)  # context: 256 positions
    prompts = [_prompts(1)[0], _prompts(1, length=250)[0]]
    with pytest.warns(UserWarning, match="1 prompts were skipped.*prompt 1.*exceeds the models' context of 256"):
        manifest = collect(target, draft, prompts, tmp_path, config=CollectionConfig(max_new_tokens=8))
    assert manifest["totals"]["sequences"] == 1 and manifest["shards"][0]["skipped"][0]["prompt"] == 1
    with pytest.raises(ValueError, match="Every prompt was skipped"):
        collect(target, draft, prompts[1:], tmp_path / "long", config=CollectionConfig(max_new_tokens=8))
    with pytest.raises(ValueError, match="`prompts` is empty"):
        collect(target, draft, [], tmp_path / "empty")


