"""EC2 as strict as a real account: eventual consistency, opt-in regions, counted list calls.

moto answers every call as if EC2 were one consistent database and every region enabled. A real
account is neither, and spotwise must survive both (issue 30). :func:`install` wraps moto's EC2
dispatcher (``EC2Response.call_action``) so that, while :func:`strict` (``SW_EMU_EC2_STRICT=1``:
set by the emulated AWS, :mod:`emulator.moto_server`, and by tests that want it in-process):

* **eventual consistency** — the first ``DescribeInstances`` naming a just-created instance by id,
  and the first ``CreateTags`` on it, answer ``InvalidInstanceID.NotFound``; the first
  ``AuthorizeSecurityGroupIngress`` on a just-created security group answers
  ``InvalidGroup.NotFound``. That is what EC2 documents for a resource read right after its create
  ("Eventual consistency in the Amazon EC2 API"): the resource exists, the read path has not seen
  it yet. Each answer comes once per resource and call kind; the next try sees the resource.
* **opt-in regions** — a call to an opt-in region the account has not enabled answers HTTP 401
  ``AuthFailure`` (what EC2 sends there), and ``DescribeRegions`` lists such a region only with
  ``AllRegions=true``, with ``OptInStatus`` ``not-opted-in``. ``SW_EMU_OPT_IN_ENABLED`` (comma
  list) names the opt-in regions the emulated account enabled (default: none).
* **a group in use is not deleted** — ``DeleteSecurityGroup`` on a group that a network interface
  still carries (an instance's, live or ended but not yet cleaned up, or a loose one) answers
  ``DependencyViolation``, as EC2 does ("Delete a security group": a group associated with an
  instance or an interface cannot be deleted); moto deletes it.
* **counted reads** — every ``Describe*`` call is recorded (:data:`CALLS`: time, action, region;
  and one JSON line each in ``$SW_EMU_CALLS`` when set, for a server in another process), so a
  test can assert how often spotwise reads the API. The emulator's own reads (its instance loop,
  whose clients' User-Agent carries :data:`EMULATOR_AGENT`) are not spotwise's and are not counted.

Test support, never product code.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import uuid

#: opt-in regions as AWS lists them (AWS Account Management Reference Guide, "Specify which AWS
#: Regions your account can use"): disabled on a new account until enabled.
OPT_IN_REGIONS = frozenset({
    "af-south-1", "ap-east-1", "ap-east-2", "ap-south-2", "ap-southeast-3", "ap-southeast-4", "ap-southeast-5",
    "ap-southeast-6", "ap-southeast-7", "ca-west-1", "eu-central-2", "eu-south-1", "eu-south-2", "il-central-1",
    "me-central-1", "me-south-1", "mx-central-1"})

CALLS: list[tuple[float, str, str]] = []          # (time.time(), action, region) of every Describe* call
_fresh: dict[str, set[str]] = {"describe": set(), "tag": set(), "ingress": set()}
_lock = threading.Lock()
_installed = False

EMULATOR_AGENT = "sw-emulator"                    # in the User-Agent of the emulator's own EC2 clients
_INSTANCE_ID = re.compile(r"\bi-[0-9a-f]{8,17}\b")
_GROUP_ID = re.compile(r"<groupId>(sg-[0-9a-f]+)</groupId>")


def strict() -> bool:
    return os.environ.get("SW_EMU_EC2_STRICT") == "1"


def enabled_opt_in() -> set[str]:
    return {r.strip() for r in os.environ.get("SW_EMU_OPT_IN_ENABLED", "").split(",") if r.strip()}


def reset() -> None:
    """Forget what was counted and created (a new test)."""
    with _lock:
        CALLS.clear()
        for s in _fresh.values():
            s.clear()


def calls(action_prefix: str = "Describe") -> list[tuple[float, str, str]]:
    with _lock:
        return [c for c in CALLS if c[1].startswith(action_prefix)]


def _error(status: int, code: str, message: str) -> tuple[int, dict, str]:
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{code}</Code>'
            f"<Message>{message}</Message></Error></Errors><RequestID>{uuid.uuid4()}</RequestID></Response>")
    return status, {"status": str(status)}, body


def _ids(resp, param: str) -> list[str]:
    v = resp._get_param(param, [])
    return [v] if isinstance(v, str) else list(v or [])


def _record(action: str, region: str) -> None:
    now = time.time()
    with _lock:
        CALLS.append((now, action, region))
    path = os.environ.get("SW_EMU_CALLS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"t": now, "action": action, "region": region}) + "\n")


def _consume(kind: str, ids: list[str]) -> list[str]:
    """The ids among ``ids`` still unseen by ``kind`` of read (each answers not-found once)."""
    with _lock:
        hit = [i for i in ids if i in _fresh[kind]]
        _fresh[kind].difference_update(hit)
    return hit


def _in_use(resp, gid: str) -> bool:
    """Whether a network interface of the region carries security group ``gid``."""
    return any(gid in {g.id for g in eni.group_set} for eni in list(resp.ec2_backend.enis.values()))


def _describe_regions(resp) -> tuple[int, dict, str]:
    """DescribeRegions with the opt-in status of each region (moto says every region needs none)."""
    from moto.core.responses import ActionResult

    all_regions = str(resp._get_param("AllRegions", False)).lower() == "true"
    names = _ids(resp, "RegionNames")
    out = []
    for r in resp.ec2_backend.describe_regions(names):
        status = ("opt-in-not-required" if r.name not in OPT_IN_REGIONS
                  else "opted-in" if r.name in enabled_opt_in() else "not-opted-in")
        if status == "not-opted-in" and not all_regions and not names:
            continue
        out.append({"RegionName": r.name, "Endpoint": r.endpoint, "OptInStatus": status})
    status_code, headers, body = resp.serialized(ActionResult({"Regions": out}))
    return status_code, headers, body


def install() -> None:
    """Wrap moto's EC2 dispatcher (idempotent; a no-op for every call while not :func:`strict`)."""
    global _installed
    if _installed:
        return
    from moto.ec2.responses import EC2Response

    original = EC2Response.call_action

    def call_action(self):
        if not strict():
            return original(self)
        action, region = self._get_action(), self.region
        if action.startswith("Describe") and EMULATOR_AGENT not in (self.headers.get("User-Agent") or ""):
            _record(action, region)
        if region in OPT_IN_REGIONS and region not in enabled_opt_in():
            return _error(401, "AuthFailure", "AWS was not able to validate the provided access credentials")
        if action == "DescribeRegions":
            return _describe_regions(self)
        if action == "DescribeInstances" and (hit := _consume("describe", _ids(self, "InstanceIds"))):
            return _error(400, "InvalidInstanceID.NotFound", f"The instance ID '{hit[0]}' does not exist")
        if action == "CreateTags" and (hit := _consume("tag", [i for i in _ids(self, "Resources")
                                                               if i.startswith("i-")])):
            return _error(400, "InvalidInstanceID.NotFound", f"The instance ID '{hit[0]}' does not exist")
        if action == "AuthorizeSecurityGroupIngress" and (hit := _consume("ingress", _ids(self, "GroupId"))):
            return _error(400, "InvalidGroup.NotFound", f"The security group '{hit[0]}' does not exist")
        if action == "DeleteSecurityGroup" and (gid := self._get_param("GroupId")) and _in_use(self, gid):
            return _error(400, "DependencyViolation", f"resource {gid} has a dependent object")
        status, headers, body = original(self)
        if int(status) < 300 and action in ("CreateFleet", "RunInstances"):
            ids = set(_INSTANCE_ID.findall(body if isinstance(body, str) else body.decode()))
            with _lock:
                _fresh["describe"] |= ids
                _fresh["tag"] |= ids
        elif int(status) < 300 and action == "CreateSecurityGroup":
            with _lock:
                _fresh["ingress"] |= set(_GROUP_ID.findall(body if isinstance(body, str) else body.decode()))
        return status, headers, body

    EC2Response.call_action = call_action
    _installed = True
