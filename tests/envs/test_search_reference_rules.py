"""More of the reference's search-team rules as env options, in scripted AEC episodes over the toy corpus.

The reference (langfengQ/DrMAS@19c632b): the search orchestra appends the Verifier's whole reply to the
team context the Search agent reads at that step (`search_sees_verifier`); its env ends an episode only on
an `<answer>` tag or the step budget, so an Answer call without one lets the Verifier run again
(`malformed_answer="continue"`); `VerifierAgent.get_verification_vector` reads `<verify>yes</verify>`
anywhere as yes (`verdict_parsing="reference"`); its agents put a generic system message and the role's
instructions in the user turn (`prompt_layout="reference"`).
"""

import json

import pytest
from search_helpers import make, play

import drmas_envs
from drmas_envs.prompt_files import PromptFileError
from drmas_envs.search import prompts as P

REVIEW = "Nothing about Curie yet. <verify>no</verify>"


# -- the Search agent sees this step's Verifier output ---------------------------------------------
@pytest.mark.parametrize("layout", ["project", "reference"])
def test_search_agent_sees_this_steps_verifier_output(toy, layout):
    env = make("search-3agent", toy, search_sees_verifier=True, prompt_layout=layout)
    assert "{verifier_output}" not in env.observe("verifier")["user"]
    env.step(REVIEW)
    assert REVIEW in env.observe("search")["user"]
    env.step("<search>Marie Curie</search>")
    env.step("Doc 1 names Warsaw, but check the city. <verify>no</verify>")
    seen = env.observe("search")["user"]
    assert "check the city" in seen and REVIEW not in seen  # this step's output, not an earlier one
    plain = make("search-3agent", toy, prompt_layout=layout)
    plain.step(REVIEW)
    assert "Nothing about Curie yet" not in plain.observe("search")["user"]


def test_own_search_template_must_show_the_verifier_output(toy, tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"search": {"system": "s", "user": "{question}"}}))
    with pytest.raises(PromptFileError, match=r"does not show \{verifier_output\}.* in .*p.json"):
        make("search-3agent", toy, search_sees_verifier=True, prompts_file=str(path))
    path.write_text(json.dumps({"search": {"system": "s", "user": "{question} | {verifier_output}"}}))
    env = make("search-3agent", toy, search_sees_verifier=True, prompts_file=str(path))
    env.step(REVIEW)
    assert env.observe("search")["user"] == f"Where was Marie Curie born? | {REVIEW}"


# -- an Answer call without tags does not end the episode ---------------------------------------------
def test_untagged_answer_lets_the_verifier_run_again(toy):
    env = make("search-3agent", toy, malformed_answer="continue", format_penalty=0.5)
    script = [("verifier", "<verify>yes</verify>"), ("answer", "It is Warsaw.")]
    for agent, action in script:
        assert env.agent_selection == agent
        env.step(action)
    assert env.agent_selection == "verifier" and not any(env.terminations.values())
    assert P.NO_ANSWER in env.observe("verifier")["user"]
    assert "Step 2 of 4" not in env.observe("verifier")["user"]  # the project layout: no step line
    rewards, info = play(env, [("verifier", "<verify>yes</verify>"), ("answer", "<answer>Warsaw</answer>")])
    assert rewards == {"verifier": 1.0, "search": 1.0, "answer": 0.5} and info["em"] == 1.0
    assert info["unanswered_steps"] == 1 and info["n_searches"] == 0 and info["queries"] == []


def test_untagged_answer_ends_the_episode_by_default(toy):
    rewards, info = play(make("search-3agent", toy), [("verifier", "<verify>yes</verify>"), ("answer", "Warsaw")])
    assert info["answer"] is None and info["unanswered_steps"] == 0 and rewards["answer"] < 0


def test_untagged_answer_uses_up_a_step_and_the_last_one_ends(toy):
    env = make("search-3agent", toy, malformed_answer="continue", verify_last_step=True, max_steps=2)
    yes = ("verifier", "<verify>yes</verify>")
    rewards, info = play(env, [yes, ("answer", "Warsaw"), yes, ("answer", "Warsaw, I think")])
    assert info["answer"] is None and info["unanswered_steps"] == 2 and rewards["verifier"] == 0.0
    env = make("search-3agent", toy, malformed_answer="continue", max_steps=2)  # last step: forced answer
    _, info = play(env, [yes, ("answer", "no tag"), ("answer", "<answer>Warsaw</answer>")])
    assert info["forced_answer"] is True and info["em"] == 1.0


def test_an_empty_answer_tag_still_ends(toy):
    env = make("search-3agent", toy, malformed_answer="continue")
    _, info = play(env, [("verifier", "<verify>yes</verify>"), ("answer", "<answer> </answer>")])
    assert info["answer"] is None and info["unanswered_steps"] == 0


def test_two_agents_search_again_after_an_untagged_answer(toy):
    env = make("search-2agent", toy, malformed_answer="continue")
    script = [("search", "<done>"), ("answer", "Warsaw"), ("search", "<search>Marie Curie</search>")]
    _, info = play(env, [*script, ("search", "<done>"), ("answer", "<answer>Warsaw</answer>")])
    assert info["em"] == 1.0 and info["n_searches"] == 1 and info["unanswered_steps"] == 1


# -- verdict parsing ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "verdict, parsing, next_role, verifier_penalised",  # a verdict read as none counts as "yes" (the presets')
    [
        ("<verify>yes</verify> or rather <verify>no</verify>", "strict", "search", False),  # the last tag
        ("<verify>yes</verify> or rather <verify>no</verify>", "reference", "answer", False),  # yes wins
        ("<verify>maybe</verify>", "strict", "answer", True),  # malformed
        ("<verify>maybe</verify>", "reference", "answer", False),  # well-formed, with no verdict in it
        ("<VERIFY>NO</VERIFY>", "strict", "search", False),
        ("<VERIFY>NO</VERIFY>", "reference", "search", True),  # routes no (any case) but the tag check is exact
        ("<verify> no </verify>", "reference", "search", False),  # the first tag's content is stripped
        ("<verify>\nyes\n</verify> <verify>no</verify>", "reference", "answer", False),
    ],
)
def test_verdict_parsing(toy, verdict, parsing, next_role, verifier_penalised):
    env = make("search-3agent", toy, verdict_parsing=parsing, malformed_verdict="yes", format_penalty=0.5)
    env.step(verdict)
    assert env.agent_selection == next_role
    script = [("answer", "<answer>Warsaw</answer>")]
    if next_role == "search":
        script = [("search", "<search>Marie Curie</search>"), ("verifier", "<verify>yes</verify>"), *script]
    rewards, _ = play(env, script)
    assert rewards["verifier"] == (0.5 if verifier_penalised else 1.0)


def test_bad_option_values_are_rejected(toy):
    for option in ("verdict_parsing", "malformed_answer", "prompt_layout"):
        with pytest.raises(ValueError, match=f"{option} must be one of"):
            drmas_envs.make("search-3agent", **toy, **{option: "sometimes"})


# -- message layout and prompts files -----------------------------------------------------------------
def test_reference_layout_puts_the_role_in_the_user_turn(toy):
    env = make("search-3agent", toy, prompt_layout="reference", require_think=True)
    verifier = env.observe("verifier")
    assert verifier["system"] == P.GENERIC_SYSTEM and "Your role: the Verifier" in verifier["user"]
    assert "step 1 of 4" in verifier["user"] and "<think>" not in verifier["user"]
    env.step("<verify>no</verify>")
    search = env.observe("search")
    assert search["system"] == P.GENERIC_SYSTEM and "Example" not in search["user"]
    assert search["user"].endswith(P.THINK_RULE)  # the think rule joins the instructions in the user turn
    for n_agents, role in ((1, "searcher"), (2, "search")):
        solo = make(f"search-{n_agents}agent", toy, prompt_layout="reference")
        assert solo.observe(role)["system"] == P.GENERIC_SYSTEM and "Searches left: 3" in solo.observe(role)["user"]
    assert "Example" in make("search-3agent", toy).observe("verifier")["system"]


def test_prompts_file_sets_a_role(toy, tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("answer:\n  system: Answer briefly.\n  user: 'Q: {question} H: {history}'\n")
    env = make("search-3agent", toy, prompts_file=str(path))
    env.step("<verify>yes</verify>")
    obs = env.observe("answer")
    assert obs["system"] == "Answer briefly." and obs["user"] == f"Q: Where was Marie Curie born? H: {P.NO_HISTORY}"
    path.write_text("answer:\n  system: s\n  user: '{problem}'\n")
    with pytest.raises(PromptFileError, match=r"p.yaml: answer.user: unknown field\(s\) \['\{problem\}'\]"):
        make("search-3agent", toy, prompts_file=str(path))
    path.write_text("solver:\n  system: s\n  user: u\n")
    with pytest.raises(PromptFileError, match=r"unknown role 'solver'; roles: \['verifier', 'search', 'answer'\]"):
        make("search-3agent", toy, prompts_file=str(path))
