#!/usr/bin/env bash
# What to run in one short lease of a GPU machine (the device tool), from the repo root:
#   - the kernel tests with compiled Triton kernels (tests/kernels; on CPU they run interpreted),
#   - benchmarks/kernels_gpu.py --quick (checks against the torch reference, then timings),
#   - benchmarks/engine.py on CUDA, fp32, on random weights in SmolLM2-135M's shape with its real
#     tokenizer: GPU machines here cannot reach a model hub and the builtin GGUF is too big to carry.
#     HF continuous batching is left out: its config keywords differ in the GPU image's transformers.
# Needs mcpmux's own dependencies (mcp, pydantic, ...) importable: the GPU image lacks them, so carry
# them as wheels and put them on PYTHONPATH first (see the device tool's README).
#   - benchmarks/engine_profile.py on CUDA: where a decode step's time goes.
# Arguments: TOKENIZER_DIR (config.json + tokenizer files of the converted builtin model), OUT_DIR, and
# optionally the steps to run (default "tests kernels engine profile").
# Every step has its own time limit and log, so one failure still leaves the others' results.
set -u
tok=${1:?tokenizer folder}
out=${2:?output folder}
steps=${3:-tests kernels engine profile}
export PYTHONUNBUFFERED=1
nvidia-smi -L | tee "$out/gpu.txt"
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" | tee -a "$out/gpu.txt"

if [[ $steps == *tests* ]]; then
    timeout 200 python3 -m pytest tests/inference/kernels tests/inference/engine/test_cuda_graphs.py \
        tests/inference/models/test_models.py::test_cuda_forward_equals_hf -q -p no:cacheprovider --timeout 120 >"$out/kernel_tests.log" 2>&1
    echo "kernel tests: exit $?" | tee -a "$out/gpu.txt"
    tail -n 30 "$out/kernel_tests.log"
fi

if [[ $steps == *kernels* ]]; then
    timeout 120 python3 benchmarks/kernels_gpu.py --quick >"$out/kernels_gpu.log" 2>&1
    echo "kernels_gpu: exit $?" | tee -a "$out/gpu.txt"
    cp benchmarks/results/kernels_gpu.json "$out/" 2>/dev/null
    tail -n 40 "$out/kernels_gpu.log"
fi

model=/tmp/smollm2-random
python3 - "$tok" "$model" <<'PY'
import shutil, sys
from pathlib import Path
import torch
from transformers import AutoConfig, AutoModelForCausalLM
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src))
model.save_pretrained(dst)
for f in src.iterdir():
    if f.name != "config.json":
        shutil.copy(f, dst / f.name)
PY
if [[ $steps == *engine* ]]; then
    timeout 180 python3 benchmarks/engine.py --model "$model" --device cuda --dtype float32 \
        --systems hf-static,mcpmux --workloads offline,poisson-32/s,shared-prefix,long-among-short >"$out/engine_gpu.log" 2>&1
    echo "engine on cuda: exit $?" | tee -a "$out/gpu.txt"
    latest=$(ls -t benchmarks/results/engine-*.json 2>/dev/null | head -1); [ -n "$latest" ] && cp "$latest" "$out/engine_gpu.json" && cp "${latest%.json}.png" "$out/engine_gpu.png" 2>/dev/null
    tail -n 25 "$out/engine_gpu.log"
fi

if [[ $steps == *profile* ]]; then
    for graphs in --no-cuda-graphs --cuda-graphs; do
        timeout 120 python3 benchmarks/engine_profile.py --model "$model" --device cuda $graphs \
            >"$out/engine_profile$graphs.log" 2>&1
        echo "engine profile $graphs: exit $?" | tee -a "$out/gpu.txt"
        head -n 9 "$out/engine_profile$graphs.log"
    done
fi
