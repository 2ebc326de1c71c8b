"""`--preset smoke` end to end: shared, per-agent and per-agent-LoRA teams, search-3agent, ids, logs."""

import json

import pytest
import torch

from drmas_train.config import build_config
from drmas_train.learner import ppo as learner_mod
from drmas_train.run.trainer import Trainer


def _smoke(tmp_path, **overrides):
    cfg = build_config("smoke", {"log.run_dir": str(tmp_path / "run"), **overrides})
    return cfg, Trainer(cfg)


def _snapshot(trainer):
    return {name: {n: p.detach().clone() for n, p in policy.trainable()} for name, policy in trainer.policies.items()}


def _changed(before, trainer):
    out = {}
    for name, policy in trainer.policies.items():
        now = dict(policy.trainable())
        out[name] = any(not torch.equal(before[name][n], now[n]) for n in before[name])
    return out


@pytest.mark.parametrize(
    "assignment, models",
    [("shared", ["shared"]), ("per_agent", ["solver", "verifier"]), ("lora", ["solver", "verifier"])],
)
def test_smoke_math_2agent(tmp_path, assignment, models):
    cfg, trainer = _smoke(tmp_path, **{"models.assignment": assignment, "steps": 2})
    assert sorted(trainer.policies) == sorted(models)
    before = _snapshot(trainer)
    rows = trainer.train()
    assert [r["step"] for r in rows] == [1, 2]
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [0, 1, 2]  # step 0: the validation before training
    assert all(k.startswith("val/") or k in ("step", "time/validate") for k in logged[0])
    logged = logged[1:]
    for row in logged:
        for m in models:
            assert f"grad_norm/{m}" in row
        for agent in ("solver", "verifier"):
            assert f"reward/{agent}" in row and f"adv/{agent}/sq_mean" in row
        assert row["mem/peak_rss_mb"] > 0 and row["time/step"] > 0
        assert row["mem/process/0/peak_rss_mb"] > 0 and "mem/process/0/peak_device_gib" not in row  # no GPU
        # grading failures are counted every step, never folded into wrong answers (generated sums: none)
        assert row["grade/errors"] == 0 and row["grade/over_budget"] == 0 and "grade/checks" in row
    for m in models:  # every model got a real gradient at least once, and its weights moved
        assert max(r[f"grad_norm/{m}"] for r in logged) > 0
    assert all(_changed(before, trainer).values())
    if assignment == "lora":  # the frozen base did not move
        base = [p for n, p in trainer.policies["solver"].module.named_parameters() if "lora_" not in n]
        assert not any(p.requires_grad for p in base)
    run = tmp_path / "run"
    assert (run / "config.yaml").is_file() and list((run / "tb").iterdir())
    assert [p.name for p in sorted((run / "checkpoints").iterdir())] == ["step-000001", "step-000002"]
    traj = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    call = traj[0]["calls"][0]
    assert call["agent"] == "solver" and "Problem" in call["user"] and isinstance(call["advantage"], float)


def test_ids_trained_equal_ids_sampled_every_turn(tmp_path, monkeypatch):
    # A malformed verdict counts as a rejection, so most episodes run Solver -> Verifier -> Solver.
    # Validation off: its generations are not trained on.
    no_val = {"eval.every": 0, "eval.before_train": False}
    cfg, trainer = _smoke(tmp_path, **{"env.kwargs.missing_verdict": "reject", "steps": 1, **no_val})
    sampled = []
    policy = trainer.policies["shared"]
    generate = policy.backend.generate

    def spy_generate(prompts, sampling, **kw):
        gens = generate(prompts, sampling, **kw)
        sampled.extend((tuple(g.prompt_ids), tuple(g.response_ids)) for g in gens)
        return gens

    trained = []
    score = learner_mod.score  # the learner's forward (plain rows or a prefix tree): the ids it runs

    def spy_score(model, records, **kw):
        trained.extend((tuple(r.prompt_ids), tuple(r.response_ids)) for r in records)
        return score(model, records, **kw)

    monkeypatch.setattr(policy.backend, "generate", spy_generate)
    monkeypatch.setattr(learner_mod, "score", spy_score)
    trainer.train()
    assert sorted(trained) == sorted(s for s in sampled if s[1])  # empty responses carry no tokens
    # Every episode makes a Solver and a Verifier call; more calls than that means third turns happened,
    # whose prompts hold earlier turns' text, yet were trained on the engine's ids, not a re-encoding.
    assert len(sampled) > 2 * cfg.rollout.prompts_per_step * cfg.rollout.group_size


def test_next_batch_is_the_batch_the_next_step_trains_on(tmp_path, monkeypatch):
    _, trainer = _smoke(tmp_path, **{"steps": 1, "eval.every": 0, "eval.before_train": False})
    peek = trainer.next_batch()
    assert (trainer.step, trainer.cursor) == (0, 0)  # a look, not a step
    trained = []
    score = learner_mod.score

    def spy_score(model, records, **kw):
        trained.extend((tuple(r.prompt_ids), tuple(r.response_ids)) for r in records)
        return score(model, records, **kw)

    monkeypatch.setattr(learner_mod, "score", spy_score)
    trainer.train()
    assert trained and sorted(trained) == sorted(
        (tuple(r.prompt_ids), tuple(r.response_ids)) for r in peek.records if r.response_ids
    )


def test_rewards_follow_final_infos(tmp_path):
    cfg, trainer = _smoke(tmp_path, **{"agents.verifier.format_penalty": 0.5, "steps": 1})
    from drmas_train.rollout import rollout

    batch = rollout(trainer.envs, [0, 1], cfg.rollout.group_size, trainer.serving, trainer.sampling, seed=3)
    for rec in batch.records:
        team = batch.episodes[rec.episode_id].info["team_reward"]
        penalty = {"solver": 0.1, "verifier": 0.5}[rec.agent]
        assert rec.reward == pytest.approx(team - (0 if rec.valid else penalty))
    for e, ep in enumerate(batch.episodes):
        mine = [r for r in batch.records if r.episode_id == e]
        assert [c["agent"] for c in ep.info["calls"]] == [r.agent for r in mine]
        assert [r.turn for r in mine] == list(range(len(mine)))
        assert {r.group_id for r in mine} == {e // cfg.rollout.group_size}


def test_smoke_search_3agent(tmp_path):
    cfg, trainer = _smoke(tmp_path, **{"env.id": "search-3agent", "models.assignment": "per_agent", "steps": 1})
    assert sorted(trainer.policies) == ["answer", "search", "verifier"]
    row = trainer.train()[0]
    for agent in ("verifier", "search", "answer"):
        assert f"grad_norm/{agent}" in row and f"reward/{agent}" in row


def test_smoke_heterogeneous_architectures_and_tokenizers(tmp_path):
    overrides = {"models.assignment": "heterogeneous", "models.per_agent_names": {"verifier": "tiny-qwen2"}}
    cfg, trainer = _smoke(tmp_path, **overrides, steps=1)
    solver, verifier = trainer.policies["solver"], trainer.policies["verifier"]
    assert solver.module.config.model_type == "llama" and verifier.module.config.model_type == "qwen2"
    assert len(solver.tokenizer) != len(verifier.tokenizer)
    row = trainer.train()[0]
    assert "grad_norm/solver" in row and "grad_norm/verifier" in row
    records_ok = json.loads((tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()[0])
    assert [c["model"] for c in records_ok["calls"]][:2] == ["solver", "verifier"]


def test_eval_subcommand_from_a_checkpoint(tmp_path):
    from drmas_train.cli.eval import build_team, eval_config, eval_parser, run_eval

    cfg, trainer = _smoke(tmp_path, **{"models.assignment": "lora", "steps": 1})
    trainer.train()
    ckpt = tmp_path / "run" / "checkpoints" / "step-000001"
    argv = ["--k", "2", "--checkpoint", str(ckpt), "--n-problems", "3", "--temperature", "0"]
    args = eval_parser().parse_args(argv)
    eval_cfg, folder = eval_config(args)
    serving = build_team(eval_cfg, ["solver", "verifier"], folder)  # the checkpoint's adapters, not fresh ones
    for agent in ("solver", "verifier"):
        loaded = dict(serving[agent].trainable())
        for name, tensor in trainer.policies[agent].trainable():
            assert torch.equal(loaded[name], tensor), name
    result = run_eval(args)
    assert result["n_problems"] == 3 and 0.0 <= result["avg@2"] <= result["pass@2"] <= 1.0
    assert set(result["by_source"]) == {"generated/L1"}
    assert run_eval(args)["metrics"] == result["metrics"]  # greedy: the same again


def test_per_agent_overrides(tmp_path):
    over = {"models.assignment": "lora", "agents.verifier.lr": 0.5, "agents.verifier.temperature": 0.3}
    over |= {"agents.verifier.micro_batch_size": 3, "agents.solver.lora_rank": 4, "agents.solver.max_new_tokens": 5}
    cfg, trainer = _smoke(tmp_path, **over)
    assert trainer.learners["verifier"].optimizer.param_groups[0]["lr"] == 0.5
    assert trainer.learners["solver"].optimizer.param_groups[0]["lr"] == cfg.learner.lr
    assert trainer.learners["verifier"].config.micro_batch_size == 3
    assert trainer.sampling["verifier"].temperature == 0.3 and trainer.sampling["solver"].max_new_tokens == 5
    peft_cfg = trainer.policies["solver"].module.peft_config
    assert peft_cfg["solver"].r == 4 and peft_cfg["verifier"].r == cfg.models.lora_rank
    with pytest.raises(ValueError, match="cannot have their own lr"):
        _smoke(tmp_path / "shared", **{"agents.verifier.lr": 0.5})
