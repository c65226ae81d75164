#!/usr/bin/env bash
# The prepared GPU device check (python -m bench.device_check): flow, HiFT A/B and engine at the
# published sizes with random weights. Needs only python3 with torch and numpy and this
# checkout (no install, no network, no Kafka/Java). Finishes in under 8 minutes: the script
# guards its own budget (--budget-s, default 400 s here) and writes partial results, and
# `timeout` kills it at 470 s whatever happens. Results: $OUT (or bench/out)/device_check.{json,md}.
#
#   bench/device_check.sh                 # on the GPU machine
#   bench/device_check.sh --quick --device cpu   # a seconds-long rehearsal anywhere
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python="${PYTHON:-python3}"
export CUBLAS_WORKSPACE_CONFIG="${CUBLAS_WORKSPACE_CONFIG:-:4096:8}"  # deterministic cuBLAS
export TORCHDYNAMO_DISABLE=1
"$python" -c "import torch, numpy" 2>/dev/null || { echo "device_check: needs torch and numpy" >&2; exit 1; }
status=0
timeout 470 "$python" -m bench.device_check --budget-s 400 "$@" || status=$?
out="${OUT:-bench/out}"
for arg in "$@"; do case "$arg" in --out=*) out="${arg#--out=}";; esac; done
[ -f "$out/device_check.md" ] && echo "device_check: wrote $out/device_check.json and .md (exit $status)" >&2
exit "$status"
