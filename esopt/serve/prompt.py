"""The prompt program a run's agent is served with: the system prompt, worked exchanges and stop strings it
was trained with, read back from a model dir (`final/prompt.json`, else the run's config and its env)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("esopt.serve")


@dataclass(frozen=True)
class ServedPrompt:
    """What a run's agent saw in front of every conversation: system prompt, worked exchanges, stop
    strings."""

    system: str | None = None
    examples: tuple[tuple[str, str], ...] = ()
    stop: tuple[str, ...] = ()
    source: str = ""

    def preamble(self) -> list[dict[str, str]]:
        out = [{"role": "system", "content": self.system}] if self.system else []
        for obs, action in self.examples:
            out += [{"role": "user", "content": obs}, {"role": "assistant", "content": action}]
        return out

    def describe(self) -> str:
        what = []
        if self.system:
            what.append(f"system prompt ({len(self.system)} chars)")
        if self.examples:
            what.append(f"{len(self.examples)} worked examples")
        if self.stop:
            what.append(f"stop {list(self.stop)}")
        return ", ".join(what) + (f" from {self.source}" if self.source else "") if what else "none"


def _run_config_path(model_dir: Path) -> Path | None:
    """RUN/config.yaml for RUN/final or RUN/checkpoints/step_N."""
    for root in (model_dir.parent, model_dir.parent.parent):
        in_run = model_dir.name == "final" or model_dir.parent.name == "checkpoints"
        if (root / "config.yaml").is_file() and in_run:
            return root / "config.yaml"
    return None


def load_prompt_program(model: str | Path, warn=log.warning) -> ServedPrompt | None:
    """The prompt program stored with a model dir (see the package doc), or None for a bare model.

    `prompt.json` may hold {"system", "examples": [[obs, action], ...], "stop": [...]}; what it lacks comes
    from the run's config.yaml (and the env it names). A run whose env cannot be built here is served with
    what could be read, with a warning."""
    path = Path(model)
    if not path.is_dir():
        return None
    data: dict = {}
    sources = []
    prompt_file = path / "prompt.json"
    if prompt_file.is_file():
        try:
            data = json.loads(prompt_file.read_text())
            sources.append(str(prompt_file))
        except (OSError, ValueError) as e:
            warn(f"esopt serve: {prompt_file} is unreadable ({e}); serving without it")
    system = data.get("system") if isinstance(data.get("system"), str) else None
    examples = [tuple(map(str, x)) for x in data.get("examples", [])
                if isinstance(x, (list, tuple)) and len(x) == 2]
    stop = [s for s in data.get("stop", []) if isinstance(s, str) and s]
    config_path = _run_config_path(path)
    if config_path is not None:
        try:
            system, examples, stop = _from_run_config(config_path, system, examples, stop, "stop" in data)
            sources.append(str(config_path))
        except Exception as e:  # an old or foreign config, an env with missing extras: serve what we have
            warn(f"esopt serve: could not rebuild the run's prompt from {config_path} "
                 f"({type(e).__name__}: {e})")
    if not (system or examples or stop):
        return None
    return ServedPrompt(system or None, tuple(examples), tuple(stop), " + ".join(sources))


def _from_run_config(config_path: Path, system, examples, stop, stop_given: bool):
    """Fill what `prompt.json` left out from the run's config and its env (built here, then closed)."""
    from esopt.envs import make_env
    from esopt.rollout import env_examples, resolve_system_prompt
    from esopt.train.config import load_config

    config = load_config(config_path)
    env = make_env(config.env.id, **dict(config.env.kwargs))
    try:
        if system is None:
            system = resolve_system_prompt(env, config.env.system_prompt)
        if not examples and config.env.few_shot:
            examples = env_examples(env, config.env.few_shot)
        if not stop_given:
            stop = list(config.sampling.stop)
            stop += [s for s in getattr(env.unwrapped, "stop_strings", ()) if s not in stop]
    finally:
        env.close()
    return system, examples, stop


def load_system_prompt(model_dir: str | Path) -> str | None:
    """The served system prompt of a model dir (kept for callers of the first version)."""
    program = load_prompt_program(model_dir)
    return program.system if program else None
