"""How a run ships the launcher's spotwise build (:mod:`spotwise.build`) to its cloud nodes.

The wheel goes into the run's storage under ``_builds/<sha256>/<wheel name>`` (content-addressed:
an unchanged build is uploaded once, whichever run uploaded it), on the first boot script rendered
— a dry run uploads nothing. Every boot script then gets a fresh short-lived fetch URL (an S3
presigned GET: a node has no spotwise and no AWS library before the install) and the wheel's
sha256, which the node checks before installing anything. On ``gs://`` storage the "URL" is the
object's ``gs://`` URI instead: a GCP node fetches it with its own service account's token from its
metadata server (:func:`~spotwise.provisioner.boot.script.install_script`), so the launcher needs no
signing permission (user ADC cannot sign a V4 URL; a VM's account would need ``signBlob``) and the
URI in the instance's metadata is worthless without the node's identity. ``az://`` likewise: an
Azure node fetches the blob with a token its managed identity gets from IMDS (no SAS to sign, no
key on the node).
"""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

from typing import TYPE_CHECKING

from spotwise.build import BootBuild, Wheel, build_wheel

if TYPE_CHECKING:
    from spotwise.runtime.storage.base import Storage

#: what a node's fetch URL stays valid for: long enough for a slow boot and its retries, short
#: enough that a URL read from an instance's user data is soon worthless (a later launch, e.g. a
#: replacement node, gets a URL of its own)
FETCH_URL_TTL_S = 3 * 3600


class NodeBuild:
    """The shipped build of one run, in the run's storage under ``_builds/<sha256>/<wheel name>``.

    Built and uploaded on the first :meth:`for_boot` (thread-safe; an upload is skipped when that
    key already holds the wheel), then each call signs a fresh fetch URL."""

    def __init__(self, storage_uri: str, *, work_dir: Path | None = None) -> None:
        self.storage_uri = storage_uri
        self.work_dir = work_dir
        self._lock = threading.Lock()
        self._wheel: Wheel | None = None
        self._key: str | None = None
        self._store: Storage | None = None   # the run's storage, opened once (a boto3 client each time costs ~0.1 s)
        self.uploaded = False        # whether this run uploaded the wheel (False: it was there)

    def _ship(self) -> tuple[Wheel, str, Storage]:
        from spotwise.runtime.storage.base import open_storage

        with self._lock:
            if self._wheel is None or self._key is None:
                out = self.work_dir or Path(tempfile.mkdtemp(prefix="spotwise-build-"))
                wheel = build_wheel(out)
                key = f"_builds/{wheel.sha256}/{wheel.name}"
                store = open_storage(self.storage_uri)
                if not store.has(key, size=wheel.path.stat().st_size):
                    store.put_file(wheel.path, key)
                    self.uploaded = True
                self._wheel, self._key, self._store = wheel, key, store
            assert self._store is not None
            return self._wheel, self._key, self._store

    def for_boot(self) -> BootBuild:
        """The build for one boot script: built and uploaded if not yet, with a fresh fetch URL."""
        wheel, key, store = self._ship()
        url = store.child_uri(key) if self.storage_uri.startswith(("gs://", "az://")) \
            else store.fetch_url(key, expires_s=FETCH_URL_TTL_S)
        return BootBuild(build_id=wheel.build_id, name=wheel.name, sha256=wheel.sha256, url=url)


_shipped: dict[str, NodeBuild] = {}
_shipped_lock = threading.Lock()


def shipped_build(storage_uri: str | None) -> NodeBuild | None:
    """The (one per process) :class:`NodeBuild` of runs whose storage is ``storage_uri``; None
    without storage (then nodes need an image that already holds spotwise)."""
    if not storage_uri:
        return None
    with _shipped_lock:
        if storage_uri not in _shipped:
            _shipped[storage_uri] = NodeBuild(storage_uri)
        return _shipped[storage_uri]


def run_storage_uri(spec, opts, cloud: str | None = None) -> str | None:
    """The storage of one run on ``cloud``: the launch's ``--storage``, else the task's checkpoint
    storage; where either gives each cloud its own store, ``cloud``'s (None when it has none)."""
    value = getattr(opts, "storage", None) or spec.training.checkpoint.storage
    if isinstance(value, dict):
        return value.get(cloud) if cloud else None
    return value
