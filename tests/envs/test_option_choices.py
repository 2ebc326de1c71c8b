"""The env options' closed choices are `Literal` types, checked from the type and carried to the code that uses them."""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
import typing

import pytest

from drmas_envs.choices import VerdictParsing, check_choices, choices
from drmas_envs.data import BadRows, RowErrors
from drmas_envs.math import prompts as math_prompts
from drmas_envs.math.answers import VERDICTS, Verdict
from drmas_envs.math.datasets import load_jsonl_tasks
from drmas_envs.math.env import MathEnvConfig
from drmas_envs.math.workflow import MathRules, VerifierMode
from drmas_envs.search import prompts as search_prompts
from drmas_envs.search.data import load_questions
from drmas_envs.search.env import SearchConfig
from drmas_envs.search.heldout import WorldKind
from drmas_envs.search.workflows import MalformedAnswer, MalformedVerdict, SearchWorkflow


def _literal_fields(cls: type) -> dict[str, tuple]:
    hints = typing.get_type_hints(cls)
    return {f.name: choices(hints[f.name]) for f in dataclasses.fields(cls) if choices(hints[f.name])}


EXPECTED = {
    SearchConfig: {"prompt_layout", "verdict_parsing", "malformed_answer", "malformed_verdict", "world", "bad_rows"},
    MathEnvConfig: {"prompt_layout", "verdict_parsing", "verifier_mode", "missing_verdict", "bad_rows"},
}


@pytest.mark.parametrize("cls", list(EXPECTED), ids=lambda c: c.__name__)
def test_every_closed_option_is_a_literal_checked_from_its_type(cls):
    fields = _literal_fields(cls)
    assert EXPECTED[cls] <= set(fields)
    for name, allowed in fields.items():
        for value in allowed if name != "world" else ():  # world held-out has rules of its own
            cls(**{name: value})
        with pytest.raises(
            ValueError, match=f"^{re.escape(f'{name} must be one of {allowed!r}, not ')}'no-such-choice'$"
        ):
            cls(**{name: "no-such-choice"})


def test_the_layout_types_are_the_prompt_tables():
    assert choices(search_prompts.SearchLayout) == tuple(search_prompts.LAYOUTS)
    assert choices(math_prompts.MathLayout) == tuple(math_prompts.LAYOUTS)
    assert VERDICTS == choices(Verdict)


def test_check_choices_lets_none_through_an_optional_literal_only():
    @dataclasses.dataclass
    class Options:
        mode: typing.Literal["a", "b"] | None = None
        kind: typing.Literal["x"] = "x"

    check_choices(Options())
    with pytest.raises(ValueError, match="kind must be one of"):
        check_choices(Options(kind=None))


SIGNATURES = [
    (SearchWorkflow.__init__, "malformed_verdict", MalformedVerdict),
    (SearchWorkflow.__init__, "malformed_answer", MalformedAnswer),
    (SearchWorkflow.__init__, "verdict_parsing", VerdictParsing),
    (load_jsonl_tasks, "bad_rows", BadRows),
    (load_questions, "bad_rows", BadRows),
    (RowErrors.__init__, "mode", BadRows),
]


@pytest.mark.parametrize(
    ("func", "param", "alias"), SIGNATURES, ids=[f"{f.__qualname__}.{p}" for f, p, _ in SIGNATURES]
)
def test_the_code_that_takes_an_option_is_typed_with_its_literal(func, param, alias):
    annotation = inspect.signature(func).parameters[param].annotation
    assert eval(annotation, vars(sys.modules[func.__module__])) == alias


def test_the_workflow_rules_carry_the_config_types():
    rules = typing.get_type_hints(MathRules)
    config = typing.get_type_hints(MathEnvConfig)
    for name, alias in (
        ("missing_verdict", Verdict),
        ("verifier_mode", VerifierMode),
        ("verdict_parsing", VerdictParsing),
    ):
        assert rules[name] == config[name] == alias
    assert typing.get_type_hints(SearchConfig)["world"] == WorldKind
