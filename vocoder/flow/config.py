"""Every size and rule of the Token2wav flow, the published sizes by default, and a restricted
reader for the published flow.yaml (docs/vocoder.md, "The flow")."""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path
from typing import Any

import yaml

from codeclog.vocoder.flow.errors import FlowConfigError


class ConformerTrim(enum.Enum):
    """How the conformer attention cache is cut back to prompt + last `att_keep_frames` frames.

    The cache packs the token-rate layers as [cache, cache] (repeated x2 so that every layer has
    a mel-rate length). `minicpmo-utils` 1.0.5 / `stepaudio2-minicpmo` 0.1.1 ("bug fix
    20260107") slice the packed tensor as if every layer were mel-rate, which scrambles the
    token-rate layers; 1.0.7 trims the two scales separately and repacks.
    """

    PER_SCALE = "per_scale"  # minicpmo-utils 1.0.7: token layers keep prompt/2 + keep/2 tokens
    PACKED = "packed"  # minicpmo-utils 1.0.5, stepaudio2-minicpmo 0.1.1: one slice for all


@dataclasses.dataclass(frozen=True)
class FlowConfig:
    """Sizes of the flow, its solver settings and its streaming rules."""

    vocab_size: int = 6561  # codec ids 0..6560 (S3Tokenizer-v2 FSQ, 3^8)
    input_size: int = 512  # token embedding width == conformer width
    mel_dim: int = 80  # mel bins (the flow's output channels)
    spk_embed_dim: int = 192  # CAMPPlus speaker vector, projected to mel_dim
    token_mel_ratio: int = 2  # mel frames per token (the encoder's up_stride)
    pre_lookahead_len: int = 3  # right-context tokens a non-final window carries
    encoder_heads: int = 8
    encoder_linear_units: int = 2048  # conformer feed-forward width
    encoder_blocks: int = 6  # token-rate conformer blocks
    encoder_up_blocks: int = 4  # mel-rate conformer blocks after the x2 upsample
    encoder_key_bias: bool = True
    dit_hidden_size: int = 512
    dit_depth: int = 16
    dit_heads: int = 8
    dit_head_dim: int = 64
    dit_mlp_ratio: float = 4.0
    n_timesteps: int = 10  # Euler steps of the flow-matching solver
    inference_cfg_rate: float = 0.7  # classifier-free guidance weight
    att_keep_frames: int = 100  # attention caches keep the prompt plus this many frames
    conformer_trim: ConformerTrim = ConformerTrim.PER_SCALE
    setup_lookahead_token: int = 4218  # silence id appended x3 to the prompt at setup
    noise_seed: int = 0  # seeds the position-indexed noise table (never the global RNG)
    noise_frames: int = 30000  # noise table length in mel frames (upstream: 50 * 600)
    max_relpos_frames: int = 5000  # rel-pos table length (upstream EspnetRelPositionalEncoding)
    init_seed: int = 0  # seeds the random initial weights (a checkpoint replaces them)

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type == "int" and (not isinstance(value, int) or isinstance(value, bool)):
                raise FlowConfigError(f"flow config {field.name} must be an int, got {value!r}")
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if field.type == "float" and not number:
                raise FlowConfigError(f"flow config {field.name} must be a number, got {value!r}")
        _check_positive(self)
        _check_consistent(self)

    @property
    def estimator_in_channels(self) -> int:
        """The DiT input: noisy mel, encoder mu, speaker and condition, mel_dim each."""
        return 4 * self.mel_dim

    @property
    def encoder_head_dim(self) -> int:
        return self.input_size // self.encoder_heads

    @classmethod
    def full(cls) -> FlowConfig:
        """The published sizes."""
        return cls()

    @classmethod
    def tiny(cls) -> FlowConfig:
        """Fast on 2 CPU cores; same interface (6561 tokens, 80 mels, 50 Hz mel, 3 lookahead)."""
        return cls(
            input_size=32,
            encoder_heads=2,
            encoder_linear_units=64,
            encoder_blocks=2,
            encoder_up_blocks=2,
            dit_hidden_size=32,
            dit_depth=2,
            dit_heads=2,
            dit_head_dim=16,
        )

    @classmethod
    def from_yaml(cls, path: str | Path) -> FlowConfig:
        """Read a flow.yaml with a loader that only knows the four published component tags.

        Solver and streaming settings (n_timesteps, noise_seed, ...) are not in flow.yaml; they
        keep their defaults (use `dataclasses.replace` to change them).
        """
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise FlowConfigError(f"cannot read flow config {path}: {exc}") from exc
        return cls.from_yaml_text(text, source=str(path))

    @classmethod
    def from_yaml_text(cls, text: str, source: str = "<flow.yaml>") -> FlowConfig:
        document = _load_restricted(text, source)
        return cls(**_fields_from_document(document, source))


def _check_positive(config: FlowConfig) -> None:
    not_sizes = {"noise_seed", "init_seed", "setup_lookahead_token"}
    positive = [f.name for f in dataclasses.fields(config) if f.type == "int"]
    for name in positive:
        if name in not_sizes:
            continue
        if getattr(config, name) < 1:
            raise FlowConfigError(f"flow config {name} must be >= 1, got {getattr(config, name)}")
    if not config.inference_cfg_rate > 0:
        raise FlowConfigError("flow config inference_cfg_rate must be > 0 (upstream asserts it)")
    if not config.dit_mlp_ratio > 0:
        raise FlowConfigError("flow config dit_mlp_ratio must be > 0")


def _check_consistent(config: FlowConfig) -> None:
    if config.input_size % config.encoder_heads:
        raise FlowConfigError("flow config input_size must be a multiple of encoder_heads")
    if config.att_keep_frames % config.token_mel_ratio:
        # the per-scale trim keeps att_keep_frames / ratio tokens in the token-rate layers
        raise FlowConfigError("flow config att_keep_frames must be a multiple of token_mel_ratio")
    if not 0 <= config.setup_lookahead_token < config.vocab_size:
        raise FlowConfigError("flow config setup_lookahead_token must be a valid codec id")
    if not isinstance(config.conformer_trim, ConformerTrim):
        raise FlowConfigError("flow config conformer_trim must be a ConformerTrim")


# The only tags flow.yaml may carry. Anything else (hyperpyyaml's !new:/!apply:/!name: to other
# targets) is refused, because hyperpyyaml would construct or call arbitrary objects.
TAG_FLOW = "!new:cosyvoice2.flow.flow.CausalMaskedDiffWithXvec"
TAG_ENCODER = "!new:cosyvoice2.transformer.upsample_encoder_v2.UpsampleConformerEncoderV2"
TAG_CFM = "!new:cosyvoice2.flow.flow_matching.CausalConditionalCFM"
TAG_DIT = "!new:cosyvoice2.flow.decoder_dit.DiT"
KNOWN_TAGS = (TAG_FLOW, TAG_ENCODER, TAG_CFM, TAG_DIT)


@dataclasses.dataclass(frozen=True)
class Component:
    """A tagged mapping from flow.yaml: which component and its keyword arguments."""

    tag: str
    kwargs: dict[str, Any]


class _RestrictedLoader(yaml.SafeLoader):
    """SafeLoader plus the four component tags, which build inert `Component` values."""


def _construct_component(loader: yaml.SafeLoader, node: yaml.Node) -> Component:
    if not isinstance(node, yaml.MappingNode):
        raise yaml.constructor.ConstructorError(None, None, f"{node.tag} must be a mapping")
    mapping = loader.construct_mapping(node, deep=True)
    return Component(node.tag, {str(key): value for key, value in mapping.items()})


for _tag in KNOWN_TAGS:
    _RestrictedLoader.add_constructor(_tag, _construct_component)


def _load_restricted(text: str, source: str) -> dict[str, Any]:
    try:
        document = yaml.load(text, Loader=_RestrictedLoader)
    except yaml.YAMLError as exc:
        raise FlowConfigError(f"{source}: not a supported flow.yaml ({exc})") from exc
    if not isinstance(document, dict):
        raise FlowConfigError(f"{source}: flow.yaml must be a mapping with a `flow` key")
    unknown = sorted(set(document) - {"flow"})
    if unknown:
        raise FlowConfigError(f"{source}: unknown top-level keys: {', '.join(unknown)}")
    return document


def _component(value: Any, tag: str, where: str) -> dict[str, Any]:
    if not isinstance(value, Component) or value.tag != tag:
        raise FlowConfigError(f"{where} must be a `{tag}` mapping")
    return dict(value.kwargs)


class _Fields:
    """Pops known keys from one component's kwargs, checks types, refuses leftovers."""

    def __init__(self, raw: dict[str, Any], where: str) -> None:
        self.raw = raw
        self.where = where

    def take(self, key: str, kind: type, default: Any = None) -> Any:
        if key not in self.raw:
            if default is None:
                raise FlowConfigError(f"{self.where}: missing `{key}`")
            return default
        value = self.raw.pop(key)
        accepted = (int, float) if kind is float else (kind,)
        if not isinstance(value, accepted) or (kind is not bool and isinstance(value, bool)):
            raise FlowConfigError(f"{self.where}.{key} must be {kind.__name__}, got {value!r}")
        return value

    def expect(self, key: str, expected: Any) -> None:
        if key in self.raw and self.raw.pop(key) != expected:
            raise FlowConfigError(f"{self.where}.{key} must be {expected!r} (the only supported)")

    def ignore(self, *keys: str) -> None:
        for key in keys:  # training-only settings (dropouts): no effect at inference
            self.raw.pop(key, None)

    def finish(self) -> None:
        if self.raw:
            raise FlowConfigError(f"{self.where}: unknown keys: {', '.join(sorted(self.raw))}")


def _fields_from_document(document: dict[str, Any], source: str) -> dict[str, Any]:
    flow = _Fields(_component(document["flow"], TAG_FLOW, f"{source}: flow"), f"{source}: flow")
    values: dict[str, Any] = {
        "input_size": flow.take("input_size", int),
        "mel_dim": flow.take("output_size", int),
        "spk_embed_dim": flow.take("spk_embed_dim", int),
        "vocab_size": flow.take("vocab_size", int),
    }
    flow.expect("output_type", "mel")
    encoder = flow.raw.pop("encoder", None)
    decoder = flow.raw.pop("decoder", None)
    flow.finish()
    values.update(_encoder_fields(encoder, values, f"{source}: flow.encoder"))
    values.update(_decoder_fields(decoder, values, f"{source}: flow.decoder"))
    return values


def _encoder_fields(raw: Any, flow: dict[str, Any], where: str) -> dict[str, Any]:
    enc = _Fields(_component(raw, TAG_ENCODER, where), where)
    for key in ("input_size", "output_size"):
        if enc.take(key, int) != flow["input_size"]:
            raise FlowConfigError(f"{where}.{key} must equal flow.input_size")
    values = {
        "pre_lookahead_len": enc.take("pre_lookahead_len", int, 3),
        "encoder_blocks": enc.take("num_blocks", int, 6),
        "encoder_up_blocks": enc.take("num_up_blocks", int, 4),
        "token_mel_ratio": enc.take("up_stride", int, 2),
        "encoder_heads": enc.take("attention_heads", int, 4),
        "encoder_key_bias": enc.take("key_bias", bool, True),
        "encoder_linear_units": enc.take("linear_units", int, 2048),
    }
    if float(enc.take("up_scale_factor", float, 2.0)) != values["token_mel_ratio"]:
        raise FlowConfigError(f"{where}.up_scale_factor must equal up_stride")
    enc.expect("input_layer", "linear")
    enc.expect("pos_enc_layer_type", "rel_pos_espnet")
    enc.expect("selfattention_layer_type", "rel_selfattn")
    enc.expect("normalize_before", True)
    enc.expect("activation_type", "swish")
    enc.ignore("dropout_rate", "positional_dropout_rate", "attention_dropout_rate")
    enc.finish()
    return values


def _decoder_fields(raw: Any, flow: dict[str, Any], where: str) -> dict[str, Any]:
    cfm = _Fields(_component(raw, TAG_CFM, where), where)
    values: dict[str, Any] = {"inference_cfg_rate": float(cfm.take("inference_cfg_rate", float))}
    estimator = cfm.raw.pop("estimator", None)
    cfm.finish()
    dit = _Fields(_component(estimator, TAG_DIT, f"{where}.estimator"), f"{where}.estimator")
    if dit.take("in_channels", int) != 4 * flow["mel_dim"]:
        raise FlowConfigError(f"{where}.estimator.in_channels must be 4 x flow.output_size")
    if dit.take("out_channels", int) != flow["mel_dim"]:
        raise FlowConfigError(f"{where}.estimator.out_channels must equal flow.output_size")
    values.update(
        dit_mlp_ratio=float(dit.take("mlp_ratio", float, 4.0)),
        dit_depth=dit.take("depth", int, 28),
        dit_heads=dit.take("num_heads", int, 8),
        dit_head_dim=dit.take("head_dim", int, 64),
        dit_hidden_size=dit.take("hidden_size", int, 256),
    )
    dit.finish()
    return values
