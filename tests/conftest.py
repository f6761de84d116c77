"""Suite-wide guard: no test may leave a Ray process, a local node or a metadata server running.

At the end of the session, any process carrying a local node's marker, and any Ray daemon started
during the session (raylet, gcs_server) that is still alive, fails the run. Outside CI (where other
work may run Ray beside the suite) the Ray-daemon part only warns.
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import pytest

# The slow phase's files, longest first (their durations in CI: docs/architecture.md, "The test
# suite"). Under `--dist loadfile --no-loadscope-reorder` (the Makefile's slow phase) xdist hands
# files to its workers in collection order, so the longest start first and none is left alone at
# the end; every other file keeps pytest's order, after these.
# (measured on 2026-11-29, twelfth session, seconds per file with two at a time: test_ray ~300,
# aws 190, gcp ~185 (its e2e and its runner's SIGKILL are one run now), launch 157, slurm 143,
# kill_runner_clouds ~140, azure 90, serve_restart 64, kill_runner 56, the rest 50; 2026-12-06: the new
# 2 x 4-rank launch 152 s, with the others' figures about the same; sixteenth session:
# kill_runner_clouds is AWS's case alone, ~115 s; seventeenth session's clean clone: GCP 278, ranks 249,
# launch 195, AWS 181, slurm 151 + 28 setup, test_ray ~230 in all, azure 126, serve_restart 83, Ctrl-C 67;
# kill_runner_clouds gone: its AWS part is a fast test now)
LONGEST_FIRST = ("runtime/training/test_ray.py", "e2e/test_launch_aws.py", "e2e/test_launch_gcp.py",
                 "e2e/test_launch.py", "e2e/test_launch_slurm.py", "e2e/test_launch_ranks.py",
                 "e2e/test_launch_azure.py",
                 "e2e/test_serve_restart.py", "e2e/test_kill_runner.py")
_TESTS = Path(__file__).resolve().parent

# The suite never reads the developer's own ~/.config/spotwise/config.yaml (its regions, project,
# database would leak into every test): /dev/null is an empty config file. A test of the file sets
# SPOTWISE_CONFIG itself (tests/test_config.py); processes the tests start inherit this one.
os.environ["SPOTWISE_CONFIG"] = os.devnull


def pytest_ignore_collect(collection_path: Path, config) -> bool | None:
    """With ``-m slow`` alone (the Makefile's slow phase), skip importing test modules that cannot
    hold a slow test: a test is slow only by ``pytest.mark.slow`` written in its own file (a
    decorator or the module's ``pytestmark``; nothing here adds the mark elsewhere, which
    tests/test_suite_collection.py checks). Each slow worker collected all ~1,700 tests to run 16:
    ``--collect-only -m slow`` took 15.1 CPU-s for the whole tree and 9.1 with this (idle machine,
    2026-12-06), about 6 CPU-s a worker."""
    if config.getoption("markexpr", "") != "slow":
        return None
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        try:
            return "mark.slow" not in collection_path.read_text()
        except OSError:
            return None
    return None


def pytest_collection_modifyitems(config, items) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def key(item) -> int:
        try:
            return rank.get(Path(item.path).resolve().relative_to(_TESTS).as_posix(), len(rank))
        except ValueError:
            return len(rank)

    items.sort(key=key)        # stable: the rest keep their order


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` that hands a worker its next file only when the worker is down to its
    last test (xdist's own keeps up to two more queued). A worker must hold one test beyond the one
    it runs (it needs the next item to tear fixtures down), so this is the least look-ahead there
    is: with one-test files longest first, xdist's default had committed a worker to three long
    files at the start, and the slow phase ended with one worker alone for a minute and a half
    (docs/architecture.md, "The test suite")."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class OneAhead(LoadFileScheduling):
        def _reschedule(self, node) -> None:
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
                return
            if self._pending_of(self.assigned_work[node]) > 1:
                return
            self._assign_work_unit(node)

    return OneAhead(config, log)


def _xdist_worker_of(pid: int) -> str | None:
    """The ``PYTEST_XDIST_WORKER`` a process inherited (None: none, or unreadable)."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"PYTEST_XDIST_WORKER="):
            return item.split(b"=", 1)[1].decode()
    return None


def _ray_daemons() -> set[int]:
    """Live Ray daemons of this test session. Under pytest-xdist each worker is a session of its
    own and its processes inherit ``PYTEST_XDIST_WORKER``: a worker counts only the daemons started
    beneath it, never its siblings' (which may still be running when it finishes)."""
    from spotwise.utils.procs import proc_state

    me = os.environ.get("PYTEST_XDIST_WORKER")
    out = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            comm = (d / "comm").read_text().strip()
        except OSError:
            continue
        if comm in ("raylet", "gcs_server") and proc_state(int(d.name)) not in (None, "Z"):
            if me is None or _xdist_worker_of(int(d.name)) == me:
                out.add(int(d.name))
    return out


@pytest.fixture(scope="session", autouse=True)
def _no_leaked_processes(tmp_path_factory):
    from spotwise.provisioner.clouds.local.cloud import marked_pids

    base = str(tmp_path_factory.getbasetemp())    # this session's tests keep SPOTWISE_HOME under it
    before = _ray_daemons()
    yield
    deadline = time.time() + 15          # give ray.shutdown() / teardown a moment to finish
    leaked_nodes, leaked_ray = marked_pids(home_prefix=base), _ray_daemons() - before
    while (leaked_nodes or leaked_ray) and time.time() < deadline:
        time.sleep(0.5)
        leaked_nodes, leaked_ray = marked_pids(home_prefix=base), _ray_daemons() - before
    assert not leaked_nodes, f"local node processes left running: {leaked_nodes}"
    if leaked_ray:
        msg = f"Ray daemons left running by the test session: {sorted(leaked_ray)}"
        if os.environ.get("CI"):
            pytest.fail(msg)
        warnings.warn(msg)


PG_ADMIN = os.environ.get("SPOTWISE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


@pytest.fixture(scope="session")
def pg_available() -> str | None:
    """None when the PostgreSQL server answers, else why not (the reason a PostgreSQL case skips)."""
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=3):
            return None
    except Exception as e:  # noqa: BLE001 - any failure means "no server here"
        return f"no PostgreSQL at {PG_ADMIN}: {e}"


@pytest.fixture
def pg_database(pg_available):
    """A fresh PostgreSQL database ``sw_test_<random>`` on 127.0.0.1:5432 for one test: yields its
    SQLAlchemy URL (the caller points ``SPOTWISE_DATABASE_URL`` at it); dropped afterwards."""
    import uuid

    import psycopg

    if pg_available:
        pytest.skip(pg_available)
    name = f"sw_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=3) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    try:
        yield url
    finally:
        from spotwise.engine.state import db

        try:
            db._engine(url).dispose()
        finally:
            db._engine.cache_clear()
            with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=3) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def local_home(tmp_path, monkeypatch):
    """``SPOTWISE_HOME`` in the test's own folder with the default (SQLite) database; afterwards every
    local node is ended and no process of ours is left (a test that leaks one fails here)."""
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path))
    monkeypatch.delenv("SPOTWISE_DATABASE_URL", raising=False)
    yield tmp_path
    from spotwise.provisioner.clouds.local.cloud import LocalCloud, marked_pids

    c = LocalCloud()
    c.terminate(c.list_nodes())
    assert marked_pids(home_prefix=str(tmp_path)) == []


# Database fixtures shared by tests/engine and tests/service: ``database`` is parametrized over SQLite
# (a fresh file) and PostgreSQL (a fresh database ``sw_test_<random>``, dropped afterwards); both point
# ``SPOTWISE_DATABASE_URL`` and ``SPOTWISE_HOME`` at it.
@pytest.fixture
def home(tmp_path, monkeypatch):
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("SPOTWISE_HOME", str(h))
    return h


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database(request, home, monkeypatch):
    """The database URL under test (SQLite file or a fresh PostgreSQL database)."""
    from spotwise.engine.state import db

    if request.param == "sqlite":
        url = f"sqlite:///{home / 'spotwise.db'}"
        monkeypatch.setenv("SPOTWISE_DATABASE_URL", url)
        yield url
        db.engine().dispose()
        db._engine.cache_clear()
        return
    url = request.getfixturevalue("pg_database")
    monkeypatch.setenv("SPOTWISE_DATABASE_URL", url)
    yield url

@pytest.fixture
def sqlite_db(home, monkeypatch):
    from spotwise.engine.state import db

    url = f"sqlite:///{home / 'spotwise.db'}"
    monkeypatch.setenv("SPOTWISE_DATABASE_URL", url)
    yield url
    db._engine(url).dispose()
    db._engine.cache_clear()


#: a head's port 22 opens to the launcher's address: in tests a documentation address (RFC 5737's
#: TEST-NET-3), so nothing asks the internet for this machine's (provisioner/head_path.py)
os.environ.setdefault("SPOTWISE_LAUNCHER_CIDR", "203.0.113.7/32")

from sshd import sshd_fixture  # noqa: E402  (tests/ is on the path: this conftest's directory)

#: a private sshd on 127.0.0.1 and a client set up for it (tests/sshd.py): the Slurm-over-ssh tests
sshd = pytest.fixture(scope="session")(sshd_fixture)
