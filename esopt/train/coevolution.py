"""The prompt half of prompt-parameter co-evolution: every `prompt.every` generations, skills are distilled
from the generation's own trajectories (by a reflector: a policy, an HTTP model, or the env's feedback),
the candidate prompt is gated on the unperturbed weights, and the winner becomes the system prompt of the
next generations' rollouts. Versions live in RUN/prompts/ (`esopt.prompt.program`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from esopt.engines.base import Engine
from esopt.population import MemberResult, member_score
from esopt.prompt.program import PromptStore, PromptVersion
from esopt.rollout import RolloutSpec, resolve_system_prompt, trajectory_score
from esopt.train.config import ESTrainConfig
from esopt.train.rundir import RunDir
from esopt.train.tasks import train_task_seeds
from esopt.utils.progress import say


class PromptEvolution:
    """The prompt program of an ES run: its current version, the spec that renders it, the step that evolves it."""

    def __init__(self, policy: Engine, config: ESTrainConfig, rd: RunDir, make_env: Callable, spec: RolloutSpec,
                 start: int, progress: bool):
        self.policy, self.config, self.make_env, self.progress = policy, config, make_env, progress
        self.store = PromptStore(rd.root)
        self.program = self._current_prompt(start)
        self.spec = spec.replace(system_prompt=self.program.render())

    def _current_prompt(self, start: int) -> PromptVersion:
        """Version 0 is the config's (or env's) system prompt; on resume, the newest accepted version made
        at or before the resumed generation."""
        accepted = [v for v in self.store.all() if v.accepted and v.generation <= start]
        if accepted:
            return accepted[-1]
        with self.make_env() as env:
            system = resolve_system_prompt(env, self.config.env.system_prompt) or ""
        v0 = PromptVersion(0, system, [], generation=0)
        self.store.save(v0)
        return v0

    def _reflector(self):
        from esopt.prompt.reflector import HTTPReflector, PolicyReflector

        p = self.config.prompt
        if p.reflector == "http":
            return HTTPReflector(p.base_url, p.model, p.api_key_env, p.timeout_s, p.retries,
                                 log=lambda m: say(m, self.progress))
        return PolicyReflector(self.policy, p.max_new_tokens)

    def prompt_score(self, system_prompt: str, generation: int) -> float:
        """Mean score of the unperturbed policy on the gate's tasks with this system prompt."""
        c = self.config
        tasks = train_task_seeds(c.seed, 10**6 + generation, c.prompt.gate_tasks)  # not this generation's tasks
        spec = self.spec.replace(system_prompt=system_prompt)
        trajectories, _ = spec.run(self.policy, self.make_env, tasks, seed=generation)
        return member_score(trajectories, c.es.reward)

    def step(self, generation: int, results: Sequence[MemberResult]) -> dict:
        """Distil skills from this generation's trajectories, gate the candidate, keep the winner."""
        from esopt.prompt.skills import distill, feedback_lessons, gate

        c = self.config
        episodes = sorted(((trajectory_score(t, c.es.reward), t) for r in results for t in r.trajectories),
                          key=lambda x: x[0])
        if c.prompt.reflector == "feedback":  # every trajectory of the generation: counting is cheap
            skills = feedback_lessons([t for _, t in episodes], self.program.skills, c.prompt.max_skills)
            if skills is None:
                say("prompt step: no failing turn had feedback; the current prompt stays", self.progress)
        else:  # the reflector reads the k/2 worst and k/2 best episodes
            k = c.prompt.episodes
            picked = episodes[: (k + 1) // 2] + episodes[len(episodes) - k // 2:] if len(episodes) > k else episodes
            skills = distill(self._reflector(), self.program.system, [t for _, t in picked],
                             [s for s, _ in picked], self.program.skills, c.prompt.max_skills,
                             log=lambda m: say(m, self.progress))
        if skills is None:
            return {"prompt_accepted": False}
        if skills == self.program.skills:
            say("prompt step: the distilled skills equal the current ones; nothing to gate", self.progress)
            return {"prompt_accepted": False}
        candidate = PromptVersion(max(v.version for v in self.store.all()) + 1, self.program.system, skills,
                                  generation=generation)
        accepted, now, new = gate(lambda text: self.prompt_score(text, generation), self.program.render(),
                                  candidate.render(), c.prompt.margin)
        candidate.score, candidate.accepted = new, accepted
        self.store.save(candidate)
        say(f"prompt step @ {generation}: v{candidate.version} scores {new:.3f} vs v{self.program.version} {now:.3f}"
            f" -> {'accepted' if accepted else 'rejected'}", self.progress)
        if accepted:
            self.program = candidate
            self.spec = self.spec.replace(system_prompt=candidate.render())
        return {"prompt_accepted": accepted, "prompt_score": new, "prompt_score_before": now}

    def files(self) -> dict:
        """prompt.json beside the weights (`esopt serve` reads it)."""
        return {"prompt.json": json.dumps({"system": self.program.render(), "version": self.program.version})}
