"""The benchmark's Markdown tables and PNG plots, from its JSON results: measurements only.

What the numbers mean, and which targets they are held against, is docs/performance.md's job, not the report's.
One function per table; :func:`markdown` writes the tables of the items that ran.
"""

from __future__ import annotations

from pathlib import Path


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f}"


def _x(value: float) -> str:
    return f"{value:,.2f}x" if value < 10 else f"{value:,.1f}x" if value < 100 else f"{value:,.0f}x"


def _shape(values) -> str:
    return "x".join(map(str, values))


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def markdown(results: dict) -> str:
    """The whole report: a header, the summary, then one section per item that ran."""
    sections = [_header(results), _summary(results)]
    for key, section in SECTIONS:
        if key in results:
            sections.append(section(results[key]))
    return "\n\n".join("\n".join(lines) for lines in sections) + "\n"


def _header(results: dict) -> list[str]:
    env = results["environment"]
    return [
        "# densecnn benchmarks",
        "",
        f"torch {env['torch']}, densecnn {env['densecnn']}, {env['threads']} threads, {env['cpu']} "
        f"(kernels {env.get('isa', 'instruction set not recorded')}), "
        f"{env.get('allocator', 'system malloc')}, "
        f"compiled kernels {'built' if env['ext_available'] else 'NOT built'}; mode {results['mode']}, "
        f"median of {results['repeats']} interleaved rounds; speedups are medians of per-round ratios. "
        "Baselines (native dilated ops, fast scanning, patch-by-patch) run in NCHW and channels_last; each figure "
        f"is against the faster of the two, named in brackets. Times in ms. Run: `{results['command']}`.",
    ]


def summary(results: dict) -> list[list[str]]:
    """[measurement, value, baseline] rows: the headline ratios of the items that ran (no targets: see the docs)."""
    rows = []
    for item in results.get("per_layer", []):
        m, s, f, t, lay = (
            item["model"],
            item["speedup"],
            item["forward_s"],
            item["train_s"],
            item["baseline_layouts"],
        )
        rows += [
            [f"{m} forward vs best native", _x(s["forward_vs_native"]), f"native [{lay['native']}] {_ms(f['native'])}"],
            [f"{m} training step vs best native", _x(s["train_vs_native"]),
             f"native [{lay['native_train']}] {_ms(t['native'])}"],
            [f"{m} forward vs fast scanning", _x(s["forward_vs_fast_scan"]),
             f"fast scan [{lay['fast_scan']}] {_ms(f['fast_scan'])}"],
            [f"{m} forward vs patch-by-patch", _x(s["forward_vs_patch"]),
             f"patch-by-patch [{lay['patch']}] {_ms(f['patch'])} (scaled)"],
        ]  # fmt: skip
    for r in results.get("conv_limit", []):
        rows.append([f"{r['model']} forward / conv-only limit", f"{r['overhead']:.2f}", f"Σ best conv {_ms(r['conv_limit_s'])}"])  # fmt: skip
        rows.append([f"{r['model']} forward / Σ best native conv", f"{r['vs_native_conv_sum']:.2f}",
                     f"Σ best native conv {_ms(r['native_conv_sum_s'])}"])  # fmt: skip
    for r in results.get("first_call", []):
        for direction in ("forward", "train"):
            d = r[direction]
            rows.append([f"{r['model']} first {direction} call / warm (empty cache)", f"{d['first_over_warm']:.2f}",
                         f"warm {_ms(d['warm_s'])}"])  # fmt: skip
    for r in results.get("immediate_vs_tuned", []):
        for direction in ("forward", "train"):
            d = r[direction]
            rows.append([f"{r['model']} {direction}: immediate plan / tuned plan", f"{d['immediate_over_tuned']:.2f}",
                         f"tuned {_ms(d['tuned_s'])}"])  # fmt: skip
    for r in results.get("max_pool", []):
        for direction in ("forward", "backward"):
            native = (
                f"F.max_pool2d [{r['native_layout'][direction]}] {_ms(r['times_s'][f'native_{direction}'])}"
            )
            rows.append([f"max pool k={r['kernel']} d={r['dilation']} {direction} vs native",
                         _x(r["speedup"][direction]), native])  # fmt: skip
    for r in results.get("monai", []):
        if "skipped" not in r:
            rows.append([f"{r['model']} forward vs MONAI's sliding window", _x(r["speedup"]["densecnn_vs_monai"]),
                         f"SlidingWindowInferer {_ms(r['forward_s']['monai'])} (scaled)"])  # fmt: skip
    if "memory" in results:
        mem = results["memory"]
        rows.append([f"{mem['model']} predict {mem['image'][2]}² peak RSS", f"{mem['peak_rss_bytes'] / 1e9:.2f} GB",
                     f"max_memory={mem['max_memory']:,}"])  # fmt: skip
    return rows


def _summary(results: dict) -> list[str]:
    return ["## Summary", ""] + _table(["measurement", "value", "baseline (same run)"], summary(results))


def _per_layer(items: list[dict]) -> list[str]:
    out = []
    for item in items:
        out += ["", f"## Per layer: {item['model']}, image {item['image']} (Table 1 analogue)", ""]
        fmt = item["memory_format"]
        out += [f"densecnn's memory format: inference {fmt['infer']}, training {fmt['train']}; per layer, native is "
                "the faster of NCHW and channels_last for that layer [named].", ""]  # fmt: skip
        rows = [
            [r["layer"], f"{r['solver']} / {r['train_solver']} ({r['choice']})",
             f"{_ms(r['native_forward'])} [{r['native_forward_format']}]", _ms(r["densecnn_forward"]),
             _x(r["forward_speedup"]), f"{_ms(r['native_backward'])} [{r['native_backward_format']}]",
             _ms(r["densecnn_backward"]), _x(r["backward_speedup"])]
            for r in item["layers"]
        ]  # fmt: skip
        header = ["layer", "solver (infer / train)", "native fwd", "densecnn fwd", "speedup", "native bwd"]
        out += _table(header + ["densecnn bwd", "speedup"], rows)
        f, t, s, lay = item["forward_s"], item["train_s"], item["speedup"], item["baseline_layouts"]
        out += ["", "Whole net (baselines in their faster layout):", ""]
        out += _table(
            ["", f"patch-by-patch [{lay['patch']}]", f"fast scanning [{lay['fast_scan']}]",
             f"native dilated [{lay['native']}]", "densecnn"],
            [
                ["forward", _ms(f["patch"]), _ms(f["fast_scan"]), _ms(f["native"]), _ms(f["densecnn"])],
                ["training step", _ms(t["patch"]), "–", _ms(t["native"]), _ms(t["densecnn"])],
                ["densecnn speedup (fwd)", _x(s["forward_vs_patch"]), _x(s["forward_vs_fast_scan"]),
                 _x(s["forward_vs_native"]), "1x"],
                ["densecnn speedup (train)", _x(s["train_vs_patch"]), "–", _x(s["train_vs_native"]), "1x"],
            ],
        )  # fmt: skip
        native = item["native_forward_s"]
        out += [
            "",
            f"Native dilated forward by layout: NCHW {_ms(native['nchw'])}, NHWC {_ms(native['nhwc'])}.",
        ]
    return out[1:]


def _sweep(title: str, column: str, table: int):
    def section(rows: list[dict]) -> list[str]:
        out = [f"## Forward vs {title} (Table {table} analogue)", ""]
        body = []
        for r in rows:
            layouts = r.get("baseline_layouts", {})
            times = [_ms(r["forward_s"][k]) + (f" [{layouts[k]}]" if k in layouts else "") if k in r["forward_s"]
                     else "–" for k in ("patch", "fast_scan", "native", "densecnn")]  # fmt: skip
            speedups = [
                _x(r["speedup"][k]) if k in r["speedup"] else "–" for k in ("patch", "fast_scan", "native")
            ]
            body.append([str(r[column]), *times, *speedups])
        header = [column, "patch-by-patch", "fast scan", "native", "densecnn", "vs patch", "vs fast scan"]
        return out + _table(header + ["vs native"], body)

    return section


def _memory(mem: dict) -> list[str]:
    out = ["## Memory: tiled predict in a fresh process", ""]
    out += [mem["note"] + ".", ""] if "note" in mem else []
    return out + _table(
        ["model", "image", "max_memory", "peak RSS (whole process)", "time (s)"],
        [[mem["model"], _shape(mem["image"]), f"{mem['max_memory']:,}", f"{mem['peak_rss_bytes']:,}",
          f"{mem['seconds']:.1f}"]],
    )  # fmt: skip


def _masked(masked: dict) -> list[str]:
    out = [f"## Masked training step vs selected pixels ({masked['model']}, image {masked['image']})", ""]
    return out + _table(
        ["selected pixels", "densecnn step", "patch minibatch step [layout]"],
        [[str(r["selected"]), _ms(r["densecnn_s"]), f"{_ms(r['patch_s'])} [{r['patch_layout']}]"]
         for r in masked["rows"]],
    )  # fmt: skip


def _bfloat16(rows: list[dict]) -> list[str]:
    out = ["## bf16 inference (bfloat16 image, backend auto) vs float32", ""]
    header = [
        "model",
        "image",
        "label agreement",
        "max |score error|",
        "max |score|",
        "float32",
        "bf16",
        "speedup",
    ]
    return out + _table(
        header,
        [[r["model"], _shape(r["image"]), f"{r['label_agreement']:.2%}", f"{r['max_abs_score_error']:.2g}",
          f"{r['max_abs_score']:.2g}", _ms(r["times_s"]["float32"]), _ms(r["times_s"]["bfloat16"]), _x(r["speedup"])]
         for r in rows],
    )  # fmt: skip


def _monai(rows: list[dict]) -> list[str]:
    out = ["## Third-party baseline: MONAI's SlidingWindowInferer at stride 1 (labels every pixel)", ""]
    skipped = [r["skipped"] for r in rows if "skipped" in r]
    if skipped:
        return out + [skipped[0]]
    out += ["MONAI and patch-by-patch are timed on a crop and scaled to the image; labels compared with densecnn's on "
            "the crop (equal: at every pixel without an exact tie).", ""]  # fmt: skip
    header = ["model", "image", "labels equal", "agreement", "MONAI", "patch-by-patch", "densecnn"]
    return out + _table(
        header + ["densecnn vs MONAI", "patch vs MONAI"],
        [[r["model"], _shape(r["image"]), "yes" if r["labels_equal"] else "NO", f"{r['label_agreement']:.2%}",
          _ms(r["forward_s"]["monai"]), f"{_ms(r['forward_s']['patch'])} [{r['patch_layout']}]",
          _ms(r["forward_s"]["densecnn"]), _x(r["speedup"]["densecnn_vs_monai"]), _x(r["speedup"]["patch_vs_monai"])]
         for r in rows],
    )  # fmt: skip


def _solver_race(rows: list[dict]) -> list[str]:
    out = ["## Which solver won each layer, and by how much (inference, real shapes, both formats)", ""]
    for r in rows:
        out += [f"{r['model']}, image {r['image']}; the net runs in {r['memory_format']}:", ""]
        out += _table(
            ["layer", "winner", "time", "runner-up", "margin", "best native", "winner vs best native",
             "plan's choice", "choice / best in its format"],
            [[x["layer"], x["winner"], _ms(x["winner_s"]), x["runner_up"] or "–",
              _x(x["margin"]) if x["margin"] else "–", x["best_native"], _x(x["vs_best_native"]), x["plan_choice"],
              f"{x['plan_choice_vs_best_in_format']:.2f}"] for x in r["layers"]],
        )  # fmt: skip
        out += ["", f"Overhead over the conv-only limit: densecnn forward {_ms(r['densecnn_forward_s'])} / Σ best conv "
                f"{_ms(r['conv_limit_s'])} = {r['overhead']:.2f}. Against the direct-convolution limit (torch's "
                f"conv per layer in the faster format, summed: {_ms(r['native_conv_sum_s'])}): "
                f"{r['vs_native_conv_sum']:.2f}.", ""]  # fmt: skip
    return out[:-1]


def _max_pool(rows: list[dict]) -> list[str]:
    out = ["## d-sparse max pooling vs F.max_pool2d(dilation=d, stride=1) in its faster layout", ""]
    return out + _table(
        ["k", "d", "input", "solver fwd / bwd", "native fwd", "densecnn fwd", "speedup", "native bwd",
         "densecnn bwd", "speedup"],
        [[str(r["kernel"]), str(r["dilation"]), _shape(r["input"]), f"{r['solver']['forward']} / {r['solver']['backward']}",
          f"{_ms(r['times_s']['native_forward'])} [{r['native_layout']['forward']}]", _ms(r["times_s"]["densecnn_forward"]),
          _x(r["speedup"]["forward"]), f"{_ms(r['times_s']['native_backward'])} [{r['native_layout']['backward']}]",
          _ms(r["times_s"]["densecnn_backward"]), _x(r["speedup"]["backward"])] for r in rows],
    )  # fmt: skip


def _first_call(rows: list[dict]) -> list[str]:
    out = ["## First call with an empty solver cache (fresh process) vs warm calls", ""]
    return out + _table(
        ["model", "image", "direction", "first call", "warm call", "first / warm", "fresh processes"],
        [[r["model"], _shape(r["image"]), d, _ms(r[d]["first_s"]), _ms(r[d]["warm_s"]),
          f"{r[d]['first_over_warm']:.2f}", str(r["runs"])] for r in rows for d in ("forward", "train")],
    )  # fmt: skip


def _immediate_vs_tuned(rows: list[dict]) -> list[str]:
    out = ["## Immediate plan (cost model) vs tuned plan (timed candidates), warm", ""]
    out += _table(
        ["model", "direction", "immediate", "tuned", "immediate / tuned", "first tuned call (timing)"],
        [[r["model"], d, _ms(r[d]["immediate_s"]), _ms(r[d]["tuned_s"]), f"{r[d]['immediate_over_tuned']:.2f}",
          _ms(r[d]["first_tuned_call_s"])] for r in rows for d in ("forward", "train")],
    )  # fmt: skip
    out += ["", "Plans (memory format: solver per step):", ""]
    for r in rows:
        for d in ("forward", "train"):
            for which, p in r[d]["plans"].items():
                out.append(f"- {r['model']} {d}, {which}: {p['format']}: {', '.join(p['solvers'])}")
    return out


SECTIONS = [
    ("per_layer", _per_layer),
    ("conv_limit", _solver_race),
    ("first_call", _first_call),
    ("immediate_vs_tuned", _immediate_vs_tuned),
    ("vs_image_size", _sweep("image size", "size", 3)),
    ("vs_patch_size", _sweep("patch size", "patch", 4)),
    ("memory", _memory),
    ("masked_backward", _masked),
    ("bfloat16", _bfloat16),
    ("max_pool", _max_pool),
    ("monai", _monai),
]


def plots(results: dict, out: Path) -> list[str]:
    """Write the PNG plots of the items that ran into ``out``; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    for item in results.get("per_layer", []):
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
            ax.legend(["native dilated (faster layout)", "densecnn"], fontsize=8)
        fig.tight_layout()
        names.append(_save(fig, out, f"per_layer_{item['model']}.png"))
    for key, col, label in (
        ("vs_image_size", "size", "image side (px)"),
        ("vs_patch_size", "patch", "patch size"),
    ):
        if key not in results:
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        for baseline in ("patch", "fast_scan", "native"):
            rows = [r for r in results[key] if baseline in r["speedup"]]
            ax.plot(
                [r[col] for r in rows],
                [r["speedup"][baseline] for r in rows],
                marker="o",
                label=f"vs {baseline} (faster layout)",
            )
        ax.set_yscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("densecnn speedup (forward)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        names.append(_save(fig, out, f"speedup_{key}.png"))
    if "masked_backward" in results:
        rows = results["masked_backward"]["rows"]
        fig, ax = plt.subplots(figsize=(6, 4))
        selected = [r["selected"] for r in rows]
        ax.plot(selected, [r["densecnn_s"] * 1e3 for r in rows], marker="o", label="densecnn")
        ax.plot(selected, [r["patch_s"] * 1e3 for r in rows], marker="o", label="patch minibatch")
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
