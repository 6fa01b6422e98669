"""PNG plots of a run from its metrics rows (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path


def save_figure(fig, path: str | Path) -> Path:
    """Lay out, write as a 100-dpi PNG (parent folders created) and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    path = Path(path)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_run(rows: list[dict], out_dir: str | Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    evals = [r for r in rows if r.get("kind") == "eval"]
    if evals:
        written.append(plot_evals(evals, out_dir / "eval.png"))
    train = [r for r in rows if r.get("kind") == "train" and "reward_mean" in r]
    if train:
        fig, ax = plt.subplots(figsize=(5.5, 3.5))
        steps = [r["step"] for r in train]
        ax.fill_between(steps, [r["reward_min"] for r in train], [r["reward_max"] for r in train], alpha=0.25,
                        label="min-max")
        lo = [r["reward_mean"] - r["reward_std"] for r in train]
        hi = [r["reward_mean"] + r["reward_std"] for r in train]
        ax.fill_between(steps, lo, hi, alpha=0.35, label="mean ± std")
        ax.plot(steps, [r["reward_mean"] for r in train], label="mean")
        ax.set(xlabel="generation / step", ylabel="reward", title="population / batch reward spread")
        ax.legend(loc="best", fontsize=8)
        written.append(save_figure(fig, out_dir / "reward_spread.png"))
    return written


def eval_changes(evals: list[dict]) -> list[tuple[int, float, float, float]]:
    """(step, change, low, high) of held-out success against the first eval: paired over the same tasks
    and sampling seeds, with a bootstrap 95% interval (empty if the rows carry no per-episode scores)."""
    from esopt.utils.stats import paired_difference

    first = evals[0].get("episode_success")
    if not first:
        return []
    out = []
    for r in evals:
        after = r.get("episode_success")
        if after and len(after) == len(first):
            d = paired_difference(first, after, len(first))
            out.append((r["step"], d.mean, d.low, d.high))
    return out


def plot_evals(evals: list[dict], path: Path) -> Path:
    """Left: held-out success on a 0-1 axis. Right: its paired change from the first eval with the 95%
    interval as a band, on an axis that always shows 0, so a change whose interval contains 0 looks
    like one rather than filling the panel."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
    steps = [r["step"] for r in evals]
    ax[0].plot(steps, [r["success_rate"] for r in evals], marker="o")
    ax[0].set(xlabel="generation / step", ylabel="held-out success rate", title="eval success", ylim=(0, 1))
    changes = eval_changes(evals)
    if changes:
        x, mean, low, high = (list(v) for v in zip(*changes))
        ax[1].fill_between(x, low, high, alpha=0.3, label="paired 95% interval")
        ax[1].plot(x, mean, marker="o", color="C1", label="change")
        ax[1].axhline(0.0, color="k", lw=0.8)
        span = max(0.1, *(abs(v) for v in low + high)) * 1.15
        ax[1].set_ylim(-span, span)
        ax[1].legend(loc="best", fontsize=8)
    ax[1].set(xlabel="generation / step", ylabel="success change vs first eval",
              title=f"paired change ({len(evals[0].get('episode_success') or [])} episodes)")
    return save_figure(fig, path)
