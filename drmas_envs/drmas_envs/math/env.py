"""`math_env`: the math task family as PettingZoo AEC envs (`math-1agent`, `math-2agent`).

    env = drmas_envs.make("math-2agent")                          # generated problems, levels 1-3
    env = drmas_envs.make("math-2agent", dataset="math500", data_dir="data")
    env = drmas_envs.make("math-1agent", dataset="my_problems.jsonl", format_penalty=0.0)

See `drmas_envs.math.workflow` for the turn order and format rules and docs/math.md for the guide.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from drmas_envs.choices import VerdictParsing, check_choices
from drmas_envs.data import BadRows
from drmas_envs.env import WorkflowEnv
from drmas_envs.math import prompts as P
from drmas_envs.math.answers import Verdict
from drmas_envs.math.datasets import load_tasks
from drmas_envs.math.generated import generate
from drmas_envs.math.grading import DEFAULT_TIMEOUT_S, Grader, default_grader
from drmas_envs.math.prompts import MathLayout
from drmas_envs.math.workflow import MathRules, MathWorkflowFactory, VerifierMode
from drmas_envs.prompt_files import load_prompts_file
from drmas_envs.provenance import TaskSet
from drmas_envs.workflow import PromptTemplate


@dataclass
class MathEnvConfig:
    """Every option of the math envs; `make("math-2agent", **options)` sets them."""

    n_agents: int = 2
    """1: the Solver alone (`math-1agent`); 2: Solver and Verifier (`math-2agent`)."""
    dataset: str | None = None
    """A JSONL/Parquet path (fields problem, answer, optional id, source), a known name (math500, aime24,
    aime25, amc23, minerva, olympiadbench, gsm8k, math_train, dapo, dapo_filter, ...), a mix (the paper's
    validation set `math_test_sampled`, its final test set `math_test`), or None for the generated problems.
    The paper trains on `dapo_filter` (docs/paper_runs.md says how to fetch each set once)."""
    split: str | None = None
    """The split of a known or generated dataset ("train"/"test"); None: the dataset's default
    ("train" for the generated set)."""
    data_dir: str | os.PathLike | None = None
    """A local directory searched for known names before $DRMAS_DATA_DIR and the Hugging Face hub."""
    bad_rows: BadRows = "error"
    """A malformed dataset row: "error" stops with one line naming file and row; "skip" leaves it out, logs
    how many and where the first ones are, and records them in the dataset's provenance (`skipped_rows`)."""
    level: int | tuple[int, ...] = (1, 2, 3)
    """Generated set only: difficulty levels 1-5; level 1 is single-digit + and - (see `generated`)."""
    n_per_level: int = 1000
    """Generated set only: problems per level."""
    gen_seed: int = 0
    """Generated set only: which problems are generated (the order per episode comes from `reset(seed)`)."""
    max_loops: int = 2
    """Most Solver attempts (2 = Solver, Verifier, Solver, as in the paper); `math-1agent` ignores it."""
    missing_verdict: Verdict = "approve"
    """What a missing or malformed verdict counts as ("approve", as in the paper's code, or "reject");
    the call is malformed and penalised either way."""
    verdict_first: bool = False
    """The Verifier's prompt asks for the verdict first, then the reason, and its reply starts with
    `<verify>` written for it (`prompts.VERIFIER_VERDICT_FIRST`): for small models, which otherwise run
    out of tokens before the verdict or never open the tag; the paper's order (reason, then verdict, no
    prefix) is the default. A `prompts["verifier"]` override wins."""
    verdict_reward: float = 0.0
    """Added to a Verifier call's reward when its verdict is right (approve an attempt that grades right,
    reject one that grades wrong). 0, as in the paper and the reference code: the Verifier trains on the
    team reward alone, which barely separates its verdicts (rejecting a right attempt costs nothing when
    the retry is right too); a small judging Verifier can settle on one verdict either way
    (benchmarks/results/cpu_default/README.md). The `cpu` preset sets 1.0."""
    verifier_mode: VerifierMode = "judge"
    """How the Verifier decides. "judge" (the paper): it reads the attempt and writes a verdict tag.
    "recompute": it solves the problem itself without seeing the attempt (`prompts.VERIFIER_RECOMPUTE`),
    and the attempt is approved iff the two answers are equivalent: checking by solving again, for
    models too small to judge (the cpu preset; benchmarks/results/cpu_default/README.md). Not combinable
    with `verdict_first`."""
    review_malformed: bool = True
    """Show a malformed Solver attempt (no answer box) to the Verifier, as the paper does; False skips its
    review and asks for the next attempt at once, so the Verifier only judges answers (its `verdicts`
    entry is then None)."""
    format_penalty: float | Mapping[str, float] = 0.1
    """Subtracted from an agent's reward per malformed call (the paper uses 0.1 for math)."""
    verdict_parsing: VerdictParsing = "strict"
    """How a judging Verifier's reply is read. "strict": the last `<verify>` tag counts, and a reply whose
    tags disagree or hold another word is malformed (penalised). "reference" (the reference code's
    `update_approved_vector`): a reply holding `<verify>` and `</verify>` is well-formed, and the exact tag
    `<verify>approve</verify>` anywhere approves, even beside `<verify>reject</verify>`; with neither verdict
    the reply counts as `missing_verdict`. The paper presets use "reference"."""
    max_context_chars: int = 4000
    """Each earlier output shown in a prompt is clipped to this many characters (the first quarter and the
    rest from the tail kept); 0: never clipped, as the reference, which shows teammates' outputs whole (a
    Solver reply can run 4,096 tokens: set `rollout.max_prompt_tokens` to hold them; the paper preset: 8192)."""
    prompt_layout: MathLayout = "project"
    """The built-in prompts. "project": each role's instructions and a worked example in the system message
    (the examples lift a small model's format: docs/math.md). "reference": the reference code's layout in this
    project's words: a generic system message, and the problem, the team's work and the role's instructions in
    the user message, with no examples (the paper preset). The recompute and verdict-first Verifier prompts
    exist in the project layout only and replace the Verifier's in either."""
    prompts_file: str | os.PathLike | None = None
    """A JSON or YAML file of per-role templates ({role: {system, user[, reply_prefix]}}) over the layout's, for
    any prompt set (e.g. the reference's own); checked when the env is made (`drmas_envs.prompt_files`)."""
    prompts: Mapping[str, PromptTemplate | Mapping[str, str]] | None = None
    """Per-role prompt overrides: PromptTemplate or {"system": ..., "user": ...}; they win over `prompts_file`."""
    grader: Callable[[str | None, str], bool] | None = None
    """Grades (answer, reference); None: the shared math-verify `Grader` (or one with `grade_timeout_s`),
    whose checks are right, wrong, over budget or error (`drmas_envs.math.grading`). A callable may return
    a bool or a `grading.Grade`."""
    grade_timeout_s: float | None = None
    """Hard bound per grading check, in CPU seconds of the grading worker; None uses the shared grader's (5 s)."""
    grade_max_answer_chars: int = 1000
    """An answer longer than this many characters is over budget without parsing (a bound on grading cost)."""
    max_text_length: int = 1_000_000
    """The longest action or observation text the spaces admit."""
    render_mode: str | None = None
    """None or "ansi"."""

    def __post_init__(self) -> None:
        if self.n_agents not in (1, 2):
            raise ValueError(f"n_agents must be 1 or 2, got {self.n_agents}")
        if self.max_loops < 1:
            raise ValueError(f"max_loops must be at least 1, got {self.max_loops}")
        check_choices(self)
        if self.verifier_mode == "recompute" and self.verdict_first:
            raise ValueError(
                "verdict_first applies to verifier_mode 'judge' (a recomputing Verifier writes no verdict)"
            )
        if self.verdict_reward < 0:
            raise ValueError(f"verdict_reward must be >= 0, got {self.verdict_reward}")
        if self.grade_max_answer_chars < 0:
            raise ValueError(f"grade_max_answer_chars must be >= 0, got {self.grade_max_answer_chars}")
        if self.max_context_chars < 0:
            raise ValueError("max_context_chars must be >= 0 (0: no clipping)")


def _templates(prompts: Mapping[str, Any] | None) -> dict[str, PromptTemplate]:
    out = {}
    for role, tpl in (prompts or {}).items():
        if isinstance(tpl, PromptTemplate):
            out[role] = tpl
        elif isinstance(tpl, Mapping) and {"system", "user"} <= set(tpl) <= {"system", "user", "reply_prefix"}:
            out[role] = PromptTemplate(str(tpl["system"]), str(tpl["user"]), str(tpl.get("reply_prefix", "")))
        else:
            raise TypeError(
                f"prompts[{role!r}] must be a PromptTemplate or a {{'system', 'user'[, 'reply_prefix']}} mapping"
            )
    return out


def _prompts(cfg: MathEnvConfig, roles: tuple[str, ...]) -> dict[str, PromptTemplate]:
    """Each role's template: `prompts`, else `prompts_file`, else the Verifier's mode template, else the layout's."""
    prompts = dict(P.LAYOUTS[cfg.prompt_layout])
    if cfg.prompt_layout == "reference" and cfg.n_agents == 1:
        prompts["solver"] = P.REFERENCE_SOLO
    if cfg.n_agents == 2 and cfg.verdict_first:
        prompts["verifier"] = P.VERIFIER_VERDICT_FIRST
    if cfg.n_agents == 2 and cfg.verifier_mode == "recompute":
        prompts["verifier"] = P.VERIFIER_RECOMPUTE
    if cfg.prompts_file is not None:
        prompts.update(load_prompts_file(cfg.prompts_file, roles, P.CONTEXT_FIELDS))
    overrides = _templates(cfg.prompts)
    unknown = set(overrides) - set(roles)
    if unknown:
        raise ValueError(f"prompts name unknown roles {sorted(unknown)}; roles: {list(roles)}")
    prompts.update(overrides)
    return {r: prompts[r] for r in roles}


def env_tasks(cfg: MathEnvConfig) -> TaskSet:
    """The tasks `cfg` names (a dataset, or the generated problems), with their provenance."""
    if cfg.dataset is None:
        split = cfg.split or "train"
        tasks = generate(cfg.level, cfg.n_per_level, cfg.gen_seed, split)
        levels = [cfg.level] if isinstance(cfg.level, int) else list(cfg.level)
        record = {"dataset": "generated", "split": split, "n": len(tasks), "origin": "generated"}
        return TaskSet(tasks, {**record, "levels": levels, "n_per_level": cfg.n_per_level, "seed": cfg.gen_seed})
    return load_tasks(str(cfg.dataset), cfg.split, cfg.data_dir, cfg.bad_rows)


def _grader(cfg: MathEnvConfig) -> tuple[Callable[[str | None, str], Any], Callable[[list[str]], dict] | None]:
    """(grade, check_references): a `Grader`'s `check` and reference check (the configured one, else the
    shared one), or a configured plain callable alone.
    """
    if cfg.grader is not None and not isinstance(cfg.grader, Grader):
        return cfg.grader, None
    grader = cfg.grader or default_grader(cfg.grade_timeout_s or DEFAULT_TIMEOUT_S, cfg.grade_max_answer_chars)
    return grader.check, grader.check_references


def math_env(n_agents: int = 2, **kwargs: Any) -> WorkflowEnv:
    """Build a math env; keyword arguments are the fields of `MathEnvConfig`.

    Raises:
        TypeError: an unknown option (the message names it).
        ValueError: a bad option value or an unknown dataset name.

    """
    cfg = MathEnvConfig(n_agents=n_agents, **kwargs)
    grade, check_references = _grader(cfg)
    rules = MathRules(
        grade=grade,
        check_references=check_references,
        max_loops=cfg.max_loops,
        missing_verdict=cfg.missing_verdict,
        max_context_chars=cfg.max_context_chars,
        verdict_reward=cfg.verdict_reward,
        review_malformed=cfg.review_malformed,
        verifier_mode=cfg.verifier_mode,
        verdict_parsing=cfg.verdict_parsing,
    )
    factory = MathWorkflowFactory(cfg.n_agents, rules)
    prompts = _prompts(cfg, factory.roles)
    return WorkflowEnv(
        factory,
        env_tasks(cfg),
        roles=factory.roles,
        format_penalty=cfg.format_penalty,
        prompts=prompts,
        max_text_length=cfg.max_text_length,
        name=f"drmas_math_{cfg.n_agents}agent_v0",
        render_mode=cfg.render_mode,
    )
