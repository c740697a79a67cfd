"""The model card of a PACER head.

It is rendered from `pacer_core/templates/pacer_head_card.md` (shipped in the wheel; `hub_cards/` at the
repository root holds the cards of the heads we publish) with YAML front matter that the Hub indexes:
`library_name: pacer-hf`, `base_model: <draft>` with `base_model_relation: adapter`, the target model, tags,
datasets, license and, when measured, a `model-index` of speed-ups.
"""

from collections.abc import Mapping, Sequence
from importlib import metadata, resources
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

from .config import PacerHeadConfig

TEMPLATE_NAME = "pacer_head_card.md"
BASE_MODEL_RELATION = "adapter"


def _installed(distribution: str) -> dict[str, str]:
    """`{distribution: version}` if it is installed. Read from its metadata, not imported: the head and its card
    must stay usable where transformers is another version or absent (a serving engine's environment)."""
    try:
        return {distribution: metadata.version(distribution)}
    except metadata.PackageNotFoundError:
        return {}


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

    data = ModelCardData()
    _apply_metadata(data, config, mixin_data, repo_id, datasets, speedups)
    template = resources.files("pacer_core").joinpath("templates", TEMPLATE_NAME).read_text(encoding="utf-8")
    best_fixed = max(metrics["threshold"]["fixed_speedups"].values()) if metrics else None
    return ModelCard.from_template(
        data, template_str=template, config=config.to_dict(), draft=config.draft_name_or_path,
        target=config.target_name_or_path, repo_id=repo_id, num_parameters=f"{num_parameters:,}", metrics=metrics,
        best_fixed_speedup=best_fixed, speedups=dict(sorted(speedups.items())) if speedups else None,
        versions={**_installed("transformers"), "torch": torch.__version__},
    )
