"""A run over several clouds keeps its checkpoints in each cloud's own store (issue 29, item 3):
each store is checked against its own cloud's nodes before anything launches (exit 2 naming the
field), the job is submitted with the store of the cloud it landed on, and the newest committed
checkpoint is copied there from another cloud's store first — through the real S3 (moto_server)
and GCS (gcp-storage-emulator) clients; the plan and the policy's moves count that copy's egress."""

from __future__ import annotations

import json

import pytest
from orchestrator_fakes import Control, FakeCloud, Jobs, Lease

from emulator.gcs_server import GcsEmulator
from emulator.moto_server import MotoServer
from spotwise.cli import main
from spotwise.engine.run.orchestrator import Factories, LaunchOptions, Orchestrator
from spotwise.engine.plan.planner import make_plan
from spotwise.engine.run.run_stores import RunStores, copy_usd
from spotwise.engine.run.steering import transfer_read_usd
from spotwise.provisioner.base import CapacityError
from spotwise.errors import InputError
from spotwise.runtime.checkpoint.checkpointer import committed_steps, run_storage
from spotwise.taskspec import parse_taskspec

BOTH = {"aws": "s3://ckpt/runs", "gcp": "gs://ckpt/runs"}
TASK = "name: xc\nresources:\n  accelerators: {A100: 8}\n  clouds: [aws, gcp]\ntraining:\n  steps: 10\n"


@pytest.fixture
def identities(monkeypatch, local_home):
    """What each cloud's nodes need for their own store: AWS an instance profile, GCP a service account."""
    monkeypatch.setenv("SPOTWISE_AWS_INSTANCE_PROFILE", "spotwise-node")
    monkeypatch.setenv("SPOTWISE_GCP_SERVICE_ACCOUNT", "spotwise-node@p.iam.gserviceaccount.com")
    return local_home


def spec(storage, **over):
    data = {"name": "xc", "resources": {"nodes": 1, "accelerators": "A100:8", "clouds": ["aws", "gcp"],
                                        "market": "spot"},
            "training": {"steps": 10, "checkpoint": {"storage": storage}}, **over}
    return parse_taskspec(data)


def problem(e: pytest.ExceptionInfo) -> tuple[str, str]:
    p = e.value.problems[0]
    return p.field, p.allowed


def test_each_cloud_gets_its_own_store_checked_against_its_own_nodes(identities, monkeypatch):
    o = Orchestrator(spec(BOTH), LaunchOptions())
    assert dict(o.stores.by_cloud) == BOTH
    assert o.row.doc["training"]["checkpoint"]["storage"] == BOTH        # a resume finds both again
    with pytest.raises(InputError) as e:                                  # one s3:// store: GCP nodes cannot reach it
        Orchestrator(spec("s3://ckpt/runs"), LaunchOptions())
    field, allowed = problem(e)
    assert field == "training.checkpoint.storage" and "gcp: gs://BUCKET/PREFIX" in allowed
    assert "gcp nodes cannot reach s3://" in allowed
    with pytest.raises(InputError) as e:
        Orchestrator(spec({"aws": "s3://ckpt/runs"}), LaunchOptions())
    assert problem(e)[0] == "training.checkpoint.storage" and "gcp has none" in problem(e)[1]
    with pytest.raises(InputError) as e:
        Orchestrator(spec({**BOTH, "gcp": "s3://ckpt/other"}), LaunchOptions())
    assert problem(e)[0] == "training.checkpoint.storage.gcp"
    with pytest.raises(InputError) as e:
        Orchestrator(spec({**BOTH, "moon": "s3://ckpt/x"}), LaunchOptions())
    assert problem(e)[0] == "training.checkpoint.storage.moon"
    with pytest.raises(InputError) as e:                                  # the flag's store, per cloud, wins
        Orchestrator(spec(BOTH), LaunchOptions(storage={"aws": "gs://ckpt/a", "gcp": "gs://ckpt/b"}))
    assert problem(e)[0] == "--storage aws=" and "aws nodes cannot reach gs://" in problem(e)[1]
    monkeypatch.delenv("SPOTWISE_GCP_SERVICE_ACCOUNT")
    with pytest.raises(InputError) as e:                                  # GCP's store still needs GCP's identity
        Orchestrator(spec(BOTH), LaunchOptions())
    assert "SPOTWISE_GCP_SERVICE_ACCOUNT" in problem(e)[0]


@pytest.mark.parametrize(("flags", "field", "says"), [
    (["aws=s3://ckpt/a", "s3://ckpt/b"], "--storage", "not both"),
    (["moon=s3://ckpt/a"], "--storage moon=", "aws"),
    (["aws=s3://ckpt/a", "aws=s3://ckpt/b"], "--storage aws=", "each cloud once"),
    (["aws=s3://", "gcp=gs://ckpt/b"], "--storage aws=", "bucket"),
    (["aws=s3://ckpt/a"], "--storage", "gcp has none"),
    (["s3://ckpt/a"], "--storage", "gcp: gs://BUCKET/PREFIX"),
])
def test_bad_storage_flags_exit_2_naming_the_flag(identities, tmp_path, capsys, flags, field, says):
    task = tmp_path / "xc.yaml"
    task.write_text(TASK)
    args = [a for f in flags for a in ("--storage", f)]
    assert main(["launch", str(task), *args, "--dry-run", "--format", "json"]) == 2
    err = capsys.readouterr().err
    assert field in err and says in err and "Traceback" not in err


def test_storage_flags_per_cloud_plan_a_run_over_both_clouds(identities, tmp_path, capsys):
    task = tmp_path / "xc.yaml"
    task.write_text(TASK)
    assert main(["launch", str(task), "--storage", "aws=s3://ckpt/a", "--storage", "gcp=gs://ckpt/b",
                 "--dry-run", "--format", "json"]) in (0, None)
    plan = json.loads(capsys.readouterr().out)
    assert {plan["chosen"]["cloud"], *(o["cloud"] for o in plan["fallbacks"])} == {"aws", "gcp"}


def test_a_resume_that_lands_on_another_clouds_store_pays_for_the_copy(monkeypatch):
    """The plan charges an offer for copying the resume's checkpoint into its cloud's store when
    another cloud's store holds it (and only then); the policy's view of a move counts the same copy."""
    s = spec(BOTH, resources={"nodes": 1, "accelerators": "A100:8", "clouds": ["aws", "gcp"], "market": "spot",
                              "regions": ["us-east-1", "us-central1"]})
    monkeypatch.setenv("SPOTWISE_STORAGE_REGION", "us-east-1")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    gcp_copy = copy_usd(s, BOTH["aws"], BOTH["gcp"])              # AWS's internet egress for one checkpoint
    assert gcp_copy > 0 and copy_usd(s, BOTH["aws"], BOTH["aws"]) == 0
    fresh = make_plan(s, ["aws", "gcp"], storage=BOTH)
    resumed = make_plan(s, ["aws", "gcp"], storage=BOTH, resuming=True, resume_from=BOTH["aws"])
    f = {x.offer.key: x for x in fresh.ranked}
    assert {x.offer.cloud for x in resumed.ranked} == {"aws", "gcp"}
    for x in resumed.ranked:
        copied = any("copies its checkpoint" in n for n in x.notes)
        assert copied == (x.offer.cloud == "gcp")
        extra = x.transfer_usd - f[x.offer.key].transfer_usd     # the copy (GCP) + the resume's one read
        assert (extra >= gcp_copy - 1e-12) if copied else (extra < gcp_copy)
    # a policy's move to GCP: the copy into GCP's store, then a read within GCP
    assert transfer_read_usd(BOTH["aws"], s, "gcp/us-central1", BOTH) >= gcp_copy
    assert transfer_read_usd(BOTH["aws"], s, "aws/us-east-1", BOTH) == 0


# -- the copy on a run that lands on the other cloud ---------------------------------------------------
@pytest.fixture(scope="module")
def clouds_storage():
    """S3 (moto_server) and GCS (gcp-storage-emulator), each with a ``ckpt`` bucket."""
    moto, gcs = MotoServer(), GcsEmulator()
    try:
        moto.client("s3").create_bucket(Bucket="ckpt")
        gcs.create_bucket("ckpt")
        yield {**moto.env(), **gcs.env()}
    finally:
        moto.close()
        gcs.close()


class NoCapacity(FakeCloud):
    """A cloud whose every launch, on-demand or spot, meets a capacity error (AWS exhausted)."""

    def launch(self, request):
        raise CapacityError(f"no capacity in {request.offer.zone}", offer_key=request.offer.key,
                            cloud=self.cloud_name, region=request.offer.region)


def test_a_run_that_lands_on_gcp_trains_on_gs_from_the_checkpoint_copied_from_s3(identities, clouds_storage,
                                                                                 monkeypatch):
    for k, v in clouds_storage.items():
        monkeypatch.setenv(k, v)
    job = "xc-job-1"
    s3, gs = run_storage(BOTH["aws"], job), run_storage(BOTH["gcp"], job)
    for step in (4, 8):                                   # what the job committed while it ran on AWS
        s3.put_bytes(f"checkpoints/step_{step:09d}/__0_0.distcp", b"w" * step)
        s3.put_bytes(f"checkpoints/step_{step:09d}/COMMITTED", json.dumps({"step": step}).encode())
    s3.put_bytes("checkpoints/step_000000009/__0_0.distcp", b"torn")          # torn: never copied
    log: list = []
    fakes = {"aws": NoCapacity("aws", log), "gcp": FakeCloud("gcp", log)}
    jobs = Jobs(log)
    make = Factories(cloud=lambda name: fakes[name], lease=lambda job_id, budget: Lease(log, job),
                     jobs_client=lambda url, headers: jobs, control=lambda url, token: Control(log, jobs, url))
    task = spec(BOTH, resources={"nodes": 1, "accelerators": "A100:8", "clouds": ["aws", "gcp"], "market": "spot",
                                 "regions": ["us-east-1", "us-central1"]})
    o = Orchestrator(task, LaunchOptions(tick_s=0.01, policy_interval_s=0.05), job_id=job, factories=make, resume=True)
    rep = o.run()
    assert rep["status"] == "succeeded", rep.get("message")
    assert o.fleet.site().startswith("gcp/") and o.driver.storage == BOTH["gcp"]   # trained on GCP's own store
    assert committed_steps(gs) == [8] and gs.get_bytes("checkpoints/step_000000008/__0_0.distcp") == b"w" * 8
    assert not gs.list("checkpoints/step_000000009/")
    [ev] = [e for e in rep["events"] if e["event"] == "checkpoint_copied"]
    assert (ev["frm"], ev["to"], ev["step"], ev["bytes"]) == (BOTH["aws"], BOTH["gcp"], 8, 8 + len(b'{"step": 8}'))
    submitted = [i for i, x in enumerate(log) if x[0] == "submit"]
    assert submitted, log
    # again (a later leg on GCP): the newest is already there, nothing crosses
    assert RunStores(BOTH).bring(job, "gcp", keep_last=2) is None
    assert RunStores(BOTH).newest(job) == (BOTH["aws"], 8)          # a tie: the first cloud's store



# -- the copy's money: GCP's gs:// to Azure's az:// (both sites known whatever their emulators' address) --
@pytest.fixture(scope="module")
def gcs_and_azurite():
    """GCS (gcp-storage-emulator) with a ``ckpt`` bucket and Azurite with a ``ckpt`` container; the
    test skips (saying why) where Azurite is not installed."""
    from emulator.azurite_server import Azurite, azurite_bin

    if azurite_bin() is None:
        pytest.skip("azurite is not installed (scripts/install.sh --test installs it with npm)")
    with GcsEmulator() as gcs, Azurite() as az:
        gcs.create_bucket("ckpt")
        az.create_container("ckpt")
        yield {**gcs.env(), **az.env()}


GA = {"gcp": "gs://ckpt/runs", "azure": "az://devstoreaccount1/ckpt/runs"}


def _landing_on_azure(job: str, monkeypatch, env, budget=None, **training):
    """A resume of ``job`` over GCP and Azure (a store each) whose GCP launches meet capacity
    errors: it lands on Azure."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("SPOTWISE_AZURE_NODE_IDENTITY", "/subscriptions/s/resourceGroups/rg/providers/"
                       "Microsoft.ManagedIdentity/userAssignedIdentities/spotwise-node")
    task = parse_taskspec({"name": "xc", "resources": {"nodes": 1, "accelerators": "A100:8", "market": "spot",
                                                       "clouds": ["gcp", "azure"]},
                           "training": {"steps": 10, "checkpoint": {"storage": GA}, **training}})
    log: list = []
    fakes = {"azure": FakeCloud("azure", log), "gcp": NoCapacity("gcp", log)}
    jobs = Jobs(log)
    make = Factories(cloud=lambda name: fakes[name], lease=lambda job_id, b: Lease(log, job),
                     jobs_client=lambda url, headers: jobs, control=lambda url, token: Control(log, jobs, url))
    opts = LaunchOptions(tick_s=0.01, policy_interval_s=0.05, budget_usd=budget)
    return Orchestrator(task, opts, job_id=job, factories=make, resume=True), log


def _committed_on_gs(job: str, step: int, size: int) -> None:
    gs = run_storage(GA["gcp"], job)
    gs.put_bytes(f"checkpoints/step_{step:09d}/__0_0.distcp", b"w" * size)
    gs.put_bytes(f"checkpoints/step_{step:09d}/COMMITTED", json.dumps({"step": step}).encode())


def test_the_copy_is_billed_in_the_ledger_at_the_rate_of_the_cloud_the_bytes_leave(identities, gcs_and_azurite,
                                                                                     monkeypatch):
    """Money is data: the copy's egress is a ledger row (market ``egress``) at GCP's internet rate
    with that rate's source and date, counted in the job's cost and the report's ``cost_by_item``."""
    from spotwise.engine.state.ledger import cost_report
    from spotwise.pricing.egress import copy_rate

    job = "xc-job-bill"
    o, _ = _landing_on_azure(job, monkeypatch, gcs_and_azurite)
    _committed_on_gs(job, 6, 3_000_000)
    rep = o.run()
    assert rep["status"] == "succeeded", rep.get("message")
    assert o.driver.storage == GA["azure"] and committed_steps(run_storage(GA["azure"], job)) == [6]
    [ev] = [e for e in rep["events"] if e["event"] == "checkpoint_copied"]
    rate = copy_rate(GA["gcp"], GA["azure"])
    assert rate.scope == "internet" and rate.usd_per_gb > 0 and rate.source and rate.as_of
    want = rate.usd_per_gb * ev["bytes"] / 1e9
    assert ev["bytes"] > 3_000_000 and ev["egress_usd"] == pytest.approx(want, abs=1e-6)
    cost = cost_report(job)
    [row] = [r for r in cost["rows"] if r["market"] == "egress"]
    assert (row["cloud"], row["price_source"], row["price_as_of"]) == ("gcp", rate.source, rate.as_of)
    assert row["cost_usd"] == pytest.approx(want, abs=1e-6) and row["hours"] == 0
    assert rep["cost_by_item"]["egress"] == pytest.approx(want, abs=1e-6)
    assert rep["cost_usd"] == pytest.approx(cost["total_usd"], abs=1e-5)


def test_a_copy_the_budget_cannot_pay_fails_the_run_before_anything_is_copied(identities, gcs_and_azurite,
                                                                              monkeypatch):
    """An 8B model's checkpoint (about 96 GB, over $10 of GCP egress) cannot move under a $5 cap:
    the run fails naming the cost and the budget, nothing lands in Azure's store, nothing is billed
    as egress, training is never submitted and no account is left open."""
    from spotwise.engine.state.ledger import cost_report

    job = "xc-job-poor"
    o, log = _landing_on_azure(job, monkeypatch, gcs_and_azurite, budget=5.0,
                               entrypoint="llama", model={"flavor": "8b"},
                               activation_checkpointing=True)   # 8 x 40 GB: a rank of 8b needs it
    assert copy_usd(o.spec, GA["gcp"], GA["azure"]) > 5
    _committed_on_gs(job, 6, 10)
    rep = o.run()
    assert rep["status"] == "failed"
    assert "cannot pay" in rep["message"] and "$5.00" in rep["message"] and "egress" in rep["message"]
    assert not run_storage(GA["azure"], job).list("")
    assert "egress" not in cost_report(job)["by_market"]
    assert not any(x[0] == "submit" for x in log)
    assert o.purse.ledger.open_ids() == []


def test_a_task_that_names_no_store_uses_each_clouds_default_store(identities, monkeypatch, tmp_path, capsys):
    """``aws.storage`` / ``gcp.storage`` (or their variables) are each cloud's default store: a
    task over both that names none gets one store per cloud; a cloud without a default is an error
    naming the task's field and the setting; a default that cloud's nodes cannot reach names the
    setting (the file's key when it came from the file)."""
    from spotwise.engine.run.run_stores import run_stores

    bare = parse_taskspec({"name": "xc", "resources": {"nodes": 1, "accelerators": "A100:8",
                                                       "clouds": ["aws", "gcp"]}, "training": {"steps": 10}})
    cfg = tmp_path / "config.yaml"
    cfg.write_text("aws:\n  storage: s3://team-ckpt/spotwise\n")
    monkeypatch.setenv("SPOTWISE_CONFIG", str(cfg))
    with pytest.raises(InputError) as e:
        run_stores(bare, LaunchOptions(), ["aws", "gcp"])
    field, allowed = problem(e)
    assert field == "training.checkpoint.storage" and "SPOTWISE_GCP_STORAGE" in allowed and "gcp.storage" in allowed
    monkeypatch.setenv("SPOTWISE_GCP_STORAGE", "gs://team-ckpt/spotwise")
    assert run_stores(bare, LaunchOptions(), ["aws", "gcp"]).by_cloud == {
        "aws": "s3://team-ckpt/spotwise", "gcp": "gs://team-ckpt/spotwise"}
    assert run_stores(bare, LaunchOptions(), ["local"]).of("local").startswith("file://")
    # the task's own store still wins over the defaults
    assert run_stores(spec("s3://mine/ckpt", resources={"nodes": 1, "accelerators": "A100:8", "clouds": ["aws"]}),
                      LaunchOptions(), ["aws"]).by_cloud == {"aws": "s3://mine/ckpt"}
    cfg.write_text("aws:\n  storage: gs://wrong-cloud/p\n")            # AWS nodes cannot reach gs://
    with pytest.raises(InputError) as e:
        run_stores(bare, LaunchOptions(), ["aws", "gcp"])
    assert problem(e)[0] == f"{cfg}: aws.storage"
    # end to end through the CLI: a dry run plans each cloud on its own default store
    cfg.write_text("aws:\n  storage: s3://team-ckpt/spotwise\n")
    task = tmp_path / "t.yaml"
    task.write_text(TASK)
    assert main(["launch", str(task), "--dry-run", "--format", "json"]) in (0, None)
    assert json.loads(capsys.readouterr().out)["chosen"]["cloud"] in ("aws", "gcp")


def test_a_remote_cloud_without_a_default_store_setting_is_named_without_one(identities, monkeypatch):
    """A cloud whose nodes cannot share this disk and that has no default-store setting at all:
    the error says so, instead of asking the user to set a setting named None."""
    from spotwise.engine.run.run_stores import run_stores
    from spotwise.provisioner.base import cloud_class

    monkeypatch.setattr(cloud_class("gcp"), "default_storage_setting", None)
    bare = parse_taskspec({"name": "xc", "resources": {"nodes": 1, "accelerators": "A100:8", "clouds": ["gcp"]},
                           "training": {"steps": 10}})
    with pytest.raises(InputError) as e:
        run_stores(bare, LaunchOptions(), ["gcp"])
    field, allowed = problem(e)
    assert field == "training.checkpoint.storage"
    assert "gs://" in allowed and "gcp has no default store" in allowed and "None" not in allowed, allowed
