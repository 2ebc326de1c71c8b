"""drmas_train: agent-wise GRPO (Dr. MAS) for teams of LLM agents on drmas-envs environments."""

__version__ = "0.1.0"
