"""The algorithm: what turns a step's scored calls into advantages, with no torch and no model.

Modules: `records` (one model call as the rollout records it and the learner consumes it), `advantages`
(the estimator registry: Dr. MAS and its baselines, one row each, and the per-agent statistics the
paper's argument rests on), `group_stats` (how many of each agent's calls a step can learn from, read
from the same registry rows).
"""
