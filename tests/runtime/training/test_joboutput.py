"""What a process of the job prints becomes line records (:mod:`spotwise.runtime.training.joboutput`): cut
into lines per stream, bounded in length and number, copied without changing what the original
streams get, logging included, and shipped in order — what is left shipped on the way out."""

from __future__ import annotations

import logging
import sys

from spotwise.runtime.training.joboutput import LineBuffer, Shipper, captured, clip


def _lines(recs):
    return [(r["stream"], r["line"]) for r in recs]


def test_writes_become_lines_per_stream_and_an_unfinished_line_waits_for_its_end():
    b = LineBuffer(rank="1", node="n-1")
    b.write("stdout", "step 1 lo")
    b.write("stderr", "warn\nhalf")
    b.write("stdout", "ss 2.5\r\n:task_name:RayTrainWorker.poll\nstep 2\n")     # Ray's own marker is not output
    recs = b.take()
    assert _lines(recs) == [("stderr", "warn"), ("stdout", "step 1 loss 2.5"), ("stdout", "step 2")]
    assert {(r["rank"], r["node"]) for r in recs} == {("1", "n-1")}
    b.end_partial()                                          # the process ends: "half" is a line too
    assert _lines(b.take()) == [("stderr", "half")] and b.take() == []


def test_long_lines_are_cut_and_say_so_and_a_full_buffer_drops_the_oldest_with_a_note():
    assert clip("x" * 10, 4) == "xxxx [... 6 more characters cut]" and clip("abc", 4) == "abc"
    b = LineBuffer(rank="0", node="n", max_lines=3, max_chars=5)
    b.write("stdout", "".join(f"l{i}\n" for i in range(5)) + "y" * 12 + "\n")
    recs = b.take()
    assert "3 lines of this process dropped" in recs[0]["line"] and recs[0]["stream"] == "stderr"
    assert [r["line"] for r in recs[1:]] == ["l3", "l4", "yyyyy [... 7 more characters cut]"]
    assert b.take(most=10) == []


def test_captured_copies_prints_and_logging_in_order_and_leaves_the_streams_as_they_were(capsys):
    got: list[dict] = []
    log = logging.getLogger("spotwise.test.joboutput")
    handler = logging.StreamHandler(sys.stderr)             # a handler holding the stream, as basicConfig's does
    log.addHandler(handler)
    log.propagate = False
    before = sys.stdout, sys.stderr
    try:
        with captured(got.extend, rank="driver", node="head-1", every_s=3600) as shipper:
            print("hello from the driver")
            log.warning("a logged warning")
            print("no newline yet", end="")
            assert shipper.flush() and _lines(got) == [("stdout", "hello from the driver"),
                                                       ("stderr", "a logged warning")]
            assert sys.stdout.isatty() == before[0].isatty()
        assert (sys.stdout, sys.stderr) == before and handler.stream is before[1]
    finally:
        log.removeHandler(handler)
    assert got[-1]["line"] == "no newline yet"              # the unfinished line shipped on the way out
    out, err = capsys.readouterr()                          # and the original streams got everything
    assert "hello from the driver" in out and "no newline yet" in out and "a logged warning" in err
    assert {r["rank"] for r in got} == {"driver"} and {r["node"] for r in got} == {"head-1"}


def test_a_failed_send_keeps_the_lines_for_the_next_one():
    sent: list[list[str]] = []
    fail = [True]

    def send(recs):
        if fail[0]:
            raise ConnectionError("actor unreachable")
        sent.append([r["line"] for r in recs])

    b = LineBuffer(rank="0", node="n")
    s = Shipper(b, send, every_s=3600)
    b.write("stdout", "a\nb\n")
    assert s.flush() is False and sent == []
    b.write("stdout", "c\n")
    fail[0] = False
    assert s.flush() is True
    assert sum(sent, []) == ["a", "b", "c"]                # nothing lost, nothing reordered
