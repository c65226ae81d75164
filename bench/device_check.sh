#!/usr/bin/env bash
# The prepared GPU device check (python -m bench.device_check): flow, HiFT A/B and engine at the
# published sizes with random weights. Needs only python3 with torch and numpy and this
# checkout (no install, no network, no Kafka/Java). Finishes in under 8 minutes: the script
# guards its own budget (--budget-s, default 400 s here) and writes partial results, and
# `timeout` kills it at 470 s whatever happens. Results: $OUT (or bench/out)/device_check.{json,md}.
#
#   bench/device_check.sh                 # on the GPU machine
#   bench/device_check.sh --quick --device cpu   # a seconds-long rehearsal anywhere
#
# The peer comparison (issue 53, bench/bench_vs_vllm_omni.py) instead, when the first argument is
# --vs-vllm-omni: codeclog against vllm-omni 0.30's own BatchedToken2Wav with its HiFT and DiT CUDA
# graphs, published sizes, b = 1, 4, 16, in under 6 minutes (`timeout` at 360 s). It needs an
# environment with vllm-omni 0.30 and minicpmo-utils 1.0.7 (scripts/bootstrap.sh's omni venv and
# ~/.cache/codeclog/ref-minicpmo-utils): PEER_PYTHON names its python (default: $PYTHON). Its
# report goes to $OUT (or bench/out)/vs_vllm_omni.md; the remaining arguments are the bench's.
# Its `codeclog invariant` row is a batch-invariant CUDA engine: the flow's GEMMs over fixed tiles
# of CUDA_GEMM_TILE rows (vocoder/flow/stable.py; printed before the run and in its settings).
#
#   PEER_PYTHON=~/.cache/codeclog/omni-venv/bin/python bench/device_check.sh --vs-vllm-omni
#   PEER_PYTHON=... bench/device_check.sh --vs-vllm-omni --device cpu --quick   # rehearsal
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python="${PYTHON:-python3}"
export CUBLAS_WORKSPACE_CONFIG="${CUBLAS_WORKSPACE_CONFIG:-:4096:8}"  # deterministic cuBLAS
if [ "${1:-}" = "--vs-vllm-omni" ]; then
  shift
  peer_python="${PEER_PYTHON:-$python}"
  out="${OUT:-bench/out}"
  mkdir -p "$out"
  "$peer_python" -c "import vllm_omni" 2>/dev/null || {
    echo "device_check: vllm-omni is not importable by $peer_python (set PEER_PYTHON)" >&2; exit 1; }
  tile=$("$peer_python" -c "from codeclog.vocoder.flow.stable import CUDA_GEMM_TILE as t; print(t)")
  echo "device_check: GEMM tile for CUDA (batch-invariant engines): $tile rows" >&2
  exec timeout 360 "$peer_python" -m bench.bench_vs_vllm_omni --device cuda --spec full \
    --batches 1,4,16 --windows 3 --rounds 2 --codeclog ragged,invariant \
    --out "$out/vs_vllm_omni.md" "$@"
fi
export TORCHDYNAMO_DISABLE=1
"$python" -c "import torch, numpy" 2>/dev/null || { echo "device_check: needs torch and numpy" >&2; exit 1; }
status=0
timeout 470 "$python" -m bench.device_check --budget-s 400 "$@" || status=$?
out="${OUT:-bench/out}"
for arg in "$@"; do case "$arg" in --out=*) out="${arg#--out=}";; esac; done
[ -f "$out/device_check.md" ] && echo "device_check: wrote $out/device_check.json and .md (exit $status)" >&2
exit "$status"
