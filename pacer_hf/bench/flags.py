"""The command-line flags the eval scripts share, each defined once with one default.

Run settings default to the harness's `Pair` and cost ratios to `pacer_hf.threshold.CostModel`, so a default is never typed
twice. `load_models(args)` applies what the model flags ask for (threads, dtype, prepacked weights).
"""

import argparse
import dataclasses
from typing import Any, Callable, NamedTuple

import torch

from pacer_core.config import model_sizes
from pacer_hf import prepack_linear_weights
from pacer_hf.models import check_device, load_model, load_pair as load_pinned_pair
from pacer_hf.prompts import chat_input_ids
from pacer_hf.threshold import CostModel
from pacer_hf.tiny_models import tiny_pair, tiny_tokenizer

from .methods import Pair

DTYPES = ("bfloat16", "float32")
TINY_PADDED = "tiny-padded"
TINY_PADDED_DRAFT_ROWS = 92


def field_default(cls: type, name: str) -> Any:
    """The default of dataclass `cls`'s field `name`: the one place a flag's default comes from."""
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def add_model_flags(parser: argparse.ArgumentParser, pair: str = "tiny") -> None:
    """`--pair` (or `--draft` and `--target`), `--dtype`, `--device`, `--prepack`, `--threads`: which models, and how
    they run."""
    parser.add_argument("--pair", default=pair, help=f"`tiny`, `{TINY_PADDED}` (tiny, the draft with fewer embedding "
                        f"rows than the target for one tokenizer), or a pinned pair of `pacer_hf.models.PAIRS` "
                        f"(default: {pair})")
    parser.add_argument("--draft", help="instead of --pair: the draft, a Hub id, a folder or a pinned model's name")
    parser.add_argument("--target", help="instead of --pair: the target, a Hub id, a folder or a pinned model's name")
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


class Models(NamedTuple):
    """The models a benchmark runs: `encode(text)` gives the prompt's ids on the target's device; `tokenizer` is the
    target's (None for `tiny`) and `draft_tokenizer` the draft's."""

    target: torch.nn.Module
    draft: torch.nn.Module
    encode: Callable[[str], torch.Tensor]
    tokenizer: Any
    draft_tokenizer: Any

    def label(self, args: argparse.Namespace) -> str:
        """How the records name the pair: `--pair`, or `DRAFT->TARGET`."""
        return f"{args.draft}->{args.target}" if args.draft else args.pair

    def stock_tokenizers(self) -> dict[str, Any]:
        """What a draft-model call of this pair passes to `generate()`: nothing for one vocabulary of one size; for a
        pair whose embedding rows differ, both tokenizers, with which transformers runs its universal assisted
        generation (the stock baseline for such pairs) and pacer-hf checks that the two share one vocabulary."""
        if model_sizes(self.draft)[0] == model_sizes(self.target)[0]:
            return {}
        return {"tokenizer": self.tokenizer, "assistant_tokenizer": self.draft_tokenizer}


def _tiny(padded: bool, device: str) -> Models:
    check_device(device)
    place = "cpu" if device == "auto" else device
    if padded:  # the tiny tokenizer's 91 tokens; the target has 96 rows, the draft 92
        target, draft = tiny_pair("qwen2", "noisy", seed=0, draft_vocab_size=TINY_PADDED_DRAFT_ROWS)
        tokenizer = tiny_tokenizer()
        return Models(target.to(place), draft.to(place), lambda text: chat_input_ids(tokenizer, text).to(place),
                      tokenizer, tokenizer)
    target, draft = tiny_pair("qwen2", "noisy", seed=0)
    # A stand-in tokenizer for random models: characters to ids; only the token counts matter here.
    return Models(target.to(place), draft.to(place),
                  lambda text: torch.tensor([[0] + [ord(c) % 94 + 2 for c in text[:32]]], device=place), None, None)


def load_pair(args: argparse.Namespace) -> Models:
    """The models of `--pair` (or `--draft` and `--target`) in `--dtype` on `--device`."""
    dtype = getattr(torch, args.dtype)
    if bool(args.draft) != bool(args.target):
        raise ValueError("`--draft` and `--target` go together (or use `--pair`).")
    if args.draft:
        target, tokenizer = load_model(args.target, dtype, device=args.device)
        draft_device = str(target.device) if args.device == "auto" else args.device
        draft, draft_tokenizer = load_model(args.draft, dtype, device=draft_device)
    elif args.pair in ("tiny", TINY_PADDED):
        return _tiny(args.pair == TINY_PADDED, args.device)
    else:
        target, draft, tokenizer = load_pinned_pair(args.pair, dtype, device=args.device)
        draft_tokenizer = tokenizer
    return Models(target, draft, lambda text: chat_input_ids(tokenizer, text).to(target.device), tokenizer,
                  draft_tokenizer)


def load_models(args: argparse.Namespace) -> Models:
    """The [`Models`] of the model flags, prepacked with `--prepack`, on `--threads`."""
    torch.set_num_threads(args.threads)
    models = load_pair(args)
    if args.prepack:  # both models, so every method (autoregressive too) runs on the same kernels
        prepack_linear_weights(models.target, models.draft)
    return models
