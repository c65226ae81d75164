"""When the parity tests' upstream reference may skip, and when its absence or breakage fails."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.vocoder import reference


def _missing(error: ImportError, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail() -> None:
        raise error

    monkeypatch.setattr(reference, "_bare_package", fail)


@pytest.mark.parametrize("package", sorted(reference.REFERENCE_PACKAGES))
def test_a_reference_package_not_installed_skips_outside_ci(
    package: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CI", raising=False)
    _missing(ModuleNotFoundError(f"No module named {package!r}", name=package), monkeypatch)
    with pytest.raises(pytest.skip.Exception, match=package):
        reference.import_reference("flashcosyvoice.modules.hifigan")


@pytest.mark.parametrize("value", ["true", "1", "yes"])
def test_a_reference_package_not_installed_fails_in_ci(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", value)
    _missing(ModuleNotFoundError("No module named 'stepaudio2'", name="stepaudio2"), monkeypatch)
    with pytest.raises(pytest.fail.Exception, match="CI must run the parity tests"):
        reference.import_reference("flashcosyvoice.modules.hifigan")


@pytest.mark.parametrize(
    "error",
    [
        # the package is there but a submodule is not: a broken or different install
        ModuleNotFoundError("No module named 'stepaudio2.x'", name="stepaudio2.flashcosyvoice"),
        # something upstream imports that the bare-package import was meant to avoid
        ModuleNotFoundError("No module named 'torchaudio'", name="torchaudio"),
        ImportError("cannot import name 'SineGen2'"),
    ],
    ids=["missing-submodule", "other-package", "import-error"],
)
@pytest.mark.parametrize("ci", ["", "true"])
def test_any_other_import_error_fails_everywhere(
    error: ImportError, ci: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", ci)
    _missing(error, monkeypatch)
    with pytest.raises(ImportError) as raised:
        reference.import_reference("flashcosyvoice.modules.hifigan")
    assert raised.value is error


def test_the_installed_reference_imports() -> None:
    """Where the reference is installed, every module the parity tests use imports."""
    modules = reference.import_reference(
        "flashcosyvoice.modules.hifigan",
        "cosyvoice2.flow.flow",
        "cosyvoice2.flow.flow_matching",
        "cosyvoice2.flow.decoder_dit",
        "cosyvoice2.transformer.upsample_encoder_v2",
    )
    assert hasattr(modules[0], "HiFTGenerator")


# -- the causal reference (minicpmo-utils 1.0.7, in its own directory) --------------------------


@pytest.mark.parametrize(
    ("ci", "outcome"), [("", pytest.skip.Exception), ("true", pytest.fail.Exception)]
)
def test_a_missing_causal_reference_directory_skips_outside_ci_and_fails_in_it(
    ci: str, outcome: type[BaseException], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", ci)
    monkeypatch.setenv(reference.CAUSAL_ENV, str(tmp_path / "absent"))
    with pytest.raises(outcome, match=r"minicpmo-utils==1\.0\.7"):
        reference.import_causal_reference("causal_vocoder.generator")


def test_a_broken_causal_reference_fails_everywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "stepaudio2" / "causal_vocoder"
    folder.mkdir(parents=True)
    (folder / "generator.py").write_text("import stepaudio2.not_there\n")
    monkeypatch.setenv("CI", "")
    monkeypatch.setenv(reference.CAUSAL_ENV, str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="not_there"):
        reference.import_causal_reference("causal_vocoder.generator")


def test_the_causal_reference_leaves_the_scheme_a_reference_in_place() -> None:
    """Both ship `stepaudio2`: importing 1.0.7's swaps sys.modules out and back, so the 0.1.1
    modules stay importable and are the ones `stepaudio2` names afterwards."""
    before = reference.import_reference("flashcosyvoice.modules.hifigan")[0]
    causal = reference.import_causal_reference("causal_vocoder.generator")[0]
    assert hasattr(causal, "CausalHiFTGenerator")
    assert sys.modules["stepaudio2.flashcosyvoice.modules.hifigan"] is before
    assert "stepaudio2.causal_vocoder.generator" not in sys.modules
