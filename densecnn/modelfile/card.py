"""The README.md model card of a model directory: the model, its data, the full training command, metrics and
limitations (:func:`densecnn.train.record.save_trained_model` fills it in for a training run)."""

from __future__ import annotations

from pathlib import Path


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def write_model_card(
    path: str | Path,
    *,
    title: str,
    config: dict,
    command: str,
    model_summary: dict,
    data_summary: dict,
    training_summary: dict,
    val_scores: dict | None,
    class_names: list[str],
    validation_note: str | None = None,
    intensity: str = "dtype",
) -> Path:
    """Write the card to ``path`` (a README.md) and return it. ``command`` is the full command of the run (every
    option written, defaults included); a run started from Python gets the equivalent ``densecnn train`` command.
    ``validation_note``: what the validation section says when there are no ``val_scores`` (by default, that no
    validation set was given); ``intensity``: the model's intensity rule as text (``"range:0,4095"``)."""
    lines = [f"# {title}", "", "A densecnn patch classifier: it labels the centre pixel of a patch; "]
    lines[-1] += "`densecnn` runs it on whole images in one exact dense pass."
    lines += ["", *_listing("Model", model_summary), "", *_listing("Data", data_summary), ""]
    lines += _command_section(command, from_command_line=bool(config.get("command")))
    lines += [*_listing("Training", training_summary), ""]
    lines += _validation_section(val_scores, config.get("val"), class_names, validation_note)
    lines += _limitations_section(model_summary.get("patch size", "patch"), intensity)
    lines += USE_SECTION
    path = Path(path)
    path.write_text("\n".join(lines), encoding="utf-8")  # class names and paths in any script, any locale
    return path


def _listing(heading: str, items: dict) -> list[str]:
    return [f"## {heading}", "", *(f"- {key}: {value}" for key, value in items.items())]


def _command_section(command: str, *, from_command_line: bool) -> list[str]:
    return [
        "## Training command",
        "",
        "Every option is written, defaults included, so the command reproduces this run whatever later versions",
        "change."
        if from_command_line
        else "change. The run was started from Python; this is its equivalent command.",
        "",
        "```",
        command,
        "```",
        "",
    ]


def _validation_section(
    val_scores: dict | None, val: str | None, class_names: list[str], note: str | None = None
) -> list[str]:
    lines = ["## Validation metrics", ""]
    if val_scores is None:
        return [
            *lines,
            note or "No validation set was given (`--val`): there are no held-out metrics for this model.",
            "",
        ]
    lines += [f"Whole-image dense prediction on `{val}`, every labelled pixel counted.", ""]
    lines += ["| class | IoU |", "|---|---|"]
    lines += [f"| {name} | {_fmt(iou)} |" for name, iou in zip(class_names, val_scores["iou"], strict=True)]
    return [
        *lines,
        f"| **mean IoU** | {_fmt(val_scores['mean_iou'])} |",
        f"| **foreground IoU** (classes 1..K-1 vs class 0) | {_fmt(val_scores['foreground_iou'])} |",
        f"| pixel accuracy | {_fmt(val_scores['pixel_accuracy'])} |",
        "",
    ]


def _scaled_by(intensity: str) -> str:
    """How the intensity rule ``intensity`` (``"dtype"``, ``"range:L,H"``, ``"percentiles:L,H"``) scales values."""
    mode, _, values = intensity.partition(":")
    low, _, high = values.partition(",")
    if mode == "range":
        return f"from the range {low}..{high}"
    if mode == "percentiles":
        return f"from each image's percentiles {low} to {high}"
    return "by their bit depth"


def _limitations_section(patch_size, intensity: str) -> list[str]:
    return [
        "## Limitations",
        "",
        "- Trained only on the data above; expect lower accuracy on other instruments, stains, magnifications or "
        "intensity ranges. Validate on your own images before relying on it.",
        f"- Each pixel's label depends only on its {patch_size} patch: structures "
        "larger than the patch are judged from partial context.",
        "- Input is normalised with the stored per-channel mean/std of the training images (values scaled to "
        f"[0, 1] {_scaled_by(intensity)}); images with a very different intensity distribution need fine-tuning.",
        "- Pixels near the image border see padded context (the stored padding mode).",
        "",
    ]


USE_SECTION = [
    "## Use",
    "",
    "```python",
    "import densecnn",
    "from densecnn.io import decode_array, model_input",
    "",
    'loaded = densecnn.load("PATH/TO/THIS/DIRECTORY")',
    'image = model_input(decode_array("image.png"), loaded)  # (1, C, H, W): scaled, normalised, checked',
    "labels = loaded.dense().predict(image)  # (1, H, W) class ids",
    "```",
    "",
]
