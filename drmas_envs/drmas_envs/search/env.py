"""`search_env`: the search-1agent / 2agent / 3agent environments.

    env = drmas_envs.make("search-3agent")                       # the generated world, BM25
    env = drmas_envs.make("search-3agent", dataset="nq", corpus="wiki.jsonl.gz", retriever="dense")
    env = drmas_envs.make("search-2agent", dataset="q.jsonl", retriever="http://127.0.0.1:8000")

Rewards: exact match (SQuAD-normalised, against any gold answer) to every agent at the end, minus
`format_penalty` per malformed call of that agent, plus `retrieval_reward` per supporting passage a
search call finds first (0 by default). See docs/search.md.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from drmas_envs.choices import VerdictParsing, check_choices
from drmas_envs.data import BadRows
from drmas_envs.env import WorkflowEnv
from drmas_envs.prompt_files import PromptFileError, load_prompts_file, template_fields
from drmas_envs.provenance import TaskSet
from drmas_envs.search import prompts as search_prompts
from drmas_envs.search.data import WORLD_NAMES, default_corpus, load_questions
from drmas_envs.search.heldout import WorldKind, heldout_world
from drmas_envs.search.prompts import SearchLayout
from drmas_envs.search.retrievers import Retriever, build_in_memory, get_retriever
from drmas_envs.search.workflows import (
    MalformedAnswer,
    MalformedVerdict,
    OneAgentSearch,
    SearchWorkflow,
    ThreeAgentSearch,
    TwoAgentSearch,
)
from drmas_envs.search.world import generate_world
from drmas_envs.workflow import PromptTemplate

HOP_COUNTS = (1, 2)
"""The generated worlds' hop counts (`SearchConfig.hops`; each question's `hops`)."""

WORKFLOWS: dict[int, type[SearchWorkflow]] = {1: OneAgentSearch, 2: TwoAgentSearch, 3: ThreeAgentSearch}


@dataclass
class SearchConfig:
    """Options of the search envs (all keyword arguments of `make`)."""

    dataset: str | None = None
    """None: the generated world; a JSONL/Parquet path; a known name (nq, triviaqa, popqa, hotpotqa, ...,
    bamboogle); or one of the paper's sets: `nq_hotpotqa_train` (training), `search_test_sampled` (the
    reference's validation set, 30 per source), `search_test` (the full test sets); docs/paper_runs.md."""
    split: str | None = None
    """World: "train" (default), "test" or "all", and "validation" for `world="held-out"`; known names: the
    file's split (default: the paper's eval split)."""
    data_dir: str | None = None
    """Local data directory for known names (then $DRMAS_DATA_DIR, then the Hugging Face hub)."""
    bad_rows: BadRows = "error"
    """A malformed dataset row: "error" stops with one line naming file and row; "skip" leaves it out, logs
    how many and where the first ones are, and records them in the dataset's provenance (`skipped_rows`)."""
    corpus: str | None = None
    """A JSONL(.gz) corpus; default: the world's own, or the data directory's Wikipedia passages for known names."""
    retriever: str = "bm25"
    """"bm25" (in-process), "dense" (sentence-transformers, needs drmas-envs[dense]), "faiss" (dense through a
    FAISS IVF-PQ index, also drmas-envs[faiss]) or a service URL (the paper's wiki-18: docs/retrieval.md)."""
    encoder: str = "minilm"
    """Dense encoder: "minilm" (offline copy if installed), "e5" (intfloat/e5-base-v2, as in the paper), a path."""
    index_dir: str | None = None
    """Where the corpus index is built and loaded; default: a cache folder keyed by the corpus file."""
    topk: int = 3
    """Passages per search (the paper uses 3)."""
    max_steps: int = 4
    """Step budget; a step ends in a search or the answer, so at most max_steps - 1 searches (the paper: 4)."""
    history_steps: int = 3
    """How many of the most recent searches every prompt shows."""
    format_penalty: float | Mapping[str, float] = 0.01
    """Subtracted from an agent's reward per malformed call (the paper uses 0.01 for search)."""
    malformed_verdict: MalformedVerdict = "no"
    """What a malformed Verifier verdict counts as: "no" (search again) or "yes" (answer now; the reference
    treats any verdict that is not <verify>no</verify> as yes). The call is penalised either way."""
    verify_last_step: bool = False
    """3 agents: also ask the Verifier at the last step, where "no" ends the episode unanswered (the reference
    does: its Search agent only runs while steps remain). False: the last step goes straight to the Answer agent."""
    require_think: bool = False
    """The reference's format check: a Search or Answer call (one agent: every call) needs exactly one
    <think>...</think>, else it is malformed and penalised, its query or answer still used; their prompts
    then ask for it. False: only the action tag is checked."""
    verdict_parsing: VerdictParsing = "strict"
    """How a Verifier reply is read. "strict": the last `<verify>` tag, which must say yes or no, else the call is
    malformed. "reference" (the reference's `get_verification_vector`): a reply holding `<verify>` and `</verify>`
    is well-formed, `<verify>yes</verify>` anywhere (any case) means yes even beside `<verify>no</verify>`, and a
    reply with neither counts as `malformed_verdict`. The paper presets use "reference"."""
    malformed_answer: MalformedAnswer = "end"
    """What an Answer call without an `<answer>` tag does (2 and 3 agents). "end": the episode ends unanswered.
    "continue" (the reference, whose env only ends on an answer tag): the call uses up its step and the next step
    begins, the Verifier running again; at the last step it ends unanswered. Penalised either way."""
    search_sees_verifier: bool = False
    """3 agents: the Search agent's prompt shows the Verifier's whole reply at this step (`{verifier_output}`), as
    the reference's team context does; the built-in prompts gain the section, and a Search template of your own
    must use the field. False: the Search agent sees the question and the search history only."""
    prompt_layout: SearchLayout = "project"
    """The built-in prompts. "project": each role's instructions and a short worked example in the system message
    (the examples give a small model its format: drmas_benchmarks.search_format_smollm2). "chain": the same, its
    examples two-hop questions (search the named entity, then the one its passage names), phrased unlike any
    question of the generated worlds; for `world="held-out"`. "reference": the reference
    code's layout in this project's words: a generic system message, and the question, history and role
    instructions in the user message, with no examples (the paper presets)."""
    prompts_file: str | None = None
    """A JSON or YAML file of per-role templates ({role: {system, user[, reply_prefix]}}) over the layout's, for
    any prompt set (e.g. the reference's own); checked when the env is made (`drmas_envs.prompt_files`)."""
    open_tags: bool = False
    """The env writes the opening tag of each reply for the model (`reply_prefix`): `<search>` for the Search
    agent, `<answer>` for the Answer agent, `<verify>` for the Verifier; one agent: `<search>` while searches
    are left, `<answer>` at the last call. A small model then only writes the query or answer and its closing
    tag, so the format is reachable (SmolLM2-135M writes no tag on its own at first). The 2-agent Search agent
    can no longer hand over early (`<done>`): it searches every step left. Off in the paper presets."""
    hops: list[int] | None = None
    """The generated world only: keep questions of these hop counts (1: single-hop, 2: multi-hop), e.g. [1]
    to train on single-hop questions first; None: all. The paper trains on NQ + HotpotQA (None)."""
    world: WorldKind = "classic"
    """The generated world (dataset None). "classic": one world (seed 0), its questions split into train and
    test, one wording per fact and per question kind. "held-out": training on `train_worlds` worlds, the
    validation and test splits on worlds of their own whose names never occur in training, each fact in
    several wordings among distractors, two passages per entity, confusable names, several question
    phrasings, wordings held out for the held-out worlds, two-hop questions that never name the middle
    entity (`drmas_envs.search.heldout`; sources per wording, see docs/search.md)."""
    train_worlds: int = 4
    """`world="held-out"`: how many worlds the train split draws its questions from."""
    retrieval_reward: float = 0.0
    """Added to a search call's reward for each passage it retrieves that the question's `supporting_titles`
    name and no earlier search of the episode found: a shaping term for the searching agent alone (the Answer
    agent and the Verifier keep exact match), so the Search agent has a signal while every answer is still
    wrong, e.g. a small model's first two-hop searches. The outcome (a right answer) is unchanged. Questions
    without `supporting_titles` (the generated worlds have them) earn none. 0 in the paper (EM only)."""
    max_query_chars: int = 512
    """Queries and answers are clipped to this many characters."""
    timeout: float = 30.0
    """Seconds per request to a retrieval service."""
    retries: int = 3
    """Extra attempts per request to a retrieval service after a connection error, a timeout or a 5xx/429
    reply, the wait between them doubling from 0.2 s (3: 1.4 s in all; 10: 205 s, to ride out a restart).
    After the last one, training stops with one line naming the service; its last checkpoint is intact."""
    prompts: Mapping[str, PromptTemplate | Mapping[str, str]] = field(default_factory=dict)
    """Per-role prompt overrides: a PromptTemplate or {"system": ..., "user": ...}; they win over `prompts_file`."""
    render_mode: str | None = None
    """None or "ansi"."""

    def __post_init__(self) -> None:
        check_choices(self)
        if self.hops is not None and (not self.hops or set(self.hops) - set(HOP_COUNTS)):
            raise ValueError(f"hops must be a non-empty list of {list(HOP_COUNTS)}, not {self.hops!r}")
        if self.hops is not None and self.dataset not in WORLD_NAMES:
            raise ValueError(
                f"hops filters the generated world's questions; dataset {self.dataset!r} has no hop counts"
            )
        self._check_world()
        if not 0 <= self.retrieval_reward < float("inf"):
            raise ValueError(f"retrieval_reward must be a finite number >= 0, not {self.retrieval_reward!r}")
        if self.max_steps < 1 or self.topk < 1 or self.history_steps < 0 or self.retries < 0:
            raise ValueError("max_steps and topk must be at least 1, history_steps and retries at least 0")

    def _check_world(self) -> None:
        if self.train_worlds < 1:
            raise ValueError(f"train_worlds must be at least 1, not {self.train_worlds}")
        if self.world == "held-out" and (
            self.dataset not in WORLD_NAMES or self.corpus is not None or self.retriever.startswith("http")
        ):
            raise ValueError(
                "world='held-out' generates its own questions and corpora: leave dataset and corpus unset and use "
                f"an in-process retriever (bm25 or dense), not dataset={self.dataset!r}, corpus={self.corpus!r}, "
                f"retriever={self.retriever!r}"
            )


@functools.lru_cache(maxsize=4)
def _world_retriever(kind: str, encoder: str) -> Retriever:
    return build_in_memory(list(generate_world().passages), kind, encoder=encoder)


@functools.cache  # every world a process uses keeps its index: a factory looks one up per episode
def heldout_retriever(key: str, kind: str = "bm25", encoder: str = "minilm") -> Retriever:
    """The (cached) in-memory retriever over the passages of the held-out world `key` ("test-0", ...)."""
    return build_in_memory(list(heldout_world(key).passages), kind, encoder=encoder)


def world_retrievers(cfg: SearchConfig) -> Callable[[str], Retriever] | None:
    """`world="held-out"`: world key -> the (cached) retriever over that world's passages; else None."""
    if cfg.world != "held-out":
        return None
    kind, encoder = cfg.retriever, cfg.encoder
    return lambda key: heldout_retriever(key, kind, encoder)  # positional: one cache entry per world and kind


def resolve_retriever(cfg: SearchConfig) -> Retriever | None:
    """The (cached) retriever the config asks for; None for the held-out worlds (one per world instead)."""
    if cfg.world == "held-out":
        return None
    if cfg.retriever.startswith(("http://", "https://")):
        return get_retriever(cfg.retriever, timeout=cfg.timeout, retries=cfg.retries)
    corpus = cfg.corpus
    if corpus is None and cfg.dataset in WORLD_NAMES:
        return _world_retriever(cfg.retriever, cfg.encoder)
    if corpus is None:
        found = default_corpus(cfg.data_dir)
        if found is None:
            raise ValueError(
                f"dataset {cfg.dataset!r} needs a corpus: pass corpus=FILE.jsonl(.gz), a data_dir holding "
                "corpus/wiki_passages.jsonl.gz, or retriever='http://host:port'"
            )
        corpus = str(found)
    return get_retriever(cfg.retriever, str(corpus), index_dir=cfg.index_dir, encoder=cfg.encoder)


def _templates(overrides: Mapping[str, Any], roles: tuple[str, ...]) -> dict[str, PromptTemplate]:
    unknown = set(overrides) - set(roles)
    if unknown:
        raise ValueError(f"prompts for unknown roles {sorted(unknown)}; roles: {list(roles)}")
    return {r: t if isinstance(t, PromptTemplate) else PromptTemplate(**t) for r, t in overrides.items()}


def _prompts(cfg: SearchConfig, n_agents: int, roles: tuple[str, ...]) -> dict[str, PromptTemplate]:
    """Each role's template: `prompts`, else `prompts_file`, else the layout's (with the options' additions)."""
    reference = cfg.prompt_layout == "reference"
    out = dict(search_prompts.LAYOUTS[cfg.prompt_layout][n_agents])
    sees = cfg.search_sees_verifier and n_agents == 3
    if sees:
        out["search"] = search_prompts.with_verifier_output(out["search"])
    if cfg.require_think:  # the roles whose format check reads the think block are told about it
        for role in set(roles) - {"verifier"}:
            out[role] = search_prompts.with_think(out[role], in_user=reference)
    if cfg.open_tags:
        if n_agents == 2:  # the Search agent always searches: its prompt stops offering the <done> hand-over
            out["search"] = search_prompts.LAYOUTS[cfg.prompt_layout][3]["search"]
        for role in set(roles) & set(search_prompts.OPENING_TAGS):
            out[role] = dataclasses.replace(out[role], reply_prefix=search_prompts.OPENING_TAGS[role])
    if cfg.prompts_file is not None:
        out.update(load_prompts_file(cfg.prompts_file, roles, search_prompts.CONTEXT_FIELDS))
    out.update(_templates(cfg.prompts, roles))
    if sees and "verifier_output" not in template_fields(out["search"].user, "prompts['search'].user"):
        raise PromptFileError(
            "search_sees_verifier is on but the Search template does not show {verifier_output}; add the field "
            f"to it{f' in {cfg.prompts_file}' if cfg.prompts_file else ''} or turn the option off"
        )
    return out


def _with_hops(tasks: TaskSet, hops: list[int]) -> TaskSet:
    """The world's questions of the given hop counts, in their order, the provenance saying so."""
    items = [q for q in tasks if q["hops"] in hops]
    return TaskSet(items, {**tasks.provenance, "hops": sorted(set(hops)), "n": len(items)})


class _Factory:
    """Builds one workflow per episode with the env's retriever and settings."""

    def __init__(self, cls: type[SearchWorkflow], worlds: Callable[[str], Retriever] | None = None, **kwargs: Any):
        self.cls, self.kwargs, self.worlds = cls, kwargs, worlds
        self.roles = cls.roles
        self.max_calls = 2 * kwargs["max_steps"] + 1  # 3 agents: a verdict and a search per step, then an answer

    def __call__(self, task: Mapping[str, Any], prompts: Mapping[str, PromptTemplate] | None = None) -> SearchWorkflow:
        if self.worlds is not None:  # the held-out worlds: each question searches its own world's passages
            return self.cls(task, prompts=prompts, **{**self.kwargs, "retriever": self.worlds(task["world"])})
        return self.cls(task, prompts=prompts, **self.kwargs)


def search_env(n_agents: int, **kwargs: Any) -> WorkflowEnv:
    """A search env with 1, 2 or 3 agents; `kwargs` are the fields of `SearchConfig`."""
    if n_agents not in WORKFLOWS:
        raise ValueError(f"n_agents must be 1, 2 or 3, not {n_agents}")
    valid = {f.name for f in dataclasses.fields(SearchConfig)}
    unknown = set(kwargs) - valid
    if unknown:
        raise TypeError(f"unknown search env option(s) {sorted(unknown)}; options: {sorted(valid)}")
    cfg = SearchConfig(**kwargs)
    cls = WORKFLOWS[n_agents]
    tasks = load_questions(cfg.dataset, cfg.split, cfg.data_dir, cfg.bad_rows, cfg.world, cfg.train_worlds)
    if cfg.hops is not None:
        tasks = _with_hops(tasks, cfg.hops)
    factory = _Factory(
        cls,
        worlds=world_retrievers(cfg),
        retriever=resolve_retriever(cfg),
        topk=cfg.topk,
        max_steps=cfg.max_steps,
        history_steps=cfg.history_steps,
        max_query_chars=cfg.max_query_chars,
        malformed_verdict=cfg.malformed_verdict,
        verify_last_step=cfg.verify_last_step,
        require_think=cfg.require_think,
        malformed_answer=cfg.malformed_answer,
        verdict_parsing=cfg.verdict_parsing,
        retrieval_reward=cfg.retrieval_reward,
    )
    templates = _prompts(cfg, n_agents, cls.roles)
    return WorkflowEnv(
        factory,
        tasks,
        roles=cls.roles,
        format_penalty=cfg.format_penalty,
        prompts=templates,
        name=f"drmas_search_{n_agents}agent_v0",
        render_mode=cfg.render_mode,
    )
