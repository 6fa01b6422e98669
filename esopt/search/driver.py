"""One heuristic-search run, top to bottom: EoH (or independent sampling) whose proposals a language model
writes, with the model frozen, perturbed without updates (noise only) or tuned by ES between batches.

Per batch k (operator from `SearchConfig.plan`): draw parents by rank -> build one prompt per proposal ->
generate (perturbed members for m1/m2 in the noise and ES arms, one member per proposal, each with its own
parent) -> parse -> score on the train instances in the sandbox -> for ES/noise: reward_i = cost(parent_i)
- cost(child_i), an invalid or worse-than-worst child clipped to the population's worst, z-scored, one
`ES.tell` (ledger line) -> population management -> one fsync'd line in batches.jsonl.

Run dir: config.json, batches.jsonl (every proposal and the population after each batch), history.jsonl
(the ES ledger), summary.json. Resume after a kill at any moment: the last complete batch line is the
state; the ledger is truncated to the ES generations that line counts and replayed onto the base weights;
everything random is derived from (seed, batch), so the resumed run continues exactly as if never stopped.
Final pick: the population member with the best validation objective, reported on every test size.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

from esopt.engines.base import Engine, SamplingParams
from esopt.envs.heuristics import HeuristicEvaluator, Score, get_problem, score_host_baselines
from esopt.es import ES, Ledger, read_history, replay
from esopt.es.shaping import ZeroVariancePopulation
from esopt.search import levels
from esopt.search.config import SearchConfig
from esopt.search.population import Individual, manage, select
from esopt.utils.io import write_json_atomic
from esopt.utils.progress import progress_bar
from esopt.utils.signals import defer_sigint

Hook = Callable[[str, int], None]  # (event, batch): "told" after an ES update, "batch" after a batch line


def instance_sets(problem) -> dict[str, list[dict]]:
    sets = {"train": problem.instances("train"), "val": problem.instances("val")}
    for size in problem.test_sizes:
        sets[f"test@{size}"] = problem.instances("test", size)
    return sets


class HeuristicSearch:
    def __init__(self, config: SearchConfig, engine: Engine, out: str | Path, hook: Hook | None = None,
                 progress: bool = True):
        self.config, self.engine, self.out = config, engine, Path(out)
        self.problem = get_problem(config.problem, **config.sizes)
        self.evaluator = HeuristicEvaluator(self.problem, instance_sets(self.problem), backend=config.sandbox)
        self.hook = hook or (lambda event, batch: None)
        self.progress = progress
        self.plan = config.plan()
        self.sampling = SamplingParams(temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
                                       max_new_tokens=config.max_new_tokens)
        self.batches_path, self.ledger_path = self.out / "batches.jsonl", self.out / "history.jsonl"
        self.es: ES | None = None
        self.host = None  # BatchedLowRank, built on first use
        self.seconds = {"generate": 0.0, "evaluate": 0.0, "es": 0.0}

    # -- state -------------------------------------------------------------------------------------------
    def _start(self, resume: bool) -> tuple[list[dict], list[Individual], list[Individual]]:
        """Lines of the batches done, the population after them (the seeded one for a new run), the seeds."""
        self.out.mkdir(parents=True, exist_ok=True)
        config_path = self.out / "config.json"
        mine = self.config.model_dump(mode="json")
        if config_path.exists():
            if not resume:
                raise FileExistsError(f"{self.out} already holds a search: resume it or choose another dir")
            if json.loads(config_path.read_text()) != mine:
                raise ValueError(f"{self.out} holds a search with another config; choose another dir")
        write_json_atomic(config_path, mine)
        lines = read_batches(self.batches_path)
        _rewrite(self.batches_path, lines)  # drop a torn last line for good
        for line in lines:
            for p in line["proposals"]:
                if p.get("code"):
                    self.evaluator.remember(p["code"], "train", p["objective"], p.get("error", ""))
        if self.config.arm != "frozen":
            done = lines[-1]["es_generations"] if lines else 0
            records = read_history(self.ledger_path)[:done] if self.ledger_path.exists() else []
            Ledger(self.ledger_path).truncate(done)
            replay(self.engine.model, records)  # the engine holds the base weights
            self.es = ES(self.engine.model, self.config.es_config(), ledger=self.ledger_path, generation=done,
                         on_weights_changed=self.engine.weights_changed)
        seeded = self._seeded()  # scored again on resume too: the same cache state as a run never stopped
        if lines:
            return lines, [Individual(**x) for x in lines[-1]["population"]], seeded
        return lines, seeded, seeded

    def _seeded(self) -> list[Individual]:
        pop = []
        for name, parsed in levels.seeds(self.config.level, self.problem):
            s = self.evaluator.score(parsed.code, "train")
            if not s.valid:
                raise RuntimeError(f"seed heuristic {name!r} is invalid ({s.error}): a problem definition bug")
            pop.append(Individual(parsed.text, parsed.code, s.objective, f"seed:{name}"))
        return manage([], pop, self.config.population_size)

    # -- one batch -----------------------------------------------------------------------------------------
    def _batch(self, k: int, population: list[Individual], fixed: Individual) -> dict:
        c, op = self.config, self.plan[k]
        rng = np.random.default_rng([c.seed, k, 1])
        if c.scaffold == "sampling":
            parents = [[fixed] * levels.PARENTS[op] for _ in range(c.batch_size)]
        else:
            parents = [select(population, levels.PARENTS[op], rng) for _ in range(c.batch_size)]
        prompts = []
        for ps in parents:
            messages, prefill = levels.prompt(c.level, self.problem, op, [levels.Parent(p.text, p.objective)
                                                                          for p in ps])
            prompts.append(self.engine.build_prompt(messages) + prefill)
        seed = int(np.random.default_rng([c.seed, k, 2]).integers(2**31))
        t0 = time.perf_counter()
        texts, members = self._generate(prompts, op, seed)
        t1 = time.perf_counter()
        proposals, children = [], []
        for j, (ps, text) in enumerate(zip(parents, texts)):
            record, child = self._score(op, f"{op}@{k}.{j}", text)
            proposals.append({**record, "parents": [p.origin for p in ps]})
            children.append(child)
        self.seconds["generate"] += t1 - t0
        self.seconds["evaluate"] += time.perf_counter() - t1
        line = {"batch": k, "operator": op, "proposals": proposals}
        if members is not None:
            line.update(self._tell(population, parents, children))
            self.hook("told", k)
        new = manage(population, [x for x in children if x is not None], c.population_size)
        line.update(es_generations=self.es.generation if self.es is not None else 0,
                    population=[x.to_dict() for x in new])
        return line

    def _generate(self, prompts: list[str], op: str, seed: int) -> tuple[list[str], list | None]:
        """The completions, and the ES members that wrote them (None: the base model did)."""
        if not self.config.perturbed(op):
            return [x.text for x in self.engine.generate(prompts, self.sampling, seed=seed)], None
        assert self.es is not None
        members = self.es.ask()
        if self.config.noise == "lowrank" and hasattr(self.engine, "route_members"):
            from esopt.es.batched import BatchedLowRank

            if self.host is None:
                self.host = BatchedLowRank(self.engine.model, self.es.perturbation)
            with self.host.members(members, self.es.sigma), self.engine.route_members(self.host):
                out = self.engine.generate(prompts, self.sampling, seed=seed, members=list(range(len(members))))
            texts = [x.text for x in out]
        else:  # one member at a time, its noise written into the weights and restored
            texts = []
            for i, m in enumerate(members):
                with self.es.perturbed(m):
                    texts.append(self.engine.generate([prompts[i]], self.sampling, seed=seed + i)[0].text)
        return texts, members

    def _score(self, op: str, origin: str, text: str) -> tuple[dict, Individual | None]:
        record: dict = {"operator": op, "completion": text[:2000]}
        try:
            parsed = levels.parse(self.config.level, self.problem, text)
        except ValueError as e:  # UnsafeCode is a ValueError
            return {**record, "stage": "parse", "error": str(e)[:300], "objective": None, "code": ""}, None
        s: Score = self.evaluator.score(parsed.code, "train")
        record.update(text=parsed.text, code=parsed.code, objective=s.objective, error=s.error,
                      stage="ok" if s.valid else "evaluate", cached=s.cached)
        if not s.valid:
            return record, None
        return record, Individual(parsed.text, parsed.code, float(s.objective), origin)

    def _tell(self, population: list[Individual], parents: list[list[Individual]],
              children: list[Individual | None]) -> dict:
        """reward_i = cost(parent_i) - cost(child_i), the child's cost clipped to the population's worst."""
        assert self.es is not None
        worst = max(x.objective for x in population)
        rewards = [ps[0].objective - (worst if ch is None else min(ch.objective, worst))
                   for ps, ch in zip(parents, children)]
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught, defer_sigint():
            warnings.simplefilter("always", ZeroVariancePopulation)
            told = self.es.tell(rewards)
        self.seconds["es"] += time.perf_counter() - t0
        zero = any(issubclass(w.category, ZeroVariancePopulation) for w in caught)
        return {"rewards": rewards, "sigma": told.sigma, "alpha": told.alpha, "update_rms": told.update_rms,
                "zero_variance": zero}

    # -- the run -------------------------------------------------------------------------------------------
    def run(self, resume: bool = False) -> dict:
        summary_path = self.out / "summary.json"
        if resume and summary_path.exists():
            return json.loads(summary_path.read_text())
        start = time.perf_counter()
        lines, population, seeded = self._start(resume)
        fixed = seeded[0]  # the best seed: the sampling scaffold's parent
        bar = progress_bar(self.config.budget, f"{self.config.arm} seed {self.config.seed}", unit="proposal",
                           initial=len(lines) * self.config.batch_size) if self.progress else None
        for k in range(len(lines), len(self.plan)):
            line = self._batch(k, population, fixed)
            append_line(self.batches_path, line)
            lines.append(line)
            population = [Individual(**x) for x in line["population"]]
            self.hook("batch", k)
            if bar is not None:
                bar.update(self.config.batch_size)
        if bar is not None:
            bar.close()
        summary = self._finish(lines, population, seeded, time.perf_counter() - start)
        write_json_atomic(summary_path, summary)
        return summary

    def _finish(self, lines: list[dict], population: list[Individual], seeded: list[Individual], seconds: float
                ) -> dict:
        """Pick the final population's best on validation (the seeds if none of it runs there)."""
        pick, best_val = None, None
        for candidates in (population, seeded):
            val = [(self.evaluator.score(x.code, "val").objective, i) for i, x in enumerate(candidates)]
            val = [(v, i) for v, i in val if v is not None]
            if val:
                best_val, i = min(val)
                pick = candidates[i]
                break
        if pick is None:
            raise RuntimeError("no heuristic of the population or the seeds runs on the validation set")
        tests = {name: self.evaluator.score(pick.code, name).objective for name in self.evaluator.sets
                 if name.startswith("test@")}
        proposals = [p for line in lines for p in line["proposals"]]
        by_stage = {s: sum(p["stage"] == s for p in proposals) for s in ("ok", "parse", "evaluate")}
        return {
            "config": self.config.model_dump(mode="json"), "proposals": len(proposals),
            "valid": by_stage["ok"], "valid_rate": by_stage["ok"] / max(1, len(proposals)),
            "invalid_parse": by_stage["parse"], "invalid_evaluate": by_stage["evaluate"],
            "valid_by_operator": _rate_by_operator(proposals),
            "pick": pick.to_dict(), "pick_val": best_val, "pick_test": tests,
            "best_train": population[0].objective, "seconds": seconds, "seconds_by_part": self.seconds,
            "sandbox_calls": self.evaluator.sandbox_calls, "es_generations": self.es.generation if self.es else 0,
            "zero_variance_updates": sum(bool(line.get("zero_variance")) for line in lines),
        }


def _rate_by_operator(proposals: list[dict]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for p in proposals:
        v = out.setdefault(p["operator"], [0, 0])
        v[0] += p["stage"] == "ok"
        v[1] += 1
    return out


def baseline_scores(problem_name: str, sizes: dict) -> dict[str, dict[str, float]]:
    """Trusted host baselines (first fit, best fit, nearest neighbour, ...) on the val and test sets."""
    problem = get_problem(problem_name, **sizes)
    sets = instance_sets(problem)
    return {name: score_host_baselines(problem, sets[name]) for name in sets if name != "train"}


def read_batches(path: Path) -> list[dict]:
    """The complete batch lines (a torn last line, from a kill mid-write, is dropped)."""
    if not path.exists():
        return []
    lines = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        try:
            line = json.loads(raw)
        except json.JSONDecodeError:
            break
        if line.get("batch") != len(lines):
            raise ValueError(f"{path}: batch {line.get('batch')} where {len(lines)} was expected")
        lines.append(line)
    return lines


def append_line(path: Path, record: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, separators=(",", ":")) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _rewrite(path: Path, lines: list[dict]) -> None:
    if not path.exists():
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines), encoding="utf-8")
    os.replace(tmp, path)
