"""drmas_envs: multi-agent LLM workflows as PettingZoo AEC environments.

    import drmas_envs
    env = drmas_envs.make("math-2agent")          # or pettingzoo.make("aec", "drmas/math-2agent-v0")
    drmas_envs.list_envs()
    drmas_envs.evaluate(policy, "math-2agent", k=16)

Importing this package registers every built-in env here and in PettingZoo's registry, and the envs
that installed packages declare in the `drmas_envs.envs` entry-point group (`drmas_envs.loading`).
`make` also takes a `package.module:factory` reference. No torch is imported, here or by any env.
"""

from drmas_envs.data import DataError, DatasetNotFoundError, read_jsonl
from drmas_envs.env import WorkflowEnv
from drmas_envs.evaluate import evaluate
from drmas_envs.loading import EnvNotFoundError
from drmas_envs.lockstep import EpisodeResult, run_lockstep
from drmas_envs.provenance import TaskSet, dataset_provenance, reference_check
from drmas_envs.registry import discover_installed, env_dataset, list_envs, make, register
from drmas_envs.services import ServiceError
from drmas_envs.workflow import Call, Parsed, PromptTemplate, Score, Workflow

__version__ = "0.1.0"

register(
    "math-1agent",
    "drmas_envs.math.env:math_env",
    n_agents=1,
    description="one Solver answers in \\boxed{} (the single-agent baseline)",
)
register(
    "math-2agent",
    "drmas_envs.math.env:math_env",
    n_agents=2,
    description="Solver -> Verifier -> (on reject) Solver, up to max_loops (the paper's math team)",
)
register(
    "search-1agent",
    "drmas_envs.search.env:search_env",
    n_agents=1,
    description="one agent searches several times, then answers (Search-R1 style)",
)
register(
    "search-2agent",
    "drmas_envs.search.env:search_env",
    n_agents=2,
    description="a Search agent gathers passages, an Answer agent answers",
)
register(
    "search-3agent",
    "drmas_envs.search.env:search_env",
    n_agents=3,
    description="Verifier -> Search or Answer each step, up to max_steps (the paper's search team)",
)
discover_installed()

__all__ = [
    "Call",
    "DataError",
    "DatasetNotFoundError",
    "EnvNotFoundError",
    "EpisodeResult",
    "Parsed",
    "PromptTemplate",
    "Score",
    "ServiceError",
    "TaskSet",
    "Workflow",
    "WorkflowEnv",
    "dataset_provenance",
    "env_dataset",
    "evaluate",
    "list_envs",
    "make",
    "read_jsonl",
    "reference_check",
    "register",
    "run_lockstep",
]
