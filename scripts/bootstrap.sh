#!/usr/bin/env bash
# Prepare everything `make test` and `make demo` need on a fresh machine, idempotently:
# - a virtual environment kept once per machine (torch from PyPI is a multi-GB CUDA build, so
#   it is installed once, not once per checkout or CI run);
# - codeclog itself in editable mode, with the dev extra whenever pyproject.toml changed;
# - promtool and docker-compose (Debian packages) for validating the alert rules and compose
#   file, qemu-user for the cross-CPU determinism test, and chromium for opening `codeclog
#   report` pages headless in the tests, when running as root on Debian and they are missing.
# The Kafka jars are fetched by `codeclog broker fetch` (called by the test session / demo).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${CODECLOG_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/codeclog/venv}"
python="${PYTHON:-python3}"

need() { command -v "$1" >/dev/null 2>&1 || { echo "bootstrap: '$1' is required but not installed" >&2; exit 1; }; }
need "$python"

if [ ! -x "$venv/bin/python" ]; then
  echo "bootstrap: creating virtual environment $venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
fi

stamp="$venv/.codeclog-deps"
want="$(sha256sum "$here/pyproject.toml" | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "bootstrap: installing codeclog[dev] (first time on this machine: torch is several GB)"
  "$venv/bin/python" -m pip install -q --progress-bar off -e "$here[dev]"
  echo "$want" > "$stamp"
else
  "$venv/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$here" >/dev/null
fi

# The upstream reference implementation for the vocoder parity tests (test-only, no deps).
if ! "$venv/bin/python" -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('stepaudio2') is None)" 2>/dev/null; then
  echo "bootstrap: installing stepaudio2-minicpmo==0.1.1 (parity reference, --no-deps)"
  "$venv/bin/python" -m pip install -q --progress-bar off --no-deps stepaudio2-minicpmo==0.1.1
fi
# The causal HiFT's reference (minicpmo-utils 1.0.7, scheme B). It ships a top-level `stepaudio2`
# package too, so it goes into its own directory (tests/vocoder/reference.py imports it from there,
# or from $CODECLOG_REF_MINICPMO_UTILS) and never replaces the 0.1.1 package above.
ref_causal="${CODECLOG_REF_MINICPMO_UTILS:-${XDG_CACHE_HOME:-$HOME/.cache}/codeclog/ref-minicpmo-utils}"
if [ ! -f "$ref_causal/stepaudio2/causal_vocoder/generator.py" ]; then
  echo "bootstrap: installing minicpmo-utils==1.0.7 into $ref_causal (parity reference, --no-deps)"
  "$venv/bin/python" -m pip install -q --progress-bar off --no-deps --target "$ref_causal" minicpmo-utils==1.0.7
fi

# The vllm-omni environment of the real-package tier (tests/omni/test_vllm_omni_tier.py): built
# as a vllm-omni user builds it, pip resolving vllm-omni 0.30.0 with vllm 0.30.0 (the pair it is
# built for), then codeclog with its dependencies; once per machine (about 9 GB, 5 minutes).
# Python 3.10, the oldest both support, where this machine has it: codeclog runs inside vLLM
# on 3.10 too. The tier reinstalls the checkout's codeclog into it on every run.
omni_venv="${CODECLOG_OMNI_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/codeclog/omni-venv}"
omni_stamp="$omni_venv/.codeclog-omni"
omni_want="vllm-omni==0.30.0 vllm==0.30.0"
if [ "$(cat "$omni_stamp" 2>/dev/null)" != "$omni_want" ]; then
  omni_python=""
  for candidate in python3.10 "$(pyenv root 2>/dev/null)"/versions/3.10*/bin/python3.10; do
    if [ -n "$candidate" ] && "$candidate" -c "import sys; sys.exit(sys.version_info[:2] != (3, 10))" 2>/dev/null; then
      omni_python="$candidate"; break
    fi
  done
  omni_python="${omni_python:-$python}"
  echo "bootstrap: building the vllm-omni environment $omni_venv ($omni_want, $("$omni_python" -V 2>&1); first time on this machine: about 9 GB)"
  rm -rf "$omni_venv"
  "$omni_python" -m venv "$omni_venv"
  "$omni_venv/bin/python" -m pip install -q --upgrade pip
  # shellcheck disable=SC2086
  "$omni_venv/bin/python" -m pip install -q --progress-bar off $omni_want
  "$omni_venv/bin/python" -m pip install -q --progress-bar off "$here" pytest pytest-timeout
  "$omni_venv/bin/python" -m pip check >/dev/null
  echo "$omni_want" > "$omni_stamp"
fi

missing=()
# prometheus (promtool and the server) and prometheus-alertmanager (its binary and amtool): the
# alert rule tests, and the alerting chain run for real (tests/deploy/test_alerting_end_to_end.py)
{ command -v promtool && command -v prometheus; } >/dev/null 2>&1 || missing+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || missing+=(prometheus-alertmanager)
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
# qemu-user: the cross-CPU test decodes under emulated Intel and AMD CPUs (x86-64 hosts only)
if [ "$(uname -m)" = x86_64 ]; then command -v qemu-x86_64 >/dev/null 2>&1 || missing+=(qemu-user); fi
# chromium: the report tests open each page headless (tests/replay/test_report_browser.py)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
# faketime: the clock-skew network fault jumps a member's clock (codeclog.devtools.network_faults)
command -v faketime >/dev/null 2>&1 || missing+=(faketime)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "bootstrap: installing Debian packages: ${missing[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "bootstrap: warning: ${missing[*]} missing (the tests that need them will be skipped)" >&2
  fi
fi
# Toxiproxy: a faultable local cluster's links run through it (codeclog.devtools.links; the
# network-fault tests and `python -m bench.faults`). Built once per machine with Go.
toxiproxy="${XDG_CACHE_HOME:-$HOME/.cache}/codeclog/toxiproxy-2.5.0"
if [ ! -x "$toxiproxy/server" ]; then
  if command -v go >/dev/null 2>&1; then
    echo "bootstrap: building Toxiproxy 2.5.0 into $toxiproxy (go install, first time on this machine)"
    GOBIN="$toxiproxy" GOFLAGS=-mod=mod go install github.com/Shopify/toxiproxy/v2/cmd/server@v2.5.0 >/dev/null
  else
    echo "bootstrap: warning: Go is missing, so Toxiproxy is not built (faultable clusters refuse to start)" >&2
  fi
fi
echo "$venv"
