#!/usr/bin/env bash
# Prepare what `make demo` (bootstrap.sh demo) or `make test` (bootstrap.sh test, the default)
# needs on a fresh machine, idempotently, one line per step with roughly how long it takes.
# Each step's output goes to $log; a step that fails prints its last lines and the log's path.
#
# demo: a virtual environment kept once per machine (torch from PyPI is a multi-GB CUDA build,
#       so it is installed once, not once per checkout or CI run) with codeclog and the demo's
#       extras (the vocoder, the plot). The Kafka jars come later, from `codeclog broker fetch`
#       (the demo and the test session call it).
# test: all of demo, then the dev extra (pytest, ruff, mypy, ...), the parity references, the
#       vllm-omni environment of the real-package tier (about 9 GB), Debian's prometheus,
#       alertmanager, docker-compose, qemu-user, chromium and faketime, and Toxiproxy (Go).
set -euo pipefail
target="${1:-test}"
case "$target" in demo|test) ;; *) echo "usage: bootstrap.sh [demo|test]" >&2; exit 2 ;; esac
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/codeclog"
venv="${CODECLOG_VENV:-$cache/venv}"
python="${PYTHON:-python3}"
mkdir -p "$cache"
log="$cache/bootstrap.log"
: > "$log"

say() { echo "bootstrap: $*" >&2; }
# step "what (about how long)" command...: runs it with its output in $log; on failure, shows it
step() {
  local what="$1"; shift
  say "$what"
  local started=$SECONDS
  if ! "$@" >>"$log" 2>&1; then
    say "failed: $what; the last lines of $log:"
    tail -n 30 "$log" >&2
    exit 1
  fi
  if (( SECONDS - started >= 20 )); then say "  done in $((SECONDS - started)) s"; fi
}
need() { command -v "$1" >/dev/null 2>&1 || { say "'$1' is required but not installed"; exit 1; }; }
need "$python"

if [ ! -x "$venv/bin/python" ]; then
  step "creating the virtual environment $venv (a few seconds)" "$python" -m venv "$venv"
  step "upgrading pip (a few seconds)" "$venv/bin/python" -m pip install -q --upgrade pip
fi

# codeclog itself, with the extras the target needs, whenever pyproject.toml changed
extras="demo"; [ "$target" = test ] && extras="dev"
stamp="$venv/.codeclog-deps-$extras"
want="$(sha256sum "$here/pyproject.toml" | cut -d' ' -f1)"
# the dev extra holds the demo's: a test environment serves the demo as it is
if [ "$(cat "$venv/.codeclog-deps-dev" 2>/dev/null)" = "$want" ]; then stamp="$venv/.codeclog-deps-dev"; fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  step "installing codeclog[$extras] (first time on this machine: torch, about 3 GB, 1-3 min)" \
    "$venv/bin/python" -m pip install -q --progress-bar off -e "$here[$extras]"
  echo "$want" > "$stamp"
else
  step "linking this checkout into the environment (a few seconds)" \
    "$venv/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$here"
fi
if [ "$target" = demo ]; then
  echo "$venv"
  exit 0
fi

# The upstream reference implementation for the vocoder parity tests (test-only, no deps).
if ! "$venv/bin/python" -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('stepaudio2') is None)" 2>/dev/null; then
  step "installing stepaudio2-minicpmo==0.1.1, the parity reference (--no-deps, seconds)" \
    "$venv/bin/python" -m pip install -q --progress-bar off --no-deps stepaudio2-minicpmo==0.1.1
fi
# The causal HiFT's reference (minicpmo-utils 1.0.7, scheme B). It ships a top-level `stepaudio2`
# package too, so it goes into its own directory (tests/vocoder/reference.py imports it from there,
# or from $CODECLOG_REF_MINICPMO_UTILS) and never replaces the 0.1.1 package above.
ref_causal="${CODECLOG_REF_MINICPMO_UTILS:-$cache/ref-minicpmo-utils}"
if [ ! -f "$ref_causal/stepaudio2/causal_vocoder/generator.py" ]; then
  step "installing minicpmo-utils==1.0.7 into $ref_causal (parity reference, seconds)" \
    "$venv/bin/python" -m pip install -q --progress-bar off --no-deps --target "$ref_causal" minicpmo-utils==1.0.7
fi

# The vllm-omni environment of the real-package tier (tests/omni/test_vllm_omni_tier.py): built
# as a vllm-omni user builds it, pip resolving vllm-omni 0.30.0 with vllm 0.30.0 (the pair it is
# built for), then codeclog with its dependencies; once per machine (about 9 GB, 5 minutes).
# On Python 3.12, the one Python upstream runs its CI on: on 3.10 the package's serving layer
# does not import (vllm_omni/engine/duplex/commands.py:84, "multiple bases have instance lay-out
# conflict"; docs/vllm-omni.md, "Versions"). $CODECLOG_OMNI_PYTHON names another interpreter.
# The stamp names the Python too, so an environment built on another one is built again. The
# tier reinstalls the checkout's codeclog into it on every run.
omni_venv="${CODECLOG_OMNI_VENV:-$cache/omni-venv}"
omni_stamp="$omni_venv/.codeclog-omni"
omni_pkgs="vllm-omni==0.30.0 vllm==0.30.0"
omni_want="$omni_pkgs on Python 3.12"
if [ "$(cat "$omni_stamp" 2>/dev/null)" != "$omni_want" ]; then
  omni_python="${CODECLOG_OMNI_PYTHON:-}"
  if [ -z "$omni_python" ]; then
    for candidate in python3.12 "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12; do
      if [ -n "$candidate" ] && "$candidate" -c "import sys; sys.exit(sys.version_info[:2] != (3, 12))" 2>/dev/null; then
        omni_python="$candidate"; break
      fi
    done
  fi
  if [ -z "$omni_python" ]; then
    say "the vllm-omni environment needs Python 3.12 (python3.12 on PATH, pyenv's 3.12, or"
    say "\$CODECLOG_OMNI_PYTHON): e.g. 'pyenv install 3.12', then run this again"
    exit 1
  fi
  rm -rf "$omni_venv"
  step "creating the vllm-omni environment $omni_venv ($("$omni_python" -V 2>&1))" \
    "$omni_python" -m venv "$omni_venv"
  step "upgrading its pip (a few seconds)" "$omni_venv/bin/python" -m pip install -q --upgrade pip
  # shellcheck disable=SC2086
  step "installing $omni_pkgs into it (first time on this machine: about 9 GB, 5 min)" \
    "$omni_venv/bin/python" -m pip install -q --progress-bar off $omni_pkgs
  step "installing codeclog and pytest into it (a minute)" \
    "$omni_venv/bin/python" -m pip install -q --progress-bar off "$here" pytest pytest-timeout
  step "checking its dependencies (seconds)" "$omni_venv/bin/python" -m pip check
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
    step "updating Debian's package lists (seconds)" apt-get update -qq
    step "installing Debian packages: ${missing[*]} (1-2 min)" \
      env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  else
    say "warning: ${missing[*]} missing (the tests that need them will be skipped)"
  fi
fi
# Toxiproxy: a faultable local cluster's links run through it (codeclog.devtools.links; the
# network-fault tests and `python -m bench.faults`). Built once per machine with Go.
toxiproxy="$cache/toxiproxy-2.5.0"
if [ ! -x "$toxiproxy/server" ]; then
  if command -v go >/dev/null 2>&1; then
    step "building Toxiproxy 2.5.0 into $toxiproxy (go install, about a minute)" \
      env GOBIN="$toxiproxy" GOFLAGS=-mod=mod go install github.com/Shopify/toxiproxy/v2/cmd/server@v2.5.0
  else
    say "warning: Go is missing, so Toxiproxy is not built (faultable clusters refuse to start)"
  fi
fi
echo "$venv"
