"""Per-turn (prompt, response) samples and their right-padded batch; the mask is 1 only on generated tokens."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from esopt.rollout import Trajectory


@dataclass
class TurnSample:
    """One (prompt, response) training sample: one agent turn of one trajectory."""

    prompt_ids: list[int]
    token_ids: list[int]  # the policy's own generated ids, exactly as produced
    advantage: float = 0.0
    ret: float = 0.0  # PPO: the value target
    traj: int = 0  # index of the trajectory in the step's rollout
    turn: int = 0


def turn_samples(trajectories: list[Trajectory], advantages: list[list[float]], keep_empty: bool = False
                 ) -> list[TurnSample]:
    """Every turn becomes a sample with its advantage; turns with no generated token are dropped
    unless keep_empty (they carry no policy gradient, but PPO still fits their value)."""
    out = []
    for i, (traj, advs) in enumerate(zip(trajectories, advantages, strict=True)):
        if len(advs) != len(traj.turns):
            raise ValueError(f"trajectory {i}: {len(advs)} advantages for {len(traj.turns)} turns")
        for k, (turn, adv) in enumerate(zip(traj.turns, advs)):
            if turn.token_ids or keep_empty:
                out.append(TurnSample(list(turn.prompt_ids), list(turn.token_ids), float(adv), traj=i, turn=k))
    return out


@dataclass
class TokenBatch:
    """Right-padded samples. Position t of the (N, L-1) tensors scores target token input_ids[:, t+1]."""

    input_ids: torch.Tensor  # (N, L) prompt + response, right-padded
    attention_mask: torch.Tensor  # (N, L)
    mask: torch.Tensor  # (N, L-1) float: 1 where the target is a generated token
    lengths: torch.Tensor  # (N,) real lengths
    prompt_last: torch.Tensor  # (N,) index of the last prompt token (where the critic reads the value)
    advantages: torch.Tensor  # (N,)
    returns: torch.Tensor  # (N,)
    old_logprobs: torch.Tensor | None = None  # (N, L-1)
    ref_logprobs: torch.Tensor | None = None  # (N, L-1)
    old_values: torch.Tensor | None = None  # (N,)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, idx: torch.Tensor) -> TokenBatch:
        """Rows idx, trimmed to their longest real length."""
        idx = idx.to(self.input_ids.device)
        n = int(self.lengths[idx].max()) if len(idx) else 1
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None:
                out[f.name] = None
            elif v.dim() == 2:
                out[f.name] = v[idx, : n if v.shape[1] == self.input_ids.shape[1] else n - 1]
            else:
                out[f.name] = v[idx]
        return TokenBatch(**out)


def collate(samples: list[TurnSample], pad_id: int, device: torch.device | str = "cpu") -> TokenBatch:
    n = len(samples)
    lengths = [len(s.prompt_ids) + len(s.token_ids) for s in samples]
    width = max(lengths, default=1)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, max(width - 1, 0)))
    for i, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.token_ids)
        ids[i, : p + r] = torch.tensor(s.prompt_ids + s.token_ids, dtype=torch.long)
        attn[i, : p + r] = 1
        mask[i, max(p - 1, 0) : p + r - 1] = 1.0  # a first token with no prompt before it cannot be scored
    prompt_last = torch.tensor([max(len(s.prompt_ids) - 1, 0) for s in samples], dtype=torch.long)
    return TokenBatch(
        input_ids=ids.to(device), attention_mask=attn.to(device), mask=mask.to(device),
        lengths=torch.tensor(lengths, dtype=torch.long, device=device), prompt_last=prompt_last.to(device),
        advantages=torch.tensor([s.advantage for s in samples], dtype=torch.float32, device=device),
        returns=torch.tensor([s.ret for s in samples], dtype=torch.float32, device=device),
    )
