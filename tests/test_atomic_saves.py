"""Saves that are atomic as a whole: after a kill at any step of a head save, or a full disk, the head folder holds the
old head or the new one (never new weights beside an old config), on any filesystem layout, a mount point included.

Kills are real: a subprocess saves with `pacer_core.files.fault_hook` set to `os._exit` at one named step.
"""

import errno
import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import torch

from pacer_core import files
from pacer_hf import PacerHead, PacerHeadConfig

# every step of `save_folder_atomic`, in order, for a head (config, weights, card)
STEPS = ("written", "committed", "moved config.json", "moved model.safetensors", "journal removed")
OLD, NEW = 0.75, 0.25  # the thresholds (and weight seeds) that tell the two heads apart


def _head(threshold: float) -> PacerHead:
    torch.manual_seed(int(threshold * 100))
    head = PacerHead(PacerHeadConfig(vocab_size=10, draft_hidden_size=8, threshold=threshold))
    torch.nn.init.normal_(head.classifier.weight)
    return head


def _which(folder: Path) -> float:
    """Which head the folder holds, checking that its weights belong to its config."""
    loaded = PacerHead.from_pretrained(folder)
    expected = _head(loaded.config.threshold)
    torch.testing.assert_close(loaded.classifier.weight, expected.classifier.weight)  # weights match the config
    assert not (folder / files.STAGING_NAME).exists() and not (folder / files.JOURNAL_NAME).exists()
    return loaded.config.threshold


_SAVE_AND_DIE = textwrap.dedent("""
    import os, sys, torch
    from pacer_core import files
    from pacer_hf import PacerHead, PacerHeadConfig
    step, folder = sys.argv[1], sys.argv[2]
    files.fault_hook = lambda name: os._exit(9) if name == step else None
    if step == "inside the weights file":  # a kill halfway through writing the weights
        import safetensors.torch
        def half(tensors, path, metadata=None):
            open(path, "wb").write(b"half a file")
            os._exit(9)
        safetensors.torch.save_file = half
    torch.manual_seed(25)
    head = PacerHead(PacerHeadConfig(vocab_size=10, draft_hidden_size=8, threshold=0.25))
    torch.nn.init.normal_(head.classifier.weight)
    head.save_pretrained(folder)
""")


@pytest.mark.parametrize("step", ("inside the weights file", *STEPS))
def test_a_kill_at_any_step_leaves_the_old_head_or_the_new_one(tmp_path, step):
    folder = tmp_path / "head"
    _head(OLD).save_pretrained(folder)
    result = subprocess.run([sys.executable, "-c", _SAVE_AND_DIE, step, str(folder)], capture_output=True, text=True,
                            env={**os.environ, "PACER_HF_NO_PATCH": "1"})
    assert result.returncode == 9, result.stderr
    # the commit point is the journal: before it the old head stays, after it the next reader finishes the new one
    committed = step not in ("inside the weights file", "written")
    assert _which(folder) == (NEW if committed else OLD)


def test_a_full_disk_at_any_step_before_the_commit_keeps_the_old_head(tmp_path, monkeypatch):
    folder = tmp_path / "head"
    _head(OLD).save_pretrained(folder)

    def disk_full(name):
        if name == "written":
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "fault_hook", disk_full)
    with pytest.raises(OSError, match="No space left.*holds exactly what it held before"):
        _head(NEW).save_pretrained(folder)
    monkeypatch.setattr(files, "fault_hook", None)

    import safetensors.torch

    def half_written(tensors, path, metadata=None):
        Path(path).write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", half_written)
    with pytest.raises(OSError, match="No space left"):
        _head(NEW).save_pretrained(folder)
    monkeypatch.undo()
    assert _which(folder) == OLD
    _head(NEW).save_pretrained(folder)  # and the next save goes through
    assert _which(folder) == NEW


def test_a_save_keeps_an_edited_card_and_files_it_does_not_write(tmp_path):
    folder = tmp_path / "head"
    _head(OLD).save_pretrained(folder)
    (folder / "README.md").write_text("my card")
    (folder / "notes.txt").write_text("mine")
    _head(NEW).save_pretrained(folder, extra_files={"training_metrics.json": b"{}"})
    assert (folder / "README.md").read_text() == "my card" and (folder / "notes.txt").read_text() == "mine"
    assert json.loads((folder / "training_metrics.json").read_text()) == {} and _which(folder) == NEW


@pytest.fixture
def mount_point(tmp_path):
    """A small tmpfs mounted inside `tmp_path` (another device than its parent), where this machine allows it."""
    point = tmp_path / f"volume-{uuid.uuid4().hex[:6]}"
    point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(point)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.decode().strip() or 'not permitted'}); the mount-point "
                    "case needs root in a machine that allows mounts")
    try:
        assert os.stat(point).st_dev != os.stat(tmp_path).st_dev
        yield point
    finally:
        subprocess.run(["umount", str(point)], check=False)


def test_a_head_saves_into_a_folder_that_is_a_mount_point(mount_point):
    _head(OLD).save_pretrained(mount_point)
    _head(NEW).save_pretrained(mount_point)
    assert _which(mount_point) == NEW


def test_train_saves_into_a_mount_point(mount_point, tmp_path):
    from test_train import COST, FAST, _head_config, _synthetic_collection

    from pacer_hf.training import TrainingConfig, train

    _synthetic_collection(tmp_path / "data")
    result = train(tmp_path / "data", mount_point, cost=COST, head_config=_head_config(),
                   config=TrainingConfig(**FAST, val_fraction=0.25))
    loaded = PacerHead.from_pretrained(mount_point)
    assert loaded.config.threshold == result.head.config.threshold
    assert (mount_point / "training_metrics.json").is_file() and (mount_point / "threshold_curve.png").is_file()
