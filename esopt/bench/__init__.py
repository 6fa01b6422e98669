"""Benchmarks and analyses that compare ES with the GRPO and PPO baselines (`esopt bench horizon`,
`esopt analyze variance`, `esopt analyze step`)."""

import argparse


def add_analysis_options(p: argparse.ArgumentParser, writes: str) -> None:
    """The options every analysis shares: smoke preset, threads, output folder, quiet."""
    p.add_argument("--smoke", action="store_true", help="a seconds-long preset (tests)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: no OpenMP oversubscription)")
    p.add_argument("--out", default="results", help=f"writes {writes}")
    p.add_argument("--quiet", action="store_true")
