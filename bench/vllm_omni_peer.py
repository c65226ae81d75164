"""vllm-omni 0.30's own batched Token2wav (`BatchedToken2Wav`), loaded with codeclog's tensors.

The peer is the class vllm-omni's MiniCPM-o 4.5 Code2Wav stage decodes with
(`vllm_omni.model_executor.models.minicpmo_4_5.batched_token2wav`): request-owned caches, one
batched flow call and one batched HiFT call per equal-shape group, CUDA graphs for the DiT and
HiFT on a GPU when enabled, plain eager torch on the CPU. It wraps a `Token2wav`-like object that
only holds modules; here that object is built from:

- the flow: `stepaudio2.cosyvoice2` of minicpmo-utils 1.0.7 (the `cosyvoice2.*` classes the
  published flow.yaml names, whose `forward_chunk` carries the `torch.compile(backend="eager")`
  wrapper the peer removes), imported from its own directory
  (`~/.cache/codeclog/ref-minicpmo-utils`, or $CODECLOG_REF_MINICPMO_UTILS) under a bare
  `stepaudio2` package so that its `__init__` (Token2wav, torchaudio, ONNX) is not run;
- the HiFT: vllm-omni's own `cosyvoice3.code2wav_core.hifigan.HiFTGenerator` with the F0
  predictor of its `step_audio2_token2wav._build_hift` (at other sizes, the same layers resized).

Weights: codeclog's flow and HiFT state dicts, loaded with `strict=True` (codeclog keeps
upstream's parameter names: the published flow.pt and hift.pt load into both). The flow's
noise table, which upstream draws from the global RNG when the CFM is built, is codeclog's
table (same values by construction). Upstream's scratch buffers that the peer never reads
(the CFM's 4.2 GB `att_cache_buffer` and the DiT's, sized for the published model at batch 1)
are replaced by empty tensors. Nothing here changes how the peer computes.

HiFT noise: the peer draws the harmonic phases and the source noise from the global RNG inside
every HiFT call. `codeclog_noise` replaces exactly those two draws with the per-row draws
codeclog makes for the same stream and window, so that the two implementations' audio can be
compared sample by sample; the timed runs do not use it.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from codeclog.paths import default_cache_dir
from codeclog.vocoder.flow import FlowConfig, Token2WavFlow
from codeclog.vocoder.flow.cfm import draw_noise_table
from codeclog.vocoder.hift.config import HiftConfig
from codeclog.vocoder.hift.excitation import draw_source_noise
from codeclog.vocoder.hift.noncausal import HiFTGenerator
from codeclog.vocoder.voice import Voice

UTILS_ENV = "CODECLOG_REF_MINICPMO_UTILS"
UTILS_INSTALL = (
    "pip install --no-deps --target ~/.cache/codeclog/ref-minicpmo-utils minicpmo-utils==1.0.7"
)
PEER_MODULE = "vllm_omni.model_executor.models.minicpmo_4_5.batched_token2wav"


class PeerUnavailableError(RuntimeError):
    """The peer cannot be built here (vllm-omni or minicpmo-utils is missing); says what to do."""


def utils_root() -> Path:
    return Path(os.environ.get(UTILS_ENV) or default_cache_dir() / "ref-minicpmo-utils")


def _flow_modules() -> tuple[types.ModuleType, ...]:
    """minicpmo-utils 1.0.7's cosyvoice2 flow modules (flow, flow_matching, decoder_dit,
    upsample_encoder_v2), imported under a bare `stepaudio2` package."""
    folder = utils_root() / "stepaudio2"
    if not (folder / "cosyvoice2" / "flow" / "flow.py").is_file():
        raise PeerUnavailableError(
            f"minicpmo-utils 1.0.7 is not at {folder.parent}: {UTILS_INSTALL}"
        )
    if "stepaudio2" not in sys.modules:
        package = types.ModuleType("stepaudio2")
        package.__path__ = [str(folder)]
        package.__spec__ = importlib.machinery.ModuleSpec("stepaudio2", None, is_package=True)
        package.__spec__.submodule_search_locations = [str(folder)]
        sys.modules["stepaudio2"] = package
    names = (
        "flow.flow",
        "flow.flow_matching",
        "flow.decoder_dit",
        "transformer.upsample_encoder_v2",
    )
    return tuple(importlib.import_module(f"stepaudio2.cosyvoice2.{name}") for name in names)


def _peer_modules() -> tuple[types.ModuleType, types.ModuleType, types.ModuleType]:
    """vllm-omni's BatchedToken2Wav module, its HiFT module and its step_audio2 Token2wav core."""
    _stub_hyperpyyaml()
    try:
        batched = importlib.import_module(PEER_MODULE)
        hifigan = importlib.import_module(
            "vllm_omni.model_executor.models.cosyvoice3.code2wav_core.hifigan"
        )
        core = importlib.import_module(
            "vllm_omni.model_executor.models.step_audio2.step_audio2_token2wav"
        )
    except ImportError as exc:
        raise PeerUnavailableError(
            f"vllm-omni is not importable here ({exc}); run this bench with the vllm-omni "
            "environment's python (~/.cache/codeclog/omni-venv/bin/python, scripts/bootstrap.sh)"
        ) from exc
    return batched, hifigan, core


def _stub_hyperpyyaml() -> None:
    """The peer's Token2wav core module imports hyperpyyaml to read flow.yaml, which the bench
    never does (it builds the flow itself); the released environment may lack it."""
    if "hyperpyyaml" not in sys.modules and importlib.util.find_spec("hyperpyyaml") is None:
        stub = types.ModuleType("hyperpyyaml")

        def load_hyperpyyaml(*_: Any, **__: Any) -> Any:
            raise RuntimeError("hyperpyyaml is not installed (bench stub)")

        stub.load_hyperpyyaml = load_hyperpyyaml  # type: ignore[attr-defined]
        stub.__spec__ = importlib.machinery.ModuleSpec("hyperpyyaml", None)
        sys.modules["hyperpyyaml"] = stub


def build_peer_flow(config: FlowConfig, weights: Token2WavFlow) -> nn.Module:
    """Upstream's CausalMaskedDiffWithXvec with flow.yaml's arguments at `config`'s sizes,
    holding a copy of `weights`' parameters and noise table."""
    flow_mod, cfm_mod, dit_mod, encoder_mod = _flow_modules()
    c = config
    with torch.random.fork_rng(devices=[]):  # upstream initialises from the global RNG
        encoder = encoder_mod.UpsampleConformerEncoderV2(
            input_size=c.input_size,
            output_size=c.input_size,
            input_layer="linear",
            pre_lookahead_len=c.pre_lookahead_len,
            num_blocks=c.encoder_blocks,
            num_up_blocks=c.encoder_up_blocks,
            up_stride=c.token_mel_ratio,
            up_scale_factor=c.token_mel_ratio,
            attention_heads=c.encoder_heads,
            pos_enc_layer_type="rel_pos_espnet",
            selfattention_layer_type="rel_selfattn",
            key_bias=c.encoder_key_bias,
            linear_units=c.encoder_linear_units,
            dropout_rate=0.1,
            positional_dropout_rate=0.1,
            attention_dropout_rate=0.1,
            normalize_before=True,
        )
        estimator = dit_mod.DiT(
            in_channels=c.estimator_in_channels,
            out_channels=c.mel_dim,
            mlp_ratio=c.dit_mlp_ratio,
            depth=c.dit_depth,
            num_heads=c.dit_heads,
            head_dim=c.dit_head_dim,
            hidden_size=c.dit_hidden_size,
        )
        with torch.device("meta"):  # its buffers only: 4.2 GB of scratch the peer never reads
            decoder = cfm_mod.CausalConditionalCFM(estimator, c.inference_cfg_rate)
        model = flow_mod.CausalMaskedDiffWithXvec(
            input_size=c.input_size,
            output_size=c.mel_dim,
            spk_embed_dim=c.spk_embed_dim,
            output_type="mel",
            vocab_size=c.vocab_size,
            encoder=encoder,
            decoder=decoder,
        )
    for module, name in ((decoder, "cnn_cache_buffer"), (decoder, "att_cache_buffer")):
        setattr(module, name, torch.empty(0))
    for name in ("cnn_cache_buffer", "att_cache_buffer"):
        setattr(estimator, name, torch.empty(0))
    decoder.rand_noise = draw_noise_table(config)
    model.load_state_dict(weights.state_dict(), strict=True)
    return model.eval()


def build_peer_hift(config: HiftConfig, weights: HiFTGenerator) -> nn.Module:
    """vllm-omni's HiFTGenerator as its Token2wav core builds it (`_build_hift`), at `config`'s
    sizes, holding a copy of `weights` (unfused weight norm: load before an engine fuses it)."""
    _, hifigan, core = _peer_modules()
    with torch.random.fork_rng(devices=[]):
        f0 = core._ConvRNNF0Predictor()
        if (config.in_channels, config.f0_channels, config.f0_layers) != (80, 512, 5):
            f0.condnet, f0.classifier = _f0_layers(config)
        model = hifigan.HiFTGenerator(
            in_channels=config.in_channels,
            base_channels=config.base_channels,
            nb_harmonics=config.nb_harmonics,
            sampling_rate=config.sampling_rate_hz,
            nsf_alpha=config.nsf_alpha,
            nsf_sigma=config.nsf_sigma,
            nsf_voiced_threshold=config.nsf_voiced_threshold_hz,
            upsample_rates=list(config.upsample_rates),
            upsample_kernel_sizes=list(config.upsample_kernel_sizes),
            istft_params={"n_fft": config.istft_n_fft, "hop_len": config.istft_hop},
            resblock_kernel_sizes=list(config.resblock_kernel_sizes),
            resblock_dilation_sizes=[list(d) for d in config.resblock_dilations],
            source_resblock_kernel_sizes=list(config.source_resblock_kernel_sizes),
            source_resblock_dilation_sizes=[list(d) for d in config.source_resblock_dilations],
            lrelu_slope=config.lrelu_slope,
            audio_limit=config.audio_limit,
            f0_predictor=f0,
        )
    model.load_state_dict(weights.state_dict(), strict=True)
    return model.eval()


def _f0_layers(config: HiftConfig) -> tuple[nn.Sequential, nn.Linear]:
    """The peer's F0 predictor layers (weight-normed k=3 convs with ELU, then a linear head) at
    other widths than its hard-coded 80 -> 512 x 5."""
    from torch.nn.utils.parametrizations import weight_norm

    layers: list[nn.Module] = []
    channels = [config.in_channels] + [config.f0_channels] * (config.f0_layers - 1)
    for width in channels:
        layers += [weight_norm(nn.Conv1d(width, config.f0_channels, 3, padding=1)), nn.ELU()]
    return nn.Sequential(*layers), nn.Linear(config.f0_channels, 1)


@dataclass
class _Assets:
    """What BatchedToken2Wav reads from the Token2wav object it wraps."""

    flow: nn.Module
    hift: nn.Module
    float16: bool
    n_timesteps: int
    mel_cache_len: int
    source_cache_len: int
    speech_window: Tensor

    def _prepare_prompt(self, prompt_wav: str) -> Any:
        raise NotImplementedError("the bench passes prompt features, never a prompt wav")


class Peer:
    """One BatchedToken2Wav over the given weights, decoding codeclog's voice."""

    def __init__(
        self,
        flow_config: FlowConfig,
        hift_config: HiftConfig,
        flow: Token2WavFlow,
        hift: HiFTGenerator,
        voice: Voice,
        device: str = "cpu",
        graph_batches: Sequence[int] = (1,),
    ) -> None:
        batched, _, _ = _peer_modules()
        self.device = torch.device(device)
        cuda = self.device.type == "cuda"
        assets = _Assets(
            flow=build_peer_flow(flow_config, flow).to(self.device),
            hift=build_peer_hift(hift_config, hift).to(self.device),
            float16=False,
            n_timesteps=flow_config.n_timesteps,
            mel_cache_len=hift_config.mel_cache_frames,
            source_cache_len=hift_config.cache_samples,
            # vllm-omni's speech window: np.hamming cast to float32 (codeclog fades in float64)
            speech_window=torch.from_numpy(np.hamming(2 * hift_config.cache_samples)).to(
                device=self.device, dtype=torch.float32
            ),
        )
        self.hift_config = hift_config
        self.backend = batched.BatchedToken2Wav(
            assets,
            connector_config={"codec_chunk_frames": 25, "codec_left_context_frames": 3},
            hift_graph_config={"enabled": cuda, "capture_batch_sizes": list(graph_batches)},
            cfm_graph_config={"enabled": cuda, "max_graphs": 32, "bucket_frames": 16},
        )
        self.features = batched.PromptFeatures(
            cache_key=(voice.voice_id, voice.fingerprint),
            speech_tokens=voice.prompt_tokens[None].to(self.device, torch.int32),
            speaker_embedding=voice.spk_embedding[None].to(self.device, torch.float32),
            mels=voice.prompt_mel[None].to(self.device, torch.float32),
        )

    def setup(self, batch: int) -> list[Any]:
        with torch.inference_mode():
            return list(self.backend.setup_batch(self.features, batch))

    @contextlib.contextmanager
    def eager_hift(self) -> Iterator[None]:
        """Without the HiFT CUDA graphs (which replay the noise drawn at capture): the compare
        pass, whose noise is codeclog's."""
        wrapper = self.backend.hift_graph_wrapper
        self.backend.hift_graph_wrapper = None
        try:
            yield
        finally:
            self.backend.hift_graph_wrapper = wrapper

    def decode(
        self, states: Sequence[Any], windows: Sequence[Sequence[int]], final: bool
    ) -> tuple[list[np.ndarray], list[Any]]:
        """One window per stream, all of one length: one batched call, as the peer's stage
        makes for an equal-shape bucket."""
        tokens = torch.tensor([list(w) for w in windows], dtype=torch.int32, device=self.device)
        with torch.inference_mode():
            audios, new = self.backend.decode_batch(
                tokens, self.features, list(states), last_chunk=final
            )
        return [a.to("cpu").numpy() for a in audios], list(new)


@contextlib.contextmanager
def codeclog_noise(seeds: Sequence[int], harmonics: int) -> Iterator[None]:
    """Inside: the peer's HiFT call draws codeclog's noise for rows seeded by `seeds` (its
    phases from `torch.rand(B, harmonics)`, its source noise from the first `randn_like` of a
    (B, samples, harmonics) tensor); every other draw is left alone."""
    rand, randn_like = torch.rand, torch.randn_like

    def phases(*args: Any, **kwargs: Any) -> Tensor:
        shape = tuple(args[0]) if len(args) == 1 and not isinstance(args[0], int) else args
        if tuple(shape) == (len(seeds), harmonics):
            drawn = draw_source_noise(seeds, 0, harmonics).phase
            return drawn.to(kwargs.get("device") or "cpu", kwargs.get("dtype") or drawn.dtype)
        return rand(*args, **kwargs)

    def gaussian(like: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        if like.dim() == 3 and like.shape[0] == len(seeds) and like.shape[2] == harmonics:
            noise = draw_source_noise(seeds, int(like.shape[1]), harmonics, like.device)
            return noise.gaussian.to(like.dtype)
        return randn_like(like, *args, **kwargs)

    torch.rand, torch.randn_like = phases, gaussian  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.rand, torch.randn_like = rand, randn_like
