"""The upstream reference modules (stepaudio2-minicpmo 0.1.1) for the parity tests.

No silent skip: a reference that is really not installed (ModuleNotFoundError naming one of
REFERENCE_PACKAGES itself) skips the test on a developer box but fails it in CI (CI set to
anything but "", "0", "false", "no"); any other ImportError (a broken install, a missing
submodule, an import-time error in upstream code) fails everywhere.

The upstream package `__init__` imports Token2wav and with it torchaudio, s3tokenizer and ONNX;
so its submodules are imported under a bare package object (with the real spec, so later
find_spec calls still work). `flow_matching` imports onnxruntime without using it; a stub stands
in when it is missing.
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import types

import pytest

PACKAGE = "stepaudio2"
# the reference itself and the packages its modules import that are not our dependencies
REFERENCE_PACKAGES = frozenset({PACKAGE, "scipy", "einops"})
INSTALL = "pip install --no-deps stepaudio2-minicpmo==0.1.1 && pip install einops scipy"


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in {"", "0", "false", "no"}


def not_installed(exc: ImportError) -> str | None:
    """The reference package `exc` says is not installed, or None for any other failure."""
    if isinstance(exc, ModuleNotFoundError) and exc.name in REFERENCE_PACKAGES:
        return exc.name
    return None


def _bare_package() -> None:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None:
        raise ModuleNotFoundError(f"No module named {PACKAGE!r}", name=PACKAGE)
    if spec.submodule_search_locations is None:
        raise ImportError(f"{PACKAGE} at {spec.origin} is not a package")
    if not hasattr(sys.modules.get(PACKAGE), "__path__"):
        package = types.ModuleType(PACKAGE)
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        sys.modules[PACKAGE] = package
    if importlib.util.find_spec("onnxruntime") is None and "onnxruntime" not in sys.modules:
        stub = types.ModuleType("onnxruntime")
        stub.__spec__ = importlib.machinery.ModuleSpec("onnxruntime", None)
        sys.modules["onnxruntime"] = stub


def import_reference(*modules: str) -> list[types.ModuleType]:
    """Import upstream submodules (names relative to `stepaudio2.`), or skip / fail as above."""
    try:
        _bare_package()
        return [importlib.import_module(f"{PACKAGE}.{name}") for name in modules]
    except ImportError as exc:
        missing = not_installed(exc)
        if missing is None:
            raise  # broken, not absent: the test fails with the real traceback
        message = f"reference package {missing!r} is not installed ({INSTALL})"
        if in_ci():
            pytest.fail(f"{message}; CI must run the parity tests", pytrace=False)
        pytest.skip(message)


# ---------------------------------------------------------------------------------------------
# minicpmo-utils 1.0.7 (the causal HiFT, scheme B). It also ships a top-level `stepaudio2`
# package, so it is installed into its own directory (scripts/bootstrap.sh:
# `pip install --no-deps --target ~/.cache/codeclog/ref-minicpmo-utils minicpmo-utils==1.0.7`)
# and imported with the `stepaudio2` entries of sys.modules swapped out and back in: the modules
# returned keep working (their own imports are resolved at import time), and the 0.1.1 reference
# above is untouched.

CAUSAL_VERSION = "1.0.7"
CAUSAL_ENV = "CODECLOG_REF_MINICPMO_UTILS"
CAUSAL_INSTALL = (
    f"pip install --no-deps --target ~/.cache/codeclog/ref-minicpmo-utils "
    f"minicpmo-utils=={CAUSAL_VERSION}"
)


def causal_reference_root() -> str:
    default = os.path.join(os.path.expanduser("~"), ".cache", "codeclog", "ref-minicpmo-utils")
    return os.environ.get(CAUSAL_ENV) or default


def _swapped_import(root: str, modules: tuple[str, ...]) -> list[types.ModuleType]:
    folder = os.path.join(root, PACKAGE)
    if not os.path.isfile(os.path.join(folder, "causal_vocoder", "generator.py")):
        raise ModuleNotFoundError(f"No module named {PACKAGE!r} under {root}", name=PACKAGE)
    saved = {k: v for k, v in sys.modules.items() if k == PACKAGE or k.startswith(PACKAGE + ".")}
    for key in saved:
        del sys.modules[key]
    try:
        package = types.ModuleType(PACKAGE)
        package.__path__ = [folder]
        package.__spec__ = importlib.machinery.ModuleSpec(PACKAGE, None, is_package=True)
        package.__spec__.submodule_search_locations = [folder]
        sys.modules[PACKAGE] = package
        return [importlib.import_module(f"{PACKAGE}.{name}") for name in modules]
    finally:
        for key in [k for k in sys.modules if k == PACKAGE or k.startswith(PACKAGE + ".")]:
            del sys.modules[key]
        sys.modules.update(saved)


@functools.cache
def causal_upstream() -> tuple[types.ModuleType, types.ModuleType, types.ModuleType]:
    """(generator, f0_predictor, bounded_vocoder) of the causal reference, imported once per
    session: every test module must use the same classes, or an upstream model built from one
    import fails another import's isinstance checks (BoundedVocoder's)."""
    generator, f0, bounded = import_causal_reference(
        "causal_vocoder.generator", "causal_vocoder.f0_predictor", "causal_vocoder.bounded_vocoder"
    )
    return generator, f0, bounded


def import_causal_reference(*modules: str) -> list[types.ModuleType]:
    """Submodules of minicpmo-utils 1.0.7's `stepaudio2` (e.g. "causal_vocoder.generator"),
    or skip / fail exactly as `import_reference` does."""
    try:
        return _swapped_import(causal_reference_root(), modules)
    except ImportError as exc:
        missing = not_installed(exc)
        if missing is None:
            raise
        message = f"causal reference {missing!r} is not installed ({CAUSAL_INSTALL})"
        if in_ci():
            pytest.fail(f"{message}; CI must run the parity tests", pytrace=False)
        pytest.skip(message)
