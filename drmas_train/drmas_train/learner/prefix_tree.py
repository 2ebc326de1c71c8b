"""Pack call records that share token prefixes into one row: a prefix tree (trie) of their exact ids.

Each distinct prefix is stored once (a GRPO group's shared prompt, an agent's system prompt, even
common first response tokens); then each record's remaining tokens follow. A token sees exactly
itself and its ancestors in the tree, which are the tokens before it in its own sequence, and its
position id is its depth in that sequence. So every token's hidden state is the one an unshared
forward of any record through it computes (up to float summation order), and so are the gradients:
the loss reads each record's response tokens at the tree nodes on that record's path.

Traps this layout avoids: a 2D mask with position ids that restart makes transformers infer packed
*independent* sequences (no sharing, silently different attention); a KV cache of the prefix does
not survive gradient checkpointing. Here one forward sees a 4D mask (`ancestor_mask`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class PackedRow:
    """A micro-batch as one row of L tree nodes, and where its N response tokens are scored.

    Attributes:
        input_ids: [1, L] the nodes' tokens, every node after its parent.
        position_ids: [1, L] each node's depth in its sequences (0 at the root tokens).
        parents: [L] each node's parent (-1 at a root).
        paths: per record, the nodes of its input sequence (prompt + response[:-1]), in order.
        predict: [N] the node whose hidden state predicts each scored token.
        rows: [N] the record of each scored token.
        cols: [N] its index in that record's response.
        targets: [N] the response token itself.
        pad: trailing padding nodes (`padded`), each seeing only itself: no real node sees them and
            nothing scores them, so they change no log-prob and no gradient.

    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    parents: torch.Tensor
    paths: list[list[int]]
    predict: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    targets: torch.Tensor
    pad: int = 0

    @property
    def length(self) -> int:
        """L, the number of tokens the forward runs."""
        return int(self.input_ids.shape[1])

    def ancestor_mask(self) -> torch.Tensor:
        """[L, L] bool: entry [j, i] is True when node i is node j or one of its ancestors."""
        n = self.length
        mask = torch.zeros((n, n), dtype=torch.bool)
        for path in self.paths:
            # Along one path the pattern is causal; nodes shared by two paths get the same entries
            # from both, and nodes on different branches never see each other.
            idx = torch.as_tensor(path, dtype=torch.long)
            mask[idx[:, None], idx[None, :]] = torch.ones(len(path), len(path), dtype=torch.bool).tril()
        if self.pad:  # a padding node attends to itself: a row with no key at all would give NaN
            tail = torch.arange(n - self.pad, n)
            mask[tail, tail] = True
        return mask

    def padded(self, multiple: int, pad_id: int) -> PackedRow:
        """The row with padding nodes appended up to a length that is a multiple of `multiple`.

        Why: every distinct length is a new matmul shape, and oneDNN builds kernels per shape; a few
        lengths instead of one per micro-batch cost at most `multiple - 1` tokens of compute each.
        """
        if multiple <= 1 or self.length % multiple == 0:
            return self
        extra = multiple - self.length % multiple
        device = self.input_ids.device
        return PackedRow(
            input_ids=torch.cat([self.input_ids, torch.full((1, extra), pad_id, dtype=torch.long, device=device)], 1),
            position_ids=torch.cat([self.position_ids, torch.zeros((1, extra), dtype=torch.long, device=device)], 1),
            parents=torch.cat([self.parents, torch.full((extra,), -1, dtype=torch.long, device=device)]),
            paths=self.paths,
            predict=self.predict,
            rows=self.rows,
            cols=self.cols,
            targets=self.targets,
            pad=self.pad + extra,
        )


def _input_sequence(prompt: Sequence[int], response: Sequence[int]) -> list[int]:
    """The tokens a forward needs: the last response token is only ever a target."""
    return [*prompt, *response[:-1]]


def tree_length(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]) -> int:
    """The number of nodes `pack_prefix_tree` would make (L), without building any tensor."""
    children: dict[tuple[int, int], int] = {}
    for p, r in zip(prompts, responses):
        node = -1
        for tok in _input_sequence(p, r):
            node = children.setdefault((node, int(tok)), len(children))
    return len(children)


def pack_prefix_tree(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], *, device=None) -> PackedRow:
    """Build the prefix tree of the records' input sequences and index their response tokens.

    Args:
        prompts: each record's exact prompt ids (at least one token each).
        responses: each record's exact response ids.
        device: where the tensors go.

    Returns:
        The packed row (see `PackedRow`).

    """
    if len(prompts) != len(responses) or not prompts:
        raise ValueError(f"need as many prompts as responses (>0), got {len(prompts)} and {len(responses)}")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token (the first response token is predicted from it)")
    children: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    tokens: list[int] = []
    depth: list[int] = []
    parents: list[int] = []
    paths: list[list[int]] = []
    predict: list[int] = []
    rows: list[int] = []
    cols: list[int] = []
    targets: list[int] = []
    for b, (prompt, response) in enumerate(zip(prompts, responses)):
        node, path = -1, []
        for d, tok in enumerate(_input_sequence(prompt, response)):
            nxt = children.get((node, int(tok)))
            if nxt is None:
                nxt = children[(node, int(tok))] = len(tokens)
                tokens.append(int(tok))
                depth.append(d)
                parents.append(node)
            path.append(nxt)
            node = nxt
        paths.append(path)
        for t, tok in enumerate(response):
            predict.append(path[len(prompt) - 1 + t])
            rows.append(b)
            cols.append(t)
            targets.append(int(tok))

    def tensor(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    return PackedRow(
        input_ids=tensor(tokens)[None],
        position_ids=tensor(depth)[None],
        parents=tensor(parents),
        paths=paths,
        predict=tensor(predict),
        rows=tensor(rows),
        cols=tensor(cols),
        targets=tensor(targets),
    )
