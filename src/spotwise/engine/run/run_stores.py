"""Where a run keeps its checkpoints on each cloud it may land on, and the copy when it moves.

Each cloud's nodes reach only their own cloud's storage with their own identity (an AWS node its
instance profile for ``s3://``, a GCP node its service account for ``gs://``; keys baked into an
image are not an identity). So a run planned over several clouds has one store per cloud —
``training.checkpoint.storage: {aws: s3://b/p, gcp: gs://b/p}`` or ``--storage aws=s3://b/p
--storage gcp=gs://b/p`` — and a single URI stays what a run whose clouds all reach it uses.
:func:`run_stores` resolves and checks them before anything launches (an :class:`InputError`
naming the field, exit 2): every cloud of the run has a store, each key is a cloud, and each
cloud's store passes that cloud's own checks (:func:`~spotwise.engine.plan.options.check_storage`).

The nodes of a cluster read and write only the store of the cloud they run on. Before training
is submitted to a cluster (its first launch, a migration, a ``spotwise resume``), the launcher
finds which of the run's stores holds the newest committed checkpoint (:meth:`RunStores.newest`)
and, when that is another cloud's, copies it into this cloud's store with its own credentials,
marker last (:meth:`RunStores.bring`, :func:`spotwise.runtime.checkpoint.copy.copy_latest`); a copy
that fails fails the move rather than let training start over. The plan and the policy's moves
count that copy's egress (:func:`copy_usd`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spotwise.errors import InputError, Problem, SpotwiseError
from spotwise.provisioner.base import known_clouds
from spotwise.runtime.checkpoint.copy import Copied
from spotwise.runtime.config import DEFAULT_STORAGE
from spotwise.taskspec import TaskSpec

if TYPE_CHECKING:
    from spotwise.engine.state.ledger import Ledger

FLAG = "--storage"


@dataclass(frozen=True, slots=True)
class RunStores:
    """The run's checkpoint storage URI on each of its clouds (resolved: ``file://`` paths absolute)."""

    by_cloud: Mapping[str, str]

    def of(self, cloud: str) -> str:
        """The store of ``cloud``'s nodes (a cloud the run does not use: the first cloud's)."""
        return self.by_cloud.get(cloud) or next(iter(self.by_cloud.values()))

    @property
    def uris(self) -> list[str]:
        """Each distinct store once, in the run's cloud order."""
        return list(dict.fromkeys(self.by_cloud.values()))

    def as_task(self) -> str | dict[str, str]:
        """As the task stored with the job says it: one URI when every cloud shares it, else the mapping."""
        return self.uris[0] if len(self.uris) == 1 else dict(self.by_cloud)

    def newest(self, job_id: str) -> tuple[str, int] | None:
        """The store holding the job's newest committed checkpoint and its step (the first such
        store on a tie), read with this process's credentials; None when no store holds one."""
        from spotwise.runtime.checkpoint.layout import run_storage
        from spotwise.runtime.checkpoint.layout import newest_step

        best: tuple[str, int] | None = None
        for uri in self.uris:
            step = newest_step(run_storage(uri, job_id))
            if step is not None and (best is None or step > best[1]):
                best = (uri, step)
        return best

    def holder(self, job_id: str) -> str | None:
        """The store holding the job's newest committed checkpoint when the run has several (a
        resume reads it once, for the plan's copy egress); a store that cannot be read is a
        :class:`~spotwise.errors.SpotwiseError` in one line."""
        if len(self.uris) < 2:
            return None
        try:
            found = self.newest(job_id)
        except Exception as e:  # noqa: BLE001 - a store that cannot be read: one line, no traceback
            raise SpotwiseError(f"could not read the checkpoints of {job_id} in {', '.join(self.uris)}: "
                                f"{type(e).__name__}: {str(e)[:200]}") from None
        return found[0] if found else None

    def bring(self, job_id: str, cloud: str, *, keep_last: int,
              afford: Callable[[str, str], None] | None = None) -> tuple[str, Copied] | None:
        """Make ``cloud``'s store hold the job's newest committed checkpoint: copied from the store
        that holds it when that is another one. ``afford(src, dst)`` is asked before anything is
        copied and may raise (the budget cannot pay the copy). Returns (the source URI, what was
        copied), or None when nothing had to move. Raises what the stores raise."""
        from spotwise.runtime.checkpoint.layout import run_storage
        from spotwise.runtime.checkpoint.copy import copy_latest

        if len(self.uris) == 1:
            return None
        found = self.newest(job_id)
        dst = self.of(cloud)
        if found is None or found[0] == dst:
            return None
        if afford is not None:
            afford(found[0], dst)
        got = copy_latest(run_storage(found[0], job_id), run_storage(dst, job_id), keep_last=keep_last)
        return None if got is None else (found[0], got)


def parse_storage_flags(values: Sequence[str] | None) -> str | dict[str, str] | None:
    """``--storage`` as given: one URI (every cloud's), or ``CLOUD=URI`` once per cloud; None when
    not given. Each URI is checked as the task file's are; an :class:`InputError` names the flag."""
    from spotwise.runtime.storage.base import BadStorageUri, check_uri

    vals = [v for v in (values or []) if v is not None]
    if not vals:
        return None
    plain = [v for v in vals if not _is_pair(v)]
    if plain and len(vals) > 1:
        raise InputError(Problem(FLAG, vals, "one URI for every cloud, or CLOUD=URI once per cloud (e.g. --storage "
                                             "aws=s3://b/p --storage gcp=gs://b/p), not both"), source="launch")
    out: dict[str, str] = {}
    for v in vals:
        cloud, uri = v.split("=", 1) if _is_pair(v) else ("", v)
        field = f"{FLAG} {cloud}=" if cloud else FLAG
        if cloud and cloud not in known_clouds():
            raise InputError(Problem(field, cloud, ", ".join(known_clouds())), source="launch")
        if cloud in out:
            raise InputError(Problem(field, v, "each cloud once"), source="launch")
        try:
            out[cloud] = check_uri(uri)
        except BadStorageUri as e:
            raise InputError(Problem(field, uri, str(e)), source="launch") from None
    return out[""] if "" in out else out


def _is_pair(v: str) -> bool:
    """``CLOUD=URI`` (a ``=`` before any ``://``), not a URI that holds a ``=``."""
    head = v.split("://", 1)[0]
    return "=" in head


def run_stores(spec: TaskSpec, opts, clouds: list[str]) -> RunStores:
    """Every cloud's checkpoint store of a run of ``spec`` on ``clouds``: the launch's
    ``--storage`` (``opts.storage``), else the task's ``training.checkpoint.storage``; one URI is
    every cloud's. Checked per cloud against that cloud's nodes (see the module docstring)."""
    from spotwise.engine.plan.options import check_storage

    value = opts.storage if opts.storage else spec.training.checkpoint.storage
    field = FLAG if opts.storage else "training.checkpoint.storage"
    if value == DEFAULT_STORAGE:
        return _default_stores(clouds)
    if isinstance(value, str):
        uri = check_storage(value, field, clouds)
        return RunStores({c: uri for c in clouds})

    def named(cloud: str) -> str:
        return f"{FLAG} {cloud}=" if field == FLAG else f"{field}.{cloud}"

    unknown = [k for k in value if k not in known_clouds()]
    if unknown:
        raise InputError([Problem(named(k), k, f"a cloud name: {', '.join(known_clouds())}") for k in unknown])
    missing = [c for c in clouds if c not in value]
    if missing:
        raise InputError(Problem(field, dict(value), f"a store for every cloud the run may land on "
                                                     f"({', '.join(clouds)}): {', '.join(missing)} has none"))
    return RunStores({c: check_storage(value[c], named(c), [c]) for c in clouds})


def _default_stores(clouds: list[str]) -> RunStores:
    """The stores of a run that names none: each cloud's default store
    (``Cloud.default_storage_setting``: ``SPOTWISE_GCP_STORAGE``, ``gcp.storage`` in the config
    file…), checked under that setting's name; this machine's ``file://`` store for clouds whose
    nodes run here. A cloud whose nodes cannot share this disk and that has no default is an
    :class:`InputError` naming the task's field and the setting."""
    from spotwise.config import file_key, setting, where
    from spotwise.engine.plan.options import check_storage
    from spotwise.provisioner.base import cloud_class

    out: dict[str, str] = {}
    for c in clouds:
        cls = cloud_class(c)
        name = cls.default_storage_setting
        uri = setting(name) if name else None
        if uri:
            out[c] = check_storage(uri, where(name or ""), [c])
        elif cls.on_this_machine:
            out[c] = check_storage(DEFAULT_STORAGE, "training.checkpoint.storage", [c])
        else:
            schemes = " or ".join(f"{x}://" for x in cls.node_storage_schemes)
            default = (f", or set {name} ({file_key(name)} in the config file) as {c}'s default store"
                       if name else f" ({c} has no default store)")
            raise InputError(Problem("training.checkpoint.storage", None,
                                     f"a {schemes} store for the run's {c} nodes: name it in the task or with "
                                     f"--storage{default}"))
    return RunStores(out)


def storage_uri(spec: TaskSpec, opts, clouds: list[str]) -> str:
    """The run's checkpoint URI on its first cloud (the one store a single-cloud run has)."""
    return run_stores(spec, opts, clouds).of(clouds[0])


def _storage_uri(spec: TaskSpec, opts) -> str:     # kept for callers of the old name
    from spotwise.engine.plan.options import parse_clouds

    return storage_uri(spec, opts, parse_clouds(opts.cloud, spec))


def copy_usd(spec: TaskSpec, src_uri: str, dst_uri: str, *, gb: float | None = None) -> float:
    """What copying one checkpoint of ``spec``'s model (``gb`` when known, else its expected size)
    from store ``src_uri`` to ``dst_uri`` costs in egress (:func:`spotwise.pricing.egress.copy_usd`:
    free within a region, the leaving cloud's rate across clouds)."""
    from spotwise.pricing import egress
    from spotwise.pricing.estimate import params_from_taskspec

    return egress.copy_usd(src_uri, dst_uri, egress.checkpoint_gb(params_from_taskspec(spec)[0]) if gb is None else gb)


def check_copy_budget(spec: TaskSpec, src: str, dst: str, *, job_id: str, budget: float | None,
                      ledger: Ledger) -> None:
    """Refuse a copy the budget cannot pay: its egress at the model's checkpoint size (what the
    plan counts, :func:`copy_usd`), on top of what the run has spent and one billing increment of
    its nodes, must stay within the cap; else a :class:`SpotwiseError` before anything is copied
    (``spotwise resume --budget`` can raise the cap)."""
    from spotwise.engine.run.purse import BILLING_INCREMENT_S

    if budget is None:
        return
    usd = copy_usd(spec, src, dst)
    spend = ledger.spend()
    nodes = ledger.rate_usd_per_hour() * BILLING_INCREMENT_S / 3600
    if spend + usd + nodes > budget:
        raise SpotwiseError(f"copying the last checkpoint of {job_id} from {src} to {dst} costs about ${usd:,.4f} "
                            f"in egress; with ${spend:,.4f} spent the budget of ${budget:,.2f} cannot pay it "
                            "(raise it with spotwise resume --budget)")


def bill_copy(ledger: Ledger, src: str, dst: str, copied: Copied) -> float:
    """Record what a copy cost in the run's ledger: the bytes that left ``src``'s cloud at that
    cloud's rate in force (its source and date), market ``egress``; returns the amount (0: free,
    nothing recorded)."""
    from spotwise.pricing import egress

    rate = egress.copy_rate(src, dst)
    usd = rate.usd_per_gb * copied.bytes / 1e9
    if usd > 0:
        ledger.charge(f"egress/step-{copied.step}/{src}->{dst}", cloud=egress.storage_site(src).cloud,
                      market="egress", usd=usd, source=rate.source, as_of=rate.as_of)
    return usd


def bring_checkpoint(stores: RunStores, *, job_id: str, spec: TaskSpec, cloud: str, budget: float | None,
                     ledger: Ledger, event: Callable[..., None]) -> None:
    """Before training is submitted to a cluster on ``cloud``: when the run has a store per cloud
    and another cloud's holds its newest committed checkpoint (a migration, a resume on another
    cloud), copy it into ``cloud``'s store with this process's credentials, marker last
    (:meth:`RunStores.bring`; the nodes boot meanwhile, nothing reads the store before the job
    starts), refused first when the budget cannot pay it (:func:`check_copy_budget`), billed to
    ``ledger`` and told as a ``checkpoint_copied`` event. A copy that fails fails the run (``spotwise
    resume`` tries again) rather than let training start over from step 0: a :class:`SpotwiseError`."""
    dst = stores.of(cloud)
    try:
        got = stores.bring(job_id, cloud, keep_last=spec.training.checkpoint.keep_last,
                           afford=lambda src, to: check_copy_budget(spec, src, to, job_id=job_id, budget=budget,
                                                                    ledger=ledger))
    except SpotwiseError:
        raise
    except Exception as e:  # noqa: BLE001 - any store failure: the run's error, one line
        raise SpotwiseError(f"could not copy the last checkpoint of {job_id} into {dst}: "
                            f"{type(e).__name__}: {str(e)[:300]}") from None
    if got is None:
        return
    src, c = got
    usd = bill_copy(ledger, src, dst, c)
    event("checkpoint_copied", frm=src, to=dst, step=c.step, objects=c.objects, bytes=c.bytes,
          seconds=round(c.seconds, 2), egress_usd=round(usd, 6))


def stage_code(spec: TaskSpec, stores: RunStores, clouds: list[str], event: Callable[..., None]) -> dict[str, dict]:
    """On a cloud run with bucket storage, the task's workdir as a content-addressed zip in each of
    the run's stores (:func:`spotwise.taskcode.stage_workdir`: uploaded once, reused while
    unchanged), before the first node is paid for: each cloud's nodes read it from their own store.
    Returns store URI -> the runtime env of the workdir staged there (empty: the local cloud gets
    the directory as is, and a task without a workdir has nothing to stage)."""
    from spotwise.taskcode import runtime_env, stage_workdir
    from spotwise.taskspec import user_code

    envs: dict[str, dict] = {}
    if spec.workdir is None or all(c == "local" for c in clouds):
        return envs
    for uri in stores.uris:
        code, uploaded = stage_workdir(user_code(spec), uri)
        if code.workdir_uri is not None:
            envs[uri] = runtime_env(code)
            event("workdir_staged", uri=code.workdir_uri, uploaded=uploaded)
    return envs
