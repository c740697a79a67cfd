"""Files that a kill or a full disk can never leave half written, on any filesystem layout, and their checksums.

- One file ([`write_file_atomic`]): written to a temporary file beside it, flushed to disk, then renamed over it.
- A folder of files that belong together, a head's `config.json` and `model.safetensors` ([`save_folder_atomic`]):
  every new file is written into a staging folder *inside* the destination, so each later move is a rename within one
  filesystem (a destination that is a mount point, such as a container volume, included: a staging folder beside it
  would sit on another device, where `os.replace` fails with EXDEV). A journal listing the files is the commit point;
  then they are moved into place. Whoever opens the folder next ([`recover_folder`]: every load and every save does)
  finishes a committed save or discards an uncommitted one, so the folder reads as wholly old or wholly new.
"""

import errno
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

STAGING_NAME = ".pacer-staging"
JOURNAL_NAME = ".pacer-commit.json"

# Tests only: called with the name of each step of a folder save, so that a test can kill the process (or fill the
# disk) exactly there. None in normal use.
fault_hook: Callable[[str], None] | None = None


_CHUNK_BYTES = 16 * 2**20  # streaming read size: fast for GiB-sized files, small in memory


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _step(name: str) -> None:
    if fault_hook is not None:
        fault_hook(name)


def _fsync(path: Path) -> None:
    """Flushes a file, or a folder's entries, to disk: a rename is durable only once both are."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:  # some filesystems cannot fsync a folder; the rename is still atomic there
        if exc.errno not in (errno.EINVAL, errno.EBADF):
            raise
    finally:
        os.close(fd)


def write_file_atomic(path: str | Path, write: Callable[[Path], None]) -> None:
    """Writes `path` by calling `write(temporary path)` on a file in the same folder, then renaming it over `path`:
    a kill or a full disk leaves the old file or the new one, never a truncated one.

    Raises:
        `OSError`: the write failed (e.g. the disk is full); the old file is intact and the temporary one removed.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        _fsync(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OSError(
            exc.errno, f"Could not write `{path}` ({exc}). Files written before are intact; fix the cause (e.g. free "
            "disk space) and run the same command again."
        ) from exc


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Writes `data` as indented JSON to `path` atomically ([`write_file_atomic`])."""
    write_file_atomic(path, lambda tmp: tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8"))


def save_folder_atomic(
    directory: str | Path, write: Callable[[Path], None], keep_existing: Collection[str] = ()
) -> list[str]:
    """Saves the files that `write(staging folder)` creates into `directory`, all of them or none.

    Files of `directory` that `write` does not create are left alone; a file named in `keep_existing` (a model card
    the user edited) is only added, never replaced. Returns the names of the files that were replaced or added.

    Raises:
        `OSError`: writing failed (e.g. the disk is full); `directory` holds exactly what it held before.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    recover_folder(directory)
    staging = directory / STAGING_NAME
    try:
        staging.mkdir()
        write(staging)
        _step("written")
        names = sorted(p.name for p in staging.iterdir()
                       if p.is_file() and not (p.name in keep_existing and (directory / p.name).exists()))
        for name in names:
            _fsync(staging / name)
        _fsync(staging)
        write_json_atomic(directory / JOURNAL_NAME, {"files": names})
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise OSError(
            exc.errno, f"Could not save into `{directory}` ({exc}); it holds exactly what it held before. Fix the "
            "cause (e.g. free disk space) and save again."
        ) from exc
    _step("committed")
    _roll_forward(directory, names)
    return names


def _roll_forward(directory: Path, names: list[str]) -> None:
    staging = directory / STAGING_NAME
    for name in names:
        if (staging / name).exists():  # absent: moved before an interruption
            os.replace(staging / name, directory / name)
            _step(f"moved {name}")
    _fsync(directory)
    (directory / JOURNAL_NAME).unlink()
    _step("journal removed")
    shutil.rmtree(staging, ignore_errors=True)


def recover_folder(directory: str | Path) -> None:
    """Finishes a committed [`save_folder_atomic`] into `directory` that a kill interrupted, or discards an
    uncommitted one. Does nothing for a folder no save was interrupted in (a Hub download, say).

    Raises:
        `OSError`: the folder needs recovering but cannot be written to.
    """
    directory = Path(directory)
    journal, staging = directory / JOURNAL_NAME, directory / STAGING_NAME
    for stale in directory.glob(f".{JOURNAL_NAME}.tmp-*"):  # a journal whose own write was killed: never committed
        stale.unlink(missing_ok=True)
    if not journal.exists() and not staging.exists():
        return
    try:
        if journal.exists():
            _roll_forward(directory, json.loads(journal.read_text(encoding="utf-8"))["files"])
        else:
            shutil.rmtree(staging)
    except OSError as exc:
        raise OSError(
            exc.errno, f"A save into `{directory}` was interrupted and must be finished before it is read, but the "
            f"folder cannot be written to ({exc}). Open it once with write permission."
        ) from exc
