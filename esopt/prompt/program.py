"""The agent's prompt program: a system prompt plus a skills document, versioned.

Every version is saved as RUN/prompts/vNNNN.json with the generation it was made at, its gate score and
whether it was accepted; the ledger line of each generation names the version its rollouts used, so a
resume rebuilds the same prompt. `render()` is what the agent sees as its system prompt.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from esopt.utils.io import write_text_atomic


@dataclass
class PromptVersion:
    version: int
    system: str
    skills: list[str] = field(default_factory=list)
    generation: int = 0  # made after this many generations
    score: float | None = None  # gate score on its minibatch
    accepted: bool = True

    def render(self) -> str:
        if not self.skills:
            return self.system
        return self.system + "\n\nSkills:\n" + "\n".join(f"- {s}" for s in self.skills)


class PromptStore:
    """RUN/prompts/: every version ever proposed (accepted or not)."""

    def __init__(self, root: str | Path):
        self.root = Path(root) / "prompts"

    def save(self, v: PromptVersion) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.root / f"v{v.version:04d}.json", json.dumps(asdict(v), indent=1))

    def all(self) -> list[PromptVersion]:
        if not self.root.exists():
            return []
        return [PromptVersion(**json.loads(p.read_text())) for p in sorted(self.root.glob("v*.json"))]
