"""Skill distillation from trajectories (the Trace2Skill recipe) and the gate that guards the prompt.

1. Analyse: each batch of trajectories (failures and successes, with their scores) goes to the reflector,
   which answers with short lessons, one per line.
2. Merge: the current skills and the new lessons are merged by the reflector into one conflict-free
   document of at most `max_skills` lines.
3. Gate: the candidate prompt is scored on a minibatch with the unperturbed weights and accepted only if
   it beats the current prompt by `margin` (as GEPA does), so a weak reflector cannot make things worse.
With `reflector: feedback` no model is asked: `feedback_lessons` turns the env's most frequent feedback on
failing turns into "avoid" lessons. That is for small models, which cannot write lessons about their own
episodes (SmolLM2-135M writes none), on machines with no larger model to ask.
Reflector replies are untrusted text: `parse_skills` keeps bullet-like lines, trims and dedupes them, and
never raises.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from esopt.prompt.reflector import Reflector
from esopt.rollout import Trajectory

MAX_SKILL_CHARS = 200
_BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+(.*\S)\s*$")


def parse_skills(text: str | None, max_skills: int) -> list[str]:
    """Bullet or numbered lines of a reply, trimmed, deduplicated, at most `max_skills`."""
    out: list[str] = []
    for line in (text or "").splitlines():
        m = _BULLET.match(line)
        if not m:
            continue
        skill = " ".join(m.group(1).split())[:MAX_SKILL_CHARS]
        if skill and skill.lower() not in {s.lower() for s in out}:
            out.append(skill)
        if len(out) >= max_skills:
            break
    return out


def transcript(t: Trajectory, score: float, max_turns: int = 4) -> str:
    lines = [f"Episode (score {score:.2f}, {'solved' if t.success else 'not solved'}):"]
    for turn in t.turns[:max_turns]:
        obs = (turn.observation or turn.prompt).strip().splitlines()[-6:]  # its tail: the current state
        lines += ["  observation: " + " / ".join(obs)[-300:], f"  action: {turn.text.strip()[:120]!r}",
                  f"  feedback: {turn.info.get('feedback', '')}"]
    return "\n".join(lines)


def analysis_messages(instructions: str, episodes: Sequence[str]) -> list[dict[str, str]]:
    return [{"role": "system", "content": "You study an agent's episodes and write lessons that would help it."},
            {"role": "user", "content": f"Task: {instructions}\n\n" + "\n\n".join(episodes) +
             "\n\nWrite up to 5 short, general lessons, one per line, each starting with '- '."}]


def merge_messages(current: Sequence[str], lessons: Sequence[str], max_skills: int) -> list[dict[str, str]]:
    have = "\n".join(f"- {s}" for s in current) or "(none)"
    new = "\n".join(f"- {s}" for s in lessons)
    return [{"role": "system", "content": "You maintain a short skills document for an agent."},
            {"role": "user", "content": f"Current skills:\n{have}\n\nNew lessons:\n{new}\n\nMerge them into at most "
             f"{max_skills} non-conflicting skills, one per line, each starting with '- '."}]


def distill(reflector: Reflector, instructions: str, trajectories: Sequence[Trajectory], scores: Sequence[float],
            current: Sequence[str], max_skills: int, batch: int = 4, log: Callable[[str], None] = print
            ) -> list[str] | None:
    """A new skills document, or None when the reflector gave nothing usable (keep the current one)."""
    lessons: list[str] = []
    texts = [transcript(t, s) for t, s in zip(trajectories, scores)]
    for lo in range(0, len(texts), batch):
        lessons += parse_skills(reflector.complete(analysis_messages(instructions, texts[lo:lo + batch])), 5)
    if not lessons:
        log("prompt step: the reflector wrote no usable lessons; the current prompt stays")
        return None
    merged = parse_skills(reflector.complete(merge_messages(current, lessons, max_skills)), max_skills)
    if not merged:
        log("prompt step: the reflector's merge had no usable skills; the current prompt stays")
        return None
    return merged


_NUMBER = re.compile(r"\d+")


def _failed(turn) -> bool:
    info = turn.info
    return not info.get("action_is_valid", True) or info.get("action_is_correct") is False


def feedback_lessons(trajectories: Sequence[Trajectory], current: Sequence[str], max_skills: int) -> list[str] | None:
    """Model-free distillation. Feedback on failing turns (invalid or incorrect actions) is grouped with its
    numbers masked, the most frequent groups become "avoid" lessons with one concrete example each, and the
    current lessons fill the rest. Feedback that passing turns get as well (an env's plain "ok" on a valid move
    that ended an unsolved episode) says nothing about the mistake and is left out. None when no turn failed
    with telling feedback (nothing to learn)."""
    groups: dict[str, list[tuple[str, str]]] = {}
    passing: set[str] = set()
    for t in trajectories:
        for turn in t.turns:
            feedback = " ".join(str(turn.info.get("feedback", "")).split())[:120]
            if not feedback:
                continue
            key = _NUMBER.sub("N", feedback)
            if _failed(turn):
                move = " ".join(turn.text.split())[:60]  # one line: replies may hold newlines
                groups.setdefault(key, []).append((move, feedback))
            else:
                passing.add(key)
    groups = {key: group for key, group in groups.items() if key not in passing}
    if not groups:
        return None
    ranked = sorted(groups.items(), key=lambda kv: len(kv[1]), reverse=True)  # stable: first seen wins a tie
    lessons = [f"Avoid moves like '{g[0][0]}': they got '{g[0][1]}'" for _, g in ranked]
    seen = {f"got '{key}'" for key, _ in ranked}
    kept = [s for s in current if not any(k in _NUMBER.sub("N", s) for k in seen)]  # an older lesson, same mistake
    return [s[:MAX_SKILL_CHARS] for s in (lessons + kept)[:max_skills]]


def gate(score: Callable[[str], float], current: str, candidate: str, margin: float) -> tuple[bool, float, float]:
    """(accepted, current score, candidate score): accept only a candidate better by more than `margin`."""
    now, new = score(current), score(candidate)
    return new > now + margin, now, new
