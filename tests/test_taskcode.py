"""The task's own code is checked before anything launches (issue 31, item 5): every bad input
is an exit-2 error naming its field, found by reading the workdir, never by importing it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from spotwise.errors import InputError
from spotwise.taskcode import WORKDIR_MAX_BYTES, runtime_env, scan_workdir
from spotwise.taskspec import load_taskspec, user_code

TRAIN = "from spotwise.train import TrainSpec\n\n\ndef make_spec(config):\n    return None\n\n\ndef helper():\n    pass\n"


def _task(tmp_path: Path, files: dict[str, str] | None = None, **over) -> Path:
    code = tmp_path / "code"
    for rel, text in ({"pkg/__init__.py": "", "pkg/train.py": TRAIN} if files is None else files).items():
        (code / rel).parent.mkdir(parents=True, exist_ok=True)
        (code / rel).write_text(text)
    doc = {"name": "mine", "workdir": "code", "training": {"entrypoint": "pkg.train:make_spec"}}
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(doc.get(k), dict):
            doc[k].update(v)
        elif v is None:
            doc.pop(k, None)
        else:
            doc[k] = v
    path = tmp_path / "task.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _problems(path: Path) -> list[tuple[str, str]]:
    with pytest.raises(InputError) as e:
        load_taskspec(path)
    return [(p.field, f"{p.given} | {p.allowed}") for p in e.value.problems]


def test_a_good_task_resolves_its_workdir_and_ships_it(tmp_path):
    spec = load_taskspec(_task(tmp_path, env={"MY_FLAG": "1"}, pip=["numpy>=1.26", "torch"]))
    assert spec.workdir == str((tmp_path / "code").resolve())
    env = runtime_env(user_code(spec))
    assert env == {"working_dir": spec.workdir, "pip": ["numpy>=1.26", "torch"], "env_vars": {"MY_FLAG": "1"}}


def test_missing_module_lists_the_modules_that_exist(tmp_path):
    [(field, msg)] = _problems(_task(tmp_path, training={"entrypoint": "pkg.trian:make_spec"}))
    assert field == "training.entrypoint"
    assert "no 'pkg.trian'" in msg and "pkg.train" in msg and "pkg" in msg


def test_missing_function_lists_the_functions_that_exist(tmp_path):
    [(field, msg)] = _problems(_task(tmp_path, training={"entrypoint": "pkg.train:make_spex"}))
    assert field == "training.entrypoint"
    assert "no 'make_spex'" in msg and "make_spec, helper" in msg


def test_a_syntax_error_is_reported_as_file_and_line(tmp_path):
    files = {"pkg/__init__.py": "", "pkg/train.py": TRAIN, "pkg/util.py": "x = 1\ndef broken(:\n"}
    [(field, msg)] = _problems(_task(tmp_path, files))
    assert field == "training.entrypoint" and "pkg/util.py:2" in msg


def test_a_workdir_over_the_limit_names_its_largest_paths(tmp_path):
    path = _task(tmp_path)
    with open(tmp_path / "code" / "weights.bin", "wb") as f:
        f.truncate(WORKDIR_MAX_BYTES + 1)          # sparse: no real bytes written
    (tmp_path / "code" / "data").mkdir()
    (tmp_path / "code" / "data" / "big.csv").write_bytes(b"x" * 1000)
    [(field, msg)] = _problems(path)
    assert field == "workdir" and "Largest: weights.bin (100.0 MiB), data/big.csv" in msg


def test_ignore_files_leave_paths_out_of_the_size_and_the_hash(tmp_path):
    path = _task(tmp_path)
    code = tmp_path / "code"
    before = scan_workdir(code).sha256()
    with open(code / "weights.bin", "wb") as f:
        f.truncate(WORKDIR_MAX_BYTES + 1)
    (code / "notes.md").write_text("x")
    (code / ".gitignore").write_text("*.bin\n")
    (code / ".spotwiseignore").write_text("*.md\n")
    spec = load_taskspec(path)                     # no longer over the limit
    wd = user_code(spec).workdir
    assert wd is not None
    rels = [r for r, _ in wd.files]
    assert "weights.bin" not in rels and "notes.md" not in rels and ".gitignore" in rels
    assert wd.excludes == ("*.md",) and runtime_env(user_code(spec))["excludes"] == ["*.md"]
    assert wd.sha256() != before                   # the ignore files themselves ship
    assert scan_workdir(code).sha256() == wd.sha256()


@pytest.mark.parametrize("pip", [["ray==2.9.0"], ["torch>=2"], ["spotwise @ https://example.com/x.whl"],
                                 "reqs.txt"])
def test_pins_of_the_cluster_packages_are_refused(tmp_path, pip):
    (tmp_path / "reqs.txt").write_text("# ours\nnumpy\nTorch==2.1.0  # old\n")
    problems = _problems(_task(tmp_path, pip=pip))
    assert [f for f, _ in problems] == ["pip"]
    assert "come with the cluster" in problems[0][1]
    if pip == "reqs.txt":
        assert "reqs.txt:3: Torch==2.1.0" in problems[0][1]


def test_bad_requirements_and_pip_options_are_refused(tmp_path):
    problems = _problems(_task(tmp_path, pip=["numpy>>1", "-e ."]))
    assert [f for f, _ in problems] == ["pip", "pip"]
    assert "PEP 508" in problems[0][1] and "requirements only" in problems[1][1]


@pytest.mark.parametrize("shadow", ["spotwise/__init__.py", "torch.py", "ray/x.txt"])
def test_a_workdir_that_would_shadow_a_cluster_package_is_refused(tmp_path, shadow):
    files = {"pkg/__init__.py": "", "pkg/train.py": TRAIN, shadow: ""}
    [(field, msg)] = _problems(_task(tmp_path, files))
    assert field == "workdir" and "shadow" in msg and shadow.split("/")[0].removesuffix(".py") in msg


def test_a_missing_workdir_is_refused(tmp_path):
    [(field, _)] = _problems(_task(tmp_path, workdir="nowhere"))
    assert field == "workdir"


def test_without_a_workdir_the_module_must_be_importable_here(tmp_path):
    [(field, msg)] = _problems(_task(tmp_path, workdir=None))
    assert field == "training.entrypoint" and "no workdir" in msg
    # an installed module passes (the function itself is then checked on the head)
    load_taskspec(_task(tmp_path, workdir=None, training={"entrypoint": "json:loads"}))


@pytest.mark.parametrize("training, field, says", [
    ({"entrypoint": "pkg.train"}, "training.entrypoint", "package.module:function"),
    ({"entrypoint": "pkg.train:make_spec", "config": {"x": float("nan")}}, "training.config", "finite"),
    ({"entrypoint": "pkg.train:make_spec", "config": {"x": [1, float("inf")]}}, "training.config", "x[1]"),
    ({"entrypoint": "pkg.train:make_spec", "lr": 0.1, "batch_size": 4}, "training", "batch_size, lr"),
    ({"entrypoint": "tiny-gpt", "config": {"a": 1}}, "training", "training.config is for your own"),
    ({"entrypoint": "pkg.train:make_spec", "max_restarts_on_errors": -1}, "training.max_restarts_on_errors", ""),
])
def test_training_section_errors_name_their_field(tmp_path, training, field, says):
    problems = _problems(_task(tmp_path, training=training))
    assert problems[0][0] == field, problems
    assert says in problems[0][1]


def test_env_names_and_code_keys_without_an_entrypoint(tmp_path):
    problems = _problems(_task(tmp_path, env={"RAY_ADDRESS": "x", "1BAD": "y"}))
    assert [f for f, _ in problems] == ["env"]
    problems = _problems(_task(tmp_path, training={"entrypoint": "tiny-gpt"}))
    assert "set training.entrypoint" in problems[0][1]


def test_the_task_steps_precision_and_checkpoint_override_only_when_given(tmp_path):
    spec = load_taskspec(_task(tmp_path, training={"steps": 50, "checkpoint": {"keep_last": 3}}))
    assert spec.training.overrides() == {"steps": 50, "keep_last": 3}
    spec = load_taskspec(_task(tmp_path, training={"precision": "fp32", "checkpoint": {"interval_steps": 7}}))
    assert spec.training.overrides() == {"precision": "fp32", "checkpoint_interval": 7}


def test_launch_exits_2_naming_the_field_and_dry_run_shows_the_workdir_hash(tmp_path):
    env_ok = {**__import__("os").environ, "SPOTWISE_HOME": str(tmp_path / "home")}
    bad = _task(tmp_path, training={"entrypoint": "pkg.train:nope"})
    r = subprocess.run([sys.executable, "-m", "spotwise.cli", "launch", str(bad)], capture_output=True, text=True,
                       env=env_ok)
    assert r.returncode == 2, r.stderr
    assert "training.entrypoint" in r.stderr and "make_spec, helper" in r.stderr and "Traceback" not in r.stderr
    good = _task(tmp_path)
    r = subprocess.run([sys.executable, "-m", "spotwise.cli", "launch", str(good), "--dry-run", "--format", "json"],
                       capture_output=True, text=True, env=env_ok, check=True)
    doc = yaml.safe_load(r.stdout)
    assert doc["workdir"]["sha256"] == scan_workdir((tmp_path / "code").resolve()).sha256()
    assert doc["workdir"]["files"] == 2 and doc["workdir"]["bytes"] == len(TRAIN)


# -- training.train_func: the same checks, naming its own field --------------------------------------
RAYFN = "import ray.train\n\n\ndef train_func(config):\n    ray.train.report({'step': 1})\n\n\ndef other():\n    pass\n"


def _tf_task(tmp_path: Path, ref: str, files: dict[str, str] | None = None, **training) -> Path:
    path = _task(tmp_path, files or {"pkg/__init__.py": "", "pkg/fn.py": RAYFN})
    doc = yaml.safe_load(path.read_text())
    doc["training"] = {"train_func": ref, **training}
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_good_train_func_task_loads(tmp_path):
    spec = load_taskspec(_tf_task(tmp_path, "pkg.fn:train_func", config={"steps": 3}))
    assert spec.training.user_code and spec.training.user_ref == ("training.train_func", "pkg.fn:train_func")


@pytest.mark.parametrize("ref, files, says", [
    ("pkg.nope:train_func", None, "no 'pkg.nope'"),
    ("pkg.fn:train_fn", None, "no 'train_fn'; functions there: train_func, other"),
    ("pkg.fn:train_func", {"pkg/__init__.py": "", "pkg/fn.py": RAYFN, "pkg/bad.py": "def f(:\n"}, "pkg/bad.py:1"),
])
def test_train_func_checks_name_their_field(tmp_path, ref, files, says):
    [(field, msg)] = _problems(_tf_task(tmp_path, ref, files))
    assert field == "training.train_func" and says in msg, msg


@pytest.mark.parametrize("training, says", [
    ({"entrypoint": "pkg.fn:other"}, "training.entrypoint ('pkg.fn:other') and training.train_func"),
    ({"precision": "bf16"}, "precision: a Ray Train function owns its loop"),
    ({"checkpoint": {"interval_steps": 5}}, "checkpoint.interval_steps"),
    ({"lr": 0.5}, "only the built-in model"),
])
def test_train_func_refuses_what_it_would_ignore_or_contradict(tmp_path, training, says):
    [(field, msg)] = _problems(_tf_task(tmp_path, "pkg.fn:train_func", **training))
    assert field == "training" and says in msg, msg


def test_launch_with_entrypoint_and_train_func_exits_2_naming_both(tmp_path):
    env_ok = {**__import__("os").environ, "SPOTWISE_HOME": str(tmp_path / "home")}
    bad = _tf_task(tmp_path, "pkg.fn:train_func", entrypoint="pkg.fn:other")
    r = subprocess.run([sys.executable, "-m", "spotwise.cli", "launch", str(bad)], capture_output=True, text=True,
                       env=env_ok)
    assert r.returncode == 2, r.stderr
    assert "training.entrypoint" in r.stderr and "training.train_func" in r.stderr and "Traceback" not in r.stderr


def test_a_workdir_in_storage_is_handed_to_ray_as_is(tmp_path):
    """A workdir given as the storage URI of a zip (what the service takes) is not read here: Ray
    fetches it on the nodes, and the head's preflight imports the function."""
    path = _task(tmp_path, workdir="s3://bucket/code/5f3a.zip", training={"entrypoint": "pkg.absent:make_spec"})
    spec = load_taskspec(path)
    assert spec.workdir == "s3://bucket/code/5f3a.zip"
    code = user_code(spec)
    assert runtime_env(code)["working_dir"] == "s3://bucket/code/5f3a.zip" and code.summary() == {
        "uri": "s3://bucket/code/5f3a.zip"}
    [(field, msg)] = _problems(_task(tmp_path, workdir="s3://bucket/code"))
    assert field == "workdir" and "storage URI of a zip" in msg
