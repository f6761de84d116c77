"""The generic registry (spotwise.registry) and the optional-dependency gate (spotwise.extras)."""

from __future__ import annotations

import sys
import types

import pytest

from spotwise.errors import InputError
from spotwise.extras import MissingExtra, require
from spotwise.registry import Registry


@pytest.fixture
def plugin_package(tmp_path, monkeypatch):
    """A throwaway package with two modules that register themselves and one private module."""
    pkg = tmp_path / "swreg_plugins"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "_private.py").write_text("raise RuntimeError('private modules are not imported')\n")
    (pkg / "alpha.py").write_text(
        "from tests_registry_holder import REG\n@REG.register('alpha')\nclass Alpha: pass\n")
    (pkg / "beta.py").write_text(
        "from tests_registry_holder import REG\n@REG.register('beta')\ndef beta(): return 'b'\n")
    holder = types.ModuleType("tests_registry_holder")
    holder.REG = Registry("widget", ("swreg_plugins",), field="--widget")
    monkeypatch.setitem(sys.modules, "tests_registry_holder", holder)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield holder.REG                                                       
    for name in [m for m in sys.modules if m.startswith("swreg_plugins")]:
        del sys.modules[name]


def test_entries_register_themselves_and_are_found_on_first_lookup(plugin_package):
    reg = plugin_package
    assert reg.names() == ["alpha", "beta"]
    assert reg.get("beta")() == "b"
    assert reg.get("alpha").__name__ == "Alpha"
    assert "alpha" in reg and "gamma" not in reg
    assert list(reg) == ["alpha", "beta"]


def test_unknown_name_is_an_input_error_naming_field_and_allowed(plugin_package):
    with pytest.raises(InputError) as e:
        plugin_package.get("gamma")
    msg = str(e.value)
    assert "--widget" in msg and "'gamma'" in msg and "alpha, beta" in msg


def test_a_name_cannot_be_taken_twice():
    reg: Registry[object] = Registry("thing", ())
    reg.register("x")(int)
    reg.register("x")(int)          # the same entry again (a module re-imported) is fine
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("x")(str)


def test_require_names_the_extra_when_the_sdk_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "boto3", None)      # what `import boto3` sees when it is not installed
    with pytest.raises(MissingExtra) as e:
        require("boto3", "aws", "the AWS cloud")
    assert "pip install 'spotwise[aws]'" in str(e.value) and "the AWS cloud" in str(e.value)
    assert e.value.exit_code == 3


def test_require_returns_the_module_when_present():
    assert require("json", "none", "a test").dumps([1]) == "[1]"


def test_a_broken_import_inside_a_present_module_is_not_reported_as_a_missing_extra(tmp_path, monkeypatch):
    (tmp_path / "swreg_broken.py").write_text("import swreg_does_not_exist\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError):
        require("swreg_broken", "x", "a test")


def test_s3_storage_without_the_aws_extra_names_it(monkeypatch):
    from spotwise.runtime.storage.base import open_storage

    monkeypatch.setitem(sys.modules, "boto3", None)
    with pytest.raises(MissingExtra) as e:
        open_storage("s3://spotwise-ckpt/run")
    assert "spotwise[aws]" in str(e.value) and "s3://" in str(e.value)
