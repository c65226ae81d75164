"""argparse pieces the commands share: a command's parser, its on/off flags, and the vocoder
options that more than one command takes (their choices and defaults live here once; each
command words its help).
"""

from __future__ import annotations

import argparse
from typing import TypeAlias

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

HIFT_VARIANTS = ("noncausal", "causal")  # the first is the default
FLOW_DTYPES = ("float32", "bfloat16", "float16")  # the first is the default


def add_command(
    subparsers: Subparsers, name: str, summary: str, description: str, epilog: str | None = None
) -> argparse.ArgumentParser:
    """A command's (or a command's action's) parser: `summary` is its line in the parent's
    help; the description and epilog are printed with their line breaks as written."""
    return subparsers.add_parser(
        name,
        help=summary,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_flag(parser: argparse._ActionsContainer, *names: str, help: str) -> None:
    """An on/off option, off unless given (`--json`, `--secure`, `-v/--verbose`)."""
    parser.add_argument(*names, action="store_true", help=help)


def add_offline_vocoder_args(parser: argparse.ArgumentParser, kernels_help: str) -> None:
    """--vocoder (none by default) and --kernels (portable by default), as the offline
    commands, `replay` and `report`, take them."""
    parser.add_argument(
        "--vocoder",
        default="none",
        metavar="none|tiny|DIR",
        help="also decode audio: 'tiny' (the test fixture) or a checkpoint dir (default none)",
    )
    parser.add_argument(
        "--kernels", choices=("portable", "native"), default="portable", help=kernels_help
    )


def add_variant_args(parser: argparse.ArgumentParser, hift_help: str, dtype_help: str) -> None:
    """--hift and --dtype: the engine's HiFT variant and the flow's precision."""
    parser.add_argument("--hift", choices=HIFT_VARIANTS, default=HIFT_VARIANTS[0], help=hift_help)
    parser.add_argument("--dtype", choices=FLOW_DTYPES, default=FLOW_DTYPES[0], help=dtype_help)


# argparse types: a value out of range is argparse's one-line usage error (exit 2)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value
