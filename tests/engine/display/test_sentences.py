"""Every event the journal emits reads as one sentence (:mod:`spotwise.engine.display.sentences`): what
``spotwise launch`` prints as it goes and ``spotwise status JOB`` lists — never a Python repr."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

import spotwise
from spotwise.engine.run.journal import Journal
from spotwise.engine.display.sentences import SENTENCES, generic, node, sentence

T = 1_700_000_000.0
WORKER = "sw8bdad92744-worker-e296d7"

# one event of each kind, with the detail its emitter gives it (grep ``event(`` under src/spotwise),
# and what its sentence must say
EVENTS: dict[str, tuple[dict, list[str]]] = {
    "plan": ({"chosen": "local/local/local-a/cpu/spot", "reason": "lowest expected total cost"},
             ["plan: start on local/local/local-a/cpu/spot", "lowest expected"]),
    "workdir_staged": ({"uri": "s3://b/code/abc.zip", "uploaded": True}, ["workdir uploaded to s3://b/code/abc.zip"]),
    "checkpoint_copied": ({"frm": "s3://b/runs", "to": "gs://b/runs", "step": 40, "bytes": 123456, "seconds": 1.5,
                           "egress_usd": 0.0001},
                          ["checkpoint step 40 copied from s3://b/runs to gs://b/runs (123456 bytes in 1.5 s, egress $0.0001)"]),
    "launched": ({"instance_id": WORKER, "role": "worker", "market": "spot", "usd_per_hour": 0.1, "zone": "local-a",
                  "cloud": "local", "price_source": "local sheet"},
                 ["launched spot worker sw...-e296d7 in local-a at $0.1/h"]),
    "submitted": ({"submission_id": "raysubmit_1", "dashboard": "http://127.0.0.1:8265"},
                  ["training submitted", "raysubmit_1"]),
    "spot_notice": ({"instance_id": WORKER, "kill_at": T + 10}, ["spot node sw...-e296d7 got its interruption notice (10 s)"]),
    "node_notice": ({"instance_id": WORKER, "market": "spot", "zone": "local-a", "goes_in_s": 29.5},
                    ["spot worker sw...-e296d7 in local-a got its interruption notice: it goes in 29.5 s; its "
                     "replacement is asked for now"]),
    "notice_restart": ({"instances": [WORKER], "before_deadline_s": 3.2},
                       ["training restarts now, before the noticed node goes: the just-in-time checkpoint is committed "
                        "and the worker group fits without sw...-e296d7 (3.2 s before its deadline)"]),
    "notice_passed": ({"instance_id": WORKER, "market": "spot", "zone": "local-a", "past_deadline_s": 60.0},
                      ["spot worker sw...-e296d7 in local-a ended: still up 60 s past its notice's deadline"]),
    "preempted": ({"instance_id": WORKER, "market": "spot", "zone": "local-a"},
                  ["preempted: spot worker sw...-e296d7 in local-a"]),
    "lost": ({"instance_id": WORKER, "market": "on-demand", "zone": "local-a"},
             ["lost: on-demand worker sw...-e296d7 in local-a", "not a preemption"]),
    "not_joined": ({"instance_id": WORKER, "market": "spot", "zone": "local-a", "unseen_s": 301.2,
                    "seen": "never ALIVE in Ray", "join_timeout_s": 300},
                   ["spot worker sw...-e296d7 in local-a ended: not in Ray after 300 s", "replaced"]),
    "replaced": ({"by": "i-0abc", "market": "on-demand", "reason": "spot refused"},
                 ["replacement launched: on-demand worker i-0abc: spot refused"]),
    "waiting": ({"missing": 2, "reason": "spot is out"}, ["waiting for 2 workers: spot is out"]),
    "no_capacity": ({"wanted": 2, "got": 1, "market": "spot", "why": "replace"},
                    ["no capacity: got 1 of 2 spot workers: replace"]),
    "capacity_error": ({"offer": "aws/us-east-1/us-east-1b/p5.48xlarge/spot", "error": "InsufficientInstanceCapacity"},
                       ["no capacity for aws/us-east-1/us-east-1b/p5.48xlarge/spot: InsufficientInstanceCapacity"]),
    "spot_probe_granted": ({"instance_id": WORKER}, ["spot probe sw...-e296d7 granted"]),
    "spot_probe_ended": ({"instance_id": WORKER, "reason": "a young streak"}, ["spot probe sw...-e296d7 ended"]),
    "move": ({"from": "spot", "to": "on-demand", "reason": "deadline", "step": 93},
             ["moving the workers from spot to on-demand at step 93: deadline"]),
    "move_abandoned": ({"to": "spot", "reason": "cheaper"}, ["move to spot abandoned"]),
    "migrate_requested": ({"frm": "aws/us-east-1", "to": "gcp/us-central1", "market": "spot", "reason": "r",
                           "step": 40}, ["moving the job from aws/us-east-1 to gcp/us-central1 (spot) at step 40"]),
    "migrated": ({"from": "aws/us-east-1", "to": "gcp/us-central1", "market": "spot", "reason": "r", "step": 40},
                 ["job moved from aws/us-east-1 to gcp/us-central1 (spot)"]),
    "budget_stop_requested": ({"spend_usd": 0.049, "budget_usd": 0.05},
                              ["budget: $0.0490 of $0.0500 spent: stopping at a checkpoint"]),
    "budget_hard_stop": ({"spend_usd": 12.5, "budget_usd": 12.0}, ["budget: $12.50 of $12.00 spent", "hard stop"]),
    "cancel_requested": ({}, ["cancel requested"]),
    "signals_deferred_during_teardown": ({"signals": ["SIGINT", "SIGTERM"]}, ["SIGINT, SIGTERM"]),
    "list_failed": ({"cloud": "aws", "regions": ["us-east-1"], "message": "throttled"},
                    ["could not list the aws nodes in us-east-1", "throttled"]),
    "deleted": ({"what": "security group sg-1"}, ["deleted security group sg-1"]),
}


def emitted_kinds() -> set[str]:
    """Every event kind the engine and the clouds emit, read from the source (``event("kind"``,
    ``"preempted" if x else "lost"``, a cloud's ``{"event": "spot_notice"}``). The runtime's own
    control events stay in its snapshot and are not the journal's."""
    kinds: set[str] = set()
    src = Path(spotwise.__file__).parent
    for path in src.rglob("*.py"):
        if "runtime" in path.relative_to(src).parts:
            continue
        text = path.read_text()
        for m in re.finditer(r'(?:\.event|\b_event|\bevent)\(\s*"(\w+)"(?:\s+if\s+\w+\s+else\s+"(\w+)")?', text):
            kinds |= {k for k in m.groups() if k}
        kinds |= set(re.findall(r'"event":\s*"(\w+)"', text))
    return kinds


def test_every_kind_the_code_emits_has_a_sentence_and_a_case_here():
    kinds = emitted_kinds()
    assert {"launched", "preempted", "lost", "spot_notice", "move", "migrated"} <= kinds   # the scan works
    assert kinds - set(SENTENCES) == set(), "event kinds without a sentence in spotwise.engine.display.sentences"
    assert kinds - set(EVENTS) == set(), "event kinds without a case in this test"


@pytest.mark.parametrize("kind", sorted(EVENTS))
def test_each_event_reads_as_one_plain_sentence(kind):
    detail, says = EVENTS[kind]
    text = sentence({"t": T, "event": kind, **detail})
    for part in says:
        assert part in text, text
    assert "{'" not in text and "{" not in text and "\n" not in text, text
    assert text.isascii() and text.isprintable(), text


def test_a_noticed_worker_the_run_ended_first_reads_as_its_preemption_and_what_ended_it():
    text = sentence({"t": T, "event": "preempted", "instance_id": WORKER, "market": "spot", "zone": "local-a",
                     "ended_by": "migrated"})
    assert text == ("preempted: spot worker sw...-e296d7 in local-a (under its notice, ended by the run first: "
                    "migrated)"), text


def test_an_unknown_kind_or_a_missing_detail_falls_back_to_key_value_pairs():
    text = sentence({"t": T, "id": 3, "event": "new_thing", "where": {"zone": "a", "n": 2}, "ids": ["x", "y"],
                     "note": "two\nlines", "price": 0.5, "gone": None})
    assert text == "new thing: where=(zone=a n=2) ids=x, y note=two lines price=0.5 gone=-"
    assert sentence({"event": "preempted"}) == "preempted"                 # no instance id: no crash
    assert sentence({"event": "launched", "instance_id": WORKER, "usd_per_hour": "n/a"}).startswith("launched:")
    assert generic({"event": "quiet"}) == "quiet"


def test_instance_ids_read_short_where_the_cluster_part_repeats():
    assert node(WORKER) == "sw...-e296d7"
    assert node("sw8bdad92744-head-0") == "sw...-0"
    assert node("i-0123456789abcdef0") == "i-0123456789abcdef0"


def test_progress_prints_the_sentence_with_a_utc_time_and_the_log_has_it_too(database, capsys, caplog):
    j = Journal("job-1", progress=True)
    with caplog.at_level(logging.INFO, logger="spotwise.orchestrator"):
        j.event("preempted", instance_id=WORKER, market="spot", zone="local-a")
    err = capsys.readouterr().err
    assert re.fullmatch(r"\[spotwise \d\d:\d\d:\d\dZ\] preempted: spot worker sw\.\.\.-e296d7 in local-a\n", err), err
    assert "\x1b" not in err
    [info] = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert info == "preempted: spot worker sw...-e296d7 in local-a [preempted]"


def test_a_replacement_at_a_notice_says_the_noticed_node_still_runs():
    text = sentence({"t": T, "event": "replaced", "by": "i-0abc", "market": "spot", "reason": "policy chose spot",
                     "at_notice_of": [WORKER]})
    assert text == ("replacement launched: spot worker i-0abc: policy chose spot (while sw...-e296d7 still runs "
                    "out its notice)")
