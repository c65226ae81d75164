"""The vllm general plugin: registers `CodeclogKafkaConnector` with vllm-omni's factory.

vLLM calls every `vllm.general_plugins` entry point (pyproject.toml) with no arguments, in every
process, possibly more than once. `register()` is a no-op when vllm_omni is not importable and
harmless when called again (the factory refuses a second registration of a name). On a vllm-omni
release other than the ones codeclog is tested inside (`TESTED`), it registers and logs a
warning naming both (docs/vllm-omni.md), never raises.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import logging
from typing import Any

LOGGER = logging.getLogger("codeclog.omni")
FACTORY_MODULE = "vllm_omni.distributed.omni_connectors.factory"
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
