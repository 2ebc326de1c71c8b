"""The math envs' episode facts used by validation: every attempt graded, the loose answer read."""

import drmas_envs
from drmas_envs.math.answers import last_number


def _play(env, texts):
    env.reset(options={"task": {"problem": "What is $3 + 4$?", "answer": "7", "source": "t"}})
    for _agent in env.agent_iter():
        _, _, term, trunc, info = env.last()
        if term or trunc:
            env.step(None)
            continue
        env.step(texts.pop(0))
    return info


def test_attempts_graded_and_loose_answer():
    env = drmas_envs.make("math-2agent")
    info = _play(env, ["3 + 4 = 8. \\boxed{8}", "<verify>reject</verify>", "3 + 4 = 7, so 7"])
    assert info["verdicts"] == ["reject"]
    assert info["attempts_correct"] == [False, False]  # the second attempt is unboxed: malformed
    assert info["loose_correct"] is True and info["correct"] is False


def test_approved_right_attempt():
    env = drmas_envs.make("math-2agent")
    info = _play(env, ["\\boxed{7}", "<verify>approve</verify>"])
    assert info["attempts_correct"] == [True] and info["verdicts"] == ["approve"] and info["correct"]


def test_last_number():
    assert last_number("3 + 4 = 7.") == "7"
    assert last_number("it is -2.5 or \\boxed{3}") == "3"
    assert last_number("no digits") is None


def test_verdict_first_prompt_option():
    plain = drmas_envs.make("math-2agent")
    first = drmas_envs.make("math-2agent", verdict_first=True)
    for env in (plain, first):
        env.reset(seed=0)
        env.step("\\boxed{3}")
    assert "verdict first" not in plain.observe("verifier")["system"]
    seen = first.observe("verifier")
    assert "verdict first" in seen["system"] and seen["user"].rstrip().endswith("<verify>reject</verify>.")
    assert "\\boxed{3}" in seen["user"]  # the attempt under review is shown


def test_verdict_first_opens_the_tag_for_the_model():
    """With `verdict_first` the Verifier's reply starts with `<verify>`: its action continues it."""
    env = drmas_envs.make("math-2agent", verdict_first=True)
    info = _play(env, ["\\boxed{7}", "approve</verify> 3 + 4 is 7."])
    assert info["verdicts"] == ["approve"] and info["correct"]
    assert all(c["valid"] for c in info["calls"])
    assert env.unwrapped.workflow.history[-1].text == "<verify>approve</verify> 3 + 4 is 7."  # the whole reply


def test_reply_prefix_is_in_the_observation():
    env = drmas_envs.make("math-2agent", verdict_first=True)
    env.reset(seed=0)
    assert env.observe("solver")["reply_prefix"] == ""
    env.step("\\boxed{3}")
    obs = env.observe("verifier")
    assert obs["reply_prefix"] == "<verify>" and env.observation_space("verifier").contains(obs)
    plain = drmas_envs.make("math-2agent")
    plain.reset(seed=0)
    plain.step("\\boxed{3}")
    assert plain.observe("verifier")["reply_prefix"] == ""
