"""A search run whose retrieval service goes down: one line naming the service, a non-zero exit, and the
last checkpoint intact; `drmas-train eval` against a service that is down: one line naming it.

A real `drmas-retrieval serve` process on loopback serves the generated world's passages; a real
`drmas-train` process trains search-2agent against it with a checkpoint every step. Once a checkpoint
exists the service is killed (SIGKILL, as a crash or a lost node would take it).
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from drmas_envs.search.retrievers import get_retriever
from drmas_envs.search.world import generate_world
from drmas_train.run.checkpoint import latest_checkpoint, load_checkpoint

pytestmark = pytest.mark.slow


@pytest.fixture
def service(tmp_path):
    """A `drmas-retrieval serve` process (BM25 over the world's passages) and its URL."""
    corpus = tmp_path / "world.jsonl"
    with corpus.open("w") as fh:
        for pid, title, text in generate_world().passages:
            fh.write(json.dumps({"id": pid, "title": title, "text": text}) + "\n")
    index = tmp_path / "index"
    get_retriever("bm25", str(corpus), index_dir=str(index))  # builds the index folder `serve` reads
    cli = [sys.executable, "-c", "from drmas_retrieval.cli import main; main()"]
    proc = subprocess.Popen(
        [*cli, "serve", "--index", str(index), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    found = None
    try:
        lines = []
        for line in proc.stdout:  # "serving ... at URL" once the socket is bound
            lines.append(line)
            found = re.search(r"serving .* at (http://127\.0\.0\.1:\d+)", line)
            if found:
                break
        assert found, "".join(lines)
        yield proc, found.group(1)
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_a_service_outage_ends_the_run_with_one_line_and_its_checkpoint_intact(service, tmp_path):
    server, url = service
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "drmas_train", "--preset", "cpu-search", "--run-dir", str(run), "--steps", "200"]
    tiny = {
        "models.name": "tiny-math",
        "models.backend": "transformers",
        "threads": 1,
        "rollout.prompts_per_step": 2,
        "rollout.group_size": 2,
        "eval.every": 0,
        "eval.before_train": "false",
        "log.checkpoint_every": 1,
        "env.kwargs.retriever": url,
        "env.kwargs.retries": 1,
        # The Search agent's reply opens with a whole query, written for it (the tiny model writes no tag of
        # its own): every episode asks the service.
        "env.kwargs.open_tags": "false",
        "env.kwargs.prompts": '{search: {system: S, user: "{question}", reply_prefix: "<search>city</search>"}}',
    }
    for key, value in tiny.items():
        argv += ["--set", f"{key}={value}"]
    env = {**os.environ, "COLUMNS": "80"}  # a narrow terminal: the error must still be one line
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 300
        while latest_checkpoint(run / "checkpoints") is None:
            if proc.poll() is not None:
                pytest.fail(f"the run ended before its first checkpoint:\n{proc.stderr.read()[-3000:]}")
            assert time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.1)
        os.kill(server.pid, signal.SIGKILL)
        server.wait(timeout=30)
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 4, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert "Traceback" not in stderr
    assert last.startswith(f"error: retrieval service at {url}/retrieve failed after 2 attempts"), last
    found = re.search(r"the last complete checkpoint is step (\d+): --resume continues", last)
    assert found, last

    folder = latest_checkpoint(run / "checkpoints")
    ckpt = load_checkpoint(folder)
    assert ckpt["state"]["step"] == int(found.group(1)) < 200
    assert ckpt["weights"] and ckpt["learners"]
    # the step the outage cut short left no checkpoint of its own and no trained row
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in rows) == ckpt["state"]["step"]


def test_eval_against_a_service_that_is_down_is_one_line_naming_it():
    with socket.socket() as s:  # a loopback port bound but never listening: every connection is refused
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        argv = [sys.executable, "-m", "drmas_train", "eval", "--model", "tiny-math", "--env", "search-2agent"]
        argv += ["--backend", "transformers", "--threads", "1", "--k", "1", "--n-problems", "2", "--no-greedy"]
        for key, value in {
            "env.kwargs.retriever": url,
            "env.kwargs.retries": 0,
            "env.kwargs.open_tags": "false",
            "env.kwargs.prompts": '{search: {system: S, user: "{question}", reply_prefix: "<search>city</search>"}}',
        }.items():
            argv += ["--set", f"{key}={value}"]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "80"})
    assert out.returncode == 4, out.stderr[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: retrieval service at {url}/retrieve failed after 1 attempts"), last
    assert "Traceback" not in out.stderr and out.stdout == ""
