"""The config file (issue 36 item 1): one registry of settings, env > file > default, field-path
errors for a bad file from any command, and ``spotwise config show``."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from spotwise import config
from spotwise.cli import main
from spotwise.errors import InputError

SRC = Path(config.__file__).parent
ROOT = SRC.parents[1]

#: A sample file value of each kind and the string its variable would hold.
SAMPLES = {
    "str": ("v-{leaf}", "v-{leaf}"),
    "path": ("~/p-{leaf}", "{home}/p-{leaf}"),
    "list": (["a-{leaf}", "b-2"], "a-{leaf},b-2"),
    "int": (7, "7"),
    "float": (2.5, "2.5"),
    "bool": (True, "1"),
    "port": (7001, "7001"),
}


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    """Write a config file (a dict) and point SPOTWISE_CONFIG at it; no SPOTWISE_* setting in the env."""
    for s in config.SETTINGS:
        monkeypatch.delenv(s.env, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    path = tmp_path / "config.yaml"
    monkeypatch.setenv("SPOTWISE_CONFIG", str(path))

    def write(data) -> Path:
        path.write_text(data if isinstance(data, str) else json.dumps(data))   # JSON is YAML
        return path

    return write


def _nested(key: str, value) -> dict:
    out: dict = {}
    node = out
    *sections, leaf = key.split(".")
    for s in sections:
        node = node.setdefault(s, {})
    node[leaf] = value
    return out


def _merge(a: dict, b: dict) -> dict:
    for k, v in b.items():
        a[k] = _merge(a.get(k, {}), v) if isinstance(v, dict) else v
    return a


def _sample(s: config.Setting, home: str) -> tuple[object, str]:
    leaf = s.key.rsplit(".", 1)[-1].replace("_", "-")
    value, rendered = SAMPLES[s.kind]
    value = [v.format(leaf=leaf) for v in value] if isinstance(value, list) else (
        value.format(leaf=leaf) if isinstance(value, str) else value)
    return value, rendered.format(leaf=leaf, home=home)


# -- the registry ----------------------------------------------------------------------------------

def test_every_setting_round_trips_from_the_file_and_the_env_wins(cfg, tmp_path, monkeypatch):
    data: dict = {}
    want = {}
    for s in config.SETTINGS:
        value, rendered = _sample(s, str(tmp_path / "home"))
        _merge(data, _nested(s.key, value))
        want[s.env] = rendered
    path = cfg(data)
    for s in config.SETTINGS:
        eff = config.effective(s.env)
        assert (eff.value, eff.source) == (want[s.env], f"file {path}: {s.key}"), s.env
        assert config.where(s.env) == f"{path}: {s.key}"
    for s in config.SETTINGS:
        monkeypatch.setenv(s.env, "from-env")
        assert config.effective(s.env).value == "from-env" and config.effective(s.env).source == f"env {s.env}"
        assert config.where(s.env) == s.env


def test_the_registry_is_whole_unique_and_every_entry_is_read_by_the_product():
    envs = [s.env for s in config.SETTINGS]
    keys = [s.key for s in config.SETTINGS]
    assert len(set(envs)) == len(envs) and len(set(keys)) == len(keys)
    assert all(e.startswith("SPOTWISE_") for e in envs)
    assert all(s.kind in config.KINDS and s.help for s in config.SETTINGS)
    product = {p: p.read_text() for p in SRC.rglob("*.py") if p.name != "config.py"}
    for s in config.SETTINGS:
        assert any(s.env in text for text in product.values()), f"{s.env}: registered but read nowhere"
        # read through config.setting only: a direct read would ignore the file
        direct = [str(p) for p, t in product.items() if re.search(rf"environ(\.get)?[\[(]\s*\"{s.env}\"", t)]
        assert not direct, f"{s.env} read from os.environ directly in {direct}"


def test_every_setting_is_listed_in_the_docs():
    doc = (ROOT / "docs" / "configuration.md").read_text()
    rows = set(re.findall(r"^\| `([a-z_.]+)` \| `(SPOTWISE_[A-Z_]+)` \|", doc, re.M))
    assert rows == {(s.key, s.env) for s in config.SETTINGS}


def test_an_unregistered_name_is_a_bug_not_a_silent_none():
    with pytest.raises(KeyError):
        config.setting("SPOTWISE_NOT_A_SETTING")


# -- precedence ------------------------------------------------------------------------------------

def test_env_over_file_over_default(cfg, monkeypatch):
    path = cfg("gcp:\n  project: file-proj\naws:\n  regions: [us-west-2, eu-west-1]\n")
    assert config.setting("SPOTWISE_GCP_PROJECT") == "file-proj"
    assert config.setting("SPOTWISE_AWS_REGIONS") == "us-west-2,eu-west-1"
    assert config.effective("SPOTWISE_GCP_IMAGE").source == "default"
    assert config.setting("SPOTWISE_GCP_IMAGE") is None
    monkeypatch.setenv("SPOTWISE_GCP_PROJECT", "env-proj")
    assert config.effective("SPOTWISE_GCP_PROJECT").source == "env SPOTWISE_GCP_PROJECT"
    assert config.setting("SPOTWISE_GCP_PROJECT") == "env-proj"
    monkeypatch.setenv("SPOTWISE_GCP_PROJECT", "")      # empty is unset, as the code always read it
    assert config.effective("SPOTWISE_GCP_PROJECT").source == f"file {path}: gcp.project"
    env = config.environ()
    assert env["SPOTWISE_AWS_REGIONS"] == "us-west-2,eu-west-1" and env["SPOTWISE_GCP_PROJECT"] == "file-proj"


def test_the_default_path_and_no_file(tmp_path, monkeypatch):
    monkeypatch.delenv("SPOTWISE_CONFIG")
    monkeypatch.delenv("SPOTWISE_DATABASE_URL", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert config.config_path() == tmp_path / ".config" / "spotwise" / "config.yaml"
    assert config.setting("SPOTWISE_DATABASE_URL") is None          # no file: nothing set, no error
    (tmp_path / ".config" / "spotwise").mkdir(parents=True)
    config.config_path().write_text("database:\n  url: sqlite:////tmp/x.db\n")
    assert config.setting("SPOTWISE_DATABASE_URL") == "sqlite:////tmp/x.db"


def test_parsed_once_per_version_of_the_file(cfg):
    path = cfg("gcp: {project: one}\n")
    first = config.load()
    assert config.load() is first                      # unchanged file: the parsed one, no YAML again
    path.write_text("gcp: {project: second}\n")        # another size: seen at once
    assert config.load() is not first and config.setting("SPOTWISE_GCP_PROJECT") == "second"


def test_product_reads_pick_up_the_file(cfg, tmp_path):
    from spotwise.engine.state.db import database_url
    from spotwise.paths import home
    from spotwise.pricing.egress import storage_site
    from spotwise.service.boundary import serves_user_code
    from spotwise.service.guard import max_body_bytes

    cfg({"home": "~/state", "database": {"url": "sqlite:////tmp/sw-config-test.db"},
         "storage": {"region": "eu-west-3"}, "service": {"serve_user_code": True, "max_body_bytes": 4096}})
    assert home() == tmp_path / "home" / "state" and home().is_dir()
    assert database_url() == "sqlite:////tmp/sw-config-test.db"
    assert storage_site("s3://bucket/p").region == "eu-west-3"
    assert serves_user_code() is True and max_body_bytes() == 4096


# -- errors ----------------------------------------------------------------------------------------

def _problems(exc: InputError) -> dict[str, str]:
    return {p.field: p.allowed for p in exc.problems}


@pytest.mark.parametrize("text,field,allowed", [
    ("aws:\n  regoins: [us-east-1]\n", "aws.regoins", "known keys here: ami,"),
    ("bogus: 1\n", "bogus", "known keys here: aws, azure"),
    ("aws:\n  regions: us-east-1\n", "aws.regions", "a list of strings"),
    ("aws:\n  regions: [\"us-east-1,us-west-2\"]\n", "aws.regions.0", "without commas"),
    ("gcp:\n  external_ip: \"yes\"\n", "gcp.external_ip", "true or false"),
    ("nodes:\n  ray_port: 70000\n", "nodes.ray_port", "1..65535"),
    ("nodes:\n  lease_s: .nan\n", "nodes.lease_s", "a finite number"),
    ("service:\n  max_body_bytes: true\n", "service.max_body_bytes", "a whole number"),
    ("gcp:\n  project: 12345\n", "gcp.project", "a string"),
    ("database: postgres://x\n", "database", "a mapping"),
    ("slurm:\n  clusters:\n    - name: lab\n", "slurm.clusters.0.partitions", "required"),
    ("slurm:\n  clusters:\n    - {name: lab, python: python3, partitions: {p: {price_per_gpu_hour: 1}}}\n",
     "slurm.clusters.0.python", "an absolute path to a Python >= 3.11 on the nodes"),
    *[(f"slurm:\n  clusters:\n    - {{name: lab, ssh: '{bad}', partitions: {{p: {{price_per_gpu_hour: 1}}}}}}\n",
       "slurm.clusters.0.ssh", allowed) for bad, allowed in [
        ("-oProxyCommand=touch /tmp/x", "user@login-host, login-host"),     # an option, not a host
        ("alice@login host", "no spaces"), ("alice@login;reboot", "user@login-host"), ("", "user@login-host"),
        ("ssh://alice@login:70000", "a port 1..65535"), ("ssh://alice@login/home", "ssh://user@login-host:port"),
        ("https://login", "user@login-host")]],
    ("- a\n- b\n", "(file)", "a YAML mapping"),
    ("aws: [\n", "line 2, column 1", "valid YAML"),
])
def test_a_bad_file_names_the_field_and_what_is_allowed(cfg, text, field, allowed):
    path = cfg(text)
    with pytest.raises(InputError) as e:
        config.setting("SPOTWISE_HOME")
    assert e.value.source == str(path)
    assert field in _problems(e.value) and allowed in _problems(e.value)[field], _problems(e.value)


def test_a_bad_file_is_an_error_even_where_the_env_wins(cfg, monkeypatch):
    cfg("aws:\n  regoins: [x]\n")
    monkeypatch.setenv("SPOTWISE_AWS_REGIONS", "us-east-1")
    with pytest.raises(InputError):
        config.setting("SPOTWISE_AWS_REGIONS")


def test_a_named_file_that_is_missing_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTWISE_CONFIG", str(tmp_path / "nope.yaml"))
    with pytest.raises(InputError) as e:
        config.setting("SPOTWISE_HOME")
    assert _problems(e.value) == {"SPOTWISE_CONFIG": "an existing YAML config file"}


def test_a_consumer_names_the_file_key_when_the_bad_value_came_from_the_file(cfg):
    from spotwise.engine.state.lease import node_lease_s
    from spotwise.provisioner.base import env_cidrs

    path = cfg("nodes: {lease_s: 5}\naws: {client_cidrs: [10.0.0.0/8, not-a-cidr]}\n")
    with pytest.raises(InputError) as e:
        node_lease_s()
    assert list(_problems(e.value)) == [f"{path}: nodes.lease_s"]
    with pytest.raises(InputError) as e:
        env_cidrs("SPOTWISE_AWS_CLIENT_CIDRS", "aws")
    assert list(_problems(e.value)) == [f"{path}: aws.client_cidrs"]


def test_a_bad_ssh_destination_exits_2_naming_the_clusters_field(cfg, capsys):
    cfg("slurm:\n  clusters:\n    - {name: lab, ssh: '-oProxyCommand=x', partitions: {p: {price_per_gpu_hour: 1}}}\n")
    assert main(["prices", "--cloud", "slurm"]) == 2
    err = capsys.readouterr().err
    assert "slurm.clusters.0.ssh" in err and "ssh://user@login-host:port" in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [["status"], ["config", "show"], ["prices", "--gpu", "H100", "--cloud", "aws"]])
def test_every_command_that_reads_settings_exits_2_with_the_field(cfg, capsys, tmp_path, monkeypatch, argv):
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path / "state"))     # the env wins, the bad file still counts
    cfg("gcp:\n  projekt: x\n")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "gcp.projekt" in err and "not part of spotwise's config file" in err and "Traceback" not in err


# -- config show -----------------------------------------------------------------------------------

def test_config_show_prints_values_sources_masked_secrets_and_clusters(cfg, capsys, monkeypatch):
    path = cfg({"gcp": {"project": "file-proj", "api_key": "AIzaSECRETKEY"},
                "database": {"url": "postgresql://sw:hunter2@db.internal/spotwise"},
                "aws": {"regions": ["us-east-1", "us-west-2"]},
                "slurm": {"clusters": [{"name": "lab", "partitions": {"gpu-low": {"price_per_gpu_hour": 0.4}}}]}})
    monkeypatch.setenv("SPOTWISE_AWS_HEAD_TYPE", "m6i.xlarge")
    assert main(["config", "show", "--format", "json"]) == 0
    out = capsys.readouterr().out
    assert "hunter2" not in out and "AIzaSECRETKEY" not in out
    data = json.loads(out)
    rows = {r["key"]: r for r in data["settings"]}
    assert [r["key"] for r in data["settings"]] == [s.key for s in config.SETTINGS]
    assert data["file"] == str(path) and data["file_exists"] is True
    assert rows["gcp.project"]["value"] == "file-proj" and rows["gcp.project"]["source"] == f"file {path}: gcp.project"
    assert rows["gcp.api_key"]["value"] == "****"
    assert rows["database.url"]["value"] == "postgresql://sw:****@db.internal/spotwise"
    assert rows["aws.regions"]["value"] == "us-east-1,us-west-2"
    assert rows["aws.head_type"] == {"key": "aws.head_type", "env": "SPOTWISE_AWS_HEAD_TYPE", "value": "m6i.xlarge",
                                     "source": "env SPOTWISE_AWS_HEAD_TYPE", "help": rows["aws.head_type"]["help"]}
    assert rows["gcp.image"]["value"] is None and rows["gcp.image"]["source"] == "default"
    assert data["slurm"]["clusters"] == [{"name": "lab", "slurm_conf": None, "ssh": None,
                                          "partitions": {"gpu-low": {"price_per_gpu_hour": 0.4}}, "python": None}]

    monkeypatch.setenv("COLUMNS", "200")
    assert main(["config", "show"]) == 0
    table = capsys.readouterr().out
    assert str(path) in table and "hunter2" not in table and "AIzaSECRETKEY" not in table
    line = next(ln for ln in table.splitlines() if "gcp.project" in ln)
    assert "file-proj" in line and "file" in line.split("file-proj", 1)[1]
    assert re.search(r"aws\.head_type\s+m6i\.xlarge\s+env SPOTWISE_AWS_HEAD_TYPE", table)
    assert re.search(r"lab\s+.\s+gpu-low\s+.\s+0\.4", table)


def test_config_show_without_a_file(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("SPOTWISE_CONFIG")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["config", "show", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["file_exists"] is False and data["slurm"]["clusters"] == []
    assert not any(r["source"].startswith("file ") for r in data["settings"])


def test_devnull_is_an_empty_config(monkeypatch):
    monkeypatch.setenv("SPOTWISE_CONFIG", os.devnull)
    assert config.load().slurm.clusters == [] and config.slurm_clusters() == []
