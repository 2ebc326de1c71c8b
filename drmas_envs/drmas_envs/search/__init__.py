"""The search environments (search-1agent, search-2agent, search-3agent) and their retrievers."""

from drmas_envs.search.env import SearchConfig, search_env
from drmas_envs.search.metrics import exact_match, f1_score, normalize_answer
from drmas_envs.search.workflows import OneAgentSearch, ThreeAgentSearch, TwoAgentSearch

__all__ = [
    "OneAgentSearch",
    "SearchConfig",
    "ThreeAgentSearch",
    "TwoAgentSearch",
    "exact_match",
    "f1_score",
    "normalize_answer",
    "search_env",
]
