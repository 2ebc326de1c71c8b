"""Worked examples of new workflows on the workflow base (see docs/workflows.md)."""
