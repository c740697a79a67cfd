"""Publishing a PACER head: its model card and the upload to the Hugging Face Hub.

The card is rendered from `pacer_hf/templates/pacer_head_card.md` (shipped in the wheel; `hub_cards/` at the
repository root holds the cards of the heads we publish) with YAML front matter that the Hub indexes:
`library_name: pacer-hf`, `base_model: <draft>` with `base_model_relation: adapter`, the target model, tags,
datasets, license and, when measured, a `model-index` of speed-ups.
"""

import json
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, HfApi, ModelCard, ModelCardData, get_token

# `HTTPError`: the base error of the HTTP library huggingface_hub uses (httpx or httpx2, depending on its version)
from huggingface_hub.errors import HFValidationError, HTTPError
from huggingface_hub.utils import validate_repo_id

from .config import PacerHeadConfig

TEMPLATE_NAME = "pacer_head_card.md"
CARD_NAME = "README.md"
# Files of a trained head folder that are uploaded besides the card; the first two are required.
UPLOADED_FILES = ("config.json", "model.safetensors", "training_metrics.json", "threshold_curve.png")
BASE_MODEL_RELATION = "adapter"


def _hub_model_id(name_or_path: str | None) -> str | None:
    """`name_or_path` when it is a Hub model id (`namespace/name`), else None: the Hub rejects a `base_model` that
    is a local path."""
    if not name_or_path or name_or_path.count("/") != 1:
        return None
    try:
        validate_repo_id(name_or_path)
    except HFValidationError:
        return None
    return name_or_path


def _apply_metadata(
    data: ModelCardData,
    config: PacerHeadConfig,
    mixin_data: ModelCardData,
    repo_id: str | None,
    datasets: Sequence[str],
    speedups: Mapping[str, float] | None,
) -> None:
    """Sets pacer-hf's fields of a card's metadata in place; applying it twice changes nothing more."""
    data.library_name = mixin_data.library_name
    data.license = data.license or mixin_data.license
    data.tags = sorted(set(data.tags or []) | set(mixin_data.tags or []) | {config.decoding})
    data.datasets = sorted(set(data.datasets or []) | set(datasets)) or None
    draft_id = _hub_model_id(config.draft_name_or_path)
    if draft_id is not None:
        data.base_model = draft_id
        data.base_model_relation = BASE_MODEL_RELATION
    data.draft_model = config.draft_name_or_path
    data.target_model = config.target_name_or_path
    if speedups:
        data.model_name = (repo_id or data.model_name or "pacer-head").split("/")[-1]
        data.eval_results = [
            EvalResult(
                task_type="text-generation", dataset_type=name, dataset_name=name, metric_type="speedup",
                metric_name="Speed-up over autoregressive decoding", metric_value=float(value),
            )
            for name, value in sorted(speedups.items())
        ]


def build_model_card(
    config: PacerHeadConfig,
    num_parameters: int,
    mixin_data: ModelCardData,
    *,
    card: ModelCard | None = None,
    repo_id: str | None = None,
    datasets: Sequence[str] = (),
    speedups: Mapping[str, float] | None = None,
    metrics: Mapping[str, Any] | None = None,
) -> ModelCard:
    """The model card of a head; see [`PacerHead.generate_model_card`], which calls it."""
    if card is not None:
        _apply_metadata(card.data, config, mixin_data, repo_id, datasets, speedups)
        return card
    import torch
    import transformers

    data = ModelCardData()
    _apply_metadata(data, config, mixin_data, repo_id, datasets, speedups)
    template = resources.files("pacer_hf").joinpath("templates", TEMPLATE_NAME).read_text(encoding="utf-8")
    best_fixed = max(metrics["threshold"]["fixed_speedups"].values()) if metrics else None
    return ModelCard.from_template(
        data, template_str=template, config=config.to_dict(), draft=config.draft_name_or_path,
        target=config.target_name_or_path, repo_id=repo_id, num_parameters=f"{num_parameters:,}", metrics=metrics,
        best_fixed_speedup=best_fixed, speedups=dict(sorted(speedups.items())) if speedups else None,
        versions={"transformers": transformers.__version__, "torch": torch.__version__},
    )


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
    from .head import PacerHead

    head_dir, staging_dir = Path(head_dir), Path(staging_dir)
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise ValueError(f"`repo_id` must be a Hub repo id like `org/name`, got {repo_id!r} ({exc}).") from exc
    head = PacerHead.from_pretrained(head_dir)  # a head that does not load is never uploaded
    staging_dir.mkdir(parents=True, exist_ok=True)
    for name in UPLOADED_FILES:
        if (head_dir / name).is_file():
            shutil.copy2(head_dir / name, staging_dir / name)
    metrics_file = head_dir / UPLOADED_FILES[2]
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
