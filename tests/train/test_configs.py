"""Shipped configs are small deltas on a base (`base: NAME`); the merge is key by key."""

from __future__ import annotations

import pytest

from esopt.train.config import ConfigError, load_config


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_config_holds_only_what_differs_from_its_base(tmp_path):
    write(tmp_path, "parent.yaml", "steps: 7\nenv: {kwargs: {size: 4, h_star: 3}}\nes: {sigma: 0.02}\n")
    child = write(tmp_path, "child.yaml", "base: parent.yaml\nenv: {kwargs: {h_star: 5}}\n")
    config = load_config(child, ["es.alpha=0.5"])
    assert (config.steps, config.env.kwargs["size"], config.env.kwargs["h_star"]) == (7, 4, 5)
    assert (config.es.sigma, config.es.alpha) == (0.02, 0.5)


def test_a_base_of_another_algorithm_gives_its_shared_fields_not_its_own_section(tmp_path):
    child = write(tmp_path, "g.yaml", "base: smoke\nalgo: grpo\ngrpo: {lr: 3.0e-5, group_size: 4}\n")
    config, smoke = load_config(child), load_config("smoke")
    assert config.algo == "grpo" and config.grpo.lr == 3e-5 and config.grpo.group_size == 4
    assert config.env == smoke.env and config.model == smoke.model and config.sampling == smoke.sampling


def test_the_paper_configs_differ_by_one_override():
    h5 = load_config("sudoku9_paper", ["env.kwargs.h_star=5"])
    h15 = load_config("sudoku9_paper", ["env.kwargs.h_star=15"])
    assert h5.model_dump(exclude={"env"}) == h15.model_dump(exclude={"env"})
    assert (h5.env.kwargs["h_star"], h15.env.kwargs["h_star"]) == (5, 15)
    grpo = load_config("grpo_sudoku9_paper")
    assert grpo.env == load_config("sudoku9_paper").env and grpo.grpo.group_size == 8


@pytest.mark.parametrize("text, message", [
    ("base: loop.yaml\n", "loops back to itself"),
    ("base: [1]\n", "base must be a config name or path"),
    ("base: no-such-config\n", "does not exist"),
])
def test_bad_bases_are_one_line_errors(tmp_path, text, message):
    path = write(tmp_path, "loop.yaml", text)
    with pytest.raises(ConfigError, match=message):
        load_config(path)
