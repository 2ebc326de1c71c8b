"""docs/paper_runs.md rehearsed: its commands run in order, offline, against a Hugging Face cache of stand-ins.

`drmas_train.testing.standin_hub` fills a fresh $HOME's hub cache with tiny stand-ins under the real repo
ids (each named a stand-in in its README and, for models, its config.json). Every command line of the
guide (`_commands`: code blocks in order, loops expanded) then meets the first rule of `RULES` that
matches it, which says what the rehearsal does with it; the rules are the whole mapping from guide to
rehearsal. A line no rule knows fails the rehearsal, and so does a rule that matches no line, so a step
added, dropped or renamed in the guide must be answered here. Commands run as subprocesses (the real
CLIs) with $HF_HUB_OFFLINE set from the start, in a scratch working folder, where the guide's relative
paths (`idx/`, `runs/`, `export/`) land.

One preset is trained, evaluated and exported: math-2x-qwen3-4b, the preset the guide's first eval and
its export name, and the cheapest (two agents). The other presets' plan lines run where the guide has
them; their training lines are skipped here because tests/train/test_rehearse.py trains each for a step
with its own config, and their eval lines need those runs. The retrieval index is built and served
from the stand-in corpus and encoder, and queried once.
"""

import contextlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from test_paper_guide import _commands

from drmas_envs.testing import SEARCH_SOURCES
from drmas_train.testing.standin_hub import (
    MATH_MEMBERS,
    SEARCH_TRAIN,
    STAND_IN_FIELD,
    build_standin_hub,
    hf_download,
)

pytestmark = pytest.mark.xdist_group("paper_guide")  # one worker builds the module's rehearsal, once

PRESET = "math-2x-qwen3-4b"
SMOKE_SET = {  # appended to the plan and train lines as --set, as the guide says: plan with the --set you train with
    "models.backend": "transformers",  # no GPU and no vLLM: the learner's own weights generate
    "models.device": "cpu",
    "placement.mode": "none",  # this process, one rank, no Ray
    "steps": 1,
    "epochs": "null",
    "rollout.prompts_per_step": 2,
    "rollout.group_size": 2,
    "rollout.max_new_tokens": 8,
    "learner.micro_batch_size": 1,
    "learner.logprob_micro_batch_size": 1,
    "eval.n_problems": 2,  # validation before step 1 stays, on two problems
    "threads": 1,
}
SMOKE = [arg for key, value in SMOKE_SET.items() for arg in ("--set", f"{key}={value}")]
RULES = [  # (the guide's line, matched from its start; what the rehearsal does; arguments appended)
    (r"pip install ", "skip", []),  # the GPU machine's install: this checkout's environment stands in for it
    (r"hf auth login$", "skip", []),  # no token: nothing is downloaded, the stand-ins are not gated
    (r"hf download ", "download", []),  # served from the stand-in cache (`hf_download`)
    (r"(export )?[A-Z_]+=\S+$", "set", []),
    (r"cat ", "bash", []),
    (r"drmas-retrieval build ", "run", []),
    (r"drmas-retrieval serve .* &$", "background", []),
    (r"until curl ", "bash", []),
    (r"drmas-train plan ", "run", SMOKE),
    (rf"drmas-train --preset {PRESET}$", "run", SMOKE),
    (r"drmas-train --preset ", "skip", []),  # tests/train/test_rehearse.py trains each preset for a step
    (r"drmas-train --run-dir \S+ --resume$", "skip", []),  # the one-step run is finished: tests/train/test_resume.py
    (rf"drmas-train eval --checkpoint runs/{PRESET} ", "run", ["--k", "1"]),  # one sample per problem, not 16
    (r"drmas-train eval --checkpoint runs/search", "skip", []),  # runs not trained here
    (rf"drmas-train export runs/{PRESET} ", "run", []),
]
GUIDE_PORT = "8000"


def _rule(line: str) -> tuple[str, str, list[str]]:
    for pattern, action, extra in RULES:
        if re.match(pattern, line):
            return pattern, action, extra
    raise AssertionError(f"docs/paper_runs.md line {line!r} matches no rule of {__name__}.RULES")


def test_every_guide_line_has_a_rule_and_every_rule_a_line():
    used = {_rule(line)[0] for line in _commands()}
    assert not [p for p, _, _ in RULES if p not in used], "a rule matches no line of the guide"


def _expand(text: str, variables: dict[str, str]) -> str:
    """`$NAME` and `${NAME}` from `variables`; one no earlier line set fails."""

    def value(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        assert name in variables, f"${name} is used before any step sets it"
        return variables[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, text)


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


class Rehearsal:
    """The guide's lines run one by one: the variables they set, the outputs they print, the service they start."""

    def __init__(self, home: Path, work: Path):
        self.home, self.work, self.port = home, work, _free_port()
        self.cache = home / ".cache" / "huggingface" / "hub"
        bindir = str(Path(sys.executable).parent)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "DRMAS_", "RAY_"))}
        self.env.update(HOME=str(home), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
        self.env["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
        self.variables = {"HOME": str(home)}
        self.outputs: dict[str, str] = {}
        self.service: subprocess.Popen | None = None
        self.log = None

    def do(self, line: str) -> None:
        _, action, extra = _rule(line)
        line = line.replace(f"--port {GUIDE_PORT}", f"--port {self.port}")
        line = line.replace(f"127.0.0.1:{GUIDE_PORT}", f"127.0.0.1:{self.port}")
        line = _expand(line, self.variables)
        if action == "skip":
            return
        if action == "set":
            name, value = line.removeprefix("export ").split("=", 1)
            self.variables[name] = value
            if line.startswith("export "):
                self.env[name] = value
        elif action == "download":
            hf_download(shlex.split(line)[2:], self.cache)
        elif action == "bash":
            self._run(["bash", "-c", line], line)
        elif action == "background":
            self.log = open(self.work / "service.log", "w")  # noqa: SIM115 (open while the service runs)
            argv = shlex.split(line.removesuffix("&"))
            self.service = subprocess.Popen(
                argv, cwd=self.work, env=self.env, stdout=self.log, stderr=subprocess.STDOUT
            )
        else:
            self._run(shlex.split(line) + extra, line)

    def _run(self, argv: list[str], line: str) -> str:
        """Run one command to its end; fail with its output if it fails, or if the service dies meanwhile."""
        out, err = self.work / "stdout.txt", self.work / "stderr.txt"
        with out.open("w") as stdout, err.open("w") as stderr:
            proc = subprocess.Popen(argv, cwd=self.work, env=self.env, stdout=stdout, stderr=stderr)
            for _ in range(600):  # a hang guard, far above any step's time
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=0.5)
                if proc.returncode is not None or (self.service is not None and self.service.poll() is not None):
                    break
            proc.kill()
            proc.wait()
        why = f"{line!r} exited {proc.returncode}:\n{err.read_text()[-3000:]}{out.read_text()[-2000:]}"
        if self.service is not None and self.service.poll() is not None:
            why += f"\nthe retrieval service died:\n{(self.work / 'service.log').read_text()[-3000:]}"
        assert proc.returncode == 0, why
        self.outputs[line] = out.read_text()
        return self.outputs[line]

    def output(self, prefix: str) -> str:
        return next(out for line, out in self.outputs.items() if line.startswith(prefix))

    def stop(self) -> None:
        if self.service is not None:
            self.service.terminate()
            self.service.wait(timeout=30)
            self.log.close()


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    assert shutil.which("curl"), "the guide's health check needs curl"
    home, work = tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("work")
    repos = build_standin_hub(home / ".cache" / "huggingface" / "hub", tmp_path_factory.mktemp("standins"))
    run = Rehearsal(home, work)
    try:
        for line in _commands():
            run.do(line)
        yield run, repos
    finally:
        run.stop()


@pytest.mark.slow
def test_the_cache_holds_only_stand_ins_under_the_real_ids(rehearsal):
    run, repos = rehearsal
    for repo in repos:
        kind = "datasets" if (run.cache / f"datasets--{repo.replace('/', '--')}").is_dir() else "models"
        (snapshot,) = (run.cache / f"{kind}--{repo.replace('/', '--')}" / "snapshots").iterdir()
        assert (snapshot / "README.md").read_text().startswith(f"STAND-IN for {repo}:")
        if kind == "models":
            assert STAND_IN_FIELD in json.loads((snapshot / "config.json").read_text())


@pytest.mark.slow
def test_the_index_is_built_served_and_answers_from_the_stand_in_corpus(rehearsal):
    run, _ = rehearsal
    assert "recall@3 against exact search" in run.output("drmas-retrieval build")
    assert json.loads(run.output("until curl"))["status"] == "ok"
    query = json.dumps({"queries": ["nq question 1?"], "topk": 3}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{run.port}/retrieve", query, {"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        (hits,) = json.loads(response.read())["result"]
    assert len(hits) == 3 and all(" answer " in hit["contents"] for hit in hits)


@pytest.mark.slow
def test_plan_finds_every_dataset_and_model_in_the_stand_in_cache(rehearsal):
    run, _ = rehearsal
    assert "missing data" not in run.output("drmas-train plan --preset math-2x-qwen3-4b")
    plan = json.loads(run.output("drmas-train plan --preset search-3x-qwen2.5-7b --json"))
    assert not plan["missing_data"] and plan["train_dataset"]["sources"] == SEARCH_TRAIN
    assert plan["eval_dataset"]["size"] == len(SEARCH_SOURCES)  # one stand-in question of each source
    assert all(str(run.cache / "models--Qwen--Qwen2.5-7B") in m["source"] for m in plan["models"])


@pytest.mark.slow
def test_the_run_is_trained_evaluated_and_exported(rehearsal):
    run, _ = rehearsal
    folder = run.work / "runs" / PRESET
    rows = [json.loads(r) for r in (folder / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 1 and (folder / "checkpoints" / "step-000001").is_dir()
    assert "val/avg@1" in rows[0]  # validated before step 1, on math_test_sampled's stand-in
    (train,) = yaml.safe_load((folder / "config.yaml").read_text())["data_provenance"]["train"]["files"]
    assert train["path"].startswith(str(run.home / "drmas-data" / "aaabiao" / "dapo_filter"))  # where step 1 put it
    result = json.loads(run.output(f"drmas-train eval --checkpoint runs/{PRESET}"))
    assert result["k"] == 1 and result["source"].endswith("step-000001")
    assert sorted(result["by_source"]) == sorted(MATH_MEMBERS)
    assert result["n_problems"] == sum(MATH_MEMBERS.values())  # math_test whole: --n-problems exceeds it
    for agent in ("solver", "verifier"):
        config = json.loads((run.work / "export" / PRESET / agent / "config.json").read_text())
        assert config[STAND_IN_FIELD].endswith("standing in for Qwen/Qwen3-4B")
