"""Write (or check) the tiny vocoder fixture: seeded random weights for the tiny flow and HiFT.

    python -m codeclog.vocoder.fixture --write # regenerate vocoder/fixtures/tiny.{safetensors,json}
    python -m codeclog.vocoder.fixture --check # regenerate in memory and compare with the files

The weights are committed (about 1.6 MB) so that golden outputs depend on the stored numbers,
not on how a torch release initialises modules. Regenerating them changes every golden hash in
tests/vocoder; do it only when the tiny sizes change, and update the goldens in the same commit.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from codeclog.vocoder.checkpoint import (
    FLOW_PREFIX,
    HIFT_PREFIX,
    TINY_CONFIG,
    TINY_WEIGHTS,
    FixtureManifest,
    file_sha256,
)
from codeclog.vocoder.flow import FlowConfig, Token2WavFlow
from codeclog.vocoder.hift.config import HiftConfig
from codeclog.vocoder.hift.fixture_weights import initialise_hift
from codeclog.vocoder.hift.noncausal import build_hift

FIXTURE_SEED = 7  # the HiFT init seed; the flow's comes from FlowConfig.init_seed
MAX_FIXTURE_BYTES = 5 * 1024 * 1024


def fixture_tensors(flow_config: FlowConfig, hift_config: HiftConfig) -> dict[str, Tensor]:
    """Every fixture weight, keyed `flow.<name>` / `hift.<name>`, contiguous CPU float32."""
    flow = Token2WavFlow(flow_config)  # seeded from flow_config.init_seed
    hift = build_hift(hift_config)
    initialise_hift(hift, FIXTURE_SEED)
    tensors = {FLOW_PREFIX + k: v for k, v in flow.state_dict().items()}
    tensors.update({HIFT_PREFIX + k: v for k, v in hift.state_dict().items()})
    return {key: value.detach().to("cpu").contiguous() for key, value in tensors.items()}


def write_fixture(weights_path: Path, config_path: Path) -> FixtureManifest:
    from safetensors.torch import save_file

    flow_config, hift_config = FlowConfig.tiny(), HiftConfig.tiny()
    save_file(fixture_tensors(flow_config, hift_config), str(weights_path))
    size = weights_path.stat().st_size
    if size > MAX_FIXTURE_BYTES:
        raise SystemExit(f"fixture is {size} bytes, over the {MAX_FIXTURE_BYTES} byte budget")
    manifest = FixtureManifest(
        flow=flow_config,
        hift=hift_config,
        weights_sha256=file_sha256(weights_path),
        seed=FIXTURE_SEED,
        torch_version=torch.__version__,
    )
    config_path.write_text(manifest.to_json())
    return manifest


def check_fixture(weights_path: Path, config_path: Path) -> bool:
    """True when regenerating gives exactly the committed weights and manifest configs."""
    with tempfile.TemporaryDirectory() as scratch:
        fresh = write_fixture(Path(scratch) / "w.safetensors", Path(scratch) / "c.json")
    committed = FixtureManifest.from_json(config_path.read_text(), str(config_path))
    same_configs = (fresh.flow, fresh.hift) == (committed.flow, committed.hift)
    return same_configs and fresh.weights_sha256 == file_sha256(weights_path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m codeclog.vocoder.fixture",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="regenerate the committed fixture")
    mode.add_argument("--check", action="store_true", help="verify the committed fixture")
    parser.add_argument("--weights", type=Path, default=TINY_WEIGHTS, help="safetensors path")
    parser.add_argument("--config", type=Path, default=TINY_CONFIG, help="manifest JSON path")
    args = parser.parse_args(argv)
    if args.write:
        args.weights.parent.mkdir(parents=True, exist_ok=True)
        manifest = write_fixture(args.weights, args.config)
        size = args.weights.stat().st_size
        print(f"wrote {args.weights} ({size} bytes, sha256 {manifest.weights_sha256[:16]}...)")
        return 0
    if not args.weights.is_file() or not args.config.is_file():
        print(f"fixture {args.weights} is missing; run with --write", file=sys.stderr)
        return 1
    if check_fixture(args.weights, args.config):
        print("fixture matches its generator")
        return 0
    print("fixture differs from what the generator writes now (torch or sizes changed?)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
