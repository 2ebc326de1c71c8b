r"""Dr. MAS in one file: a two-agent math team trained with per-agent group advantages and PPO.

    python examples/minimal_drmas.py          # no arguments, CPU, nothing downloaded

This is the algorithm `drmas-train` runs, with everything else taken away (no vLLM, Ray, FSDP,
LoRA, prefix trees, checkpoints or config system): the env, a lock-step rollout, Dr. MAS
advantages and the PPO step, in transformers and torch, read top to bottom. It trains the
`math-2agent` team on a tiny model for a few steps and prints the loss of every PPO epoch.

Every algorithmic choice, stated once:

- Env: `drmas_envs.make("math-2agent")`. The Solver answers in \boxed{}; the Verifier approves or
  rejects; on a reject the Solver tries again (2 attempts at most). Generated level-1 problems.
  The env is the one source of rewards: each call's reward is the team reward (1 when the final
  answer is right, else 0) minus 0.1 when that call was malformed (`infos[agent]["calls"]`).
- Model: one tiny Llama (2 layers, width 64, byte-level BPE tokenizer) shared by both agents, built
  locally and briefly fitted to math-2agent's formats (the smoke preset's `tiny-math`): a random
  model never writes a well-formed reply, so every reward, and every advantage, would be equal.
- Rollout: B problems x G episodes; the G episodes of one problem form its prompt group. All
  episodes step in lock-step: each round, every episode's pending call goes into one generate batch.
  A prompt is the chat template over the observation's [system, user] plus its reply prefix;
  sampling at temperature 1 with no top-k or top-p, at most 24 new tokens. The learner trains on
  the sampled token ids themselves (never re-tokenised).
- Advantages (Dr. MAS): one baseline per key = (prompt group, agent); every call is a sample, so
  an agent called twice in an episode contributes two. A = (r - mean_key) / (std_key + 1e-6) with
  the unbiased (n - 1) std; a key with one sample or with all-equal rewards gets 0. (One baseline per
  prompt group, as in GRPO, would mix the agents' reward statistics.)
- Loss: PPO clipped ratio, 1 - 0.2 .. 1 + 0.2, with dual clip 3 on negative advantages; a call's
  advantage goes to every token of its response; token-mean over all response tokens of the batch.
  Old log-probs are the policy's own before the update; log-probs are those of softmax(logits / T)
  at the sampling temperature T. No KL term, no entropy bonus (the paper's math setting).
- Update: AdamW (betas 0.9, 0.999; weight decay 0.01; lr 1e-3 for the tiny model, where the paper
  uses 1e-6 on 3-7B models), global gradient norm clipped at 1.0, one mini-batch per step. 4 PPO
  epochs per batch where the paper uses 1: on-policy the first epoch's ratio is exactly 1, so the
  later epochs are where the clip acts and where the printed loss shows each update lowering it.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

import drmas_envs

# ==================================================================================================
# 1. Settings
# ==================================================================================================
SEED = 0
STEPS = 6
PROMPTS_PER_STEP = 4  # B: problems per step
GROUP_SIZE = 4  # G: episodes per problem (one prompt group)
MAX_NEW_TOKENS = 24
TEMPERATURE = 1.0
LR = 1e-3
WEIGHT_DECAY = 0.01
GRAD_CLIP = 1.0
PPO_EPOCHS = 4
CLIP = 0.2
DUAL_CLIP = 3.0
EPS = 1e-6


# ==================================================================================================
# 2. Env and model
# ==================================================================================================
def make_envs(n: int) -> list:
    """`n` copies of the math-2agent env on generated level-1 problems (one per episode)."""
    return [drmas_envs.make("math-2agent", level=[1]) for _ in range(n)]


def load_policy() -> tuple[torch.nn.Module, object]:
    """The tiny model and its tokenizer (built and cached locally on first use)."""
    # The one import from the trainer: it only builds the tiny test model, none of the algorithm.
    from drmas_train.engines.resolve import resolve_model

    transformers.logging.disable_progress_bar()
    path = resolve_model("tiny-math")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()  # dropout off: the learner's log-probs are those of the policy that sampled
    return model, tokenizer


# ==================================================================================================
# 3. Lock-step rollout
# ==================================================================================================
@dataclass
class Sample:
    """One model call: who made it, in which group and episode, what it saw and said, its reward."""

    group: int
    episode: int
    agent: str
    prompt: list[int]
    response: list[int]
    reward: float = 0.0


def prompt_ids(tokenizer, observation: dict) -> list[int]:
    """The chat template over [system, user], then the reply prefix the env wrote for the agent."""
    messages = [{"role": "system", "content": observation["system"]}, {"role": "user", "content": observation["user"]}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    return list(ids) + tokenizer.encode(observation["reply_prefix"], add_special_tokens=False)


@torch.no_grad()
def generate(model, tokenizer, prompts: Sequence[list[int]]) -> list[list[int]]:
    """Sample one response per prompt in one batch; each response ends at its EOS (kept) or the cap."""
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])  # left-padded
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=True,
        temperature=TEMPERATURE,
        top_k=0,
        top_p=1.0,
        max_new_tokens=MAX_NEW_TOKENS,
        pad_token_id=pad,
        eos_token_id=tokenizer.eos_token_id,
    )
    eos = tokenizer.eos_token_id
    return [row[: row.index(eos) + 1] if eos in row else row for row in out[:, width:].tolist()]


def finished(env) -> bool:
    """The episode is over: the agent the env selects has terminated or been truncated."""
    return env.terminations[env.agent_selection] or env.truncations[env.agent_selection]


def rollout(model, tokenizer, envs: Sequence, tasks: Sequence[int], group_size: int) -> list[Sample]:
    """Run `group_size` episodes of each task in lock-step; return every call with the env's reward."""
    for e, env in enumerate(envs):  # episode e plays task tasks[e // G]: group e // G
        env.reset(options={"task_index": tasks[e // group_size]})
    calls: list[list[Sample]] = [[] for _ in envs]
    while True:  # one round: every unfinished episode makes its next call, all in one batch
        live = [e for e, env in enumerate(envs) if not finished(env)]
        if not live:
            break
        agents = [envs[e].agent_selection for e in live]
        prompts = [prompt_ids(tokenizer, envs[e].observe(a)) for e, a in zip(live, agents)]
        for e, agent, prompt, response in zip(live, agents, prompts, generate(model, tokenizer, prompts)):
            calls[e].append(Sample(e // group_size, e, agent, prompt, response))
            envs[e].step(tokenizer.decode(response, skip_special_tokens=True))
    for env, samples in zip(envs, calls):  # the env reports every call's reward, in call order
        reported = env.infos[env.agent_selection]["calls"]
        if [c["agent"] for c in reported] != [s.agent for s in samples]:
            raise RuntimeError(f"the env reports calls {[c['agent'] for c in reported]}, the rollout made others")
        for sample, call in zip(samples, reported):
            sample.reward = float(call["reward"])
    return [s for samples in calls for s in samples]


# ==================================================================================================
# 4. Dr. MAS advantages: normalise each agent's rewards within its prompt group
# ==================================================================================================
def drmas_advantages(rewards: Sequence[float], group_ids: Sequence, agent_ids: Sequence) -> torch.Tensor:
    """A = (r - mean) / (std + eps) over the samples of each (prompt group, agent) key."""
    r = torch.as_tensor(rewards, dtype=torch.float64)
    rows_of: dict[tuple, list[int]] = defaultdict(list)
    for i, key in enumerate(zip(group_ids, agent_ids)):
        rows_of[key].append(i)
    adv = torch.zeros_like(r)
    for rows in rows_of.values():
        v = r[rows]
        if len(rows) > 1 and not torch.all(v == v[0]):  # else no relative signal: 0
            adv[rows] = (v - v.mean()) / (v.std() + EPS)  # torch.std: unbiased (n - 1)
    return adv


# ==================================================================================================
# 5. PPO step
# ==================================================================================================
def pack(samples: Sequence[Sample], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded [prompt + response] rows, their attention mask, and the mask of response targets."""
    width = max(len(s.prompt) + len(s.response) for s in samples)
    ids = torch.full((len(samples), width), pad, dtype=torch.long)
    attention = torch.zeros_like(ids)
    targets = torch.zeros_like(ids, dtype=torch.bool)
    for i, s in enumerate(samples):
        n = len(s.prompt) + len(s.response)
        ids[i, :n] = torch.tensor(s.prompt + s.response)
        attention[i, :n] = 1
        targets[i, len(s.prompt) : n] = True
    return ids, attention, targets[:, 1:]  # position t of the log-probs predicts token t + 1


def token_logprobs(model, ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    """The log-prob of token t + 1 given tokens <= t, at every position, under softmax(logits / T)."""
    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float() / TEMPERATURE
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def ppo_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Clipped-ratio PPO loss with dual clip, token-mean over the response tokens (`mask`)."""
    a = adv[:, None].to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    loss = torch.maximum(-a * ratio, -a * ratio.clamp(1 - CLIP, 1 + CLIP))
    loss = torch.where(a < 0, torch.minimum(loss, -a * DUAL_CLIP), loss)  # dual clip: cap the loss when A < 0
    return (loss * mask).sum() / mask.sum()


def ppo_update(model, optimizer, samples: Sequence[Sample], adv: torch.Tensor, pad: int, epochs: int) -> list[float]:
    """`epochs` optimizer steps on one batch; returns the loss of each (the first is at ratio 1)."""
    ids, attention, mask = pack(samples, pad)
    with torch.no_grad():
        old_logp = token_logprobs(model, ids, attention)
    losses = []
    for _ in range(epochs):
        loss = ppo_loss(token_logprobs(model, ids, attention), old_logp, adv, mask.float())
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        optimizer.step()
        losses.append(loss.item())
    return losses


# ==================================================================================================
# 6. Training loop
# ==================================================================================================
def train(
    steps: int = STEPS, prompts_per_step: int = PROMPTS_PER_STEP, group_size: int = GROUP_SIZE, seed: int = SEED
) -> list[list[float]]:
    """Train the team for `steps` steps, printing one line per step; returns each step's losses."""
    rng = random.Random(seed)  # which problems each step draws
    torch.manual_seed(seed)  # the sampling and nothing else
    model, tokenizer = load_policy()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), weight_decay=WEIGHT_DECAY)
    envs = make_envs(prompts_per_step * group_size)
    n_tasks = len(envs[0].unwrapped.tasks)
    history = []
    for step in range(1, steps + 1):
        start = time.perf_counter()
        tasks = rng.sample(range(n_tasks), prompts_per_step)
        samples = rollout(model, tokenizer, envs, tasks, group_size)
        adv = drmas_advantages([s.reward for s in samples], [s.group for s in samples], [s.agent for s in samples])
        losses = ppo_update(model, optimizer, samples, adv, tokenizer.pad_token_id, PPO_EPOCHS)
        history.append(losses)
        rewards: dict[str, list[float]] = defaultdict(list)
        for s in samples:
            rewards[s.agent].append(s.reward)
        mean_reward = "  ".join(f"{agent} {sum(r) / len(r):.2f}" for agent, r in rewards.items())
        print(
            f"step {step}/{steps}  calls {len(samples):3d}  reward {mean_reward}  "
            f"loss {' -> '.join(f'{x:+.4f}' for x in losses)}  ({time.perf_counter() - start:.1f} s)"
        )
    return history


if __name__ == "__main__":
    # One thread: on cores that other processes share, a second OpenMP thread mostly waits for its
    # turn and spins, and the step of this tiny model gets slower, not faster (docs/algorithm.md).
    torch.set_num_threads(1)
    train()
