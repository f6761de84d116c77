"""A run's events as one-line sentences a person reads (``spotwise launch``'s progress lines,
``spotwise status JOB``'s event list).

The events themselves are a public contract (:mod:`spotwise.engine.run.journal`: their kinds and
detail keys, kept whole in ``--format json``); this module only says them in words. Why a module of
its own: every place that shows an event to a person shows the same sentence, and a new event kind
gets its sentence here or falls back to :func:`generic` — which renders ``key=value`` pairs, so no
Python ``repr`` (``{'instance_id': ...}``) ever reaches a person.

Contract of :func:`sentence`: one line (no newline, no control code: the same text on a terminal
and off one, in a log file or a pipe), ASCII punctuation only, never a ``{`` from a dict, never an
exception (a detail missing from an event or of an odd type falls back to :func:`generic`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

# Keys every event carries that are not its detail (``id`` and ISO ``t``: ``spotwise status``'s rows)
_NOT_DETAIL = {"t", "event", "id"}
_CLUSTER_NODE = re.compile(r"^sw[0-9a-f]{6,}-(?:head|worker)-(.+)$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def node(instance_id: Any) -> str:
    """An instance id as people read it: ``sw8bdad92744-worker-e296d7`` -> ``sw...-e296d7`` (the
    cluster part is the same for every node of a run); a cloud's own id (``i-0abc...``) whole."""
    text = _plain(instance_id)
    m = _CLUSTER_NODE.match(text)
    return f"sw...-{m.group(1)}" if m else text


def _plain(value: Any) -> str:
    """A value as text on one line: lists comma-joined, dicts as ``(k=v k=v)``, numbers short,
    ``None`` as ``-``, control characters (newlines included) as spaces."""
    if isinstance(value, dict):
        text = "(" + " ".join(f"{k}={_plain(v)}" for k, v in value.items()) + ")"
    elif isinstance(value, (list, tuple, set)):
        text = ", ".join(_plain(v) for v in value)
    elif isinstance(value, float):
        text = f"{value:g}" if math.isfinite(value) else str(value)
    elif value is None:
        text = "-"
    else:
        text = str(value)
    return _CONTROL.sub(" ", text)


def _usd(value: Any) -> str:
    """``$0.0123`` below a dollar (local runs cost fractions of a cent), ``$12.34`` above."""
    usd = float(value)
    return f"${usd:,.4f}" if abs(usd) < 1 else f"${usd:,.2f}"


def _in(zone: Any) -> str:
    return f" in {_plain(zone)}" if zone else ""


def _why(reason: Any) -> str:
    return f": {_plain(reason)}" if reason else ""


def _who(e: dict, role: str = "worker") -> str:
    """``spot worker sw...-e296d7 in local-a`` from an event's market, role, instance id and zone."""
    market = f"{_plain(e['market'])} " if e.get("market") else ""
    return f"{market}{_plain(e.get('role') or role)} {node(e['instance_id'])}{_in(e.get('zone'))}"


def _nodes(e: dict) -> str:
    """The noticed nodes of an event's ``instances``, shortened; ``the noticed node`` without them."""
    ids = [node(i) for i in e.get("instances") or [] if isinstance(i, str)]
    return ", ".join(ids) if ids else "the noticed node"


def _notice(e: dict) -> str:
    left = ""
    if isinstance(e.get("kill_at"), (int, float)) and isinstance(e.get("t"), (int, float)):
        left = f" ({max(0.0, e['kill_at'] - e['t']):.0f} s)"
    return f"spot node {node(e['instance_id'])} got its interruption notice{left}"


def _launched(e: dict) -> str:
    price = f" at ${float(e['usd_per_hour']):g}/h" if e.get("usd_per_hour") is not None else ""
    cloud = f" ({_plain(e['cloud'])})" if e.get("cloud") and e.get("cloud") != "local" else ""
    return f"launched {_who(e)}{cloud}{price}"


def _workdir(e: dict) -> str:
    return (f"workdir uploaded to {_plain(e['uri'])}" if e.get("uploaded")
            else f"workdir unchanged since the last run: reusing {_plain(e['uri'])}")


def _plural(n: Any, word: str) -> str:
    return f"{_plain(n)} {word}{'' if n == 1 else 's'}"


SENTENCES: dict[str, Callable[[dict], str]] = {
    # the run's course
    "plan": lambda e: f"plan: start on {_plain(e['chosen'])}{_why(e.get('reason'))}",
    "workdir_staged": _workdir,
    "launched": _launched,
    "checkpoint_copied": lambda e: (f"checkpoint step {_plain(e['step'])} copied from {_plain(e['frm'])} to "
                                    f"{_plain(e['to'])} ({_plain(e['bytes'])} bytes in {_plain(e['seconds'])} s, "
                                    f"egress ${_plain(e['egress_usd'])})"),
    "submitted": lambda e: (f"training submitted to the head (Ray job {_plain(e['submission_id'])}"
                            + (f", dashboard {_plain(e['dashboard'])})" if e.get("dashboard") else ")")),
    # spot
    "spot_notice": _notice,
    "node_notice": lambda e: (f"{_who(e)} got its interruption notice: it goes in {_plain(e['goes_in_s'])} s; "
                              "its replacement is asked for now"),
    "notice_restart": lambda e: ("training restarts now, before the noticed node goes: the just-in-time checkpoint "
                                 f"is committed and the worker group fits without {_nodes(e)}"
                                 + (f" ({_plain(e['before_deadline_s'])} s before its deadline)"
                                    if e.get("before_deadline_s") is not None else "")),
    "notice_passed": lambda e: (f"{_who(e)} ended: still up {_plain(e['past_deadline_s'])} s past its notice's "
                                "deadline (not preempted); its replacement is the worker now"),
    "preempted": lambda e: f"preempted: {_who(e)}" + (f" (under its notice, ended by the run first: {_plain(e['ended_by'])})"
                                                      if e.get("ended_by") else ""),
    "lost": lambda e: f"lost: {_who(e)} went away (not a preemption)",
    "not_joined": lambda e: (f"{_who(e)} ended: not in Ray after {_plain(e['join_timeout_s'])} s "
                             f"({_plain(e.get('seen') or 'never seen')}); it will be replaced"),
    "replaced": lambda e: (f"replacement launched: {_who(e | {'instance_id': e['by']})}{_why(e.get('reason'))}"
                           + (f" (while {', '.join(node(i) for i in e['at_notice_of'])} still runs out its notice)"
                              if e.get("at_notice_of") else "")),
    "waiting": lambda e: f"waiting for {_plural(e['missing'], 'worker')}{_why(e.get('reason'))}",
    "no_capacity": lambda e: (f"no capacity: got {_plain(e['got'])} of {_plain(e['wanted'])} "
                              f"{_plain(e['market'])} workers{_why(e.get('why'))}"),
    "capacity_error": lambda e: f"no capacity for {_plain(e['offer'])}{_why(e.get('error'))}",
    "spot_probe_granted": lambda e: f"spot probe {node(e['instance_id'])} granted: spot is obtainable again",
    "spot_probe_ended": lambda e: f"spot probe {node(e['instance_id'])} ended: the run stays{_why(e.get('reason'))}",
    # moves between markets and sites
    "move": lambda e: (f"moving the workers from {_plain(e['from'])} to {_plain(e['to'])} at step "
                       f"{_plain(e.get('step'))}{_why(e.get('reason'))}"),
    "move_abandoned": lambda e: (f"move to {_plain(e['to'])} abandoned: it could not supply every worker"
                                 f"{_why(e.get('reason'))}"),
    "migrate_requested": lambda e: (f"moving the job from {_plain(e['frm'])} to {_plain(e['to'])} "
                                    f"({_plain(e.get('market'))}) at step {_plain(e.get('step'))}"
                                    f"{_why(e.get('reason'))}"),
    "migrated": lambda e: (f"job moved from {_plain(e['from'])} to {_plain(e['to'])} "
                           f"({_plain(e.get('market'))}); training resumes from its last checkpoint"),
    "eval": lambda e: (f"held-out loss {e['loss']:.4g} at step {_plain(e['step'])}" if e.get("loss") is not None
                       else f"held-out loss not finite at step {_plain(e['step'])}"),
    # money
    "budget_stop_requested": lambda e: (f"budget: {_usd(e['spend_usd'])} of {_usd(e['budget_usd'])} spent: "
                                        "stopping at a checkpoint before the cap"),
    "budget_hard_stop": lambda e: (f"budget: {_usd(e['spend_usd'])} of {_usd(e['budget_usd'])} spent: "
                                   "ending every node now (hard stop)"),
    # the end
    "cancel_requested": lambda e: "cancel requested: stopping at a checkpoint (Ctrl-C again ends at once)",
    "signals_deferred_during_teardown": lambda e: f"held until teardown finished: {_plain(e.get('signals'))}",
    "list_failed": lambda e: (f"could not list the {_plain(e['cloud'])} nodes in {_plain(e.get('regions'))} "
                              f"(asked again later){_why(e.get('message'))}"),
    "deleted": lambda e: f"deleted {_plain(e['what'])}",
    "resumed": lambda e: (f"resumed from step {_plain(e['from_step'])} (was {_plain(e['from_status'])}, "
                          f"{_usd(e['spent_usd'])} spent): "
                          + (f"cap {_usd(e['budget_usd'])}" if e.get("budget_usd") is not None else "no cap")),
}


def generic(ev: dict) -> str:
    """Any event in words: its kind with spaces, then its detail as ``key=value`` pairs."""
    kind = _plain(ev.get("event", "event")).replace("_", " ")
    detail = " ".join(f"{k}={_plain(v)}" for k, v in ev.items() if k not in _NOT_DETAIL)
    return f"{kind}: {detail}" if detail else kind


def sentence(ev: dict) -> str:
    """One event (``{"event": kind, "t": ..., **detail}``) as one line: its kind's sentence
    (:data:`SENTENCES`), or :func:`generic` for a kind without one or a detail it lacks."""
    say = SENTENCES.get(str(ev.get("event")))
    if say is not None:
        try:
            return _CONTROL.sub(" ", say(ev))
        except (KeyError, TypeError, ValueError):
            pass
    return generic(ev)
