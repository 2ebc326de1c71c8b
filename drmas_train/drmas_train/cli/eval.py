"""`drmas-train eval`: avg@k and pass@k of a model or a training checkpoint, per data source.

With `--model M` every agent runs on M; with `--checkpoint DIR` the team is rebuilt from the run's
`config.yaml` (same assignment, models and adapters) and the checkpoint's weights are loaded.
Sampling follows the paper's evaluation: temperature 0.6, top-p 0.95 (set 0 for greedy).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from drmas_envs import evaluate
from drmas_train.backends.base import SamplingParams
from drmas_train.checkpoint import load_checkpoint
from drmas_train.config import BackendName, ModelsConfig, Truncation, build_config, choices
from drmas_train.models.assignment import agent_to_policy, build_policies
from drmas_train.rollout import chat_prompt

log = logging.getLogger(__name__)


def eval_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="drmas-train eval", description="avg@k / pass@k per data source")
    p.add_argument("--env", required=True, help="env id, e.g. math-2agent")
    p.add_argument("--k", type=int, default=16, help="episodes per problem (paper: 16)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", default=None, help="HF id, local folder or tiny name (default: SmolLM2-135M-Instruct)")
    src.add_argument("--checkpoint", default=None, help="a checkpoint folder runs/<run>/checkpoints/step-N")
    p.add_argument("--n-problems", type=int, default=None, help="first N problems (default: all)")
    p.add_argument("--temperature", type=float, default=0.6, help="paper: 0.6")
    p.add_argument("--top-p", type=float, default=0.95, help="paper: 0.95")
    p.add_argument("--max-new-tokens", type=int, default=256, help="response cap per call")
    p.add_argument("--max-prompt-tokens", type=int, default=2048, help="longer prompts are cut (--truncation)")
    p.add_argument(
        "--truncation",
        choices=choices(Truncation),
        default="middle",
        help="the part of a long prompt cut: middle (keep head and tail), left (keep the tail), right, error",
    )
    p.add_argument(
        "--stop", action="append", default=[], metavar="STRING", help="a string that ends a reply (repeatable)"
    )
    p.add_argument("--batch-episodes", type=int, default=64, help="episodes run in lock-step at once")
    p.add_argument("--seed", type=int, default=0, help="problem order and sampling seed")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto")
    p.add_argument(
        "--backend", default="auto", choices=choices(BackendName), help="generation engine; auto: vllm where it imports"
    )
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE", help="env option (YAML value)")
    return p


def _team(args: argparse.Namespace) -> tuple[dict, dict[str, Any]]:
    """(agent -> policy, env kwargs) for a plain model or a checkpoint."""
    import drmas_envs
    from drmas_train.config import parse_assignment

    env_kwargs = dict(parse_assignment(a) for a in args.env_arg)
    agents = list(drmas_envs.make(args.env, **env_kwargs).possible_agents)
    if args.checkpoint is None:
        models = ModelsConfig(device=args.device, backend=args.backend)
        if args.model:
            models.name = args.model
        return agent_to_policy(build_policies(models, agents)), env_kwargs
    from drmas_train.policy_ops import load_policy_weights, sync_engine

    folder = Path(args.checkpoint)
    config_path = folder.parent.parent / "config.yaml"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} not found: --checkpoint expects <run_dir>/checkpoints/step-N")
    cfg = build_config(str(config_path), {"models.device": args.device, "models.backend": args.backend})
    ranks = {a: o.lora_rank for a, o in cfg.agents.items() if o.lora_rank is not None}
    policies = build_policies(cfg.models, agents, seed=cfg.seed, lora_ranks=ranks)
    weights = load_checkpoint(folder)["weights"]
    for name, policy in policies.items():
        load_policy_weights(policy, weights[name])
        sync_engine(policy)  # a vLLM engine holds its own copy of the weights
    return agent_to_policy(policies), env_kwargs


def run_eval(args: argparse.Namespace) -> dict[str, Any]:
    """Evaluate and return `drmas_envs.evaluate`'s result plus the settings used."""
    if args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)
    serving, env_kwargs = _team(args)
    sampling = SamplingParams(args.temperature, args.top_p, args.max_new_tokens, stop=tuple(args.stop))
    calls = {"n": 0}

    def policy(agent: str, observations: list[dict]) -> list[str]:
        p = serving[agent]
        prompts = [
            chat_prompt(p.tokenizer, o, args.max_prompt_tokens, truncation=args.truncation) for o in observations
        ]
        gens = p.backend.generate(
            prompts, [sampling] * len(prompts), adapters=[p.adapter] * len(prompts), seed=args.seed + calls["n"]
        )
        calls["n"] += 1
        return [g.text for g in gens]

    result = evaluate(
        policy,
        args.env,
        k=args.k,
        n_problems=args.n_problems,
        seed=args.seed,
        batch_episodes=args.batch_episodes,
        **env_kwargs,
    )
    source = args.checkpoint or args.model or "default model"
    return {"env": args.env, "source": str(source), "k": args.k, "temperature": args.temperature, **result}
