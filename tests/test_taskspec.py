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


@pytest.mark.parametrize("data,field", [
    ({"name": "x", "budget_usd": float("nan")}, "budget_usd"),
    ({"name": "x", "budget_usd": float("inf")}, "budget_usd"),
    ({"name": "x", "deadline_hours": float("inf")}, "deadline_hours"),
    ({"name": "x", "training": {"lr": float("nan")}}, "training.lr"),
    ({"name": "x", "resources": {"max_price_per_hour": float("inf")}}, "resources.max_price_per_hour"),
    ({"name": "x", "local": {"preempt_at": [1.0, float("inf")]}}, "local.preempt_at.1"),
    ({"name": "x", "policy": "rm -rf /"}, "policy"),
    ({"name": "x", "training": {"checkpoint": {"storage": "file://host/x"}}}, "training.checkpoint.storage"),
    ({"name": "x", "training": {"checkpoint": {"storage": "file://../../x"}}}, "training.checkpoint.storage"),
    ({"name": "x", "training": {"checkpoint": {"storage": "s3://bu cket/x"}}}, "training.checkpoint.storage"),
    ({"name": "x", "training": {"checkpoint": {"storage": "s3://ab/x"}}}, "training.checkpoint.storage"),
    ({"name": "x", "training": {"checkpoint": {"storage": "s3://10.0.0.1/x"}}}, "training.checkpoint.storage"),
    # GCS's bucket rules: no uppercase, no "goog" prefix, nothing with "google", 63 per dot-part
    ({"name": "x", "training": {"checkpoint": {"storage": "gs://My_Bucket/ck"}}}, "training.checkpoint.storage"),
    ({"name": "x", "training": {"checkpoint": {"storage": "gs://goog-ckpt/ck"}}}, "training.checkpoint.storage"),
    ({"name": "x", "training": {"checkpoint": {"storage": "gs://my-google-ckpt/ck"}}}, "training.checkpoint.storage"),
    ({"name": "x", "training": {"checkpoint": {"storage": "gs://" + "a" * 64 + "/ck"}}}, "training.checkpoint.storage"),
    ({"name": "x", "training": {"checkpoint": {"storage": "gs:///ck"}}}, "training.checkpoint.storage"),
    # Azure's rules: account 3-24 lowercase letters and digits; container 3-63 lowercase letters,
    # digits and '-', no '--', starting and ending with a letter or digit
    ({"name": "x", "training": {"checkpoint": {"storage": "az://acct/ck"}}}, "training.checkpoint.storage"),
    ({"name": "x", "training": {"checkpoint": {"storage": "az://acct"}}}, "training.checkpoint.storage"),
    ({"name": "x", "training": {"checkpoint": {"storage": "az://My-Acct/ckpt"}}}, "training.checkpoint.storage"),
    ({"name": "x", "training": {"checkpoint": {"storage": "az://" + "a" * 25 + "/ckpt"}}}, "training.checkpoint.storage"),
    ({"name": "x", "training": {"checkpoint": {"storage": "az://acct/my--ckpt"}}}, "training.checkpoint.storage"),
    ({"name": "x", "training": {"checkpoint": {"storage": "az://acct/-ckpt"}}}, "training.checkpoint.storage"),
    ({"name": "x", "training": {"checkpoint": {"storage": "az://acct/My_Ckpt/x"}}}, "training.checkpoint.storage"),
])
def test_non_finite_numbers_bad_storage_and_unknown_policies_are_refused(data, field):
    with pytest.raises(InputError) as e:
        parse_taskspec(data)
    assert field in [p.field for p in e.value.problems]


@pytest.mark.parametrize("storage", ["file:///tmp/ck", "file://${SPOTWISE_HOME}/checkpoints", "s3://my-bucket/ck",
                                     "s3://my.bucket-2/a/b", "gs://my_bucket/ck", "gs://my-bucket",
                                     "gs://" + ".".join(["a" * 60] * 3) + "/ck", "az://myaccount/ckpt/run",
                                     "az://devstoreaccount1/my-ckpt-2", "az://abc/" + "a" * 63])
def test_good_storage_uris_pass(storage):
    assert parse_taskspec({"name": "x", "training": {"checkpoint": {"storage": storage}}}).training.checkpoint.storage == storage


def test_registered_policies_pass():
    from spotwise.policies.base import known_policies

    for name in known_policies():
        assert parse_taskspec({"name": "x", "policy": name}).policy == name


def test_default_policy_is_spotwise_with_a_deadline_and_spot_fallback_without():
    assert parse_taskspec({"name": "x"}).policy_name == "spot-fallback"
    assert parse_taskspec({"name": "x", "deadline_hours": 3}).policy_name == "spotwise"
    assert parse_taskspec({"name": "x", "deadline_hours": 3, "policy": "auto"}).policy_name == "spotwise"
    assert parse_taskspec({"name": "x", "deadline_hours": 3, "policy": "uniform-progress"}).policy_name == "uniform-progress"
    with pytest.raises(InputError, match="policy"):          # an explicit null is refused, not defaulted
        parse_taskspec({"name": "x", "deadline_hours": 3, "policy": None})
    with pytest.raises(InputError, match="deadline_hours"):  # a bad deadline is still named
        parse_taskspec({"name": "x", "deadline_hours": -1})


def test_a_deadline_given_later_chooses_the_default_policy_too():
    """The API's and a schedule's deadline are written into a task already read (and stored)."""
    from spotwise.engine.work.jobs import spec_with

    stored = parse_taskspec({"name": "x"})
    assert spec_with(stored, deadline_hours=2.0).policy_name == "spotwise"
    assert spec_with(stored.model_dump(mode="json"), deadline_hours=2.0).policy_name == "spotwise"
    named = parse_taskspec({"name": "x", "policy": "spot-fallback"})
    assert spec_with(named, deadline_hours=2.0).policy_name == "spot-fallback"


def test_yaml_infinity_and_non_utf8_files_are_input_errors(tmp_path):
    f = tmp_path / "t.yaml"
    f.write_text("name: x\nbudget_usd: 1e400\n")
    with pytest.raises(InputError, match="budget_usd"):
        load_taskspec(f)
    f.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(InputError, match="UTF-8"):
        load_taskspec(f)


def test_trace_check_gives_one_answer_whatever_the_file(tmp_path):
    from spotwise.taskspec import check_trace_file

    good = tmp_path / "good.json"
    good.write_text('{"data": [1, 0, 1]}')
    assert check_trace_file(str(good)) == str(good)
    answers = set()
    for bad in ("/no/such/file", "/etc", "/etc/passwd", str(tmp_path / "x\x00")):
        with pytest.raises(InputError) as e:
            check_trace_file(bad)
        answers.add(e.value.problems[0].allowed)
    assert len(answers) == 1
