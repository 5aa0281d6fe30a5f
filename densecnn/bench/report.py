"""The benchmark's Markdown tables and PNG plots, from its JSON results."""

from __future__ import annotations

from pathlib import Path


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f}"


def _x(value: float) -> str:
    return f"{value:,.1f}x" if value < 100 else f"{value:,.0f}x"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def markdown(results: dict) -> str:
    env = results["environment"]
    out = [
        "# densecnn benchmarks",
        "",
        f"torch {env['torch']}, densecnn {env['densecnn']}, {env['threads']} threads, {env['cpu']}, "
        f"compiled kernels {'built' if env['ext_available'] else 'NOT built'}; mode {results['mode']}, "
        f"median of {results['repeats']} interleaved rounds; speedups are medians of per-round ratios. "
        f"Times in ms. Run: `{results['command']}`.",
        "",
        "## Goals",
        "",
    ]
    out += _table(["goal", "target", "achieved", "baseline (same run)"], [g[:4] for g in goals(results)])
    for item in results["per_layer"]:
        out += ["", f"## Per layer: {item['model']}, image {item['image']} (Table 1 analogue)", ""]
        out += [
            f"memory format: inference {item['memory_format']['infer']}, training {item['memory_format']['train']}"
        ]
        out += [""]
        rows = [
            [
                r["layer"],
                f"{r['solver']} / {r['train_solver']}",
                _ms(r["native_forward"]),
                _ms(r["densecnn_forward"]),
                _x(r["forward_speedup"]),
                _ms(r["native_backward"]),
                _ms(r["densecnn_backward"]),
                _x(r["backward_speedup"]),
            ]
            for r in item["layers"]
        ]
        header = ["layer", "solver (infer / train)", "native fwd", "densecnn fwd", "speedup", "native bwd"]
        out += _table(header + ["densecnn bwd", "speedup"], rows)
        f, t, s = item["forward_s"], item["train_s"], item["speedup"]
        out += ["", "Whole net:", ""]
        out += _table(
            ["", "patch-by-patch", "fast scanning", "native dilated", "densecnn"],
            [
                ["forward", _ms(f["patch"]), _ms(f["fast_scan"]), _ms(f["native"]), _ms(f["densecnn"])],
                ["training step", _ms(t["patch"]), "–", _ms(t["native"]), _ms(t["densecnn"])],
                [
                    "densecnn speedup (fwd)",
                    _x(s["forward_vs_patch"]),
                    _x(s["forward_vs_fast_scan"]),
                    _x(s["forward_vs_native"]),
                    "1x",
                ],
                ["densecnn speedup (train)", _x(s["train_vs_patch"]), "–", _x(s["train_vs_native"]), "1x"],
            ],
        )
    for title, key, col in (
        ("image size", "vs_image_size", "size"),
        ("patch size", "vs_patch_size", "patch"),
    ):
        out += ["", f"## Forward vs {title} (Table {3 if col == 'size' else 4} analogue)", ""]
        rows = [
            [str(r[col])]
            + [
                _ms(r["forward_s"][k]) if k in r["forward_s"] else "–"
                for k in ("patch", "fast_scan", "native", "densecnn")
            ]
            + [_x(r["speedup"][k]) if k in r["speedup"] else "–" for k in ("patch", "fast_scan", "native")]
            for r in results[key]
        ]
        header = [
            col,
            "patch-by-patch",
            "fast scan",
            "native",
            "densecnn",
            "vs patch",
            "vs fast scan",
            "vs native",
        ]
        out += _table(header, rows)
    mem = results["memory"]
    out += ["", "## Memory: tiled predict in a fresh process", ""]
    out += [mem["note"] + ".", ""] if "note" in mem else []
    out += _table(
        ["model", "image", "max_memory", "peak RSS (whole process)", "time (s)"],
        [[mem["model"], "x".join(map(str, mem["image"])), f"{mem['max_memory']:,}", f"{mem['peak_rss_bytes']:,}",
          f"{mem['seconds']:.1f}"]],
    )  # fmt: skip
    masked = results["masked_backward"]
    out += [
        "",
        f"## Masked training step vs selected pixels ({masked['model']}, image {masked['image']})",
        "",
    ]
    out += _table(
        ["selected pixels", "densecnn step", "patch minibatch step"],
        [[str(r["selected"]), _ms(r["densecnn_s"]), _ms(r["patch_s"])] for r in masked["rows"]],
    )
    out += ["", "## bf16 inference (bfloat16 image, backend auto) vs float32", ""]
    out += _table(
        [
            "model",
            "image",
            "label agreement",
            "max |score error|",
            "max |score|",
            "float32",
            "bf16",
            "speedup",
        ],
        [
            [
                r["model"],
                "x".join(map(str, r["image"])),
                f"{r['label_agreement']:.2%}",
                f"{r['max_abs_score_error']:.2g}",
                f"{r['max_abs_score']:.2g}",
                _ms(r["times_s"]["float32"]),
                _ms(r["times_s"]["bfloat16"]),
                _x(r["speedup"]),
            ]
            for r in results["bfloat16"]
        ],
    )
    out += ["", "## Overhead over the conv-only limit", ""]
    out += _table(
        ["model", "Σ best conv", "densecnn forward", "overhead", "best conv solvers"],
        [
            [
                r["model"],
                _ms(r["conv_limit_s"]),
                _ms(r["densecnn_forward_s"]),
                f"{r['overhead']:.2f}",
                ", ".join(c["best"] for c in r["convs"]),
            ]
            for r in results["conv_limit"]
        ],
    )
    out += ["", "## d-sparse max pooling vs F.max_pool2d(dilation=d, stride=1) (NCHW)", ""]
    out += _table(
        ["k", "d", "input", "solver fwd / bwd", "native fwd", "densecnn fwd", "speedup", "native bwd"]
        + ["densecnn bwd", "speedup"],
        [
            [
                str(r["kernel"]),
                str(r["dilation"]),
                "x".join(map(str, r["input"])),
                f"{r['solver']['forward']} / {r['solver']['backward']}",
                _ms(r["times_s"]["native_forward"]),
                _ms(r["times_s"]["densecnn_forward"]),
                _x(r["speedup"]["forward"]),
                _ms(r["times_s"]["native_backward"]),
                _ms(r["times_s"]["densecnn_backward"]),
                _x(r["speedup"]["backward"]),
            ]
            for r in results["max_pool"]
        ],
    )
    return "\n".join(out) + "\n"


def goals(results: dict) -> list[list]:
    """[goal, target, achieved, baseline, met] rows for the issue's goals."""
    rows = []

    def goal(name: str, target: str, achieved: str, baseline: str, met: bool) -> None:
        rows.append([name, target, f"{achieved} {'(met)' if met else '(NOT met)'}", baseline, met])

    for item in results["per_layer"]:
        m, s, f, t = item["model"], item["speedup"], item["forward_s"], item["train_s"]
        speedup = s["forward_vs_native"]
        goal(f"{m} forward vs native", ">= 4x", _x(speedup), f"native {_ms(f['native'])} ms", speedup >= 4)
        speedup = s["train_vs_native"]
        goal(
            f"{m} training step vs native",
            ">= 2.5x",
            _x(speedup),
            f"native {_ms(t['native'])} ms",
            speedup >= 2.5,
        )
        speedup = s["forward_vs_fast_scan"]
        goal(
            f"{m} forward vs fast scanning",
            ">= 3x",
            _x(speedup),
            f"fast scan {_ms(f['fast_scan'])} ms",
            speedup >= 3,
        )
        if m == "plain_133":
            speedup = s["forward_vs_patch"]
            baseline = f"patch-by-patch {_ms(f['patch'])} ms (scaled)"
            goal(f"{m} forward vs patch-by-patch", ">= 2000x", _x(speedup), baseline, speedup >= 2000)
    for r in results["conv_limit"]:
        baseline = f"Σ best conv {_ms(r['conv_limit_s'])} ms"
        goal(
            f"{r['model']} forward / conv-only limit",
            "<= 1.25",
            f"{r['overhead']:.2f}",
            baseline,
            r["overhead"] <= 1.25,
        )
    for r in results["max_pool"]:
        for direction, target in (("forward", 10), ("backward", 5)):
            speedup = r["speedup"][direction]
            baseline = f"F.max_pool2d {_ms(r['times_s'][f'native_{direction}'])} ms"
            name = f"max pool k={r['kernel']} d={r['dilation']} {direction}"
            goal(name, f">= {target}x", _x(speedup), baseline, speedup >= target)
    mem = results["memory"]
    peak = mem["peak_rss_bytes"]
    name = f"{mem['model']} predict {mem['image'][2]}² peak RSS"
    goal(name, "<= 2 GB", f"{peak / 1e9:.2f} GB", f"max_memory={mem['max_memory']:,}", peak <= 2e9)
    return rows


def plots(results: dict, out: Path) -> list[str]:
    """Write the PNG plots into ``out``; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    for item in results["per_layer"]:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        labels = [r["layer"] for r in item["layers"]]
        for ax, part in zip(axes, ("forward", "backward")):
            positions = range(len(labels))
            ax.barh([p + 0.2 for p in positions], [r[f"native_{part}"] * 1e3 for r in item["layers"]], 0.4)
            ax.barh([p - 0.2 for p in positions], [r[f"densecnn_{part}"] * 1e3 for r in item["layers"]], 0.4)
            ax.set_yticks(list(positions), labels, fontsize=7)
            ax.invert_yaxis()
            ax.set_xlabel("ms")
            ax.set_title(f"{item['model']} {part}, per layer")
            ax.legend(["native dilated", "densecnn"], fontsize=8)
        fig.tight_layout()
        names.append(_save(fig, out, f"per_layer_{item['model']}.png"))
    for key, col, label in (
        ("vs_image_size", "size", "image side (px)"),
        ("vs_patch_size", "patch", "patch size"),
    ):
        fig, ax = plt.subplots(figsize=(6, 4))
        for baseline in ("patch", "fast_scan", "native"):
            rows = [r for r in results[key] if baseline in r["speedup"]]
            ax.plot(
                [r[col] for r in rows],
                [r["speedup"][baseline] for r in rows],
                marker="o",
                label=f"vs {baseline}",
            )
        ax.set_yscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("densecnn speedup (forward)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        names.append(_save(fig, out, f"speedup_{key}.png"))
    rows = results["masked_backward"]["rows"]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(
        [r["selected"] for r in rows], [r["densecnn_s"] * 1e3 for r in rows], marker="o", label="densecnn"
    )
    ax.plot(
        [r["selected"] for r in rows], [r["patch_s"] * 1e3 for r in rows], marker="o", label="patch minibatch"
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("selected pixels")
    ax.set_ylabel("training step (ms)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    names.append(_save(fig, out, "masked_backward.png"))
    return names


def _save(fig, out: Path, name: str) -> str:
    import matplotlib.pyplot as plt

    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name
