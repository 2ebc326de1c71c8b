"""Prompt templates of the search envs, kept apart from the env logic.

Every user template may use these fields (filled by the workflow's `context`):
`{question}`; `{history}`, the recent search steps, each a `<search>` query and its
`<information>Doc 1(Title: ...) ...</information>` block; `{n_searches}`; `{searches_left}`;
`{step}` and `{max_steps}`. Override any role's template with `make(..., prompts={role: PromptTemplate(...)})`.
"""

from __future__ import annotations

from drmas_envs.workflow import PromptTemplate

_TEAM = (
    "You are part of a question-answering team with a Wikipedia-style search engine. "
    "Search results are shown as <information>Doc 1(Title: ...) ... Doc 2(Title: ...) ...</information>. "
)

# The short examples at the end of each system prompt are there for small models: without them
# SmolLM2-135M wrote no tag at all in almost every sampled call, so every call got the same reward
# and training had no signal (benchmarks/search_format_smollm2.py measures the difference).
_EXAMPLE_INFO = "<information>Doc 1(Title: Marie Curie) Marie Curie was born in Warsaw in 1867. ...</information>"

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
    "inside <search>...</search>. A good query names the entity you need to look up.\n\n"
    "Example:\nQuestion: Where was Marie Curie born?\nQuery: <search>Marie Curie birthplace</search>",
    user="Question: {question}\n\nSearch history:\n{history}\n\nWrite the next search query.",
)

ANSWER = PromptTemplate(
    system=_TEAM + "You are the Answer agent. Answer the question from the information gathered, with a short phrase "
    "(a name, a place, a date or a number), inside <answer>...</answer>.\n\n"
    f"Example:\nQuestion: Where was Marie Curie born? History: <search>Marie Curie</search> {_EXAMPLE_INFO}\n"
    "Answer: <answer>Warsaw</answer>",
    user="Question: {question}\n\nSearch history:\n{history}\n\nGive the answer.",
)

SEARCH_OR_DONE = PromptTemplate(
    system=_TEAM + "You are the Search agent. Each turn, either write one search query inside <search>...</search>, "
    "or, when the information gathered is enough to answer, hand over to the Answer agent by writing <done>.\n\n"
    "Examples:\nQuestion: Where was Marie Curie born? History: (no searches yet)\n"
    "Reply: <search>Marie Curie birthplace</search>\n"
    f"Question: Where was Marie Curie born? History: <search>Marie Curie</search> {_EXAMPLE_INFO}\nReply: <done>",
    user="Question: {question}\n\nSearch history:\n{history}\n\nSearches left: {searches_left}. "
    "Search again, or write <done>.",
)

SEARCHER = PromptTemplate(
    system="Answer the question. You may use a Wikipedia-style search engine: write a query inside "
    "<search>...</search> and the results come back as <information>Doc 1(Title: ...) ...</information>. "
    "Each turn, either search once or give the final answer, a short phrase, inside <answer>...</answer>. "
    "When no searches are left, you must answer.\n\n"
    "Examples:\nQuestion: Where was Marie Curie born? History: (no searches yet)\n"
    "Reply: <search>Marie Curie birthplace</search>\n"
    f"Question: Where was Marie Curie born? History: <search>Marie Curie</search> {_EXAMPLE_INFO}\n"
    "Reply: <answer>Warsaw</answer>",
    user="Question: {question}\n\nSearch history:\n{history}\n\nSearches left: {searches_left}.",
)

THINK_RULE = "\n\nFormat: first reason step by step inside <think>...</think> (exactly once), then write your reply."
"""Added to the Search and Answer prompts when the env requires a think block (`require_think`)."""


def with_think(template: PromptTemplate) -> PromptTemplate:
    """`template` with its system prompt asking for one `<think>...</think>` before the reply."""
    return PromptTemplate(system=template.system + THINK_RULE, user=template.user)


THREE_AGENT = {"verifier": VERIFIER, "search": SEARCH, "answer": ANSWER}
TWO_AGENT = {"search": SEARCH_OR_DONE, "answer": ANSWER}
ONE_AGENT = {"searcher": SEARCHER}

NO_HISTORY = "(no searches yet)"
NO_QUERY = "(no valid query: nothing was retrieved)"
NO_RESULTS = "(no results)"
"""Fixed strings inside `{history}`."""
