"""The command-line flags the eval scripts share, each defined once with one default.

Run settings default to the harness's `Pair` and cost ratios to `pacer_hf.threshold.CostModel`, so a default is never typed
twice. `load_models(args)` applies what the model flags ask for (threads, dtype, prepacked weights).
"""

import argparse
import dataclasses
from typing import Any, Callable

import torch

from pacer_hf import prepack_linear_weights
from pacer_hf.threshold import CostModel
from pacer_hf.models import check_device, load_pair as load_pinned_pair
from pacer_hf.prompts import chat_input_ids
from pacer_hf.tiny_models import tiny_pair

from .methods import Pair

DTYPES = ("bfloat16", "float32")


def field_default(cls: type, name: str) -> Any:
    """The default of dataclass `cls`'s field `name`: the one place a flag's default comes from."""
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def add_model_flags(parser: argparse.ArgumentParser, pair: str = "tiny") -> None:
    """`--pair`, `--dtype`, `--device`, `--prepack`, `--threads`: which models, and how they run."""
    parser.add_argument("--pair", default=pair, help=f"`tiny`, or a pinned pair of `pacer_hf.models.PAIRS` "
                        f"(default: {pair})")
    parser.add_argument("--dtype", default=DTYPES[0], choices=DTYPES, help=f"default: {DTYPES[0]}")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N, or auto (accelerate's placement of the "
                        "target; the draft and head go to its first device) (default: cpu)")
    parser.add_argument("--prepack", action="store_true",
                        help="run both models' linear layers on prepacked oneDNN weights (pacer_hf.prepack_linear_weights)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default: 2, this machine's cores)")


def add_generation_flags(parser: argparse.ArgumentParser) -> None:
    """`--max-new-tokens`, with the harness's default."""
    default = field_default(Pair, "max_new_tokens")
    parser.add_argument("--max-new-tokens", type=int, default=default, help=f"new tokens per prompt (default: {default})")


def add_cost_flags(parser: argparse.ArgumentParser, prefix: str = "", required: bool = True) -> None:
    """`--{prefix}cost-ratio`, `--{prefix}head-cost-ratio`, `--{prefix}verify-cost-ratio`: a `CostModel`."""
    what = f"{prefix.rstrip('-')}: " if prefix else ""
    parser.add_argument(f"--{prefix}cost-ratio", type=float, required=required, default=None,
                        help=f"{what}drafted token / round (`python -m eval.research.costs` measures it)")
    for name, meaning in (("head", "head call"), ("verify", "verified draft token")):
        default = field_default(CostModel, name)
        parser.add_argument(f"--{prefix}{name}-cost-ratio", type=float, default=default,
                            help=f"{what}{meaning} / round (default: {default})")


def cost_model(args: argparse.Namespace, prefix: str = "") -> CostModel | None:
    """The `CostModel` of the cost flags with `prefix`; `None` when its cost ratio was not given."""
    key = prefix.replace("-", "_")
    draft = getattr(args, f"{key}cost_ratio")
    if draft is None:
        return None
    return CostModel(draft=draft, head=getattr(args, f"{key}head_cost_ratio"),
                     verify=getattr(args, f"{key}verify_cost_ratio"))


def load_pair(name: str, dtype: torch.dtype, device: str = "cpu"):
    """Returns `(target, draft, encode, tokenizer)` for `tiny` (no tokenizer) or a pinned pair of `pacer_hf.models`."""
    if name == "tiny":
        check_device(device)
        target, draft = tiny_pair("qwen2", "noisy", seed=0)
        place = "cpu" if device == "auto" else device
        target, draft = target.to(place), draft.to(place)
        # A stand-in tokenizer for random models: characters to ids; only the token counts matter here.
        return (target, draft, lambda text: torch.tensor([[0] + [ord(c) % 94 + 2 for c in text[:32]]], device=place),
                None)
    target, draft, tokenizer = load_pinned_pair(name, dtype, device=device)
    return target, draft, lambda text: chat_input_ids(tokenizer, text).to(target.device), tokenizer


def load_models(args: argparse.Namespace) -> tuple[torch.nn.Module, torch.nn.Module, Callable, Any]:
    """`(target, draft, encode, tokenizer)` of `--pair` in `--dtype`, prepacked with `--prepack`, on `--threads`."""
    torch.set_num_threads(args.threads)
    target, draft, encode, tokenizer = load_pair(args.pair, getattr(torch, args.dtype), args.device)
    if args.prepack:  # both models, so every method (autoregressive too) runs on the same kernels
        prepack_linear_weights(target, draft)
    return target, draft, encode, tokenizer
