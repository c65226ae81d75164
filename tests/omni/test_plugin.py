"""The vllm general plugin: registration, idempotence, and the entry point after install."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib
import types
from pathlib import Path
from typing import Any, ClassVar

import pytest

from codeclog.omni import plugin
from codeclog.omni.connector import NAME, CodeclogKafkaConnector

ROOT = Path(__file__).resolve().parents[2]
GROUP = "vllm.general_plugins"


class _Factory:
    """vllm-omni's OmniConnectorFactory as documented: a second registration raises."""

    registry: ClassVar[dict[str, Any]] = {}

    @classmethod
    def register_connector(
        cls, name: str, constructor: Any, *, supports_dual: bool = False
    ) -> None:
        if name in cls.registry:
            raise ValueError(f"connector {name} already registered")
        cls.registry[name] = constructor


@pytest.fixture
def fake_vllm_omni(monkeypatch: pytest.MonkeyPatch) -> type[_Factory]:
    factory = type("OmniConnectorFactory", (_Factory,), {"registry": {}})
    module = types.ModuleType(plugin.FACTORY_MODULE)
    module.OmniConnectorFactory = factory  # type: ignore[attr-defined]
    parts = plugin.FACTORY_MODULE.split(".")
    for i in range(1, len(parts)):
        monkeypatch.setitem(sys.modules, ".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    monkeypatch.setitem(sys.modules, plugin.FACTORY_MODULE, module)
    monkeypatch.setattr(plugin, "_registered", set())
    return factory


def test_without_vllm_omni_register_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm_omni", None)  # import fails
    assert plugin.register() is False
    assert plugin.register() is False


def test_register_is_idempotent_and_the_factory_builds_the_connector(
    fake_vllm_omni: type[_Factory],
) -> None:
    assert plugin.register() is True
    assert plugin.register() is True  # a second load in the same process
    plugin._registered.clear()  # as if the module were loaded again: the factory raises
    assert plugin.register() is True
    assert fake_vllm_omni.registry == {NAME: CodeclogKafkaConnector}
    connector = fake_vllm_omni.registry[NAME]({"stage_id": 2, "role": "receiver", "topic": "t"})
    assert connector.supports_raw_data is False
    assert connector.health()["role"] == "receiver"
    connector.close()


def test_pyproject_declares_the_entry_point() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    target = project["entry-points"][GROUP]["codeclog_kafka_connector"]
    assert target == "codeclog.omni.plugin:register"
    module, function = target.split(":")
    assert getattr(importlib.import_module(module), function) is plugin.register


@pytest.mark.slow
def test_entry_point_is_found_by_importlib_metadata_after_install(tmp_path: Path) -> None:
    # A --target install of this checkout (the shared venv stays as it is).
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "--target",
            str(tmp_path / "site"),
            str(ROOT),
        ],
        check=True,
        cwd=tmp_path,
        timeout=240,
    )
    found = [
        ep
        for dist in importlib.metadata.distributions(path=[str(tmp_path / "site")])
        for ep in dist.entry_points
        if ep.group == GROUP
    ]
    assert [(ep.name, ep.value) for ep in found] == [
        ("codeclog_kafka_connector", "codeclog.omni.plugin:register")
    ]
    # One top-level package: the root folders are installed under codeclog/ (issue 18)
    site = tmp_path / "site"
    installed = {p.name for p in site.iterdir() if not p.name.endswith(".dist-info")}
    assert installed - {"bin", "__pycache__"} == {"codeclog"}
    assert (site / "codeclog" / "omni" / "plugin.py").is_file()
    assert (site / "codeclog" / "schemas" / "avro" / "payload_envelope.v1.avsc").is_file()
    assert (site / "codeclog" / "vocoder" / "fixtures" / "tiny.safetensors").is_file()
    assert not (site / "codeclog" / "consumers").is_symlink()


def test_the_plugin_connector_and_hook_import_without_torch_or_vllm() -> None:
    code = (
        "import sys, codeclog.omni.plugin, codeclog.omni.connector, codeclog.omni.payload\n"
        "import codeclog.producers.vllm_omni\n"
        "codeclog.omni.plugin.register()\n"
        "assert not {'torch', 'vllm', 'vllm_omni'} & set(sys.modules), sorted(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)


@pytest.mark.parametrize(
    ("installed", "warns"), [("0.30.0", False), ("0.30.2", False), ("0.31.0", True)]
)
def test_another_vllm_omni_release_registers_with_a_warning(
    fake_vllm_omni: type[_Factory],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    installed: str,
    warns: bool,
) -> None:
    monkeypatch.setattr(importlib.metadata, "version", lambda name: installed)
    with caplog.at_level("WARNING", logger="codeclog.omni"):
        assert plugin.register() is True
    assert fake_vllm_omni.registry[NAME] is CodeclogKafkaConnector
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert bool(warnings) is warns
    if warns:
        assert f"vllm-omni {installed}" in warnings[0] and "0.30.x" in warnings[0]


def test_a_chunk_adapter_is_bound_to_its_codeclog_connector_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The adapter class is wrapped once however often the plugin loads; an adapter whose
    connector has `bind_adapter` is handed to it, any other connector is left alone."""

    class Adapter:
        def __init__(self, connector: Any) -> None:
            self.connector = connector

    class Bindable:
        bound: Any = None

        def bind_adapter(self, adapter: Any) -> None:
            self.bound = adapter

    module = types.ModuleType(plugin.ADAPTER_MODULE)
    module.OmniChunkTransferAdapter = Adapter  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, plugin.ADAPTER_MODULE, module)
    assert plugin.bind_adapters() and plugin.bind_adapters()
    wrapped = Adapter.__init__
    assert plugin.bind_adapters() and Adapter.__init__ is wrapped  # not wrapped twice
    connector = Bindable()
    adapter = Adapter(connector)
    assert connector.bound is adapter
    assert Adapter(object()).connector is not None  # no bind_adapter: nothing happens
    monkeypatch.setitem(sys.modules, plugin.ADAPTER_MODULE, None)
    assert plugin.bind_adapters() is False
