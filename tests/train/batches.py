"""Hand-built call records for learner tests."""

import torch

from drmas_train.algorithm.records import CallRecord


def shared_prefix_records(vocab: int, n: int = 6, seed: int = 3) -> list[CallRecord]:
    """`n` records whose prompts share a 6-token prefix (so shared_prefix packs), random responses of 2-8 tokens."""
    g = torch.Generator().manual_seed(seed)
    shared = torch.randint(5, vocab, (6,), generator=g).tolist()
    out = []
    for i in range(n):
        response = torch.randint(5, vocab, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g).tolist()
        out.append(
            CallRecord(
                group_id=0, episode_id=i, agent="solver", model="m", turn=0,
                prompt_ids=shared + [5 + i], response_ids=response, logprobs=[0.0] * len(response),
                advantage=float(torch.randn(1, generator=g)),
            )
        )  # fmt: skip
    return out


def flat_grad(model: torch.nn.Module) -> torch.Tensor:
    """Every parameter's gradient in one vector (parameters without one left out)."""
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
