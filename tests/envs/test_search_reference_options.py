"""The reference's search-team behaviours as env options, in scripted episodes over the toy corpus.

- `malformed_verdict="yes"` with `verify_last_step=True` (the reference, langfengQ/DrMAS@19c632b:
  `VerifierAgent.get_verification_vector` counts anything but <verify>no</verify> as yes; the search
  orchestra consults the Verifier every step and runs the Search agent only while `step < max_steps`);
- `require_think=True` (the reference's `general_projection(check_think_tag=True)` for the Search and
  Answer agents): exactly one <think>...</think>, else the call is penalised, its action still used.
"""

import pytest
from search_helpers import make, play

THINK = "<think>Curie was Polish.</think>"


REFERENCE = {"malformed_verdict": "yes", "verify_last_step": True}


def test_last_step_verifier_yes_answers(toy):
    script = []
    for _ in range(3):  # max_steps=4: three searches; the Verifier is asked again at step 4
        script += [("verifier", "<verify>no</verify>"), ("search", "<search>Marie Curie</search>")]
    rewards, info = play(
        make("search-3agent", toy, **REFERENCE),
        [*script, ("verifier", "<verify>yes</verify>"), ("answer", "<answer>Warsaw</answer>")],
    )
    assert rewards == {"verifier": 1.0, "search": 1.0, "answer": 1.0}
    assert info["calls_per_agent"] == {"verifier": 4, "search": 3, "answer": 1}
    assert info["forced_answer"] is False and info["stopped_unanswered"] is False


def test_last_step_verifier_no_ends_unanswered(toy):
    script = []
    for _ in range(3):
        script += [("verifier", "<verify>no</verify>"), ("search", "<search>Marie Curie</search>")]
    rewards, info = play(make("search-3agent", toy, **REFERENCE), [*script, ("verifier", "<verify>no</verify>")])
    assert rewards == {"verifier": 0.0, "search": 0.0, "answer": 0.0}  # no answer: EM 0, no call malformed
    assert info["answer"] is None and info["stopped_unanswered"] is True
    assert info["calls_per_agent"] == {"verifier": 4, "search": 3, "answer": 0}


def test_default_last_step_skips_the_verifier(toy):
    script = []
    for _ in range(3):
        script += [("verifier", "<verify>no</verify>"), ("search", "<search>Marie Curie</search>")]
    _, info = play(make("search-3agent", toy), [*script, ("answer", "<answer>Warsaw</answer>")])
    assert info["forced_answer"] is True and info["calls_per_agent"]["verifier"] == 3


def test_malformed_verdict_goes_to_the_answer_agent_and_is_penalised(toy):
    env = make("search-3agent", toy, **REFERENCE, format_penalty=0.5)
    rewards, info = play(env, [("verifier", "I cannot decide."), ("answer", "<answer>Warsaw</answer>")])
    assert rewards == {"verifier": 0.5, "search": 1.0, "answer": 1.0}
    assert info["malformed_per_agent"]["verifier"] == 1


def test_one_step_budget_asks_the_verifier(toy):
    env = make("search-3agent", toy, **REFERENCE, max_steps=1)
    assert env.agent_selection == "verifier"
    _, info = play(env, [("verifier", "<verify>no</verify>")])
    assert info["stopped_unanswered"] is True and info["n_searches"] == 0


def test_require_think_penalises_but_keeps_the_action(toy):
    env = make("search-3agent", toy, require_think=True, format_penalty=0.5)
    rewards, info = play(
        env,
        [
            ("verifier", "<verify>no</verify>"),  # the Verifier is not think-checked (as the reference)
            ("search", "<search>Marie Curie</search>"),  # no think block: penalised, still searched
            ("verifier", "<verify>yes</verify>"),
            ("answer", f"{THINK}{THINK}<answer>Warsaw</answer>"),  # two think blocks: penalised, still answered
        ],
    )
    assert info["n_searches"] == 1 and info["answer_in_passages"] is True
    assert info["answer"] == "Warsaw" and info["em"] == 1.0
    assert rewards == {"verifier": 1.0, "search": 0.5, "answer": 0.5}
    errors = [c["error"] for c in info["calls"]]
    assert "exactly one <think>" in errors[1] and "found 2 <think>" in errors[3]


def test_require_think_accepts_one_block_and_checks_order(toy):
    env = make("search-3agent", toy, require_think=True, format_penalty=0.5)
    rewards, info = play(
        env,
        [
            ("verifier", "<verify>no</verify>"),
            ("search", f"{THINK} <search>Marie Curie</search>"),
            ("verifier", "<verify>yes</verify>"),
            ("answer", "</think> backwards <think><answer>Warsaw</answer>"),
        ],
    )
    assert rewards == {"verifier": 1.0, "search": 1.0, "answer": 0.5}
    assert "before <think>" in info["calls"][3]["error"]


@pytest.mark.parametrize("env_id, role", [("search-3agent", "search"), ("search-2agent", "answer")])
def test_require_think_prompts_ask_for_it(toy, env_id, role):
    plain, think = make(env_id, toy), make(env_id, toy, require_think=True)
    if env_id == "search-2agent":
        for env in (plain, think):
            env.step(f"{THINK}<done>")
    assert "<think>" not in plain.observe(role)["system"]
    assert "inside <think>...</think> (exactly once)" in think.observe(role)["system"]
    if env_id == "search-3agent":
        assert "<think>" not in think.observe("verifier")["system"]


def test_require_think_one_agent(toy):
    env = make("search-1agent", toy, require_think=True, format_penalty=0.5)
    rewards, info = play(
        env, [("searcher", "<search>Marie Curie</search>"), ("searcher", f"{THINK}<answer>Warsaw</answer>")]
    )
    assert rewards == {"searcher": 0.5} and info["n_searches"] == 1 and info["em"] == 1.0
