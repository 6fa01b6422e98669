"""`python -m esopt.train.memprobe CONFIG_JSON EPISODES`: peak memory of plain inference.

Runs one batched rollout of EPISODES training tasks with the unperturbed model, with the same imports
as a training run, and prints the peak (bytes). Trainers compare their own peak against it.
"""

import sys

from esopt.train.common import env_factory, load_model, rollout, train_task_seeds
from esopt.train.config import build_config
from esopt.utils.memory import peak_memory_bytes


def main() -> None:
    import json

    import esopt.train.es  # noqa: F401  (same imported code as a training run)

    config = build_config(json.loads(sys.argv[1]))
    policy = load_model(config.model, config.env.kwargs)
    seeds = train_task_seeds(config.seed, 0, int(sys.argv[2]))
    rollout(policy, config, env_factory(config), seeds, seed=config.seed)
    print(peak_memory_bytes(policy.device))


if __name__ == "__main__":
    main()
