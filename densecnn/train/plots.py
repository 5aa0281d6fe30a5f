"""PNG plots of a run's loss and IoU curves, drawn from ``metrics.jsonl`` (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path

from .metrics import read_metrics


def plot_metrics(metrics_path: str | Path, out_dir: str | Path, class_names: list[str]) -> list[Path]:
    """Write ``loss.png`` (train and val loss vs step) and ``iou.png`` (val IoU per class, mean, foreground)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    train = [r for r in records if r["kind"] == "train"]
    val = [r for r in records if r["kind"] == "val"]
    out_dir = Path(out_dir)
    written = []

    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    ax.plot([r["step"] for r in train], [r["loss"] for r in train], label="train (selected pixels)", lw=1)
    if val:
        ax.plot(
            [r["step"] for r in val], [r["loss"] for r in val], "o-", label="validation (all pixels)", ms=3
        )
    ax.set(xlabel="step", ylabel="cross-entropy", title="Loss")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    written.append(_save(fig, out_dir / "loss.png", plt))

    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    steps = [r["step"] for r in val]
    for k, name in enumerate(class_names):
        ax.plot(steps, [_nan(r["iou"][k]) for r in val], label=name, lw=1)
    ax.plot(steps, [_nan(r["mean_iou"]) for r in val], "k--", label="mean", lw=1.5)
    ax.plot(steps, [_nan(r["foreground_iou"]) for r in val], "k-", label="foreground", lw=1.5)
    ax.set(xlabel="step", ylabel="IoU", title="Validation IoU", ylim=(0, 1))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    written.append(_save(fig, out_dir / "iou.png", plt))
    return written


def _nan(value):
    return float("nan") if value is None else value


def _save(fig, path: Path, plt) -> Path:
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)
    return path
