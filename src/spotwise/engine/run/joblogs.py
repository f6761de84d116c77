"""The job's own output in the local state: what the driver and every rank printed, kept in order.

Training's processes ship their lines to the run's control actor (:mod:`spotwise.runtime.training.joboutput`);
the orchestrator reads them from the control endpoint every :data:`PULL_EVERY_S` while the run goes
(:class:`OutputRecorder`, on the monitor's tick) into ``job_logs``, and when the run ends writes a
copy to the run's storage (:func:`save_copy`: ``<storage>/<job id>/logs/output.jsonl``, one JSON
record a line), so the lines outlive the cluster, and this database too. ``spotwise logs JOB``, the
API (``GET /api/v1/jobs/{id}/logs``) and the dashboard's job page read them back (:func:`lines`).

Order: each line gets the job's next ``seq`` (1, 2, ...), across clusters (a migration) and
resumes (the recorder starts after the highest one stored), which is also the readers' cursor.

Size: a job keeps its first :data:`HEAD_LINES` lines and its last :data:`TAIL_LINES`; when it
prints more, the line at ``seq`` ``HEAD_LINES + 1`` is a note saying so and the lines between the
two ends are deleted as new ones come (the end of a run, where a traceback is, is what a person
reads first). Each line is at most :data:`~spotwise.runtime.training.joboutput.MAX_LINE_CHARS` long (cut
where it was printed, and again here for a line from elsewhere).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from sqlalchemy import delete, func, select

from spotwise.engine.state import db
from spotwise.engine.run.cadence import Every
from spotwise.runtime.training.joboutput import MAX_LINE_CHARS, clip

log = logging.getLogger("spotwise.orchestrator")

HEAD_LINES = 10000
TAIL_LINES = 10000
PULL_EVERY_S = 1.0
#: lines of stderr a failed run's report quotes (``output_tail``)
FAILED_TAIL_LINES = 30
STORAGE_KEY = "logs/output.jsonl"
#: ``rank`` of the lines spotwise itself adds (the truncation note)
OURS = "spotwise"
FIELDS = ("seq", "t", "rank", "node", "stream", "line")


def _text(v: Any, limit: int) -> str:
    return str("" if v is None else v)[:limit]


class OutputRecorder:
    """Appends one job's output lines to ``job_logs``; ``pull`` reads them from the driver."""

    def __init__(self, job_id: str, *, every_s: float = PULL_EVERY_S, head_lines: int = HEAD_LINES,
                 tail_lines: int = TAIL_LINES) -> None:
        self.job_id = job_id
        self.poll = Every(every_s)
        self.head_lines, self.tail_lines = head_lines, tail_lines
        self._last: int | None = None       # the highest seq stored (read once from the database)

    def pull(self, source: Any, now: float, *, force: bool = False) -> int:
        """Read new lines from ``source`` (:meth:`spotwise.engine.run.driver.Driver.read_output`) when
        due (or ``force``) and store them; how many were stored. A failure is logged, never fatal:
        the job's output must not stop the run."""
        if not force and not self.poll.due(now):
            return 0
        try:
            records = source.read_output()
        except Exception:  # noqa: BLE001 - not up yet, or a hiccup: the lines wait on the head
            log.debug("could not read the output of %s", self.job_id, exc_info=True)
            return 0
        try:
            return self.append(records)
        except Exception:  # noqa: BLE001 - a database error: logged; these lines are lost here
            log.exception("could not record the output of %s", self.job_id)
            return 0

    def finish(self, report: dict, storage_uri: str) -> None:
        """At the run's end: the copy in the run's storage (its URI as the report's ``output``),
        and for a failed run the last lines it wrote to stderr (``output_tail``: a user's
        traceback, whichever process printed it). Errors are logged, never fatal."""
        try:
            report["output"] = save_copy(self.job_id, storage_uri)
        except Exception:  # noqa: BLE001 - the lines are still in the database
            log.exception("could not copy the output of %s to %s", self.job_id, storage_uri)
            report["output"] = None
        if report.get("status") == "failed":
            try:
                report["output_tail"] = tail(self.job_id, FAILED_TAIL_LINES, stream="stderr")
            except Exception:  # noqa: BLE001 - the report goes on without it
                log.exception("could not read the output of %s", self.job_id)

    def append(self, records: list[dict]) -> int:
        """Store ``records`` (``t``, ``rank``, ``node``, ``stream``, ``line``) as the job's next
        lines, keeping within :data:`HEAD_LINES` + :data:`TAIL_LINES`; how many were stored."""
        if not records:
            return 0
        with db.session() as s:
            last = self._last
            if last is None:
                last = s.scalar(select(func.max(db.JobLog.seq)).where(db.JobLog.job_id == self.job_id)) or 0
            for r in records:
                last += 1
                if last == self.head_lines + 1:
                    s.add(self._note(last, float(r.get("t") or 0.0)))
                    last += 1
                s.add(db.JobLog(job_id=self.job_id, seq=last, t=float(r.get("t") or 0.0),
                                rank=_text(r.get("rank"), 16), node=_text(r.get("node"), 128),
                                stream="stderr" if r.get("stream") == "stderr" else "stdout",
                                line=clip(_text(r.get("line"), 4 * MAX_LINE_CHARS))))
            keep_from = last - self.tail_lines + 1
            if keep_from > self.head_lines + 2:
                s.execute(delete(db.JobLog).where(db.JobLog.job_id == self.job_id,
                                                  db.JobLog.seq > self.head_lines + 1, db.JobLog.seq < keep_from))
            s.commit()
        self._last = last
        return len(records)

    def _note(self, seq: int, t: float) -> db.JobLog:
        return db.JobLog(job_id=self.job_id, seq=seq, t=t, rank=OURS, node="", stream="stderr",
                         line=f"[spotwise: the job printed more than {self.head_lines} lines: its first "
                              f"{self.head_lines} and its last {self.tail_lines} are kept, the lines "
                              "between are dropped]")


def lines(job_id: str, *, after: int = 0, limit: int | None = None, last: int | None = None) -> list[dict]:
    """The job's lines with ``seq`` above ``after``, oldest first: at most ``limit`` from there, or
    with ``last``, only the newest ``last`` of them. Each: ``seq``, ``t``, ``rank``, ``node``,
    ``stream``, ``line``."""
    q = select(db.JobLog).where(db.JobLog.job_id == job_id, db.JobLog.seq > after)
    q = q.order_by(db.JobLog.seq.desc()).limit(last) if last is not None else q.order_by(db.JobLog.seq)
    if limit is not None and last is None:
        q = q.limit(limit)
    with db.session() as s:
        rows = [{k: getattr(r, k) for k in FIELDS} for r in s.scalars(q).all()]
    return rows[::-1] if last is not None else rows


def tail(job_id: str, n: int, *, stream: str | None = None) -> list[str]:
    """The text of the job's last ``n`` lines (of ``stream`` only, when given), oldest first."""
    q = select(db.JobLog.line).where(db.JobLog.job_id == job_id, db.JobLog.rank != OURS)
    if stream is not None:
        q = q.where(db.JobLog.stream == stream)
    with db.session() as s:
        return list(s.scalars(q.order_by(db.JobLog.seq.desc()).limit(n)).all())[::-1]


def tagged(rec: dict) -> str:
    """One line as ``spotwise logs`` prints it: ``[rank 1 node sw...-worker-ab12] text``."""
    who = "driver" if rec["rank"] == "driver" else OURS if rec["rank"] == OURS else f"rank {rec['rank']}"
    where = f" node {rec['node']}" if rec.get("node") else ""
    return f"[{who}{where}] {rec['line']}"


def save_copy(job_id: str, storage_uri: str) -> str | None:
    """Write every stored line of the job to ``<storage_uri>/<job_id>/logs/output.jsonl`` (one JSON
    record a line; replaced by a later leg of the same job, which holds the earlier lines too); its
    URI, or None when the job printed nothing. Raises what the storage raises."""
    from spotwise.runtime.checkpoint.layout import run_storage

    rows = lines(job_id)
    if not rows:
        return None
    store = run_storage(storage_uri, job_id)
    store.put_bytes(STORAGE_KEY, "".join(json.dumps(r) + "\n" for r in rows).encode())
    return store.child_uri(STORAGE_KEY)
