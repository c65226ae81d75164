"""The vllm general plugin: registers `CodeclogKafkaConnector` with vllm-omni's factory.

vLLM calls every `vllm.general_plugins` entry point (pyproject.toml) with no arguments, in every
process, possibly more than once. `register()` is a no-op when vllm_omni is not importable and
harmless when called again (the factory refuses a second registration of a name).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from typing import Any

LOGGER = logging.getLogger("codeclog.omni")
FACTORY_MODULE = "vllm_omni.distributed.omni_connectors.factory"
_registered: set[int] = set()  # ids of the factories we registered with, in this process


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

    # ValueError: registered already (another load of this plugin in the same process)
    with contextlib.suppress(ValueError):
        factory.register_connector(NAME, CodeclogKafkaConnector)
    _registered.add(id(factory))
    LOGGER.info("registered %s with vllm-omni's connector factory", NAME)
    return True
