"""Fixtures of the trainer tests. `varied_env_id`: a one-turn env whose reward depends on the text written,
so that even a fresh random tiny model gets rewards that differ within a group: policy-gradient updates are
then real (non-zero advantages, a critic with something to fit), which resume tests need to tell a restored
optimizer from a fresh one."""

import json

import gymnasium
import pytest
import torch

from esopt.envs.base import AgentEnv
from esopt.envs.text_space import FreeText, ascii_text_space

VARIED_ID = "esopt-tests/CharVariety-v0"


class CharVarietyEnv(AgentEnv):
    """Reward = distinct characters of the reply / 8 (at most 1), in one turn."""

    instructions = "Reply with as many different characters as you can."

    def __init__(self) -> None:
        self.action_space = FreeText(256)
        self.observation_space = ascii_text_space(16)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "go", {"is_success": False, "action_is_valid": True}

    def step(self, action: str):
        reward = min(len(set(str(action))) / 8, 1.0)
        return "done", reward, True, False, {"is_success": reward >= 0.5, "action_is_valid": True,
                                              "shaped_reward": reward}


@pytest.fixture
def varied_env_id() -> str:
    """The registered id of `CharVarietyEnv` (a config's `env.id`)."""
    if VARIED_ID not in gymnasium.registry:
        gymnasium.register(VARIED_ID, entry_point=CharVarietyEnv)
    return VARIED_ID


@pytest.fixture
def resumed_like_uninterrupted(run_weights, same_state):
    """check(run, config, train) for a run resumed to `config.steps`: an uninterrupted run of `config` beside
    it must end with the same weights and the same optimizer (and critic) state, bit for bit, after real
    updates (every step's grad norm > 0). Returns the resumed run's final trainer state."""
    from esopt.train.pg import STATE_FILE

    def check(run, config, train):
        whole = run.parent / f"{run.name}-whole"
        train(config, whole, progress=False)
        a, b = run_weights(run), run_weights(whole)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        last = f"step_{config.steps:06d}"
        resumed, uninterrupted = (torch.load(d / "checkpoints" / last / STATE_FILE, weights_only=True)
                                  for d in (run, whole))
        same_state(resumed, uninterrupted, "pg_state")
        grads = [json.loads(x).get("grad_norm") for x in (run / "metrics.jsonl").read_text().splitlines()]
        grads = [g for g in grads if g is not None]
        assert len(grads) == config.steps and all(g > 0 for g in grads)  # real steps, not zero no-ops
        return resumed

    return check
