"""Peak memory of plain inference, measured in a fresh process: `python -m esopt.train.memprobe CONFIG_JSON
EPISODES` runs one batched rollout of EPISODES training tasks with the unperturbed model, with the same imports
as a training run, and prints the peak (bytes). Trainers compare their own peak against it.
"""

from __future__ import annotations

import json
import subprocess
import sys

from esopt.train.config import BaseTrainConfig, build_config
from esopt.utils.memory import peak_memory_bytes


def inference_peak_bytes(config: BaseTrainConfig, episodes: int, env: dict[str, str] | None = None) -> int | None:
    """Peak memory of inference alone (same model, same batch, same imports) in a fresh process (`env`: its
    environment, default this one's)."""
    cmd = [sys.executable, "-m", "esopt.train.memprobe", json.dumps(config.model_dump(mode="json")), str(episodes)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=True, env=env)
        return int(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError) as e:
        print(f"warning: inference-only memory probe failed: {e}", file=sys.stderr)
        return None


def main() -> None:
    from esopt.train import trainer
    from esopt.train.evaluate import rollout_spec
    from esopt.train.models import load_model
    from esopt.train.tasks import env_factory, train_task_seeds

    config = build_config(json.loads(sys.argv[1]))
    trainer(config.algo)  # the same imported code as a training run of this algorithm
    policy = load_model(config.model, config.env.kwargs)
    make_env = env_factory(config)
    seeds = train_task_seeds(config.seed, 0, int(sys.argv[2]))
    rollout_spec(config, make_env).run(policy, make_env, seeds, seed=config.seed)
    print(peak_memory_bytes(policy.device))


if __name__ == "__main__":
    main()
