"""Seeded Gaussian noise, generated in chunks so the extra memory is one chunk, never one model.

Every (member seed, tensor name, chunk index) gets its own stream: the name is hashed (stable across
processes, unlike `hash()`) and mixed into the seed with splitmix64, so two tensors of one member are
independent (one shared seed would make them correlated). The chunk size is part of the noise spec
(`perturbation.py`): the same spec, seed and device type always give the same numbers, in any order
and on any restart.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import torch

from esopt.es.kinds import DEFAULT_CHUNK_NUMEL

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def name_hash(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


def stream_seed(member_seed: int, name: str, chunk: int) -> int:
    """The seed of one chunk's stream; 63 bits so every torch generator accepts it."""
    x = _splitmix64(member_seed & _MASK64)
    x = _splitmix64(x ^ name_hash(name))
    x = _splitmix64(x ^ chunk)
    return x >> 1


class NoiseSource:
    """Yields (start, end, eps) chunks of a tensor's noise for one member seed, reusing one buffer."""

    def __init__(self, chunk_numel: int = DEFAULT_CHUNK_NUMEL):
        if chunk_numel < 1:
            raise ValueError(f"chunk_numel must be >= 1, got {chunk_numel}")
        self.chunk_numel = chunk_numel
        self._generators: dict[torch.device, torch.Generator] = {}
        self._buffers: dict[torch.device, torch.Tensor] = {}

    def _state(self, device: torch.device) -> tuple[torch.Generator, torch.Tensor]:
        if device not in self._generators:
            self._generators[device] = torch.Generator(device=device)
            self._buffers[device] = torch.empty(self.chunk_numel, dtype=torch.float32, device=device)
        return self._generators[device], self._buffers[device]

    def bounds(self, numel: int) -> Iterator[tuple[int, int, int]]:
        """(chunk index, start, end) covering a flat tensor of `numel` elements."""
        for k, start in enumerate(range(0, numel, self.chunk_numel)):
            yield k, start, min(start + self.chunk_numel, numel)

    def chunk(self, seed: int, name: str, k: int, length: int, device: torch.device) -> torch.Tensor:
        """Chunk k of `name`'s noise; the result is only valid until the next chunk is drawn."""
        gen, buf = self._state(torch.device(device))
        gen.manual_seed(stream_seed(seed, name, k))
        eps = buf[:length]
        torch.randn(eps.shape, generator=gen, out=eps)
        return eps

    def chunks(self, seed: int, name: str, numel: int, device: torch.device) -> Iterator[tuple[int, int, torch.Tensor]]:
        for k, start, end in self.bounds(numel):
            yield start, end, self.chunk(seed, name, k, end - start, device)

    def full(self, seed: int, name: str, shape: torch.Size, device="cpu") -> torch.Tensor:
        """The whole noise tensor (for tests and small models; allocates a full copy)."""
        numel = int(torch.Size(shape).numel())
        out = torch.empty(numel, dtype=torch.float32, device=device)
        for start, end, eps in self.chunks(seed, name, numel, torch.device(device)):
            out[start:end] = eps
        return out.view(shape)
