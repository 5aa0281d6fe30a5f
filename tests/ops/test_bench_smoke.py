"""`densecnn bench --quick` runs end to end and writes its JSON, Markdown and plots (timings are not checked)."""

from __future__ import annotations

import json

import pytest

from densecnn.cli import main


@pytest.mark.slow
def test_quick_bench_writes_results_tables_and_plots(tmp_path, ops_config):
    ops_config(cache_dir=tmp_path / "cache")
    out = tmp_path / "bench"
    assert main(["bench", "--quick", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["mode"] == "quick" and results["repeats"] >= 5
    layer_table = results["per_layer"][0]
    assert {"forward_s", "train_s", "speedup", "layers", "memory_format"} <= set(layer_table)
    assert set(layer_table["forward_s"]) == {"patch", "fast_scan", "native", "densecnn"}
    assert set(layer_table["baseline_layouts"].values()) <= {"nchw", "nhwc"}  # the faster layout is named
    assert set(layer_table["native_forward_s"]) == {"nchw", "nhwc"}
    assert all(row["native_forward"] > 0 and row["densecnn_backward"] > 0 for row in layer_table["layers"])
    assert [row["size"] for row in results["vs_image_size"]] == results["config"]["sizes"]
    assert len(results["vs_patch_size"]) == len(results["config"]["patch_kernels"])
    assert [row["selected"] for row in results["masked_backward"]["rows"]] == results["config"][
        "masked_counts"
    ]
    assert all(row["overhead"] > 0 for row in results["conv_limit"])
    for row in results[
        "conv_limit"
    ]:  # the direct-convolution limit: torch's conv per layer, the faster format
        convs = [layer for layer in row["layers"] if "Pool" not in layer["layer"]]  # convs and FC-made convs
        natives = [min(t for c, t in layer["times_s"].items() if c.startswith("native/")) for layer in convs]
        assert convs and row["native_conv_sum_s"] == pytest.approx(sum(natives))
        assert row["vs_native_conv_sum"] == row["densecnn_forward_s"] / row["native_conv_sum_s"]
    race = results["conv_limit"][0]["layers"]
    assert all(
        row["winner_s"] <= min(row["times_s"].values()) for row in race
    )  # which solver won, by how much
    assert all(row["plan_choice_vs_best_in_format"] >= 1 for row in race)
    for row in results["first_call"]:
        assert row["forward"]["first_s"] > 0 and row["train"]["first_over_warm"] > 0
    for row in results["immediate_vs_tuned"]:
        assert row["forward"]["immediate_over_tuned"] > 0 and row["train"]["plans"]["tuned"]["solvers"]
    assert all(0 <= row["label_agreement"] <= 1 for row in results["bfloat16"])
    assert results["memory"]["peak_rss_bytes"] > 0
    assert {(r["kernel"], r["dilation"]) for r in results["max_pool"]} == {(2, 2), (8, 1)}
    assert results["summary"] and all(
        {"measurement", "value", "baseline"} <= set(row) for row in results["summary"]
    )
    markdown = (out / "results.md").read_text()
    for heading in ("## Summary", "## Per layer", "## Forward vs image size", "## Masked training step"):
        assert heading in markdown
    for plot in results["plots"]:
        assert (out / plot).read_bytes().startswith(b"\x89PNG")
    assert len(results["plots"]) == len(results["per_layer"]) + 3


def test_bench_runs_only_the_items_asked_for(tmp_path, ops_config):
    ops_config(cache_dir=tmp_path / "cache")
    out = tmp_path / "bench"
    assert main(["bench", "--quick", "--only", "max_pool", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert "max_pool" in results and "per_layer" not in results
    assert "## d-sparse max pooling" in (out / "results.md").read_text()
    assert main(["bench", "--quick", "--only", "fastest", "--out", str(out)]) == 2


def test_bench_names_the_cpu_and_checks_monai_labels(tmp_path, ops_config):
    pytest.importorskip("monai")
    ops_config(cache_dir=tmp_path / "cache")
    out = tmp_path / "bench"
    assert main(["bench", "--quick", "--only", "monai", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["environment"]["cpu"] and results["environment"]["isa"]
    (row,) = results["monai"]
    assert row["labels_equal"] and row["forward_s"]["monai"] > 0 and row["forward_s"]["patch"] > 0
    markdown = (out / "results.md").read_text()
    assert "SlidingWindowInferer" in markdown and results["environment"]["cpu"] in markdown
