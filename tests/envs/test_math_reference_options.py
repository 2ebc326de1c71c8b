"""The reference's math episode rules and message layout as env options, in scripted AEC episodes.

The reference is langfengQ/DrMAS@19c632b: its math orchestra appends every teammate output whole to
the team context (`max_context_chars=0`), its `VerifierAgent.update_approved_vector` reads
`<verify>approve</verify>` anywhere as approval (`verdict_parsing="reference"`), and its agents put a
generic system message and the role's instructions in the user turn (`prompt_layout="reference"`).
"""

import json

import pytest
from search_helpers import play

import drmas_envs
from drmas_envs.math import prompts as P
from drmas_envs.prompt_files import PromptFileError

TASK = {"id": "t0", "problem": "What is $2 + 3$?", "answer": "5", "source": "unit"}
RIGHT, WRONG = "2 + 3 = 5, so \\boxed{5}", "I think \\boxed{6}"


def make(env_id="math-2agent", **kw):
    env = drmas_envs.make(env_id, **kw)
    env.reset(options={"task": TASK})
    return env


# -- whole teammate outputs -------------------------------------------------------------------------
def test_zero_context_chars_shows_a_long_solution_whole():
    long_reply = "step " * 4000 + "so \\boxed{6}"  # 20k characters: a 4096-token reply is of this size
    whole, clipped = make(max_context_chars=0), make()
    for env in (whole, clipped):
        env.step(long_reply)
    assert long_reply in whole.observe("verifier")["user"]
    seen = clipped.observe("verifier")["user"]
    assert long_reply not in seen and "characters omitted" in seen


# -- verdict parsing ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    # the Verifier's reward: the team's (1 iff retried), less 0.5 if malformed
    "verdict, parsing, order, verifier_reward",
    [
        # both tags: strict calls it malformed (penalised) and counts missing_verdict (reject here) ...
        ("<verify>approve</verify> no, <verify>reject</verify>", "strict", ["solver", "verifier", "solver"], 0.5),
        # ... the reference reads the approving tag and ends the episode, unpenalised
        ("<verify>approve</verify> no, <verify>reject</verify>", "reference", ["solver", "verifier"], 0.0),
        # a tag holding another word: malformed for strict; well-formed for the reference, no verdict in it
        ("<verify>maybe</verify>", "strict", ["solver", "verifier", "solver"], 0.5),
        ("<verify>maybe</verify>", "reference", ["solver", "verifier", "solver"], 1.0),
        # the reference's tags are case-sensitive: an upper-case tag is malformed there
        ("<VERIFY>approve</VERIFY>", "strict", ["solver", "verifier"], 0.0),
        ("<VERIFY>approve</VERIFY>", "reference", ["solver", "verifier", "solver"], 0.5),
        # the reference strips the first tag's content: a spaced rejection still rejects, unpenalised
        ("<verify> reject </verify>", "reference", ["solver", "verifier", "solver"], 1.0),
        ("<verify> approve </verify> <verify>reject</verify>", "reference", ["solver", "verifier"], 0.0),
    ],
)
def test_verdict_parsing(verdict, parsing, order, verifier_reward):
    env = make(verdict_parsing=parsing, missing_verdict="reject", format_penalty=0.5)
    script = [("solver", WRONG), ("verifier", verdict), ("solver", RIGHT)][: len(order)]
    rewards, info = play(env, script)
    assert [c["agent"] for c in info["calls"]] == order
    assert rewards["verifier"] == pytest.approx(verifier_reward)  # team reward (1 iff retried) less any penalty


def test_bad_verdict_parsing_is_rejected():
    with pytest.raises(ValueError, match="verdict_parsing must be one of"):
        drmas_envs.make("math-2agent", verdict_parsing="loose")


# -- message layout -----------------------------------------------------------------------------------
def test_reference_layout_puts_the_role_in_the_user_turn():
    env = make(prompt_layout="reference")
    first = env.observe("solver")
    assert first["system"] == P.GENERIC_SYSTEM
    assert TASK["problem"] in first["user"] and "Your role: the Solver" in first["user"]
    assert "\\boxed{}" in first["user"] and "Example" not in first["user"] + first["system"]
    env.step(WRONG)
    review = env.observe("verifier")
    assert review["system"] == P.GENERIC_SYSTEM and "Your role: the Verifier" in review["user"]
    assert WRONG in review["user"] and "<verify>approve</verify>" in review["user"]
    env.step("Wrong. <verify>reject</verify>")
    assert "Wrong. <verify>reject</verify>" in env.observe("solver")["user"]
    project = make()
    assert "Example" in project.observe("solver")["system"]


def test_reference_layout_solo_and_mode_templates():
    solo = make("math-1agent", prompt_layout="reference")
    assert solo.observe("solver")["system"] == P.GENERIC_SYSTEM and "team" not in solo.observe("solver")["user"]
    env = make(prompt_layout="reference", verdict_first=True)
    env.step(RIGHT)
    assert env.observe("verifier")["reply_prefix"] == "<verify>"  # the mode's template replaces the layout's
    with pytest.raises(ValueError, match="prompt_layout must be one of"):
        drmas_envs.make("math-2agent", prompt_layout="paper")


# -- prompts files ------------------------------------------------------------------------------------
def test_prompts_file_json_and_yaml(tmp_path):
    entry = {"system": "Judge.", "user": "P={problem} | S={latest_solution}", "reply_prefix": "<verify>"}
    as_json = tmp_path / "p.json"
    as_json.write_text(json.dumps({"verifier": entry}))
    as_yaml = tmp_path / "p.yaml"
    as_yaml.write_text("solver:\n  system: Solve.\n  user: 'Q: {problem} {history}'\n")
    env = make(prompts_file=str(as_json))
    env.step(RIGHT)
    obs = env.observe("verifier")
    assert (obs["system"], obs["user"], obs["reply_prefix"]) == (
        "Judge.",
        f"P={TASK['problem']} | S={RIGHT}",
        "<verify>",
    )
    _, info = play(env, [("verifier", "approve</verify>")])  # the prefix is part of the parsed reply
    assert info["verdicts"] == ["approve"] and info["malformed_per_agent"]["verifier"] == 0
    env = make(prompts_file=as_yaml, prompt_layout="reference")
    assert env.observe("solver")["user"] == f"Q: {TASK['problem']} "
    env.step(RIGHT)
    assert env.observe("verifier")["system"] == P.GENERIC_SYSTEM  # roles the file leaves out keep the layout's
    env = make(prompts_file=as_yaml, prompts={"solver": {"system": "S", "user": "explicit {problem}"}})
    assert env.observe("solver")["user"] == f"explicit {TASK['problem']}"  # `prompts` wins over the file


@pytest.mark.parametrize(
    "content, message",
    [
        ({"critic": {"system": "s", "user": "u"}}, r"unknown role 'critic'; roles: \['solver', 'verifier'\]"),
        ({"solver": {"system": "s"}}, r": solver: missing key 'user'"),
        ({"solver": {"system": "s", "user": "u", "temperature": 1}}, r": solver: unknown key\(s\) \['temperature'\]"),
        ({"solver": {"system": "s", "user": 3}}, r": solver.user: expected text, got int"),
        ({"solver": {"system": "s", "user": "{question}"}}, r": solver.user: unknown field\(s\) \['\{question\}'\]"),
        ({"solver": {"system": "s", "user": "\\boxed{}"}}, r": solver.user: positional field"),
        ({"solver": {"system": "s", "user": "{problem"}}, r": solver.user: not a valid template"),
        ({"solver": "Solve it."}, r": solver: expected a mapping"),
        (["solver"], r"expected a mapping of role -> template"),
    ],
)
def test_prompts_file_errors_name_the_file_and_the_key(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(content))
    with pytest.raises(PromptFileError, match=message) as err:
        drmas_envs.make("math-2agent", prompts_file=str(path))
    assert str(path) in str(err.value)


def test_prompts_file_unreadable(tmp_path):
    with pytest.raises(FileNotFoundError, match="prompts_file .*missing.json not found"):
        drmas_envs.make("math-2agent", prompts_file=str(tmp_path / "missing.json"))
    (tmp_path / "p.txt").write_text("{}")
    with pytest.raises(PromptFileError, match=r"p.txt: a prompts file is .json, .yaml or .yml"):
        drmas_envs.make("math-2agent", prompts_file=str(tmp_path / "p.txt"))
    (tmp_path / "p.yaml").write_text("solver: [unclosed\n")
    with pytest.raises(PromptFileError, match=r"p.yaml: not valid YAML"):
        drmas_envs.make("math-2agent", prompts_file=str(tmp_path / "p.yaml"))
    (tmp_path / "p.json").write_text("{\n'solver': 1}")
    with pytest.raises(PromptFileError, match=r"p.json: not valid JSON \(line 2"):
        drmas_envs.make("math-2agent", prompts_file=str(tmp_path / "p.json"))


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join(['*' + p] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi")
)
"""A "billion laughs": nine levels of nine aliases, 9^9 strings from a few hundred bytes."""


def test_a_yaml_alias_bomb_prompts_file_is_refused_before_it_expands(tmp_path):
    (tmp_path / "p.yaml").write_text(BOMB)
    with pytest.raises(PromptFileError, match=r"p.yaml:2: YAML aliases \(\*name\) are not accepted"):
        drmas_envs.make("math-2agent", prompts_file=str(tmp_path / "p.yaml"))
    (tmp_path / "anchor.yaml").write_text("solver: &s {system: S, user: 'u {problem}'}\n")
    drmas_envs.make("math-2agent", prompts_file=str(tmp_path / "anchor.yaml"))  # an anchor alone is harmless


@pytest.mark.parametrize("field", ["{problem:>400000000}", "{problem!r}", "{problem.__class__}", "{problem[0]}"])
def test_a_prompt_field_is_a_plain_name(tmp_path, field):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"solver": {"system": "S", "user": f"Solve {field}"}}))
    with pytest.raises(PromptFileError, match=r"p.json: solver.user: field .* a field is a plain name"):
        drmas_envs.make("math-2agent", prompts_file=str(path))
