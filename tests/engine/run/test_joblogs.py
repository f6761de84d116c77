"""The job's own output in the local state: what the recorder keeps (order, bounds, the truncation
note, a resumed job's lines after its earlier ones), the copy in the run's storage, ``spotwise logs``
(and ``--follow`` in a real process), the API and the job page — on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from spotwise.cli import app, main
from spotwise.engine.state import db
from spotwise.engine.run.joblogs import OutputRecorder, lines, save_copy, tagged, tail

T0 = 1_800_000_000.0


def _job(job_id="j1", status="running"):
    with db.session() as s:
        s.add(db.Job(id=job_id, name="t", status=status, cloud="local", spec={}, created_at=T0))
        s.commit()


def _set_status(job_id, status):
    with db.session() as s:
        s.get(db.Job, job_id).status = status
        s.commit()


def _recs(n, *, start=0, rank="0", node="sw1-worker-ab12", stream="stdout"):
    return [{"t": T0 + start + i, "rank": rank, "node": node, "stream": stream, "line": f"step {start + i}"}
            for i in range(n)]


class Source:
    """What the recorder reads from (the driver's ``read_output``): pages handed out in turn."""

    def __init__(self, *pages):
        self.pages = list(pages)

    def read_output(self):
        if not self.pages:
            raise ConnectionError("the control endpoint is gone")
        return self.pages.pop(0)


def test_lines_keep_their_order_rank_and_node_and_a_resumed_job_goes_on_after_them(database):
    _job()
    rec = OutputRecorder("j1", every_s=0.0)
    assert rec.pull(Source(_recs(2, rank="driver", node="sw1-head-00aa")), T0) == 2
    assert rec.pull(Source(_recs(2, start=2, rank="1", stream="stderr")), T0 + 1) == 2
    assert rec.pull(Source(), T0 + 2) == 0                                   # the endpoint gone: not fatal
    again = OutputRecorder("j1")                                              # a resume: a new runner
    again.append(_recs(1, start=4))
    got = lines("j1")
    assert [r["seq"] for r in got] == [1, 2, 3, 4, 5]
    assert [(r["rank"], r["stream"], r["line"]) for r in got][1:4] == [
        ("driver", "stdout", "step 1"), ("1", "stderr", "step 2"), ("1", "stderr", "step 3")]
    assert tagged(got[0]) == "[driver node sw1-head-00aa] step 0"
    assert tagged(got[2]) == "[rank 1 node sw1-worker-ab12] step 2"
    assert [r["seq"] for r in lines("j1", after=2, limit=2)] == [3, 4]
    assert [r["seq"] for r in lines("j1", last=2)] == [4, 5]
    assert tail("j1", 5, stream="stderr") == ["step 2", "step 3"]


def test_a_chatty_job_keeps_its_first_and_last_lines_and_says_what_was_dropped(database):
    _job()
    rec = OutputRecorder("j1", head_lines=5, tail_lines=4)
    for k in range(4):
        rec.append(_recs(6, start=6 * k))                                    # 24 lines in four pieces
    got = lines("j1")
    assert [r["line"] for r in got[:5]] == [f"step {i}" for i in range(5)]   # the first 5
    assert got[5]["rank"] == "spotwise" and "more than 5 lines" in got[5]["line"]
    assert [r["line"] for r in got[6:]] == [f"step {i}" for i in range(20, 24)]   # and the last 4
    assert tail("j1", 10) == [r["line"] for r in got if r["rank"] != "spotwise"][-10:]
    rec.append([{"t": T0, "rank": "0", "node": "n", "stream": "stdout", "line": "x" * 50_000}])
    assert len(lines("j1", last=1)[0]["line"]) < 2100                         # a huge line is cut


def test_the_copy_in_the_runs_storage_holds_every_line(database, tmp_path):
    _job()
    assert save_copy("j1", f"file://{tmp_path}/ckpt") is None                 # nothing printed: no file
    OutputRecorder("j1").append(_recs(3))
    uri = save_copy("j1", f"file://{tmp_path}/ckpt")
    assert uri is not None and uri.endswith("/j1/logs/output.jsonl")
    copy = [json.loads(x) for x in (tmp_path / "ckpt" / "j1" / "logs" / "output.jsonl").read_text().splitlines()]
    assert copy == lines("j1")
    report = {"status": "failed"}
    OutputRecorder("j1").finish(report, f"file://{tmp_path}/ckpt")
    assert report["output"] == uri and report["output_tail"] == []            # nothing on stderr


def test_spotwise_logs_prints_tagged_lines_json_and_refuses_an_unknown_job(database, capsys):
    _job(status="succeeded")
    OutputRecorder("j1").append(_recs(2, rank="0") + _recs(1, start=2, rank="1", node="sw1-worker-cd34"))
    r = CliRunner().invoke(app, ["logs", "j1"])
    assert r.exit_code == 0, r.output
    assert r.output.splitlines() == ["[rank 0 node sw1-worker-ab12] step 0", "[rank 0 node sw1-worker-ab12] step 1",
                                     "[rank 1 node sw1-worker-cd34] step 2"]
    r = CliRunner().invoke(app, ["logs", "j1", "--tail", "1", "--format", "json"])
    doc = json.loads(r.output)
    assert [x["line"] for x in doc["lines"]] == ["step 2"] and doc["next"] == 3
    r = CliRunner().invoke(app, ["logs", "j1", "--follow"])                    # ended already: prints and exits
    assert r.exit_code == 0 and len(r.output.splitlines()) == 3
    r = CliRunner().invoke(app, ["logs", "j1", "--follow", "--format", "json"])  # JSON Lines as they come
    assert r.exit_code == 0 and [json.loads(x)["seq"] for x in r.output.splitlines()] == [1, 2, 3]
    assert main(["logs", "nope"]) == 2
    err = capsys.readouterr().err
    assert "JOB_ID" in err and "nope" in err and "Traceback" not in err


def test_follow_prints_lines_as_they_come_and_exits_when_the_job_ends(database, tmp_path):
    _job()
    rec = OutputRecorder("j1")
    rec.append(_recs(1))
    errors = (tmp_path / "stderr").open("w+")
    p = subprocess.Popen([sys.executable, "-m", "spotwise.cli", "logs", "j1", "--follow"], stdout=subprocess.PIPE,
                         stderr=errors, text=True, env=dict(os.environ))
    try:
        assert p.stdout is not None
        assert p.stdout.readline().rstrip("\n") == "[rank 0 node sw1-worker-ab12] step 0"   # it is following now
        rec.append(_recs(2, start=1, rank="1"))
        assert p.stdout.readline().rstrip("\n") == "[rank 1 node sw1-worker-ab12] step 1"   # a line printed later
        rec.append(_recs(1, start=3, rank="driver"))
        _set_status("j1", "failed")
        rest = p.stdout.read()                                               # to its end: the process exits
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    errors.seek(0)
    assert p.returncode == 0, errors.read()
    assert rest.splitlines() == ["[rank 1 node sw1-worker-ab12] step 2", "[driver node sw1-worker-ab12] step 3"]


def test_the_api_and_the_job_page_serve_the_same_lines_escaped(database):
    from spotwise.service import auth
    from spotwise.service.app import create_app
    from spotwise.service.scheduler import Scheduler

    _job()
    OutputRecorder("j1").append(_recs(2) + [{"t": T0, "rank": "1", "node": "n2", "stream": "stderr",
                                             "line": "<script>alert('x')</script> & done"}])
    token = auth.create_token("test")
    with TestClient(create_app(Scheduler(launcher=lambda job_id: None)),
                    headers={"Authorization": f"Bearer {token}"}) as c:
        body = c.get("/api/v1/jobs/j1/logs").json()
        assert body == {"job_id": "j1", "lines": lines("j1"), "next": 3}
        assert c.get("/api/v1/jobs/j1/logs", params={"after": 1, "limit": 1}).json()["lines"] == lines("j1")[1:2]
        assert c.get("/api/v1/jobs/j1/logs", params={"after": 3}).json() == {"job_id": "j1", "lines": [], "next": 3}
        assert c.get("/api/v1/jobs/nope/logs").status_code == 404
        assert c.get("/api/v1/jobs/j1/logs", params={"after": -1}).status_code == 422
        assert c.get("/api/v1/jobs/j1/runner-log").json() == {"job_id": "j1", "lines": []}
        html = c.get("/jobs/j1").text
        out = html[html.index('id="output-lines"'):html.index("</pre>", html.index('id="output-lines"'))]
        assert "[rank 0 node sw1-worker-ab12] step 0" in out and "[rank 0 node sw1-worker-ab12] step 1" in out
        assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; done" in out and "<script>" not in html


@pytest.mark.parametrize("args", [["logs"], ["logs", "j1", "--tail", "0"]])
def test_logs_refuses_bad_input_with_exit_2(database, args, capsys):
    _job()
    assert main(args) == 2
    assert "Traceback" not in capsys.readouterr().err
