"""The vllm general plugin: registers `CodeclogKafkaConnector` with vllm-omni's factory.

vLLM calls every `vllm.general_plugins` entry point (pyproject.toml) with no arguments, in every
process, possibly more than once. `register()` is a no-op when vllm_omni is not importable and
harmless when called again (the factory refuses a second registration of a name). On a vllm-omni
release other than the ones codeclog is tested inside (`TESTED`), it registers and logs a
warning naming both (docs/vllm-omni.md), never raises.

It also hands every chunk adapter to its codeclog connector (`bind_adapters`): vllm-omni 0.30
gives a connector no way to fail one of the adapter's requests, and a receiver that gives up on
a request (its talker died) fails it through the adapter's own `record_receive_failure`, which
the scheduler ends as FINISHED_ERROR with the reason. Upstream-ready: the adapter would pass
itself (or that one callback) to its connector where `self.connector` is created, in
`OmniChunkTransferAdapter.__init__` (chunk_transfer_adapter.py); the plugin then need not wrap it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import logging
from typing import Any

LOGGER = logging.getLogger("codeclog.omni")
FACTORY_MODULE = "vllm_omni.distributed.omni_connectors.factory"
ADAPTER_MODULE = "vllm_omni.distributed.omni_connectors.transfer_adapter.chunk_transfer_adapter"
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
    """Register the connector: True when registered (now or before), False without vllm_omni."""
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
    return True


def bind_adapters() -> bool:
    """Wrap the chunk adapter's __init__ once so that a connector with `bind_adapter` gets the
    adapter that owns it (module docstring). False where the adapter does not import."""
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
