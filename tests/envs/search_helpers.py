"""Shared fixtures' data for the search env tests: a toy corpus and question file."""

import json
from pathlib import Path

PASSAGES = [
    {"id": "p1", "title": "Marie Curie", "text": "Marie Curie was a physicist and chemist born in Warsaw."},
    {"id": "p2", "title": "Warsaw", "text": "Warsaw is the capital of Poland and lies on the Vistula river."},
    {"id": "p3", "title": "Paris", "text": "Paris is the capital of France and lies on the Seine."},
    {"id": "p4", "title": "Albert Einstein", "text": "Albert Einstein was a physicist born in Ulm."},
    {"id": "p5", "title": "Ulm", "text": "Ulm is a city in Germany on the Danube."},
]
QUESTIONS = [
    {"id": "q1", "question": "Where was Marie Curie born?", "golden_answers": ["Warsaw"], "source": "toy-single"},
    {
        "id": "q2",
        "question": "On which river is Marie Curie's birthplace?",
        "golden_answers": ["Vistula", "the Vistula River"],
        "source": "toy-multi",
    },
]


def write_toy(root: Path) -> tuple[str, str]:
    """Write the toy corpus and questions under `root`; returns (corpus path, questions path)."""
    corpus, questions = root / "corpus.jsonl", root / "questions.jsonl"
    corpus.write_text("".join(json.dumps(p) + "\n" for p in PASSAGES))
    questions.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return str(corpus), str(questions)


def play(env, script):
    """Step `env` through [(agent, action), ...], checking the turn order; returns the final infos."""
    for agent, action in script:
        assert env.agent_selection == agent, (env.agent_selection, agent)
        assert not (env.terminations[agent] or env.truncations[agent])
        env.step(action)
    assert all(env.terminations.values()) or all(env.truncations.values()), "episode did not end"
    return dict(env.rewards), env.infos[env.agents[0]]


def toy_options(root: Path) -> dict[str, str]:
    """Env options of the toy question set and corpus written under `root`."""
    corpus, questions = write_toy(root)
    return {"corpus": corpus, "dataset": questions, "index_dir": str(root / "index")}


def make(env_id: str, toy: dict, **kw):
    """A search env on the toy set, reset to its first question ("Where was Marie Curie born?" -> Warsaw)."""
    import drmas_envs

    env = drmas_envs.make(env_id, **{**toy, **kw})
    env.reset(options={"task_index": 0})
    return env
