"""Prompt templates of the search envs, kept apart from the env logic.

Every user template may use these fields (filled by the workflow's `context`):
`{question}`; `{history}`, the recent search steps, each a `<search>` query and its
`<information>Doc 1(Title: ...) ...</information>` block; `{n_searches}`; `{searches_left}`;
`{step}` and `{max_steps}`; `{verifier_output}`, the Verifier's whole reply at this step when it was
the last call ("" otherwise). Override any role's template with `make(..., prompts={role: PromptTemplate(...)})`
or a file (`prompts_file`, `drmas_envs.prompt_files`).

Three built-in layouts (`prompt_layout`): "project" gives each role its instructions and a short worked
example in the system message; "chain" does the same with examples of two-hop questions (search the entity
the question names, then the one its passage names), for `world="held-out"`; "reference" is the reference
code's message layout, in this project's words: a generic system message, and the question, the search
history and the role's instructions in the user message, with no examples.
"""

from __future__ import annotations

from typing import Literal

from drmas_envs.workflow import PromptTemplate

_TEAM = (
    "You are part of a question-answering team with a Wikipedia-style search engine. "
    "Search results are shown as <information>Doc 1(Title: ...) ... Doc 2(Title: ...) ...</information>. "
)

# The examples at the end of each system prompt are there for small models. Without them SmolLM2-135M wrote
# no tag at all in almost every sampled call (drmas_benchmarks.search_format_smollm2). With a single example it
# copied the example itself: its query ("Marie Curie birthplace") and its answer ("Warsaw"). Three examples of
# different kinds, whose query is the question's entity copied, are what lifted the untrained model's avg@4,
# most at one passage a search (run 4 of benchmarks/results/cpu_default/search-2agent/README.md).
_EXAMPLE_INFO = (
    "<information>Doc 1(Title: Marie Curie) Marie Curie (born 1867 in Warsaw) was a physicist.</information>"
)
_ACME_INFO = (
    "<information>Doc 1(Title: Acme Works) Acme Works is a mining company founded in 1901 by John Smith.</information>"
)
_QUERY_RULE = (
    "The query is the name of the person, place or organisation the question asks about, copied from the question."
)
_QUERY_EXAMPLES = (
    "Question: Where was Marie Curie born?\nQuery: <search>Marie Curie</search>\n"
    "Question: Who founded Acme Works?\nQuery: <search>Acme Works</search>\n"
    "Question: On which river does Vienna lie?\nQuery: <search>Vienna</search>"
)
_ANSWER_EXAMPLES = (
    f"Question: Where was Marie Curie born? History: <search>Marie Curie</search> {_EXAMPLE_INFO}\n"
    "Answer: <answer>Warsaw</answer>\n"
    f"Question: In which year was Acme Works founded? History: <search>Acme Works</search> {_ACME_INFO}\n"
    "Answer: <answer>1901</answer>\n"
    "Question: On which river does Vienna lie? History: <search>Vienna</search> <information>Doc 1(Title: Vienna) "
    "Vienna is a city in Austria. It lies on the Danube river.</information>\n"
    "Answer: <answer>Danube</answer>"
)

VERIFIER = PromptTemplate(
    system=_TEAM
    + "You are the Verifier. Judge whether the information gathered so far is enough to answer the question. "
    "Think briefly, then end with <verify>yes</verify> if it is enough, or <verify>no</verify> if another search "
    "is needed.\n\nExamples:\nQuestion: Where was Marie Curie born? History: (no searches yet)\n"
    "Review: Nothing was searched yet. <verify>no</verify>\n"
    f"Question: Where was Marie Curie born? History: <search>Marie Curie</search> {_EXAMPLE_INFO}\n"
    "Review: Doc 1 says Warsaw. <verify>yes</verify>",
    user="Question: {question}\n\nSearch history:\n{history}\n\nIs this information enough to answer the question?",
)

SEARCH = PromptTemplate(
    system=_TEAM + "You are the Search agent. Write one search query that finds the information still missing, "
    f"inside <search>...</search>. {_QUERY_RULE}\n\nExamples:\n{_QUERY_EXAMPLES}",
    user="Question: {question}\n\nSearch history:\n{history}\n\nWrite the next search query.",
)

ANSWER = PromptTemplate(
    system=_TEAM + "You are the Answer agent. Answer the question from the information gathered, with a short phrase "
    "copied from the documents (a name, a place, a year or a number), inside <answer>...</answer>.\n\n"
    f"Examples:\n{_ANSWER_EXAMPLES}",
    user="Question: {question}\n\nSearch history:\n{history}\n\nGive the answer.",
)

SEARCH_OR_DONE = PromptTemplate(
    system=_TEAM + "You are the Search agent. Each turn, either write one search query inside <search>...</search>, "
    f"or, when the information gathered is enough to answer, hand over to the Answer agent by writing <done>. "
    f"{_QUERY_RULE}\n\n"
    "Examples:\nQuestion: Where was Marie Curie born? History: (no searches yet)\n"
    "Reply: <search>Marie Curie</search>\n"
    "Question: Who founded Acme Works? History: (no searches yet)\nReply: <search>Acme Works</search>\n"
    f"Question: Where was Marie Curie born? History: <search>Marie Curie</search> {_EXAMPLE_INFO}\nReply: <done>",
    user="Question: {question}\n\nSearch history:\n{history}\n\nSearches left: {searches_left}. "
    "Search again, or write <done>.",
)

SEARCHER = PromptTemplate(
    system="Answer the question. You may use a Wikipedia-style search engine: write a query inside "
    "<search>...</search> and the results come back as <information>Doc 1(Title: ...) ...</information>. "
    f"{_QUERY_RULE} Each turn, either search once or give the final answer, a short phrase copied from the "
    "documents, inside <answer>...</answer>. When no searches are left, you must answer.\n\n"
    "Examples:\nQuestion: Where was Marie Curie born? History: (no searches yet)\n"
    "Reply: <search>Marie Curie</search>\n"
    f"Question: Where was Marie Curie born? History: <search>Marie Curie</search> {_EXAMPLE_INFO}\n"
    "Reply: <answer>Warsaw</answer>\n"
    f"Question: In which year was Acme Works founded? History: <search>Acme Works</search> {_ACME_INFO}\n"
    "Reply: <answer>1901</answer>",
    user="Question: {question}\n\nSearch history:\n{history}\n\nSearches left: {searches_left}.",
)

# The "chain" layout: worked examples for two-hop questions (search the named entity, read the entity the
# question only describes, search it) whose questions are phrased unlike any question of the generated worlds
# (tests/envs/test_search_prompts_chain.py checks both), so the examples never hand over a world's own wording.
_CHAIN_INFO_1 = (
    "<information>Doc 1(Title: Marie Curie) Marie Curie, a physicist, was born in Warsaw in 1867.</information>"
)
_CHAIN_INFO_2 = (
    "<information>Doc 1(Title: Warsaw) Warsaw lies on the Vistula and is the capital of Poland.</information>"
)
_VIENNA_INFO = "<information>Doc 1(Title: Vienna) Vienna, the capital of Austria, stands on the Danube.</information>"
_CHAIN_Q = "Marie Curie's home city is in which country?"
_CHAIN_RULE = (
    "Search one name at a time. The first query is the name of the person, place or organisation the question "
    "names, copied from the question. When the question asks about someone or something it only describes (such "
    "as the founder of a company, or the city where someone was born), find that name in the passage, then search it."
)
_CHAIN_QUERIES = (
    f"Question: {_CHAIN_Q} History: (no searches yet)\nQuery: <search>Marie Curie</search>\n"
    f"Question: {_CHAIN_Q} History: <search>Marie Curie</search> {_CHAIN_INFO_1}\nQuery: <search>Warsaw</search>\n"
    "Question: Which river does Vienna stand on? History: (no searches yet)\nQuery: <search>Vienna</search>"
)
_CHAIN_BOTH = f"<search>Marie Curie</search> {_CHAIN_INFO_1} <search>Warsaw</search> {_CHAIN_INFO_2}"
_CHAIN_ANSWERS = (
    f"Question: {_CHAIN_Q} History: {_CHAIN_BOTH}\nAnswer: <answer>Poland</answer>\n"
    f"Question: Which river does Vienna stand on? History: <search>Vienna</search> {_VIENNA_INFO}\n"
    "Answer: <answer>Danube</answer>\n"
    f"Question: In what year was Marie Curie born? History: <search>Marie Curie</search> {_CHAIN_INFO_1}\n"
    "Answer: <answer>1867</answer>"
)

CHAIN_VERIFIER = PromptTemplate(
    system=_TEAM + "You are the Verifier. Judge whether the information gathered so far answers the question. "
    "Think briefly, then end with <verify>yes</verify> if it does, or <verify>no</verify> if another search is "
    f"needed.\n\nExamples:\nQuestion: {_CHAIN_Q} History: <search>Marie Curie</search> {_CHAIN_INFO_1}\n"
    "Review: Doc 1 names her city, Warsaw, but not its country. <verify>no</verify>\n"
    f"Question: {_CHAIN_Q} History: {_CHAIN_BOTH}\nReview: Warsaw is in Poland. <verify>yes</verify>",
    user=VERIFIER.user,
)
CHAIN_SEARCH = PromptTemplate(
    system=_TEAM + "You are the Search agent. Write one search query that finds the information still missing, "
    f"inside <search>...</search>. {_CHAIN_RULE}\n\nExamples:\n{_CHAIN_QUERIES}",
    user=SEARCH.user,
)
CHAIN_ANSWER = PromptTemplate(
    system=_TEAM + "You are the Answer agent. Answer the question from the information gathered, with a short phrase "
    "copied from the documents (a name, a place, a year or a number), inside <answer>...</answer>.\n\n"
    f"Examples:\n{_CHAIN_ANSWERS}",
    user=ANSWER.user,
)
CHAIN_SEARCH_OR_DONE = PromptTemplate(
    system=_TEAM + "You are the Search agent. Each turn, either write one search query inside <search>...</search>, "
    f"or, when the information gathered answers the question, hand over to the Answer agent by writing <done>. "
    f"{_CHAIN_RULE}\n\nExamples:\n{_CHAIN_QUERIES.replace('Query:', 'Reply:')}\n"
    f"Question: {_CHAIN_Q} History: {_CHAIN_BOTH}\nReply: <done>",
    user=SEARCH_OR_DONE.user,
)
CHAIN_SEARCHER = PromptTemplate(
    system="Answer the question. You may use a Wikipedia-style search engine: write a query inside "
    "<search>...</search> and the results come back as <information>Doc 1(Title: ...) ...</information>. "
    f"{_CHAIN_RULE} Each turn, either search once or give the final answer, a short phrase copied from the "
    "documents, inside <answer>...</answer>. When no searches are left, you must answer.\n\n"
    f"Examples:\n{_CHAIN_QUERIES.replace('Query:', 'Reply:')}\n"
    f"Question: {_CHAIN_Q} History: {_CHAIN_BOTH}\nReply: <answer>Poland</answer>",
    user=SEARCHER.user,
)

THINK_RULE = "\n\nFormat: first reason step by step inside <think>...</think> (exactly once), then write your reply."
"""Added to the Search and Answer prompts when the env requires a think block (`require_think`)."""


def with_think(template: PromptTemplate, *, in_user: bool = False) -> PromptTemplate:
    """`template` asking for one `<think>...</think>` before the reply, in its system message or its user one."""
    if in_user:
        return PromptTemplate(template.system, template.user + THINK_RULE, template.reply_prefix)
    return PromptTemplate(template.system + THINK_RULE, template.user, template.reply_prefix)


VERIFIER_OUTPUT = "The Verifier's output at this step:\n{verifier_output}"
"""Shown to the Search agent when the env's `search_sees_verifier` is on."""


def with_verifier_output(template: PromptTemplate) -> PromptTemplate:
    """`template` with this step's Verifier output shown just before its last paragraph (the instructions)."""
    head, sep, last = template.user.rpartition("\n\n")
    user = f"{head}{sep}{VERIFIER_OUTPUT}\n\n{last}" if sep else f"{VERIFIER_OUTPUT}\n\n{last}"
    return PromptTemplate(template.system, user, template.reply_prefix)


THREE_AGENT = {"verifier": VERIFIER, "search": SEARCH, "answer": ANSWER}
TWO_AGENT = {"search": SEARCH_OR_DONE, "answer": ANSWER}
ONE_AGENT = {"searcher": SEARCHER}

GENERIC_SYSTEM = "You are a helpful assistant."
"""The system message of the "reference" layout: the role lives in the user message."""

_REF_HISTORY = (
    "Steps taken so far: {n_searches}. Each search query is shown in <search>...</search> and what it retrieved "
    "in <information>...</information>:\n{history}\n\n"
)
_REF_TEAM = (
    "You are one of a team of agents that answers a question step by step, with a search engine over Wikipedia."
    "\nThe question: {question}\n\n" + _REF_HISTORY
)

REF_VERIFIER = PromptTemplate(
    GENERIC_SYSTEM,
    _REF_TEAM + "Your role: the Verifier, who routes the team. This is step {step} of {max_steps}. Look back at the "
    "team's queries (well aimed, or repeated, vague, or drifting from the question?) and judge whether the "
    "information gathered is enough to answer the question. Reason first, then route: <verify>yes</verify> if it "
    "is enough (the Answer agent answers), <verify>no</verify> if not (the Search agent searches again).",
)
REF_SEARCH = PromptTemplate(
    GENERIC_SYSTEM,
    _REF_TEAM + "Your role: the Search agent. Reason about the question, the searches so far and what your teammates "
    "wrote, then write one query for the information still missing inside <search>...</search>.",
)
REF_ANSWER = PromptTemplate(
    GENERIC_SYSTEM,
    _REF_TEAM + "Your role: the Answer agent. Reason over the information gathered and what you know, then give the "
    "final answer, a short phrase, inside <answer>...</answer>.",
)
REF_SEARCH_OR_DONE = PromptTemplate(
    GENERIC_SYSTEM,
    _REF_TEAM + "Your role: the Search agent. Searches left: {searches_left}. Write one query for the information "
    "still missing inside <search>...</search>, or, when the information is enough, hand over to the Answer agent "
    "by writing <done>.",
)
REF_SEARCHER = PromptTemplate(
    GENERIC_SYSTEM,
    "Answer a question step by step; you may use a search engine over Wikipedia.\nThe question: {question}\n\n"
    + _REF_HISTORY
    + "Searches left: {searches_left}. Either write one query inside <search>...</search>, or, when you know "
    "enough, give the final answer, a short phrase, inside <answer>...</answer>.",
)

SearchLayout = Literal["project", "chain", "reference"]
"""The built-in prompt sets' names (`prompt_layout`): the keys of `LAYOUTS`."""

LAYOUTS: dict[SearchLayout, dict[int, dict[str, PromptTemplate]]] = {
    "project": {3: THREE_AGENT, 2: TWO_AGENT, 1: ONE_AGENT},
    "chain": {
        3: {"verifier": CHAIN_VERIFIER, "search": CHAIN_SEARCH, "answer": CHAIN_ANSWER},
        2: {"search": CHAIN_SEARCH_OR_DONE, "answer": CHAIN_ANSWER},
        1: {"searcher": CHAIN_SEARCHER},
    },
    "reference": {
        3: {"verifier": REF_VERIFIER, "search": REF_SEARCH, "answer": REF_ANSWER},
        2: {"search": REF_SEARCH_OR_DONE, "answer": REF_ANSWER},
        1: {"searcher": REF_SEARCHER},
    },
}
"""The built-in prompt sets, by `prompt_layout` and number of agents."""

OPENING_TAGS = {"search": "<search>", "answer": "<answer>", "verifier": "<verify>", "searcher": "<search>"}
"""The reply each role's call opens with when the env writes it (`open_tags`); the one-agent searcher's last
call opens with `<answer>` instead (`OneAgentSearch.reply_prefix`)."""

CONTEXT_FIELDS = ("question", "history", "n_searches", "searches_left", "step", "max_steps", "verifier_output")
"""The fields every user template may use (see the module docstring)."""

NO_HISTORY = "(no searches yet)"
NO_QUERY = "(no valid query: nothing was retrieved)"
NO_RESULTS = "(no results)"
NO_ANSWER = "(the Answer agent wrote no <answer> tag: no answer, the team went on)"
"""Fixed strings inside `{history}`."""
