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
        fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
        steps = [r["step"] for r in evals]
        ax[0].plot(steps, [r["success_rate"] for r in evals], marker="o")
        ax[0].set(xlabel="generation / step", ylabel="held-out success rate", title="eval success")
        ax[1].plot(steps, [r["mean_reward"] for r in evals], marker="o", color="C1")
        ax[1].set(xlabel="generation / step", ylabel="mean reward", title="eval reward")
        written.append(save_figure(fig, out_dir / "eval.png"))
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
