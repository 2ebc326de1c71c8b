"""The OpenAI-compatible policy and `drmas-envs eval`.

Two servers, both real HTTP on 127.0.0.1:
- a small scripted chat-completions server defined here (fast; it can fail on purpose, which is how
  retries, timeouts, error messages and bounded concurrency are tested);
- a real `vllm serve` of a tiny model (`vllm_server` in conftest.py): greedy evaluation through HTTP
  gives exactly the replies and avg@k of the same model run in-process by drmas_train's vLLM backend.
"""

import json
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import drmas_envs
from drmas_envs import Parsed, PromptTemplate, Score, Workflow, WorkflowEnv
from drmas_envs.cli import main
from drmas_envs.openai_policy import ChatSampling, OpenAIChatPolicy, OpenAIPolicyError

# -- a workflow whose reward depends only on the reply text ------------------------------------------------


class Parity(Workflow):
    """One `solver` call; the team scores 1 when the reply has an even sum of character codes."""

    roles = ("solver",)
    default_prompts = {"solver": PromptTemplate("You are the Solver.", "Problem: {problem}")}

    def first_role(self):
        return "solver"

    def parse(self, role, text):
        return Parsed(valid=bool(text), value=text)

    def transition(self, role, parsed):
        return None

    def context(self, role):
        return {"problem": self.task["problem"]}

    def score(self):
        text = self.history[-1].text
        return Score(float(sum(map(ord, text)) % 2 == 0), {"reply": text})


PROBLEMS = [
    {"problem": f"What is {a} + {b}?", "source": "even" if a % 2 == 0 else "odd"}
    for a, b in zip(range(12), range(5, 17))
]
drmas_envs.register("test-openai-parity", lambda **kw: WorkflowEnv(Parity, PROBLEMS, **kw), description="test only")


# -- the scripted server ----------------------------------------------------------------------------------


class Script:
    """What the scripted server does; the user message picks the behaviour."""

    def __init__(self):
        self.lock = threading.Lock()
        self.bodies = []
        self.seen = Counter()
        self.in_flight = 0
        self.max_in_flight = 0
        self.delay = 0.0


def _handler(script):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, code, payload, raw=False):
            data = payload if raw else json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            user = body["messages"][-1]["content"]
            with script.lock:
                script.bodies.append(body)
                script.seen[user] += 1
                attempt = script.seen[user]
                script.in_flight += 1
                script.max_in_flight = max(script.max_in_flight, script.in_flight)
            try:
                reply = self._reply(user, attempt, body)
            finally:
                # Out of flight before the reply is written: a client that gets it may send its next
                # request at once, and must not find this one still counted.
                with script.lock:
                    script.in_flight -= 1
            self._send(*reply)

        def _reply(self, user, attempt, body):
            time.sleep(script.delay)
            if user.startswith("FLAKY") and attempt <= int(user.split()[1]):
                return 503, {"error": {"message": "busy"}}
            if user == "SLOW":
                time.sleep(1.0)
            if user == "BAD":
                return 400, {"error": {"message": "this model does not exist", "code": 404}}
            if user == "GARBAGE":
                return 200, b"<html>not json</html>", True
            content = None if user == "NULL" else f"{body['messages'][0]['content']}|{user}"
            choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
            return 200, {"choices": [choice], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}

    return Handler


@pytest.fixture
def scripted():
    script = Script()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(script))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", script
    server.shutdown()
    server.server_close()


def obs(user, system="sys"):
    return {"role": "solver", "system": system, "user": user, "turn": 0}


def test_requests_carry_messages_and_per_agent_sampling(scripted):
    url, script = scripted
    policy = OpenAIChatPolicy(
        url,
        "m",
        sampling=ChatSampling(temperature=0.7, max_tokens=50),
        agent_sampling={"verifier": ChatSampling(temperature=0.0, top_p=0.5, max_tokens=8, stop=("</verify>",))},
        seed=10,
        api_key="k",
    )
    assert policy("solver", [obs("a"), obs("b")]) == ["sys|a", "sys|b"]
    assert policy("verifier", [obs("c", system="v")]) == ["v|c"]
    bodies = sorted(script.bodies, key=lambda b: b["seed"])
    assert [b["seed"] for b in bodies] == [10, 11, 12]
    assert bodies[0]["messages"] == [{"role": "system", "content": "sys"}, {"role": "user", "content": "a"}]
    assert (bodies[0]["temperature"], bodies[0]["max_tokens"], bodies[0]["model"]) == (0.7, 50, "m")
    assert (bodies[2]["temperature"], bodies[2]["top_p"], bodies[2]["stop"]) == (0.0, 0.5, ["</verify>"])
    assert policy.usage.requests == 3 and policy.usage.completion_tokens == 6


def test_a_reply_prefix_is_continued_by_the_server():
    policy = OpenAIChatPolicy("http://127.0.0.1:1/v1", "m")
    body = policy.request_body("verifier", {**obs("check", system="v"), "reply_prefix": "<verify>"})
    assert body["messages"][-1] == {"role": "assistant", "content": "<verify>"}
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    plain = policy.request_body("solver", {**obs("a"), "reply_prefix": ""})
    assert [m["role"] for m in plain["messages"]] == ["system", "user"] and "continue_final_message" not in plain


def test_batches_run_concurrently_within_the_bound(scripted):
    url, script = scripted
    script.delay = 0.2
    with OpenAIChatPolicy(url, "m", max_concurrency=3) as policy:
        out = policy("solver", [obs(str(i)) for i in range(12)])
    assert out == [f"sys|{i}" for i in range(12)]  # in order, whatever order they finished in
    assert 2 <= script.max_in_flight <= 3


def test_retryable_failures_are_retried_then_succeed(scripted):
    url, script = scripted
    policy = OpenAIChatPolicy(url, "m", max_retries=3, backoff=0.01)
    assert policy("solver", [obs("FLAKY 2")]) == ["sys|FLAKY 2"]
    assert script.seen["FLAKY 2"] == 3 and policy.usage.retries == 2


def test_failures_beyond_the_retry_budget_raise(scripted):
    url, script = scripted
    policy = OpenAIChatPolicy(url, "m", max_retries=1, backoff=0.01)
    with pytest.raises(OpenAIPolicyError, match="HTTP 503 after 2 attempts"):
        policy("solver", [obs("FLAKY 5")])
    assert script.seen["FLAKY 5"] == 2


def test_client_errors_are_not_retried_and_name_the_cause(scripted):
    url, script = scripted
    policy = OpenAIChatPolicy(url, "m", max_retries=3, backoff=0.01)
    with pytest.raises(OpenAIPolicyError, match="HTTP 400 after 1 attempts: this model does not exist"):
        policy("solver", [obs("BAD")])
    with pytest.raises(OpenAIPolicyError, match="malformed response"):
        policy("solver", [obs("GARBAGE")])
    assert script.seen["BAD"] == 1


def test_timeouts_are_bounded(scripted):
    url, script = scripted
    policy = OpenAIChatPolicy(url, "m", timeout=0.2, max_retries=1, backoff=0.01)
    with pytest.raises(OpenAIPolicyError, match="no response after 2 attempts"):
        policy("solver", [obs("SLOW")])
    assert script.seen["SLOW"] == 2


def test_a_reply_without_text_is_an_empty_action(scripted):
    url, _ = scripted
    assert OpenAIChatPolicy(url, "m")("solver", [obs("NULL")]) == [""]


def test_evaluate_through_the_policy(scripted):
    url, _ = scripted
    with OpenAIChatPolicy(url, "m", max_concurrency=4) as policy:
        result = drmas_envs.evaluate(policy, "test-openai-parity", k=2)
    expected = [sum(map(ord, f"You are the Solver.|Problem: {p['problem']}")) % 2 == 0 for p in PROBLEMS]
    assert result["avg@2"] == pytest.approx(sum(expected) / len(expected))
    assert 0 < result["avg@2"] < 1
    assert set(result["by_source"]) == {"even", "odd"}


def test_cli_eval_prints_json_and_a_table(scripted, capsys, tmp_path):
    url, _ = scripted
    args = ["eval", "--env", "test-openai-parity", "--base-url", url, "--model", "m", "--k", "3", "--n-problems", "5"]
    assert (
        main([*args, "--json", "--agent", "solver:temperature=0,max_tokens=7", "--output", str(tmp_path / "r.json")])
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["n_problems"] == 5 and "pass@3" in report and "by_source" in report
    assert report["policy"]["agent_sampling"]["solver"]["max_tokens"] == 7
    assert report["usage"]["requests"] == 15
    assert json.loads((tmp_path / "r.json").read_text())["avg@3"] == report["avg@3"]
    assert main(args) == 0
    table = capsys.readouterr().out
    assert "avg@3" in table and "even" in table and "odd" in table


def test_cli_reports_a_dead_server_and_bad_arguments(capsys):
    with socket.socket() as sock:  # a port nobody listens on once this block closes it
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    args = ["eval", "--env", "test-openai-parity", "--base-url", f"http://127.0.0.1:{port}/v1", "--model", "m"]
    assert main([*args, "--k", "1", "--n-problems", "1", "--retries", "0"]) == 1  # the server failed: 1
    assert "no response after 1 attempts" in capsys.readouterr().err
    assert main(["eval", "--env", "no-such-env", "--model", "m"]) == 2
    assert "known ids" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*args, "--agent", "solver:temprature=0"])
    assert "unknown sampling keys" in capsys.readouterr().err


class _NotAModelServer(BaseHTTPRequestHandler):
    """Whatever else holds the port: answers every request with an HTML 404."""

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = b"<html>404 Not Found</html>"
        self.send_response(404)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_cli_exits_1_when_another_server_holds_the_port():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotAModelServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    exe = Path(sys.executable).parent / "drmas-envs"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "drmas_envs.cli"]
    try:
        with socket.socket() as other, pytest.raises(OSError):  # the port really is taken
            other.bind(("127.0.0.1", port))
        url = f"http://127.0.0.1:{port}/v1"
        out = subprocess.run(
            [*cmd, "eval", "--env", "math-1agent", "--base-url", url, "--model", "m"]
            + ["--env-arg", "level=1", "--k", "1", "--n-problems", "1", "--retries", "0"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        server.shutdown()
        server.server_close()
    assert out.returncode == 1, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("drmas-envs eval: the server failed:") and "404" in lines[0]


def test_console_script_lists_the_envs():
    exe = Path(sys.executable).parent / "drmas-envs"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "drmas_envs.cli"]
    out = subprocess.run([*cmd, "list"], capture_output=True, text=True, timeout=120, check=True).stdout
    assert "math-2agent:" in out and "math-1agent:" in out


# -- a real vllm serve against the in-process vLLM backend ----------------------------------------------


def _in_process_policy(backend, max_new_tokens):
    """The same model in-process: chat template -> token ids -> drmas_train's vLLM backend, greedy."""
    from drmas_train.engines.base import SamplingParams

    def policy(agent, observations):
        prompts = [
            backend.tokenizer.apply_chat_template(
                [{"role": "system", "content": o["system"]}, {"role": "user", "content": o["user"]}],
                add_generation_prompt=True,
                tokenize=False,
            )
            for o in observations
        ]
        ids = [backend.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        sampling = [SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)] * len(ids)
        return [g.text for g in backend.generate(ids, sampling)]

    return policy


def _recording(policy, log):
    def wrapped(agent, observations):
        out = policy(agent, observations)
        log.extend((agent, o["user"], a) for o, a in zip(observations, out))
        return out

    return wrapped


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_serve_gives_the_in_process_results_exactly(vllm_server, vllm_served_model):
    backend_mod = pytest.importorskip("drmas_train.engines.vllm_backend")
    from drmas_train.config import EngineConfig

    backend = backend_mod.VLLMBackend(vllm_served_model, EngineConfig(max_model_len=2048, kv_cache_gib=0.125))
    served = OpenAIChatPolicy(vllm_server, "tiny", sampling=ChatSampling(temperature=0.0, max_tokens=24))
    try:
        for env_id, kwargs in [("test-openai-parity", {}), ("math-2agent", {"level": 1, "n_per_level": 20})]:
            http_log, local_log = [], []
            a = drmas_envs.evaluate(_recording(served, http_log), env_id, k=2, n_problems=8, **kwargs)
            b = drmas_envs.evaluate(
                _recording(_in_process_policy(backend, 24), local_log), env_id, k=2, n_problems=8, **kwargs
            )
            assert a == b
            assert sorted(http_log) == sorted(local_log)
            assert len({reply for _, _, reply in http_log}) > 1  # the replies differ by prompt
            if env_id == "test-openai-parity":
                assert 0 < a["avg@2"] < 1  # so equal avg@k is not a trivial 0 == 0
    finally:
        served.close()
        backend.close()


@pytest.mark.vllm
@pytest.mark.slow
def test_cli_eval_against_vllm_serve(vllm_server, capsys):
    args = ["eval", "--env", "math-2agent", "--base-url", vllm_server, "--model", "tiny", "--k", "2"]
    args += ["--n-problems", "3", "--temperature", "1.0", "--max-tokens", "16", "--env-arg", "level=1", "--json"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["n_problems"] == 3 and 0.0 <= report["avg@2"] <= report["pass@2"] <= 1.0
    assert report["usage"]["requests"] >= 6 and report["usage"]["completion_tokens"] > 0
