"""Publishing a PACER head on the Hugging Face Hub: its files and card staged in a folder, then uploaded."""

import json
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from huggingface_hub import HfApi, ModelCard, get_token

# `HTTPError`: the base error of the HTTP library huggingface_hub uses (httpx or httpx2, depending on its version)
from huggingface_hub.errors import HFValidationError, HTTPError
from huggingface_hub.utils import validate_repo_id

from pacer_core.head import CONFIG_NAME, WEIGHTS_NAME, PacerHead


CARD_NAME = "README.md"
METRICS_NAME = "training_metrics.json"  # written by `pacer-hf train` beside the head
PLOT_NAME = "threshold_curve.png"
# Files of a trained head folder that are uploaded besides the card; the first two are required.
UPLOADED_FILES = (CONFIG_NAME, WEIGHTS_NAME, METRICS_NAME, PLOT_NAME)


def prepare_upload(
    head_dir: str | Path,
    staging_dir: str | Path,
    repo_id: str,
    *,
    card_path: str | Path | None = None,
    datasets: Sequence[str] = (),
    speedups: Mapping[str, float] | None = None,
) -> ModelCard:
    """Fills `staging_dir` with exactly what [`push`] uploads: the head's files and its card. `head_dir` is only read.

    The card is rendered fresh from the template (with the head's `training_metrics.json` when present), or, with
    `card_path`, that card (e.g. an edited one in `hub_cards/`) with its metadata brought up to date.
    """
    head_dir, staging_dir = Path(head_dir), Path(staging_dir)
    if not head_dir.is_dir():
        raise ValueError(f"`{head_dir}` is not a folder: pass the head folder that `pacer-hf train` (or "
                         "`PacerHead.save_pretrained`) wrote.")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise ValueError(f"`repo_id` must be a Hub repo id like `org/name`, got {repo_id!r} ({exc}).") from exc
    head = PacerHead.from_pretrained(head_dir)  # a head that does not load is never uploaded
    staging_dir.mkdir(parents=True, exist_ok=True)
    for name in UPLOADED_FILES:
        if (head_dir / name).is_file():
            shutil.copy2(head_dir / name, staging_dir / name)
    metrics_file = head_dir / METRICS_NAME
    metrics = json.loads(metrics_file.read_text(encoding="utf-8")) if metrics_file.is_file() else None
    card = head.generate_model_card(
        card=ModelCard.load(card_path) if card_path is not None else None, repo_id=repo_id, datasets=datasets,
        speedups=speedups, metrics=metrics,
    )
    card.save(staging_dir / CARD_NAME)
    return card


def push(
    head_dir: str | Path,
    repo_id: str,
    *,
    token: str | None = None,
    private: bool | None = None,
    card_path: str | Path | None = None,
    datasets: Sequence[str] = (),
    speedups: Mapping[str, float] | None = None,
    commit_message: str = "Upload PACER head",
) -> str:
    """Uploads a trained head (`config.json`, `model.safetensors`, metrics, plot) and its card to the Hub.

    Everything is staged in a temporary folder first (see [`prepare_upload`]); `head_dir` is never modified, so a
    missing token or an unreachable Hub loses nothing.

    Args:
        head_dir (`str` or `Path`): a folder written by `pacer-hf train` (or `PacerHead.save_pretrained`).
        repo_id (`str`): the Hub model repo, created if missing.
        token (`str`, *optional*): a Hub token with write access; defaults to the logged-in token / `HF_TOKEN`.
        private (`bool`, *optional*): visibility of a newly created repo.
        card_path (`str` or `Path`, *optional*): a card to use instead of the rendered template.
        datasets (`Sequence[str]`): Hub dataset ids the training prompts came from, listed in the card.
        speedups (`Mapping[str, float]`, *optional*): measured speed-ups per prompt set, for the `model-index`.
        commit_message (`str`): the commit message.

    Returns:
        `str`: the URL of the commit.
    """
    token = token or get_token()
    with tempfile.TemporaryDirectory(prefix="pacer-hf-push-") as staging:
        prepare_upload(head_dir, staging, repo_id, card_path=card_path, datasets=datasets, speedups=speedups)
        if token is None:
            raise ValueError(
                f"No Hugging Face token: log in with `hf auth login`, set `HF_TOKEN`, or pass `token=` (`--token`). "
                f"Nothing was uploaded; `{head_dir}` is unchanged."
            )
        api = HfApi(token=token)
        try:
            api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
            commit = api.upload_folder(
                repo_id=repo_id, repo_type="model", folder_path=staging, commit_message=commit_message
            )
        # HfHubHTTPError and offline mode are OSErrors; a refused or timed-out connection is an `HTTPError`
        except (OSError, HTTPError) as exc:
            raise ConnectionError(
                f"Could not upload to `{repo_id}` on the Hugging Face Hub ({type(exc).__name__}: {exc}). Nothing is "
                f"lost: `{head_dir}` is unchanged; rerun `pacer-hf push` once the Hub is reachable."
            ) from exc
    return str(commit)  # a `CommitInfo` is the commit URL
