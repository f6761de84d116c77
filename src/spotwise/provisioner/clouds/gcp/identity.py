"""Who a GCP node is: the service account and OAuth scopes it carries, and whether that identity
can reach the run's storage — checked before anything launches.

A GCP node reaches ``gs://`` storage (its checkpoints, the shipped build, the task's token file)
as its service account, through the metadata server's tokens (google.auth's GCE credentials; the
boot script's ``curl`` for the wheel): no key is put on a node or baked into an image. Two things
must hold, and both are settings a launch can read, so a launch missing either is refused with
exit 2 naming it instead of booting nodes that could never checkpoint:

* ``SPOTWISE_GCP_SERVICE_ACCOUNT`` is set: the account's email (``infra/gcp`` creates
  ``spotwise-node``, with ``roles/storage.objectAdmin`` on the bucket), or ``default`` for the
  project's Compute Engine default service account, chosen knowingly;
* the node scopes (``SPOTWISE_GCP_NODE_SCOPES``, default :data:`NODE_SCOPES`) include one that
  lets a token write GCS (``devstorage.read_write``, ``devstorage.full_control`` or
  ``cloud-platform``): a VM's token carries only its scopes, whatever roles the account has.

Only ``gs://`` (:data:`NODE_STORAGE_SCHEMES`): a GCP node has no identity for S3 (it would need
the bucket's keys baked into its image, which is no identity at all). A run planned over AWS and
GCP gives each cloud its own store (``training.checkpoint.storage: {aws: s3://..., gcp:
gs://...}``, :mod:`spotwise.engine.run.run_stores`); when it moves between them, the launcher copies
the last committed checkpoint across with its own credentials before training starts there.
"""

from __future__ import annotations

from spotwise.config import setting, where
from spotwise.errors import InputError, Problem

SCOPE_PREFIX = "https://www.googleapis.com/auth/"
NODE_SCOPES = (SCOPE_PREFIX + "devstorage.read_write",   # checkpoints, the shipped build
               SCOPE_PREFIX + "compute")                  # a node deletes itself (IAM: that only)
#: scopes whose token may write GCS objects
STORAGE_WRITE_SCOPES = frozenset({SCOPE_PREFIX + "devstorage.read_write", SCOPE_PREFIX + "devstorage.full_control",
                                  SCOPE_PREFIX + "cloud-platform"})
NODE_STORAGE_SCHEMES = ("gs",)           # s3 on a GCP node would need keys in its image (see above)
SA_SETTING = "SPOTWISE_GCP_SERVICE_ACCOUNT"
SCOPES_SETTING = "SPOTWISE_GCP_NODE_SCOPES"


def node_scopes() -> tuple[str, ...]:
    """The scopes nodes' service account gets: ``SPOTWISE_GCP_NODE_SCOPES`` (comma-separated;
    ``devstorage.read_write`` is short for its full URL), else :data:`NODE_SCOPES`. A scope that is
    not a Google OAuth scope URL or short name is refused, naming the setting."""
    raw = [x.strip() for x in (setting(SCOPES_SETTING) or "").split(",") if x.strip()]
    if not raw:
        return NODE_SCOPES
    out = []
    for s in raw:
        full = s if s.startswith(SCOPE_PREFIX) else SCOPE_PREFIX + s
        name = full[len(SCOPE_PREFIX):]
        if not name or not all(c.isalnum() or c in "._-" for c in name):
            raise InputError(Problem(where(SCOPES_SETTING), s, "OAuth scopes such as devstorage.read_write,compute "
                                     f"(or their {SCOPE_PREFIX}... URLs), comma-separated"), source="gcp")
        out.append(full)
    return tuple(dict.fromkeys(out))


def node_service_account() -> str:
    """The service account nodes carry: the setting, else the project's default one (a launch
    with ``gs://`` storage requires the setting: :func:`storage_identity_problem`)."""
    return setting(SA_SETTING) or "default"


def storage_identity_problem(storage_uri: str) -> Problem | None:
    """What a GCP node lacks to write ``gs://`` ``storage_uri`` as itself (None: nothing)."""
    if not storage_uri.startswith("gs://"):
        return None
    if not setting(SA_SETTING):
        return Problem(where(SA_SETTING), None,
                       f"the service account GCP nodes run as, allowed to read and write {storage_uri} "
                       "(infra/gcp creates 'spotwise-node'; or 'default', the project's Compute Engine "
                       "default account); nodes reach storage with their own identity, never keys")
    scopes = node_scopes()
    if not set(scopes) & STORAGE_WRITE_SCOPES:
        return Problem(where(SCOPES_SETTING), ",".join(s.removeprefix(SCOPE_PREFIX) for s in scopes),
                       "scopes including devstorage.read_write (or cloud-platform): a node's token carries "
                       f"only its scopes, so it could not write {storage_uri}")
    return None
