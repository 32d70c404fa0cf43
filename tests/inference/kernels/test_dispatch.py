"""Backend selection: MCPMUX_KERNELS, set_backend(), and the errors a user sees when it cannot work."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import mcpmux.inference.kernels as kernels
from mcpmux.inference.errors import InvalidSettingError
from mcpmux.inference.kernels import cpu_fused

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _no_override() -> Iterator[None]:
    kernels.set_backend(None)
    yield
    kernels.set_backend(None)


def test_auto_uses_torch_on_cpu_and_triton_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MCPMUX_KERNELS", raising=False)
    assert kernels.backend(torch.zeros(1)) == "torch"
    if torch.cuda.is_available():
        assert kernels.backend(torch.zeros(1, device="cuda")) == "triton"


def test_env_var_is_read_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.zeros(1)
    monkeypatch.setenv("MCPMUX_KERNELS", "triton")
    assert kernels.backend(x) == "triton"
    monkeypatch.setenv("MCPMUX_KERNELS", " Torch ")
    assert kernels.backend(x) == "torch"


def test_set_backend_overrides_env_until_cleared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCPMUX_KERNELS", "triton")
    kernels.set_backend("torch")
    assert kernels.backend(torch.zeros(1)) == "torch"
    kernels.set_backend(None)
    assert kernels.backend(torch.zeros(1)) == "triton"


def test_unknown_backend_names_the_source_and_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCPMUX_KERNELS", "cuda")
    with pytest.raises(ValueError, match=r"'cuda' from the MCPMUX_KERNELS environment variable.*auto, triton, torch"):
        kernels.backend(torch.zeros(1))
    with pytest.raises(ValueError, match=r"set_backend\(\)"):
        kernels.set_backend("fast")


def test_torch_backend_computes_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCPMUX_KERNELS", "torch")
    x = torch.randn(2, 8)
    out = kernels.rms_norm(x, torch.ones(8), 1e-6)
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out.pow(2).mean(-1), torch.ones(2), atol=1e-4, rtol=1e-4)


def test_forcing_triton_on_cpu_without_interpreter_says_how_to_fix() -> None:
    # A fresh process without TRITON_INTERPRET: the state every user starts in.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["MCPMUX_KERNELS"] = "triton"
    code = (
        "import torch, mcpmux.inference.kernels as k\n"
        "try:\n"
        "    k.rms_norm(torch.randn(2, 8), torch.ones(8), 1e-6)\n"
        "except RuntimeError as e:\n"
        "    print(e)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=True
    )
    assert "TRITON_INTERPRET=1" in run.stdout
    assert "MCPMUX_KERNELS=torch" in run.stdout


def test_fused_cpu_kernels_default_to_the_builtin_models_and_a_bad_setting_says_what_is_expected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(cpu_fused.ENV_VAR, raising=False)
    assert cpu_fused.wanted(builtin=True)
    assert not cpu_fused.wanted(builtin=False)
    monkeypatch.setenv(cpu_fused.ENV_VAR, "Fused")
    assert cpu_fused.wanted(builtin=False)
    monkeypatch.setenv(cpu_fused.ENV_VAR, "torch")
    assert not cpu_fused.wanted(builtin=True)
    monkeypatch.setenv(cpu_fused.ENV_VAR, "fast")
    with pytest.raises(InvalidSettingError, match="expected one of auto, fused, torch"):
        cpu_fused.wanted(builtin=True)
