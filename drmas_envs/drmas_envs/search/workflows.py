"""The search workflows: one, two and three agents around a retriever.

Step budget (`max_steps`, default 4). A *step* ends with a search or with the answer, so an
episode has at most `max_steps - 1` searches and always reaches the Answer role:

- 3 agents: each step the Verifier says yes (-> Answer) or no (-> Search, then the next step).
  In the last step the Verifier is not asked: the Answer agent is forced to answer. With
  `verify_last_step` (the reference's behaviour) it is asked there too, and "no" ends the episode
  without an answer (no searches are left).
- 2 agents: each step the Search agent writes `<search>` (retrieve, next step) or `<done>` (hand
  over to the Answer agent). In the last step the Answer agent is forced to answer.
- 1 agent: each call is a `<search>` or an `<answer>`; the episode ends at the first answer or
  after `max_steps` calls. A search in the last call is malformed (no searches left).

Malformed calls are penalised by the env (`format_penalty`) and never crash:
a malformed verdict counts as `malformed_verdict` ("no" by default: keep searching; the reference
counts it as "yes"); a malformed search call uses up its step with nothing retrieved; a malformed
answer means no answer (EM 0). With `require_think` a Search or Answer call (the one-agent searcher's
too) without exactly one `<think>...</think>` is malformed as well, but its query or answer still
counts, as in the reference (whose format check only decides the penalty).

Options that follow the reference code (each off by default):

- `malformed_answer = "continue"` (2 and 3 agents): an Answer call without an `<answer>` tag does not
  end the episode: it uses up its step (shown in the history as a step without an answer) and the
  next step begins, with the Verifier (3 agents) or the Search agent (2 agents). At the last step it
  ends the episode unanswered.
- `verdict_parsing = "reference"` (3 agents): a Verifier call is well-formed iff it holds `<verify>`
  and `</verify>`; `<verify>yes</verify>` anywhere (any case) routes to the Answer agent, even beside
  `<verify>no</verify>`; a call with neither counts as `malformed_verdict`.
- The Search agent's prompt may show this step's Verifier output (`{verifier_output}`; the env's
  `search_sees_verifier` adds it to the built-in prompts).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from drmas_envs.choices import VerdictParsing
from drmas_envs.search import parsing, prompts
from drmas_envs.search.metrics import contains_answer, exact_match, f1_score
from drmas_envs.search.retrievers.base import Passage, Retriever
from drmas_envs.workflow import Parsed, PromptTemplate, Score, Workflow

MalformedVerdict = Literal["yes", "no"]
"""What a Verifier reply without a readable verdict counts as (`SearchConfig.malformed_verdict`)."""
MalformedAnswer = Literal["end", "continue"]
"""What an Answer call without an `<answer>` tag does (`SearchConfig.malformed_answer`)."""


@dataclass(frozen=True)
class SearchStep:
    """One search: the query (None if the call was malformed) and the passages it returned."""

    query: str | None
    passages: tuple[Passage, ...] = ()
    unanswered: bool = False
    """The step was an Answer call without an `<answer>` tag (`malformed_answer="continue"`), not a search."""
    call: int | None = None
    """The index in `history` of the call that searched."""


def render_information(passages: tuple[Passage, ...]) -> str:
    r"""`<information>Doc 1(Title: T) text\nDoc 2(...)...</information>`, as Search-R1 shows results."""
    if not passages:
        return f"<information>{prompts.NO_RESULTS}</information>"
    docs = "\n".join(f"Doc {i}(Title: {p.title}) {p.text}" for i, p in enumerate(passages, start=1))
    return f"<information>{docs}</information>"


class SearchWorkflow(Workflow):
    """Shared state and scoring of the search workflows.

    Args:
        task: a question item (`question`, `golden_answers`).
        prompts: per-role template overrides.
        retriever: answers `search([query], topk)`.
        topk: passages per search.
        max_steps: the step budget (see the module docstring).
        history_steps: how many of the most recent searches every prompt shows.
        max_query_chars: longer queries and answers are clipped.
        malformed_verdict: what a malformed Verifier verdict counts as, "no" or "yes".
        verify_last_step: 3 agents: ask the Verifier at the last step too (see the module docstring).
        require_think: Search and Answer calls must hold exactly one `<think>...</think>`.
        malformed_answer: "end" or "continue": what an Answer call without an answer tag does.
        verdict_parsing: "strict" (the last tag, yes or no) or "reference" (see the module docstring).
        retrieval_reward: added to a search call's reward per passage it retrieves that the task's
            `supporting_titles` name and no earlier search found (`SearchConfig.retrieval_reward`).

    """

    roles: ClassVar[tuple[str, ...]] = ()
    step_role: ClassVar[str] = "answer"
    """The role that opens each step."""

    def __init__(
        self,
        task: Mapping[str, Any],
        *,
        prompts: Mapping[str, PromptTemplate] | None = None,
        retriever: Retriever,
        topk: int = 3,
        max_steps: int = 4,
        history_steps: int = 3,
        max_query_chars: int = 512,
        malformed_verdict: MalformedVerdict = "no",
        verify_last_step: bool = False,
        require_think: bool = False,
        malformed_answer: MalformedAnswer = "end",
        verdict_parsing: VerdictParsing = "strict",
        retrieval_reward: float = 0.0,
    ):
        super().__init__(task, prompts=prompts)
        self.retriever = retriever
        self.topk, self.max_steps, self.history_steps = topk, max_steps, history_steps
        self.max_query_chars = max_query_chars
        self.malformed_verdict = malformed_verdict
        self.verify_last_step, self.require_think = verify_last_step, require_think
        self.malformed_answer, self.verdict_parsing = malformed_answer, verdict_parsing
        self.retrieval_reward = retrieval_reward
        self.searches: list[SearchStep] = []
        self.answer: str | None = None
        self.forced_answer = False
        self.stopped_unanswered = False

    # -- helpers -----------------------------------------------------------------------------
    @property
    def searches_left(self) -> int:
        return max(0, self.max_steps - 1 - len(self.searches))

    def do_search(self, query: str | None) -> None:
        """Record one search step; a None query retrieves nothing."""
        passages = tuple(self.retriever.search([query], self.topk)[0]) if query else ()
        self.searches.append(SearchStep(query, passages, call=len(self.history) - 1))

    def render_history(self) -> str:
        """The last `history_steps` searches with their results."""
        if not self.searches:
            return prompts.NO_HISTORY
        first = max(0, len(self.searches) - self.history_steps)
        blocks = []
        for i, step in enumerate(self.searches[first:], start=first + 1):
            if step.unanswered:
                blocks.append(f"Step {i}: {prompts.NO_ANSWER}")
                continue
            query = f"<search>{step.query}</search>" if step.query else prompts.NO_QUERY
            info = render_information(step.passages) if step.query else ""
            blocks.append(f"Step {i}: {query}\n{info}".rstrip())
        return "\n\n".join(blocks)

    def context(self, role: str) -> dict[str, Any]:
        return {
            "question": self.task["question"],
            "history": self.render_history(),
            "n_searches": len(self.searches),
            "searches_left": self.searches_left,
            "step": len(self.searches) + 1,
            "max_steps": self.max_steps,
            "verifier_output": self.history[-1].text if self.history and self.history[-1].role == "verifier" else "",
        }

    def take_answer(self, parsed: Parsed) -> None:
        # the value, not `valid`: a call that only failed the think check still answers (see above)
        if parsed.value and parsed.value[0] == "answer" and parsed.value[1]:
            self.answer = parsed.value[1]

    def after_answer(self, parsed: Parsed) -> str | None:
        """The Answer role's call ends the episode, unless it held no answer tag and steps remain under
        `malformed_answer="continue"`: then it uses up its step and the next step begins.
        """
        self.take_answer(parsed)
        if parsed.value is not None or self.malformed_answer != "continue":
            return None
        last = self.searches_left == 0
        self.searches.append(SearchStep(None, unanswered=True))
        return None if last else self._after_search()

    def parse_verdict(self, text: str) -> Parsed:
        """The Verifier's verdict, read as `verdict_parsing` says."""
        return parsing.reference_verdict(text) if self.verdict_parsing == "reference" else parsing.parse_verdict(text)

    @staticmethod
    def query_of(parsed: Parsed) -> str | None:
        """The call's search query, or None (malformed or empty); a failed think check keeps it."""
        return parsed.value[1] if parsed.value and parsed.value[0] == "search" else None

    def check_think(self, text: str, parsed: Parsed) -> Parsed:
        """With `require_think`, a call without exactly one think block is malformed (its value kept)."""
        if not self.require_think or not parsed.valid:
            return parsed
        error = parsing.think_error(text)
        return Parsed(False, parsed.value, error) if error else parsed

    def score(self) -> Score:
        golds = [str(g) for g in self.task["golden_answers"]]
        retrieved = [p for s in self.searches for p in s.passages]
        em = exact_match(self.answer, golds)
        return Score(
            em,
            {
                "em": em,
                "f1": f1_score(self.answer, golds),
                "answer": self.answer,
                "n_searches": sum(s.query is not None for s in self.searches),
                "answer_in_passages": any(contains_answer(f"{p.title} {p.text}", golds) for p in retrieved),
                "golden_answers": golds,
                "forced_answer": self.forced_answer,
                "stopped_unanswered": self.stopped_unanswered,
                "queries": [s.query for s in self.searches if not s.unanswered],
                "unanswered_steps": sum(s.unanswered for s in self.searches),
            },
            call_bonus=self.retrieval_bonus(),
        )

    def retrieval_bonus(self) -> tuple[float, ...]:
        """Per call: `retrieval_reward` x the supporting passages its search found first (empty: none)."""
        supporting = set(self.task.get("supporting_titles") or ())
        if not self.retrieval_reward or not supporting:
            return ()
        bonus, found = [0.0] * len(self.history), set()
        for step in self.searches:
            new = {p.title for p in step.passages} & supporting - found
            if step.call is not None and new:
                bonus[step.call] += self.retrieval_reward * len(new)
                found |= new
        return tuple(bonus)

    def parse_answer_role(self, text: str) -> Parsed:
        found = parsing.first_action(text, ("answer",))
        if found is None:
            return Parsed(False, None, "no <answer>...</answer> tag")
        return self.check_think(text, parsing.parse_answer(found[1], self.max_query_chars))

    def _last_step_role(self) -> str:
        """Who opens the last step: the Verifier (`verify_last_step`, 3 agents), else the forced Answer."""
        if self.verify_last_step and self.step_role == "verifier":
            return "verifier"
        self.forced_answer = True
        return "answer"

    def _after_search(self) -> str:
        """The role after a search step: the next step's first role, or the last step's."""
        return self._last_step_role() if self.searches_left == 0 else self.step_role

    def first_role(self) -> str:
        return self._last_step_role() if self.max_steps <= 1 else self.step_role


class ThreeAgentSearch(SearchWorkflow):
    """Verifier -> Search or Answer each step (the paper's search team)."""

    roles = ("verifier", "search", "answer")
    default_prompts = prompts.THREE_AGENT
    step_role = "verifier"

    def parse(self, role: str, text: str) -> Parsed:
        if role == "verifier":
            return self.parse_verdict(text)
        if role == "search":
            return self.check_think(text, parsing.parse_action(text, ("search",), self.max_query_chars))
        return self.parse_answer_role(text)

    def transition(self, role: str, parsed: Parsed) -> str | None:
        if role == "verifier":
            verdict = parsed.value if parsed.value is not None else self.malformed_verdict
            if verdict == "yes":
                return "answer"
            if self.searches_left == 0:  # the last step (verify_last_step): no search left, no answer
                self.stopped_unanswered = True
                return None
            return "search"
        if role == "search":
            self.do_search(self.query_of(parsed))
            return self._after_search()
        return self.after_answer(parsed)


class TwoAgentSearch(SearchWorkflow):
    """Search (`<search>` or `<done>` hand-over) -> Answer."""

    roles = ("search", "answer")
    default_prompts = prompts.TWO_AGENT
    step_role = "search"

    def parse(self, role: str, text: str) -> Parsed:
        if role == "search":
            return self.check_think(text, parsing.parse_action(text, ("search", "done"), self.max_query_chars))
        return self.parse_answer_role(text)

    def transition(self, role: str, parsed: Parsed) -> str | None:
        if role == "search":
            if parsed.value and parsed.value[0] == "done":
                return "answer"
            self.do_search(self.query_of(parsed))
            return self._after_search()
        return self.after_answer(parsed)


class OneAgentSearch(SearchWorkflow):
    """One agent searches (`<search>`) until it answers (`<answer>`), Search-R1 style."""

    roles = ("searcher",)
    default_prompts = prompts.ONE_AGENT
    step_role = "searcher"

    @property
    def searches_left(self) -> int:
        return max(0, self.max_steps - 1 - len(self.history))

    def reply_prefix(self, role: str) -> str:
        """An opened `<search>` becomes `<answer>` at the last call, where a search is malformed."""
        prefix = super().reply_prefix(role)
        return "<answer>" if prefix == "<search>" and self.searches_left == 0 else prefix

    def parse(self, role: str, text: str) -> Parsed:
        parsed = parsing.parse_action(text, ("search", "answer"), self.max_query_chars)
        if parsed.valid and parsed.value[0] == "search" and self.searches_left == 0:
            return Parsed(False, ("search", None), "no searches left: the last call must answer")
        return self.check_think(text, parsed)

    def transition(self, role: str, parsed: Parsed) -> str | None:
        if parsed.value and parsed.value[0] == "answer" and parsed.value[1]:
            self.take_answer(parsed)
            return None
        if len(self.history) >= self.max_steps:
            return None
        query = self.query_of(parsed)
        if query:
            self.do_search(query)
        else:
            self.searches.append(SearchStep(None))
        return "searcher"

    def first_role(self) -> str:
        return "searcher"
