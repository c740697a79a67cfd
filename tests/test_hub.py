"""Hub publishing: the model card, loading from the Hugging Face cache offline, the wrong draft, the upload."""

import hashlib
import importlib
import json
import shutil
from pathlib import Path

import huggingface_hub
import pytest
import torch
import yaml
from huggingface_hub import HfApi, ModelCard

import pacer_hf  # noqa: F401  (teaches generate() the `pacer_head` argument)
from pacer_hf import PacerHead, PacerHeadConfig
from pacer_hf.hub import prepare_upload, push
from pacer_hf.tiny_models import tiny_model, tiny_pair

DRAFT_ID = "Qwen/Qwen2.5-Coder-0.5B-Instruct"
TARGET_ID = "Qwen/Qwen2.5-Coder-1.5B-Instruct"
METRICS = {  # the keys of `training_metrics.json` that the card shows
    "prompt_source": "prompts.jsonl", "positions": 1000, "train_sequences": 9, "val_sequences": 1,
    "val": {"auc": 0.81, "ece": 0.02},
    "threshold": {"cost": {"draft": 0.4, "head": 0.01}, "best_threshold": 0.35, "best_speedup": 1.52,
                  "oracle_speedup": 1.9, "fixed_speedups": {"1": 1.2, "4": 1.41}},
}


def _head(draft_id: str | None = DRAFT_ID) -> PacerHead:
    torch.manual_seed(0)
    return PacerHead(PacerHeadConfig(vocab_size=96, draft_hidden_size=32, draft_name_or_path=draft_id,
                                     target_name_or_path=TARGET_ID, head_hidden_size=32, threshold=0.35))


def _front_matter(card: ModelCard) -> dict:
    return yaml.safe_load(card.content.split("---")[1])


def test_card_front_matter_has_the_fields():
    card = _head().generate_model_card(repo_id="org/pacer-qwen", datasets=["openai/openai_humaneval"],
                                       speedups={"humaneval": 1.45, "sharegpt": 1.21}, metrics=METRICS)
    meta = _front_matter(card)
    assert meta["library_name"] == "pacer-hf"
    assert (meta["base_model"], meta["base_model_relation"]) == (DRAFT_ID, "adapter")
    assert (meta["draft_model"], meta["target_model"]) == (DRAFT_ID, TARGET_ID)
    assert {"speculative-decoding", "pacer"} <= set(meta["tags"])
    assert meta["datasets"] == ["openai/openai_humaneval"] and meta["license"] == "apache-2.0"
    results = meta["model-index"][0]["results"]
    assert meta["model-index"][0]["name"] == "pacer-qwen"
    assert {r["dataset"]["name"]: r["metrics"][0]["value"] for r in results} == {"humaneval": 1.45, "sharegpt": 1.21}
    assert 'PacerHead.from_pretrained("org/pacer-qwen")' in card.text and "pacer_head=head" in card.text
    assert "AUC 0.810" in card.text and "| PACER, threshold 0.35 | 1.520 |" in card.text
    assert "| best fixed draft length | 1.410 |" in card.text
    assert "model-index" not in _front_matter(_head().generate_model_card())  # no measurements: no model-index


def test_card_update_is_idempotent_and_keeps_the_text():
    head = _head()
    kwargs = dict(repo_id="org/pacer-qwen", datasets=["openai/openai_humaneval"], speedups={"humaneval": 1.45})
    edited = ModelCard("---\ntags:\n- mine\n---\n# My own words\n")
    once = head.generate_model_card(card=edited, **kwargs)
    twice = head.generate_model_card(card=ModelCard(once.content), **kwargs)
    assert once.content == twice.content
    assert twice.text == "# My own words\n"
    assert set(_front_matter(twice)["tags"]) >= {"mine", "pacer", "speculative-decoding"}
    fresh = head.generate_model_card(**kwargs)
    assert head.generate_model_card(card=ModelCard(fresh.content), **kwargs).content == fresh.content


def test_card_leaves_out_base_model_for_a_local_draft():
    meta = _front_matter(_head("/models/my-draft").generate_model_card())
    assert "base_model" not in meta and "base_model_relation" not in meta
    assert meta["draft_model"] == "/models/my-draft"


def _as_hf_cache(head_dir, cache_dir, repo_id: str) -> None:
    """Lays out `head_dir`'s files as `hf_hub_download` stores a downloaded repo."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache_dir / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for name in ("config.json", "model.safetensors", "README.md"):
        blob = repo / "blobs" / hashlib.sha256((head_dir / name).read_bytes()).hexdigest()
        shutil.copy(head_dir / name, blob)
        (snapshot / name).symlink_to(blob)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)


def test_save_then_load_from_hf_cache_offline_and_check_the_draft(tmp_path, monkeypatch):
    target, draft = tiny_pair("qwen2", "noisy", seed=0)
    head = _head(draft.config._name_or_path)
    head.save_pretrained(tmp_path / "head")
    _as_hf_cache(tmp_path / "head", tmp_path / "cache", "org/pacer-tiny")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)

    loaded = PacerHead.from_pretrained("org/pacer-tiny", cache_dir=tmp_path / "cache")
    assert loaded.config == head.config
    for name, value in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
    prompt = torch.tensor([[0, 11, 42, 7]])
    plain = target.generate(prompt, max_new_tokens=12, do_sample=False)
    assert torch.equal(target.generate(prompt, assistant_model=draft, pacer_phrases=False, pacer_head=loaded, max_new_tokens=12,
                                       do_sample=False), plain)
    wrong_draft = tiny_model("qwen2", seed=3, hidden_size=48)
    with pytest.raises(ValueError, match="trained for a draft with hidden size 32.*hidden size 48"):
        target.generate(prompt, assistant_model=wrong_draft, pacer_phrases=False, pacer_head=loaded, max_new_tokens=4)
    with pytest.raises(ValueError, match="vocabulary size"):
        tiny_target = tiny_model("qwen2", seed=0, vocab_size=100)
        tiny_target.generate(prompt, assistant_model=tiny_model("qwen2", seed=1, vocab_size=100), pacer_phrases=False, pacer_head=loaded,
                             max_new_tokens=4)


def _trained_folder(tmp_path):
    folder = tmp_path / "head"
    _head().save_pretrained(folder)
    (folder / "training_metrics.json").write_text(json.dumps(METRICS))
    (folder / "checkpoints").mkdir()  # never uploaded
    return folder


def _snapshot(folder) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_push_uploads_exactly_the_staged_folder(tmp_path, monkeypatch):
    folder = _trained_folder(tmp_path)
    before = _snapshot(folder)
    seen = {}

    def fake_create_repo(self, repo_id, **kwargs):
        seen["created"] = (repo_id, kwargs.get("private"))
        return huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}")

    def fake_upload_folder(self, *, repo_id, folder_path, **kwargs):
        seen["files"] = _snapshot(Path(folder_path))
        seen["token"] = self.token
        return f"https://huggingface.co/{repo_id}/commit/abc"

    monkeypatch.setattr(HfApi, "create_repo", fake_create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", fake_upload_folder)
    url = push(folder, "org/pacer-qwen", token="hf_test", private=True, speedups={"humaneval": 1.45})
    assert url == "https://huggingface.co/org/pacer-qwen/commit/abc"
    assert seen["created"] == ("org/pacer-qwen", True) and seen["token"] == "hf_test"
    assert sorted(seen["files"]) == ["README.md", "config.json", "model.safetensors", "training_metrics.json"]
    assert seen["files"]["model.safetensors"] == before["model.safetensors"]
    meta = yaml.safe_load(seen["files"]["README.md"].decode().split("---")[1])
    assert meta["base_model"] == DRAFT_ID and meta["model-index"][0]["results"][0]["metrics"][0]["value"] == 1.45
    assert _snapshot(folder) == before  # the local folder is only read


def test_push_without_token_says_so_and_keeps_the_folder(tmp_path, monkeypatch):
    folder = _trained_folder(tmp_path)
    before = _snapshot(folder)
    monkeypatch.setattr(importlib.import_module("pacer_hf.hub"), "get_token", lambda: None)
    with pytest.raises(ValueError, match="No Hugging Face token.*hf auth login.*Nothing was uploaded"):
        push(folder, "org/pacer-qwen")
    assert _snapshot(folder) == before


@pytest.mark.parametrize("offline", [False, True])
def test_push_without_network_says_so_and_keeps_the_folder(tmp_path, monkeypatch, offline):
    folder = _trained_folder(tmp_path)
    before = _snapshot(folder)
    # port 9 on this machine refuses connections: the upload fails at the HTTP boundary, with no network involved
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", offline)
    with pytest.raises(ConnectionError, match="Could not upload to `org/pacer-qwen`.*unchanged"):
        push(folder, "org/pacer-qwen", token="hf_test")
    assert _snapshot(folder) == before


def test_prepare_upload_refuses_a_broken_head_or_repo_id(tmp_path):
    folder = _trained_folder(tmp_path)
    with pytest.raises(ValueError, match="`repo_id` must be a Hub repo id"):
        prepare_upload(folder, tmp_path / "stage", "not a repo id")
    (folder / "model.safetensors").write_bytes(b"truncated")
    with pytest.raises(ValueError, match="corrupt or truncated"):
        prepare_upload(folder, tmp_path / "stage", "org/pacer-qwen")


def test_a_missing_folder_or_unreachable_repo_names_the_input(tmp_path, monkeypatch):
    missing = tmp_path / "heads" / "v2"
    with pytest.raises(ValueError, match=r"`.*heads/v2` is neither an existing local folder nor a Hub repo id"):
        PacerHead.from_pretrained(missing)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(importlib.import_module("huggingface_hub.constants"), "HF_HUB_OFFLINE", True)
    with pytest.raises(OSError, match="no local folder `org/not-here`.*Hub is unreachable"):
        PacerHead.from_pretrained("org/not-here", cache_dir=tmp_path / "cache")


def test_push_refuses_a_bad_speedup_and_a_missing_folder_at_once(tmp_path, capsys, monkeypatch):
    import huggingface_hub

    from pacer_hf.cli import main

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, **k: pytest.fail("the Hub was asked"))
    PacerHead(PacerHeadConfig(vocab_size=96, draft_hidden_size=32)).save_pretrained(tmp_path / "head")
    assert main(["push", str(tmp_path / "head"), "org/x", "--dry-run", "--speedup", "humaneval=fast"]) == 1
    assert "`--speedup` takes NAME=VALUE with a number VALUE" in capsys.readouterr().err
    assert main(["push", "nope_rel", "org/x", "--dry-run"]) == 1
    assert "`nope_rel` is not a folder" in capsys.readouterr().err
