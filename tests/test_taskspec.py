"""TaskSpec validation: every problem reported at once, with field path, given value and what is allowed."""

from pathlib import Path

import pytest

from spotwise.errors import InputError
from spotwise.taskspec import load_taskspec, parse_accelerators, parse_taskspec

ROOT = Path(__file__).resolve().parents[1]


def test_main_example_is_valid():
    spec = load_taskspec(ROOT / "examples" / "tiny-gpt.yaml")
    assert spec.name == "tiny-gpt"
    assert spec.resources.market == "spot"
    assert spec.resources.nodes == 2
    assert spec.local.preempt_at  # the main job has at least one scheduled preemption
    assert spec.training.checkpoint.storage.startswith("file://")


@pytest.mark.parametrize("value,expected", [
    ("H100:8", {"H100": 8}),
    ("h100:8", {"H100": 8}),
    ({"H100": 8, "A100-80GB": 8}, {"H100": 8, "A100-80GB": 8}),
    ("A100-80GB:4,H100:4", {"A100-80GB": 4, "H100": 4}),
    ("L4", {"L4": 1}),
])
def test_accelerator_forms(value, expected):
    assert parse_accelerators(value) == expected


def test_every_problem_is_reported_with_path_given_and_allowed():
    bad = {
        "name": "Bad Name!",
        "resources": {"accelerators": "B9000:8", "market": "cheap", "nodes": 0},
        "training": {"steps": -1, "precision": "fp16", "checkpoint": {"storage": "ftp://x", "keep_last": 1}},
        "budget_usd": -5,
        "colour": "blue",
    }
    with pytest.raises(InputError) as ei:
        parse_taskspec(bad, source="t.yaml")
    fields = {p.field for p in ei.value.problems}
    assert {"name", "resources.accelerators", "resources.market", "resources.nodes", "training.steps",
            "training.checkpoint.storage", "training.checkpoint.keep_last", "budget_usd", "colour",
            "training.precision"} <= fields
    by_field = {p.field: p for p in ei.value.problems}
    assert by_field["resources.market"].given == "cheap"
    assert "spot" in by_field["resources.market"].allowed
    assert "H100" in by_field["resources.accelerators"].allowed
    assert all(v in by_field["training.precision"].allowed for v in ("auto", "bf16", "fp32"))
    assert "not part of a task file" in by_field["colour"].allowed
    assert ei.value.exit_code == 2


def test_missing_name_and_not_a_mapping(tmp_path):
    with pytest.raises(InputError) as ei:
        parse_taskspec({"resources": {}})
    assert ei.value.problems[0].field == "name"
    p = tmp_path / "list.yaml"
    p.write_text("- a\n- b\n")
    with pytest.raises(InputError) as ei:
        load_taskspec(p)
    assert "mapping" in ei.value.problems[0].allowed


def test_yaml_syntax_error_names_line(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("name: x\nresources: {nodes: 2\n")
    with pytest.raises(InputError) as ei:
        load_taskspec(p)
    assert ei.value.problems[0].field.startswith("line ")


def test_missing_file():
    with pytest.raises(InputError) as ei:
        load_taskspec("/nonexistent/task.yaml")
    assert ei.value.problems[0].field == "TASK"


def test_model_heads_must_divide_width():
    with pytest.raises(InputError) as ei:
        parse_taskspec({"name": "x", "training": {"model": {"d_model": 100, "n_heads": 3}}})
    assert "divisible" in str(ei.value)
