"""Interruption notices from cloud instance-metadata services, one small poller per cloud.

Each poller answers one question, ``poll() -> Notice | None``: is this instance about to be
reclaimed, and when? They use only the standard library (urllib) so the watcher starts fast on a
fresh node. Base URLs are configurable so tests and the local cloud serve them on loopback.

* AWS (IMDSv2): ``PUT {base}/latest/api/token`` (header ``X-aws-ec2-metadata-token-ttl-seconds``),
  then ``GET {base}/latest/meta-data/spot/instance-action`` with ``X-aws-ec2-metadata-token``:
  404 = no notice; 200 = ``{"action": "terminate"|"stop"|"hibernate", "time": "...Z"}``
  (two minutes' warning). The token is cached and renewed before its TTL runs out or on 401.
* GCP: ``GET {base}/computeMetadata/v1/instance/preempted?wait_for_change=true`` with
  ``Metadata-Flavor: Google``; body ``TRUE`` once preempted (30 s warning, deadline = now + 30 s;
  the notice carries no time, so an emulated cloud with a shorter window says so in
  ``SPOTWISE_GCP_NOTICE_S``).
* Azure: ``GET {base}/metadata/scheduledevents?api-version=2020-07-01`` with ``Metadata: true``;
  an event with ``EventType == "Preempt"`` whose ``Resources`` include this VM; ``NotBefore`` is
  the deadline. After the checkpoint the event is acknowledged with
  ``POST`` ``{"StartRequests": [{"EventId": ...}]}`` so the platform may proceed early.
* Slurm: no metadata service; the job's batch script traps the signal Slurm sends at preemption
  (with ``preempt_send_user_signal``: the job's ``--signal``) or before the time limit, and writes
  the kill's deadline (epoch ms) into a notice file on its node: ``base`` is that file's path.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime

DEFAULT_BASES = {
    "aws": "http://169.254.169.254",
    "gcp": "http://metadata.google.internal",
    "azure": "http://169.254.169.254",
}
GCP_NOTICE_S = 30.0


@dataclass(frozen=True, slots=True)
class Notice:
    cloud: str
    action: str
    deadline_ms: int            # epoch milliseconds when the instance goes away
    event_id: str | None = None  # Azure: what to acknowledge


def _parse_time_ms(s: str) -> int:
    """ISO-8601 (``2026-11-22T10:00:00Z``) or RFC 1123 (Azure ``NotBefore``) to epoch ms."""
    s = s.strip()
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        dt = parsedate_to_datetime(s)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1000)


def _request(url: str, *, method: str = "GET", headers: dict | None = None, data: bytes | None = None,
             timeout: float = 2.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, method=method, headers=headers or {}, data=data)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read() or b""


class AwsImds:
    TOKEN_TTL_S = 21600

    def __init__(self, base: str | None = None) -> None:
        self.base = (base or DEFAULT_BASES["aws"]).rstrip("/")
        self._token: str | None = None
        self._token_expiry = 0.0

    def _get_token(self) -> str:
        if self._token is None or time.time() > self._token_expiry:
            status, body = _request(f"{self.base}/latest/api/token", method="PUT",
                                    headers={"X-aws-ec2-metadata-token-ttl-seconds": str(self.TOKEN_TTL_S)})
            if status != 200:
                raise OSError(f"IMDS token request failed: HTTP {status}")
            self._token = body.decode().strip()
            self._token_expiry = time.time() + self.TOKEN_TTL_S - 60
        return self._token

    def poll(self) -> Notice | None:
        status, body = _request(f"{self.base}/latest/meta-data/spot/instance-action",
                                headers={"X-aws-ec2-metadata-token": self._get_token()})
        if status == 401:                       # token expired or revoked: renew once
            self._token = None
            status, body = _request(f"{self.base}/latest/meta-data/spot/instance-action",
                                    headers={"X-aws-ec2-metadata-token": self._get_token()})
        if status == 404:
            return None
        if status != 200:
            raise OSError(f"IMDS instance-action: HTTP {status}")
        doc = json.loads(body)
        return Notice(cloud="aws", action=doc.get("action", "terminate"), deadline_ms=_parse_time_ms(doc["time"]))


def gcp_notice_s() -> float:
    """GCP's notice window: 30 s, or ``SPOTWISE_GCP_NOTICE_S`` (an emulated cloud's shorter one)."""
    import os

    raw = os.environ.get("SPOTWISE_GCP_NOTICE_S")
    if not raw:
        return GCP_NOTICE_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not 0 < value <= GCP_NOTICE_S:
        raise ValueError(f"SPOTWISE_GCP_NOTICE_S: got {raw!r}; allowed: seconds > 0 and <= {GCP_NOTICE_S:g}")
    return value


class GcpMetadata:
    def __init__(self, base: str | None = None, *, wait_timeout_s: float = 5.0) -> None:
        self.base = (base or DEFAULT_BASES["gcp"]).rstrip("/")
        self.wait_timeout_s = wait_timeout_s
        self.notice_s = gcp_notice_s()

    def poll(self) -> Notice | None:
        # wait_for_change blocks server-side until the value changes; bound it so the loop stays live
        status, body = _request(
            f"{self.base}/computeMetadata/v1/instance/preempted?wait_for_change=true"
            f"&timeout_sec={int(self.wait_timeout_s)}",
            headers={"Metadata-Flavor": "Google"}, timeout=self.wait_timeout_s + 2)
        if status != 200:
            raise OSError(f"GCP metadata preempted: HTTP {status}")
        if body.decode().strip().upper() == "TRUE":
            return Notice(cloud="gcp", action="preempt", deadline_ms=int((time.time() + self.notice_s) * 1000))
        return None


class AzureScheduledEvents:
    API = "api-version=2020-07-01"

    def __init__(self, base: str | None = None, *, vm_name: str | None = None) -> None:
        self.base = (base or DEFAULT_BASES["azure"]).rstrip("/")
        self.vm_name = vm_name

    def poll(self) -> Notice | None:
        status, body = _request(f"{self.base}/metadata/scheduledevents?{self.API}", headers={"Metadata": "true"})
        if status != 200:
            raise OSError(f"Azure scheduled events: HTTP {status}")
        for ev in json.loads(body).get("Events", []):
            if ev.get("EventType") != "Preempt":
                continue
            if self.vm_name and ev.get("Resources") and self.vm_name not in ev["Resources"]:
                continue
            nb = ev.get("NotBefore")
            deadline = _parse_time_ms(nb) if nb else int((time.time() + 30) * 1000)
            return Notice(cloud="azure", action="preempt", deadline_ms=deadline, event_id=ev.get("EventId"))
        return None

    def acknowledge(self, event_id: str) -> None:
        """Tell the platform we are ready (after the checkpoint): it may proceed before NotBefore."""
        status, _ = _request(f"{self.base}/metadata/scheduledevents?{self.API}", method="POST",
                             headers={"Metadata": "true", "Content-Type": "application/json"},
                             data=json.dumps({"StartRequests": [{"EventId": event_id}]}).encode())
        if status not in (200, 201, 202, 204):
            raise OSError(f"Azure scheduled events ack: HTTP {status}")


class SlurmNoticeFile:
    """A Slurm job's notice: the file its batch script writes on the signal (see the module doc)."""

    def __init__(self, path: str | None) -> None:
        if not path:
            raise ValueError("--metadata-url: a Slurm job's notice file path is required")
        self.path = path.removeprefix("file://")

    def poll(self) -> Notice | None:
        try:
            with open(self.path, encoding="utf-8") as f:
                text = f.read().strip()
        except FileNotFoundError:
            return None
        if not text.isdigit():
            return None                 # being written: read again next poll
        return Notice(cloud="slurm", action="terminate", deadline_ms=int(text))


def make_poller(cloud: str, base: str | None, *, instance_id: str | None = None):
    if cloud == "slurm":
        return SlurmNoticeFile(base)
    if cloud == "aws":
        return AwsImds(base)
    if cloud == "gcp":
        return GcpMetadata(base)
    if cloud == "azure":
        return AzureScheduledEvents(base, vm_name=instance_id)
    raise ValueError(f"--cloud: got {cloud!r}; allowed: aws, gcp, azure, slurm")
