"""The live fetchers are found by cloud name through one registry, with one signature."""

from __future__ import annotations

import inspect
import sys

import pytest

from spotwise.errors import InputError
from spotwise.extras import MissingExtra
from spotwise.pricing.live import FETCHERS, FetchQuery


def test_every_cloud_registers_one_fetcher_with_the_one_signature():
    assert FETCHERS.names() == ["aws", "azure", "gcp"]
    for name in FETCHERS.names():
        f = FETCHERS.get(name)
        assert f.cloud == name
        assert list(inspect.signature(f.fetch).parameters) == ["query"]
        assert f.default_regions()                 # the snapshot's regions for that cloud
    # GCP's SKUs are global: the caller asks for every region at once, declared, not probed
    assert [n for n in FETCHERS.names() if FETCHERS.get(n).all_regions_at_once] == ["gcp"]


def test_unknown_cloud_names_the_flag_and_the_allowed_values():
    with pytest.raises(InputError) as e:
        FETCHERS.get("oracle")
    assert "--cloud" in str(e.value.problems[0]) and "aws, azure, gcp" in str(e.value.problems[0])


def test_query_defaults_mean_everything_and_progress_is_optional():
    q = FetchQuery()
    assert q.regions is None and q.instance_types is None and q.attempts == 5
    q.say("nobody listens")                        # no progress callback: nothing happens
    seen: list[str] = []
    FetchQuery(progress=seen.append).say("aws us-east-1")
    assert seen == ["aws us-east-1"]


def test_missing_sdk_names_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "boto3", None)          # as if spotwise[aws] were not installed
    with pytest.raises(MissingExtra, match=r"pip install 'spotwise\[aws\]'"):
        FETCHERS.get("aws").fetch(FetchQuery(regions=("us-east-1",), instance_types=("p5.48xlarge",)))
