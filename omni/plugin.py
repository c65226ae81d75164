"""The vllm general plugin: registers `CodeclogKafkaConnector` with vllm-omni's factory, binds the
chunk adapters, and installs re-dispatch and mode 2's return stage where asked.
Reasons: docs/vllm-omni.md."""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import logging
import os
from collections.abc import Mapping
from typing import Any

from codeclog.omni import redispatch

LOGGER = logging.getLogger("codeclog.omni")
FACTORY_MODULE = "vllm_omni.distributed.omni_connectors.factory"
ADAPTER_MODULE = "vllm_omni.distributed.omni_connectors.transfer_adapter.chunk_transfer_adapter"
RUNTIME_MODULE = "vllm_omni.engine.stage_runtime"
RETURN_STAGE = "CODECLOG_RETURN_STAGE"  # the stage whose client is codeclog's audio relay
BOUND = "_codeclog_binds_connector"  # set on the adapter class once its __init__ is wrapped
_registered: set[int] = set()  # ids of the factories we registered with, in this process
TESTED = ("0.30",)  # vllm-omni release lines the real-package tier runs (tests/vllm_omni_tier/)


def _factory() -> Any:
    try:
        module = importlib.import_module(FACTORY_MODULE)
    except ImportError:
        return None
    return getattr(module, "OmniConnectorFactory", None)


def register() -> bool:
    """Register the connector: True when registered (now or before), False without vllm_omni.
    vLLM calls it in every process, possibly more than once: harmless again (the factory
    refuses a second registration of a name). On a release other than the `TESTED` ones it
    registers and logs a warning naming both, never raises."""
    factory = _factory()
    if factory is None:
        return False
    if id(factory) in _registered:
        return True
    from codeclog.omni.connector import NAME, CodeclogKafkaConnector

    warning = untested_version()
    if warning:
        LOGGER.warning(warning)

    # ValueError: registered already (another load of this plugin in the same process)
    with contextlib.suppress(ValueError):
        factory.register_connector(NAME, CodeclogKafkaConnector)
    _registered.add(id(factory))
    LOGGER.info("registered %s with vllm-omni's connector factory", NAME)
    bind_adapters()
    redispatch.install()
    install_return_stage()
    return True


def bind_adapters() -> bool:
    """Wrap the chunk adapter's __init__ once so that a connector with `bind_adapter` gets the
    adapter that owns it, which a receiver that gives up on a request (its talker died) fails
    through the adapter's own `record_receive_failure` (docs/vllm-omni.md, "Re-dispatch: a dead
    replica's requests finish on another"). False where the adapter does not import."""
    try:
        module = importlib.import_module(ADAPTER_MODULE)
    except Exception:  # vllm_omni without vllm (a documentation build): nothing to bind
        return False
    adapter_class = getattr(module, "OmniChunkTransferAdapter", None)
    if not isinstance(adapter_class, type):
        return False
    if getattr(adapter_class, BOUND, False):
        return True
    original = adapter_class.__init__  # type: ignore[misc]

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        bind = getattr(getattr(self, "connector", None), "bind_adapter", None)
        if callable(bind):
            bind(self)

    adapter_class.__init__ = __init__  # type: ignore[misc]
    setattr(adapter_class, BOUND, True)
    return True


def untested_version() -> str:
    """A warning when the installed vllm-omni is not a release line codeclog is tested with."""
    try:
        installed = importlib.metadata.version("vllm-omni")
    except importlib.metadata.PackageNotFoundError:
        return ""  # a source checkout: nothing to compare
    if ".".join(installed.split(".")[:2]) in TESTED:
        return ""
    tested = ", ".join(f"{line}.x" for line in TESTED)
    return (
        f"codeclog is tested inside vllm-omni {tested}; this is vllm-omni {installed}: "
        "CodeclogKafkaConnector registers, but the adapter it plugs into may differ "
        "(docs/vllm-omni.md)"
    )


def install_return_stage(environ: Mapping[str, str] | None = None) -> bool:
    """Where $CODECLOG_RETURN_STAGE is set, wrap `StageRuntime._initialize_replica` once so that
    the stage it names gets codeclog's `AudioRelayClient` instead of an engine client
    (docs/vllm-omni.md, "Mode 2 end to end": the one place clients are built)."""
    environ = os.environ if environ is None else environ
    stage = environ.get(RETURN_STAGE, "").strip()
    if not stage:
        return False
    try:
        runtime = importlib.import_module(RUNTIME_MODULE).StageRuntime
    except Exception:
        return False
    if getattr(runtime, BOUND, False):
        return True
    original = runtime._initialize_replica

    @functools.wraps(original)
    def _initialize_replica(self: Any, plan: Any, stage_init_timeout: int) -> Any:
        if str(plan.metadata.stage_id) != stage:
            return original(self, plan, stage_init_timeout)
        return relay_for(plan, environ)

    runtime._initialize_replica = _initialize_replica
    setattr(runtime, BOUND, True)
    LOGGER.info("stage %s of vllm-omni: codeclog's audio relay (mode 2)", stage)
    return True


def relay_for(plan: Any, environ: Mapping[str, str]) -> Any:
    """The relay client of one replica of the return stage, from its init plan."""
    from codeclog.omni.audio_return import ReturnConfig
    from codeclog.omni.relay import AudioRelayClient

    metadata = plan.metadata
    return AudioRelayClient(
        ReturnConfig.from_environment(environ),
        stage_id=int(metadata.stage_id),
        replica_id=int(getattr(plan, "replica_id", 0)),
        engine_input_source=list(metadata.engine_input_source or ()),
        default_sampling_params=metadata.default_sampling_params,
        model_stage=metadata.model_stage,
    )
