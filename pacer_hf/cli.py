"""The `pacer-hf` command line: one parser, one subcommand per job."""

import argparse
import sys

from ._version import __version__


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return 0 if run_demo(arch=args.arch, max_new_tokens=args.max_new_tokens, seed=args.seed) else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pacer-hf", description="PACER speculative decoding for transformers.")
    parser.add_argument("--version", action="version", version=f"pacer-hf {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="generate with and without a PACER head and check the outputs match")
    demo.add_argument("--arch", default="qwen2", choices=("llama", "qwen2", "gpt2"), help="tiny model architecture")
    demo.add_argument("--max-new-tokens", type=int, default=48)
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_demo)

    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
