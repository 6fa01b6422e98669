"""Every task template, loaded (`tasks_shop`, `tasks_forum`, `tasks_wiki` register themselves in `tasks.TEMPLATES`),
and the tasks they make: `make_task(name, seed)`, `templates(sites, tiers, split)`."""

from __future__ import annotations

import random

from esopt.envs.web import tasks_forum, tasks_shop, tasks_wiki  # noqa: F401  (importing registers the templates)
from esopt.envs.web.tasks import SITE_KEYS, TEMPLATES, Template, render_intent
from esopt.envs.web.world import template_world


def make_task(name: str, seed: int, data_seed: int = 0) -> dict:
    """Task `seed` of template `name` over world `data_seed` (deterministic)."""
    tpl = TEMPLATES[name]
    rng = random.Random(f"{name}-{seed}")
    got = tpl.make(template_world(data_seed), rng)
    inst = got["inst"]
    return {
        "task_id": tpl.id * 100_000 + seed % 100_000,
        "sites": [SITE_KEYS[tpl.site]],
        "require_login": True,
        "storage_state": None,
        "start_url": got["start"],
        "geolocation": None,
        "intent_template": tpl.intent_template,
        "instantiation_dict": inst,
        "intent": render_intent(tpl.intent_template, inst),
        "require_reset": "program_html" in got["eval"]["eval_types"],
        "eval": got["eval"],
        "intent_template_id": tpl.id,
        "tier": tpl.tier,
        "split": tpl.split,
        "template": name,
        "oracle": got["oracle"],
    }


def templates(
    sites: tuple[str, ...] | None = None, tiers: tuple[int, ...] | None = None, split: str | None = None
) -> list[Template]:
    """The registered templates that match every filter given, in registration order."""
    return [
        t
        for t in TEMPLATES.values()
        if (sites is None or t.site in sites)
        and (tiers is None or t.tier in tiers)
        and (split is None or t.split == split)
    ]
