"""Loading vocoder weights: a published Token2wav checkpoint directory or the tiny fixture.

Checkpoint directory (MiniCPM-o 4.5 `assets/token2wav`):

- `flow.yaml` (read by `FlowConfig.from_yaml`, a restricted loader) and `flow.pt`;
- `hift.pt`, the non-causal HiFT of scheme A. In the `minicpmo-utils` 1.0.7 layout (a
  `config.yaml` next to it) `hift.pt` is the causal CosyVoice3 vocoder (scheme B,
  `vocoder.hift.causal`) and the non-causal one is `hift_original.pt`. `load_checkpoint` loads
  the non-causal one in both layouts; `load_causal_hift` loads the causal one of a 1.0.7 layout,
  and `choose_hift_variant` says which a checkpoint gets (the variant is chosen per checkpoint:
  `noncausal` by default, `causal` only where the layout has it);
- optionally `speech_tokenizer_v2_25hz.onnx` and `campplus.onnx` (prompt extraction from a
  reference recording; not implemented yet, see `codeclog.vocoder.voice`).

Weights are read with `torch.load(weights_only=True)` (no pickled code runs) and loaded with
`strict=True`. The tiny fixture (`vocoder/fixtures/tiny.safetensors` + `tiny.json`) holds
seeded random weights for the tiny sizes, written by `python -m codeclog.vocoder.fixture
--write`, so golden outputs do not depend on torch's initialisation RNG.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from codeclog.vocoder.errors import CheckpointError, parse_choice
from codeclog.vocoder.flow import FlowConfig, Token2WavFlow
from codeclog.vocoder.hift.causal import (
    CausalHiftConfig,
    CausalHiFTGenerator,
    build_causal_hift,
    initialise_causal_hift,
)
from codeclog.vocoder.hift.config import HiftConfig
from codeclog.vocoder.hift.noncausal import HiFTGenerator, build_hift, strip_upstream_prefix

FIXTURE_DIR = Path(__file__).resolve().parent / "fixtures"
TINY_WEIGHTS = FIXTURE_DIR / "tiny.safetensors"
TINY_CONFIG = FIXTURE_DIR / "tiny.json"
FIXTURE_FORMAT = "codeclog.vocoder-fixture.v1"
FLOW_PREFIX = "flow."
HIFT_PREFIX = "hift."
CAUSAL_FIXTURE_SEED = 7  # the tiny causal HiFT's init seed (vocoder.fixture.FIXTURE_SEED's value)


@dataclasses.dataclass(frozen=True)
class CheckpointLayout:
    """The files of one checkpoint directory, resolved."""

    directory: Path
    flow_yaml: Path
    flow_weights: Path
    hift_weights: Path  # the non-causal HiFT (hift.pt, or hift_original.pt in 1.0.7 layout)
    layout: str  # "1.0.5" (hift.pt non-causal) or "1.0.7" (config.yaml + hift_original.pt)
    tokenizer_onnx: Path | None  # speech_tokenizer_v2_25hz.onnx when present
    speaker_onnx: Path | None  # campplus.onnx when present
    causal_hift_weights: Path | None = None  # the causal HiFT (hift.pt of the 1.0.7 layout)


def inspect_checkpoint(directory: str | Path) -> CheckpointLayout:
    """Resolve the files of a checkpoint directory; CheckpointError names what is missing."""
    root = Path(directory)
    if not root.is_dir():
        raise CheckpointError(f"checkpoint directory {root} does not exist")
    causal_layout = (root / "config.yaml").is_file() and (root / "hift_original.pt").is_file()
    hift = root / ("hift_original.pt" if causal_layout else "hift.pt")
    required = [root / "flow.yaml", root / "flow.pt", hift]
    missing = [path.name for path in required if not path.is_file()]
    if missing:
        raise CheckpointError(f"checkpoint {root} lacks {', '.join(missing)}")
    return CheckpointLayout(
        directory=root,
        flow_yaml=root / "flow.yaml",
        flow_weights=root / "flow.pt",
        hift_weights=hift,
        layout="1.0.7" if causal_layout else "1.0.5",
        tokenizer_onnx=_optional(root / "speech_tokenizer_v2_25hz.onnx"),
        speaker_onnx=_optional(root / "campplus.onnx"),
        causal_hift_weights=_optional(root / "hift.pt") if causal_layout else None,
    )


def _optional(path: Path) -> Path | None:
    return path if path.is_file() else None


def read_torch_weights(path: Path) -> dict[str, Tensor]:
    """A state dict from a .pt file, with no pickled code executed."""
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types here (pickle, zip, unsupported global)
        raise CheckpointError(f"cannot read weights {path}: {exc}") from exc
    if not isinstance(loaded, Mapping) or not all(isinstance(v, Tensor) for v in loaded.values()):
        raise CheckpointError(f"{path} is not a flat state dict of tensors")
    return dict(loaded)


def load_strict(model: nn.Module, weights: Mapping[str, Tensor], source: str) -> None:
    """load_state_dict(strict=True), turning a mismatch into one CheckpointError sentence."""
    try:
        model.load_state_dict(weights, strict=True)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0:3]
        raise CheckpointError(f"{source} does not fit the model: {' '.join(first)}") from exc


def load_checkpoint(
    layout: CheckpointLayout, hift_config: HiftConfig | None = None
) -> tuple[Token2WavFlow, HiFTGenerator]:
    """The flow and the HiFT of a checkpoint, on the CPU, in float32. hift.pt carries no config
    (upstream builds `HiFTGenerator()` with its defaults): the published sizes unless given."""
    flow = Token2WavFlow(FlowConfig.from_yaml(layout.flow_yaml))
    load_strict(flow, read_torch_weights(layout.flow_weights), str(layout.flow_weights))
    hift = build_hift(HiftConfig.full() if hift_config is None else hift_config)
    weights = strip_upstream_prefix(read_torch_weights(layout.hift_weights))
    load_strict(hift, weights, str(layout.hift_weights))
    return flow, hift


class HiftVariant(enum.Enum):
    """Which HiFT vocodes a checkpoint's streams."""

    NONCAUSAL = "noncausal"  # scheme A: HiFTGenerator, cross-faded 8-frame overlap
    CAUSAL = "causal"  # scheme B: CausalHiFTGenerator, bounded history, fixed 8-frame delay

    @classmethod
    def parse(cls, value: str | HiftVariant) -> HiftVariant:
        return parse_choice(cls, value, "hift variant")


def choose_hift_variant(
    layout: CheckpointLayout, requested: str | HiftVariant | None = None
) -> HiftVariant:
    """The variant for this checkpoint: `requested`, or noncausal (every layout has it).
    CheckpointError when the causal one is asked of a layout without it (1.0.5)."""
    variant = HiftVariant.NONCAUSAL if requested is None else HiftVariant.parse(requested)
    if variant is HiftVariant.CAUSAL and layout.causal_hift_weights is None:
        raise CheckpointError(
            f"checkpoint {layout.directory} has no causal HiFT (needs config.yaml, hift.pt and "
            "hift_original.pt, the minicpmo-utils 1.0.7 layout)"
        )
    return variant


def load_causal_hift(
    layout: CheckpointLayout, config: CausalHiftConfig | None = None
) -> CausalHiFTGenerator:
    """The causal HiFT of a 1.0.7 layout, strictly loaded (CPU, float32). config.yaml is not
    parsed (hyperpyyaml tags); the published CosyVoice3 sizes are used unless given."""
    choose_hift_variant(layout, HiftVariant.CAUSAL)
    assert layout.causal_hift_weights is not None
    model = build_causal_hift(CausalHiftConfig.full() if config is None else config)
    weights = strip_upstream_prefix(read_torch_weights(layout.causal_hift_weights))
    load_strict(model, weights, str(layout.causal_hift_weights))
    return model


# ---------------------------------------------------------------------------------------------
# The tiny fixture


def flow_config_to_dict(config: FlowConfig) -> dict[str, Any]:
    return {
        key: value.value if isinstance(value, enum.Enum) else value
        for key, value in dataclasses.asdict(config).items()
    }


def flow_config_from_dict(raw: Mapping[str, Any]) -> FlowConfig:
    """The inverse of flow_config_to_dict; enum fields are rebuilt from their values."""
    known = {field.name: field for field in dataclasses.fields(FlowConfig)}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise CheckpointError(f"fixture flow config has unknown keys: {', '.join(unknown)}")
    defaults = FlowConfig()
    values: dict[str, Any] = {}
    for key, value in raw.items():
        default = getattr(defaults, key)
        values[key] = type(default)(value) if isinstance(default, enum.Enum) else value
    return FlowConfig(**values)


@dataclasses.dataclass(frozen=True)
class FixtureManifest:
    """tiny.json: the configs the weights were made for and the weights' checksum."""

    flow: FlowConfig
    hift: HiftConfig
    weights_sha256: str
    seed: int
    torch_version: str  # informational: the torch that wrote the weights

    def to_json(self) -> str:
        document = {
            "format": FIXTURE_FORMAT,
            "flow_config": flow_config_to_dict(self.flow),
            "hift_config": self.hift.to_dict(),
            "weights_sha256": self.weights_sha256,
            "seed": self.seed,
            "torch_version": self.torch_version,
        }
        return json.dumps(document, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str) -> FixtureManifest:
        try:
            document = json.loads(text)
        except ValueError as exc:
            raise CheckpointError(f"{source}: not JSON ({exc})") from exc
        if not isinstance(document, dict) or document.get("format") != FIXTURE_FORMAT:
            raise CheckpointError(f"{source}: not a {FIXTURE_FORMAT} manifest")
        return cls(
            flow=flow_config_from_dict(document["flow_config"]),
            hift=HiftConfig.from_dict(document["hift_config"]),
            weights_sha256=str(document["weights_sha256"]),
            seed=int(document["seed"]),
            torch_version=str(document.get("torch_version", "")),
        )


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_fixture(
    weights_path: Path = TINY_WEIGHTS, config_path: Path = TINY_CONFIG
) -> tuple[Token2WavFlow, HiFTGenerator]:
    """The fixture's flow and HiFT (CPU, float32), checksum verified."""
    from safetensors.torch import load_file  # the vocoder extra

    if not weights_path.is_file() or not config_path.is_file():
        raise CheckpointError(
            f"fixture {weights_path.name} missing; run `python -m codeclog.vocoder.fixture --write`"
        )
    manifest = FixtureManifest.from_json(config_path.read_text(), str(config_path))
    if file_sha256(weights_path) != manifest.weights_sha256:
        raise CheckpointError(f"{weights_path} does not match the checksum in {config_path.name}")
    tensors = load_file(str(weights_path))
    flow = Token2WavFlow(manifest.flow)
    load_strict(flow, _with_prefix(tensors, FLOW_PREFIX), f"{weights_path} (flow)")
    hift = build_hift(manifest.hift)
    load_strict(hift, _with_prefix(tensors, HIFT_PREFIX), f"{weights_path} (hift)")
    return flow, hift


def load_causal_fixture() -> CausalHiFTGenerator:
    """The tiny causal HiFT: seeded random weights (`initialise_causal_hift`, an explicit CPU
    generator, so every process builds the same numbers; not stored in the fixture file)."""
    model = build_causal_hift(CausalHiftConfig.tiny())
    initialise_causal_hift(model, CAUSAL_FIXTURE_SEED)
    return model


def _with_prefix(tensors: Mapping[str, Tensor], prefix: str) -> dict[str, Tensor]:
    return {key[len(prefix) :]: value for key, value in tensors.items() if key.startswith(prefix)}
