"""The scripted oracle: a task's `oracle` steps turned into BrowserGym actions on the live page.

Each step names its element by role and accessible name (see `esopt.envs.web.tasks`), so the oracle finds the
bid on whatever page the browser shows, as an agent would, and acts through `env.step` like one.
"""

from __future__ import annotations

from typing import Any

from esopt.envs.web.browser import TextBrowser


def oracle_action(step: list, browser: TextBrowser) -> str:
    """The action string for one oracle step on the browser's current page (BrowserError if its element is absent)."""
    kind = step[0]
    if kind == "answer":
        return f"send_msg_to_user({step[1]!r})"
    if kind == "back":
        return "go_back()"
    if kind == "scroll":
        return "scroll(0, 300)"
    bid = browser.find(step[1], step[2], near=step[3] if kind == "click" and len(step) > 3 else None)
    if kind == "click":
        return f"click({bid!r})"
    if kind == "fill":
        return f"fill({bid!r}, {step[3]!r})"
    if kind == "select":
        return f"select_option({bid!r}, {step[3]!r})"
    if kind in ("check", "uncheck"):
        return f"{kind}({bid!r})"
    raise ValueError(f"unknown oracle step {kind!r}")


def run_oracle(env: Any) -> tuple[float, dict, list[tuple[str, str]]]:
    """Solve the current episode of a reset `WebEnv` with its task's oracle: (last reward, last info, the
    (observation, action) pairs taken)."""
    web = env.unwrapped
    obs, reward, info, pairs = web.last_observation, 0.0, {}, []
    for step in web.task["oracle"]:
        action = oracle_action(step, web.browser)
        pairs.append((obs, action))
        obs, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            break
    return reward, info, pairs
