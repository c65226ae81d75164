"""vllm-omni's serving layer, where a user enters: the environment it runs in.

vllm-omni 0.30's OpenAI-compatible API server (`vllm serve ... --omni`) imports its duplex
commands at start; on Python 3.10 their class definitions fail (`multiple bases have instance
lay-out conflict`, vllm_omni/engine/duplex/commands.py:84), so the tier's environment is the
Python upstream runs its CI on (docs/vllm-omni.md, "Versions").
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys


def test_the_environment_is_upstream_s_and_its_serving_layer_imports() -> None:
    assert sys.version_info[:2] == (3, 12), sys.version
    assert importlib.metadata.version("vllm-omni") == "0.30.0"
    assert importlib.metadata.version("vllm") == "0.30.0"
    server = importlib.import_module("vllm_omni.entrypoints.openai.api_server")
    commands = importlib.import_module("vllm_omni.engine.duplex.commands")
    assert callable(server.omni_run_server)
    assert commands.UpdateSession.__mro__  # the class 3.10 cannot define
