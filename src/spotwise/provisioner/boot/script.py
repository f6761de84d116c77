"""Render the boot script every spotwise node runs: AWS user-data, GCP startup-script, Azure
custom data — the same bash program on all three.

What the script does, in order, each step guarded so that running it twice is safe (GCP runs a
startup-script on *every* boot; cloud-init may re-run user-data after an image rebuild):

1. write ``$ETC_DIR/node.env`` (cluster, job, role, cloud, zone, market) — same bytes each run;
2. install the build the launch shipped (:mod:`spotwise.build`), never spotwise by name: skipped
   when ``$VENV`` already reports that build id (an image baked with it, or a second boot);
   a ``$VENV`` that is the image's own environment (a custom image's; no venv spotwise made) is
   kept when it holds that build and otherwise never changed nor deleted: the build goes in a fresh
   venv beside it, ``$VENV-spotwise``, which becomes ``$VENV`` (issue 48, item 7);
   otherwise fetch the wheel from its short-lived URL, refuse it unless its sha256 is the one
   rendered here, make ``$VENV`` a venv over the image's Python (the first of ``$SPOTWISE_PYTHON``,
   a DL image's torch env, ``python3.13`` .. ``python3`` that is >= 3.11; the image's site
   packages stay visible, so its CUDA torch is the one used) and ``pip install`` the wheel there.
   The log names the wheel, its sha256 and the build id. A script rendered without a build needs
   an image whose venv already has spotwise. Then export ``$ETC_DIR/storage.env`` when the image
   has one (keys for an S3-compatible checkpoint store on a cloud whose nodes have no role for it);
3. ask the instance's own metadata service who it is: instance id and private address (the
   node's Ray address and the label the interruption watcher looks for); a GPU node waits up to
   :data:`GPU_WAIT_S` for ``nvidia-smi`` to list its GPUs (an image may install its driver at first
   boot) and gives Ray the count it sees (``--num-gpus``); then checks that the venv's torch uses
   those GPUs, and where it does not, reinstalls the same torch version built for a CUDA that fits
   the driver, or ends the boot (:mod:`~spotwise.provisioner.boot.torch_fit`);
4. start Ray — the head with ``ray start --head``, a worker with ``ray start --address HEAD``
   once the head's GCS port accepts a connection (nodes boot at once; the wait is bounded by the
   boot lease and runs in the background), with up to :data:`RAY_START_ATTEMPTS` tries — unless
   *this node's* Ray is already running (a pidfile in the node's state dir, not a
   machine-wide process search). Nodes carry Ray labels (``spotwise-cloud``, ``-zone``,
   ``-market``, ``-instance``...) and a custom resource (``spotwise-head`` / ``spotwise-worker``)
   so placement and the orchestrator can tell them apart;
5. start the interruption watcher ``python -m spotwise.runtime.node.watch`` (it polls the metadata
   service for the cloud's notice and drains this Ray node) unless its pidfile names a live process.

How a worker finds the head: the provisioner launches the head first and passes its private
address to the workers' scripts (``head_address``). A script rendered without one reads it from
the instance's own metadata (AWS instance tag via IMDSv2, GCP metadata attribute, Azure tag via
IMDS) under the key ``spotwise-head`` and waits for it — so a new head can be announced by
re-tagging, without re-rendering anything.

The head's Ray dashboard (and with it the Jobs API the orchestrator submits training through)
listens on the head's *private* address only: it runs arbitrary code, so it must never face the
internet. The orchestrator reaches it through ssh port forwards to the head's public address, with
a key made for the cluster that the head's script authorizes first (step 0, :func:`ssh_block`), or
from inside the VPC (``SPOTWISE_HEAD_PATH=private``: :mod:`spotwise.provisioner.head_path`).

What the environment may override, and only this (an image, or the test suite's instance
emulator, sets them): ``SPOTWISE_STATE_DIR``, ``SPOTWISE_ETC_DIR``, ``SPOTWISE_VENV``,
``SPOTWISE_PYTHON`` (the image's Python), ``SPOTWISE_AUTHORIZED_KEYS`` (where a head authorizes the
launcher's cluster key, else the ``spotwise`` user's own file), ``SPOTWISE_GPU_WAIT_S`` (how long a GPU
node waits for its driver; 0 on the emulators' CPU-only machines), ``SPOTWISE_CPU_STANDIN`` (the
emulators' CPU machine stands in for a GPU node: Ray starts with no GPU where a real GPU node's boot fails),
``SPOTWISE_METADATA_URL`` (the metadata service's base URL), ``SPOTWISE_GCS_ENDPOINT`` (where a
GCP node fetches a ``gs://`` wheel, else :data:`GCS_API`), ``SPOTWISE_TORCH_INDEX`` (the PyTorch
wheel index a GPU node fetches a CUDA build of torch from, else
:data:`~spotwise.provisioner.boot.torch_fit.TORCH_INDEX`) and ``SPOTWISE_RAY_START_ARGS`` (extra
``ray start`` arguments, e.g. object-store size or fixed agent ports).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from spotwise.build import BootBuild
from spotwise.provisioner.boot.torch_fit import GPU_COUNT, torch_fit_block
from spotwise.runtime.api import INSTANCE_LABEL, WORKER_RESOURCE
from spotwise.runtime.node.deadman import BOOT_LEASE_S

RAY_PORT = 6379
DASHBOARD_PORT = 8265
HEAD_KEY = "spotwise-head"
HEAD_RESOURCE = "spotwise-head"        # the run's control actor and job driver live where this is
#: ``ray start`` flags every node of ours runs with (cloud, local and Slurm alike). No usage stats
#: sent home. No log monitor: it tails every worker's log files on the node to forward them to
#: drivers, and our job driver runs with ``log_to_driver=False`` because the job's own output is
#: shipped by :mod:`spotwise.runtime.training.joboutput` (Ray's files stay on the node either way); one
#: Python process less per node (measured on the emulated GCP end-to-end run: 3.7 of its 164
#: CPU-seconds, 2026-11-29).
RAY_NODE_FLAGS = ("--disable-usage-stats", "--include-log-monitor=false")
RAY_START_ATTEMPTS = 3                 # `ray start` tries per boot (a raylet that dies at start fails it)
_LABEL_VALUE = re.compile(r"[^a-zA-Z0-9_.-]")

# Per cloud: default metadata base URL, and a bash function ``md PATH`` that prints one value.
# The paths each script asks for: ``id`` (instance id), ``ip`` (private address), ``head`` (the
# spotwise-head tag/attribute).
_METADATA_BASE = {"aws": "http://169.254.169.254", "gcp": "http://metadata.google.internal",
                  "azure": "http://169.254.169.254", "local": "http://127.0.0.1:1"}
_MD_FUNC = {
    "aws": ('md() {\n'
            '  local tok\n'
            '  tok=$(curl -sf -m 2 -X PUT "$METADATA_URL/latest/api/token" '
            '-H "X-aws-ec2-metadata-token-ttl-seconds: 300") || return 1\n'
            '  curl -sf -m 2 -H "X-aws-ec2-metadata-token: $tok" "$METADATA_URL/latest/meta-data/$1"\n'
            '}'),
    "gcp": ('md() { curl -sf -m 2 -H "Metadata-Flavor: Google" '
            '"$METADATA_URL/computeMetadata/v1/instance/$1"; }'),
    "azure": ('md() { curl -sf -m 2 -H "Metadata: true" '
              '"$METADATA_URL/metadata/instance/$1?api-version=2021-02-01&format=text"; }'),
    "local": "md() { return 1; }",
}
_MD_PATHS = {
    "aws": {"id": "instance-id", "ip": "local-ipv4", "head": f"tags/instance/{HEAD_KEY}"},
    "gcp": {"id": "name", "ip": "network-interfaces/0/ip", "head": f"attributes/{HEAD_KEY}"},
    "azure": {"id": "compute/name", "ip": "network/interface/0/ipv4/ipAddress/0/privateIpAddress",
              "head": f"compute/tagsList/{HEAD_KEY}"},
    "local": {"id": "instance-id", "ip": "local-ipv4", "head": HEAD_KEY},
}


@dataclass(frozen=True, slots=True, kw_only=True)
class BootstrapSpec:
    """Everything the node script needs; rendered, not looked up, so it is testable as text."""

    cloud: str
    cluster_id: str
    job_id: str
    role: str                      # head | worker
    region: str
    zone: str
    market: str
    instance_type: str
    accelerator_count: int = 0
    head_address: str | None = None
    ray_port: int = RAY_PORT
    dashboard_port: int = DASHBOARD_PORT
    # the build the launch shipped (None: the image's venv must already hold spotwise)
    build: BootBuild | None = None
    extras: str = "aws"            # the wheel's extras a node installs ([aws]: boto3 for s3:// storage)
    extra_labels: dict[str, str] = field(default_factory=dict)
    # Variables exported to every process of the node, before the install (Azure on ``az://``:
    # the managed identity its storage is reached as, :mod:`~spotwise.provisioner.clouds.azure.identity`)
    env: dict[str, str] = field(default_factory=dict)
    # Extra arguments of the interruption watcher (Azure: ``--ack-after-checkpoint RUN_URI``, so the
    # Preempt event is acknowledged only once the run's just-in-time checkpoint is committed).
    watch_args: tuple[str, ...] = ()
    # The launcher's key for this cluster, an ``authorized_keys`` line (a head reached over ssh:
    # :mod:`spotwise.provisioner.head_path`); None: nobody logs in to the node
    ssh_authorized_key: str | None = None

    def __post_init__(self) -> None:
        if self.role not in ("head", "worker"):
            raise ValueError(f"role must be head or worker, got {self.role!r}")
        if self.cloud not in _MD_FUNC:
            raise ValueError(f"cloud must be one of {sorted(_MD_FUNC)}, got {self.cloud!r}")
        for name in ("ray_port", "dashboard_port"):
            port = getattr(self, name)
            if not 1 <= int(port) <= 65535:
                raise ValueError(f"{name} must be a TCP port 1..65535, got {port!r}")
        check_build(self.build, self.extras)
        key = self.ssh_authorized_key
        if key is not None and (self.role != "head" or not re.fullmatch(r"[ -~]+", key) or " ssh-" not in key):
            raise ValueError(f"ssh_authorized_key: one printable authorized_keys line, on a head only, got {key!r}")
        bad = [k for k in self.env if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", k)]
        if bad:
            raise ValueError(f"env: variable names must be [A-Z_][A-Z0-9_]*, got {bad!r}")


def check_build(b: BootBuild | None, extras: str) -> None:
    """What :func:`install_script` renders into bash is well-formed (ValueError otherwise): a
    16-hex build id, a 64-hex sha256, a spotwise wheel name, comma-separated lowercase extras."""
    if not re.fullmatch(r"[a-z0-9,]*", extras):
        raise ValueError(f"extras must be comma-separated lowercase names, got {extras!r}")
    if b is not None and not (re.fullmatch(r"[0-9a-f]{16}", b.build_id) and re.fullmatch(r"[0-9a-f]{64}", b.sha256)
                              and re.fullmatch(r"spotwise-[A-Za-z0-9.+]+-py3-none-any\.whl", b.name)):
        raise ValueError(f"build: a 16-hex build id, a 64-hex sha256 and a spotwise wheel name, got {b!r}")


def label_value(v: str) -> str:
    """A string as a valid Ray/GCP label value (``[a-zA-Z0-9_.-]``, <= 63 chars, not empty)."""
    v = _LABEL_VALUE.sub("-", str(v)).strip("-_.")[:63]
    return v or "none"


def instance_label_value(instance_id: str) -> str:
    """The ``spotwise-instance`` label value the boot script gives the node of ``instance_id``: what
    its ``tr -c 'a-zA-Z0-9_.-' '-' | cut -c1-63`` makes of the id (every other character a dash,
    at most 63). The orchestrator's join watchdog (:mod:`spotwise.engine.run.joins`) finds a node's
    Ray node by it."""
    return _LABEL_VALUE.sub("-", str(instance_id))[:63]


def ray_labels(spec: BootstrapSpec) -> dict[str, str]:
    """Static labels of the node (the instance id is added at boot, from metadata)."""
    labels = {
        "spotwise-cloud": spec.cloud, "spotwise-region": spec.region, "spotwise-zone": spec.zone,
        "spotwise-market": spec.market, "spotwise-job": spec.job_id,
        "spotwise-cluster": spec.cluster_id, "spotwise-role": spec.role,
        "spotwise-instance-type": spec.instance_type,
    }
    labels.update(spec.extra_labels)
    return {k: label_value(v) for k, v in labels.items()}


#: how a node of each cloud ends itself (:func:`spotwise.runtime.node.deadman.end_self`): an EC2
#: instance's shutdown behaviour is *terminate*, so a guest shutdown ends its bill; a GCP VM would
#: be left TERMINATED with its disk billed, so it deletes itself (Azure: see ``AzureCloud``)
SELF_END = {"gcp": "gcp"}


def watch_command(spec: BootstrapSpec) -> list[str]:
    """The interruption watcher's argv (the module belongs to the runtime); ``$``-variables are
    filled in by the script at boot. The watcher is also the node's dead man's switch
    (:mod:`spotwise.runtime.node.deadman`): ``$LEASE_DEADLINE`` is the boot lease (the watcher's start
    + ``BOOT_LEASE_S``), after which a node that never heard from its runner shuts itself down."""
    return ["python", "-m", "spotwise.runtime.node.watch", "--cloud", spec.cloud,
            "--metadata-url", "$METADATA_URL", "--instance-id", "$INSTANCE_ID", "--gcs-address", "$HEAD",
            "--lease-deadline", "$LEASE_DEADLINE", "--self-end", SELF_END.get(spec.cloud, "shutdown"),
            *spec.watch_args]


def ray_start_command(spec: BootstrapSpec) -> str:
    """``ray start --block`` for the node (run in the background by the script, pid recorded)."""
    labels = ",".join(f"{k}={v}" for k, v in ray_labels(spec).items())
    common = (f'--block {" ".join(RAY_NODE_FLAGS)} --node-ip-address="$NODE_IP" --num-gpus="$NUM_GPUS" '
              f'--labels="{labels},{INSTANCE_LABEL}=$INSTANCE_LABEL_VALUE"')
    if spec.role == "head":
        res = shlex.quote('{"%s": 1}' % HEAD_RESOURCE)
        return (f'"$VENV/bin/python" -m ray.scripts.scripts start --head {common} --port={spec.ray_port} '
                f'--dashboard-host="$NODE_IP" --dashboard-port={spec.dashboard_port} '
                f'--resources={res} $RAY_START_ARGS')
    res = shlex.quote('{"%s": 1}' % WORKER_RESOURCE)
    return f'"$VENV/bin/python" -m ray.scripts.scripts start --address="$HEAD" {common} --resources={res} $RAY_START_ARGS'


#: the image's Python, in the order tried: an explicit one, the image's own venv where ``$VENV`` was
#: one (its packages stay visible in the venv beside it), a DL image's torch environment, then
#: the newest python3.X on PATH; the first >= 3.11 is used
PYTHON_CANDIDATES = ('"${SPOTWISE_PYTHON:-}"', '"${IMAGE_VENV:+$IMAGE_VENV/bin/python}"', "/opt/pytorch/bin/python",
                     "/opt/conda/bin/python3",
                     "python3.13", "python3.12", "python3.11", "python3")
#: seconds a GPU node waits for its NVIDIA driver (``nvidia-smi``) before starting Ray with the GPUs
#: it sees: a GCP Deep Learning image installs the driver at first boot, which takes minutes
GPU_WAIT_S = 600


def _install_block(spec: BootstrapSpec) -> str:
    """Step 2 of the script: install the shipped build unless ``$VENV`` already has it."""
    return install_script(spec.build, spec.extras)


#: the GCS JSON API a GCP node fetches a ``gs://`` wheel from (``SPOTWISE_GCS_ENDPOINT`` overrides)
GCS_API = "https://storage.googleapis.com"


def _fetch_wheel(url: str) -> str:
    """Bash that downloads the shipped wheel to ``$WHEEL.part``: a (presigned, ``file://``) URL with
    ``curl``; a ``gs://`` object as the node's own service account, with a token from the GCP
    metadata server (``$METADATA_URL``) on the JSON API's media download. The token goes to curl on
    stdin, never on a command line other users of the node could read."""
    q = shlex.quote
    retry = "--retry 5 --retry-delay 2 --retry-all-errors"
    if url.startswith("az://"):
        return _fetch_az(url, retry)
    if not url.startswith("gs://"):
        return f'  curl -fsS {retry} -o "$WHEEL.part" {q(url)}'
    from urllib.parse import quote

    bucket, _, obj = url[len("gs://"):].partition("/")
    path = f"/storage/v1/b/{quote(bucket, safe='')}/o/{quote(obj, safe='')}?alt=media"
    return (f'  TOKEN=$(curl -fsS {retry} -H "Metadata-Flavor: Google" '
            '"$METADATA_URL/computeMetadata/v1/instance/service-accounts/default/token" | '
            '"$PY" -c \'import json, sys; print(json.load(sys.stdin)["access_token"])\') || '
            '{ echo "spotwise: no service-account token from the metadata server: the node cannot read its '
            'storage" >&2; exit 1; }\n'
            f'  printf \'Authorization: Bearer %s\\n\' "$TOKEN" | curl -fsS {retry} -H @- -o "$WHEEL.part" '
            f'"${{SPOTWISE_GCS_ENDPOINT:-{GCS_API}}}"{q(path)}')


#: the Blob service version an OAuth request names (bearer tokens need 2017-11-09 or later)
AZ_BLOB_VERSION = "2021-08-06"
#: the managed-identity token audience of Azure Storage
AZ_STORAGE_RESOURCE = "https://storage.azure.com/"


def _fetch_az(url: str, retry: str) -> str:
    """Bash that downloads an ``az://ACCOUNT/CONTAINER/BLOB`` wheel as the Azure node's managed
    identity: a token for Azure Storage from IMDS (``$METADATA_URL``; the identity named by
    ``$SPOTWISE_AZURE_STORAGE_IDENTITY`` when set, as ``msi_res_id``), then a Get Blob with it on
    the account's blob endpoint (``$SPOTWISE_AZURE_BLOB_ENDPOINT`` with ``{account}`` filled in,
    else ``https://ACCOUNT.blob.core.windows.net``). No SAS, no key: the URI in the VM's custom data
    is worthless without the node's identity. The token goes to curl on stdin."""
    from urllib.parse import quote

    q = shlex.quote
    account, _, blob = url[len("az://"):].partition("/")
    resource = quote(AZ_STORAGE_RESOURCE, safe="")
    return (f'  AZ_EP=https://{account}.blob.core.windows.net\n'
            '  if [ -n "${SPOTWISE_AZURE_BLOB_ENDPOINT:-}" ]; then '
            f'AZ_EP="${{SPOTWISE_AZURE_BLOB_ENDPOINT//"{{account}}"/{account}}}"; fi\n'
            '  AZ_ID=""\n'
            '  if [ -n "${SPOTWISE_AZURE_STORAGE_IDENTITY:-}" ]; then AZ_ID="&msi_res_id=$("$PY" -c '
            '\'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))\' '
            '"$SPOTWISE_AZURE_STORAGE_IDENTITY")"; fi\n'
            f'  TOKEN=$(curl -fsS {retry} -H "Metadata: true" '
            f'"$METADATA_URL/metadata/identity/oauth2/token?api-version=2018-02-01&resource={resource}$AZ_ID" | '
            '"$PY" -c \'import json, sys; print(json.load(sys.stdin)["access_token"])\') || '
            '{ echo "spotwise: no managed-identity token from IMDS: the node cannot read its storage '
            '(SPOTWISE_AZURE_NODE_IDENTITY)" >&2; exit 1; }\n'
            f'  printf \'Authorization: Bearer %s\\n\' "$TOKEN" | curl -fsS {retry} -H @- '
            f'-H "x-ms-version: {AZ_BLOB_VERSION}" -o "$WHEEL.part" "${{AZ_EP%/}}"/{q(quote(blob, safe="/"))}')


#: Bash functions of the install (and of the torch step, which runs after it): ``sw_ours DIR``
#: whether DIR is a venv spotwise made (it holds the ``_spotwise_image.pth`` every one of ours
#: has, this version's and earlier ones'); ``sw_venv PY DIR``: DIR a fresh venv over ``PY`` whose
#: site packages (an image's torch, its Ray; its own venv's, where ``PY`` is in one) stay visible
#: behind the venv's own, with pip; but not Debian's shared ``/usr/lib/python3/dist-packages``
#: unless ``PY`` is the version of the distribution's own ``python3``: it holds packages built for it (a
#: python3.11 from Ubuntu 22.04's archive would otherwise import 3.10's compiled modules). ``sw_venv`` deletes DIR first only where it is one of ours: an
#: image's own environment is never deleted (issue 48, item 7).
VENV_FUNCTIONS = r"""sw_ours() { compgen -G "$1/lib/python3*/site-packages/_spotwise_image.pth" >/dev/null; }
sw_venv() {
  if [ -e "$2" ]; then sw_ours "$2" || { echo "spotwise: $2 is not spotwise's: not replacing it" >&2; exit 1; }; rm -rf "$2"; fi
  "$1" -m venv --without-pip "$2"
  local site; site=$("$2/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$1" -c 'import os, sys; d = os.path.basename(os.path.realpath("/usr/bin/python3")) == "python%d.%d" % sys.version_info[:2]
print("\n".join(p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and (d or "/python3/" not in p)))' >"$site/_spotwise_image.pth"
  "$2/bin/python" -m pip --version >/dev/null 2>&1 || "$2/bin/python" -m ensurepip --default-pip >/dev/null
}"""


def install_script(b: BootBuild | None, extras: str) -> str:
    """Bash that installs the shipped build ``b`` into ``$VENV`` unless it already reports that
    build id: fetch the wheel (``curl``: its URL may be ``file://``, ``https://``; a ``gs://`` one
    with the GCP node's own token, :func:`_fetch_wheel`), refuse it
    unless its sha256 is ``b.sha256``, make ``$VENV`` a venv over the image's Python (the first of
    :data:`PYTHON_CANDIDATES` that is >= 3.11; ``$SPOTWISE_PYTHON`` first) whose site packages stay
    visible, ``pip install`` the wheel (its dependencies only where the image lacks some), check the
    venv reports the build id, and log the wheel's name, sha256 and build id. An image without a
    Python >= 3.11 but with apt (Ubuntu 22.04: python3 is 3.10, 3.11 is in its archive) gets
    ``python3.11`` from its archive: a cloud image has no package lists, so ``apt-get update``
    first, tried again while cloud-init or unattended-upgrades hold its lock at first boot
    (``DPkg::Lock::Timeout`` does not cover it), then ``apt-get install`` with
    ``-o DPkg::Lock::Timeout=600`` (apt >= 1.9.11 waits for dpkg's lock); apt's output is in
    ``$STATE_DIR/apt.log`` and a failure is one line with apt's first error, ``exit 1``. The image's
    torch is then not usable (built for its 3.10): pip brings one, which a GPU node's torch step
    makes fit its driver. The wheel is kept in
    ``$STATE_DIR``. A failure is ``exit 1`` with one line on stderr. Cloud boot scripts
    (:func:`render_script`) and Slurm nodes (:mod:`~spotwise.provisioner.clouds.slurm.script`) both run
    this one text. ``b`` None: only check that ``$VENV`` already has spotwise and Ray."""
    check_build(b, extras)
    if b is None:
        return (VENV_FUNCTIONS + '\n"$VENV/bin/python" -c "import spotwise, ray" >/dev/null 2>&1 || {\n'
                '  echo "spotwise: the launch shipped no build and $VENV has none" >&2; exit 1; }')
    bid, sha, name = b.build_id, b.sha256, b.name
    return f"""have_build() {{ "$VENV/bin/python" -c 'import sys, spotwise.build as b; sys.exit(b.build_id() != sys.argv[1])' "$1" >/dev/null 2>&1; }}
{VENV_FUNCTIONS}
image_python() {{
  local p
  for p in {" ".join(PYTHON_CANDIDATES)}; do
    [ -n "$p" ] && command -v "$p" >/dev/null 2>&1 || continue
    "$p" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && {{ command -v "$p"; return 0; }}
  done
  return 1
}}
if [ -e "$VENV" ] && ! sw_ours "$VENV" && {{ [ -e "$VENV-spotwise" ] || ! have_build {bid}; }}; then
  IMAGE_VENV="$VENV"; VENV="$VENV-spotwise"
  echo "spotwise: $IMAGE_VENV is the image's own venv, left as it is; the build goes in $VENV"
fi
if have_build {bid}; then
  echo "spotwise build {bid} already installed in $VENV ({name} sha256 {sha})"
else
  if ! PY=$(image_python) && command -v apt-get >/dev/null 2>&1; then
    # empty lists on a cloud image; first-boot jobs hold apt's locks (see install_script)
    echo "spotwise: no Python >= 3.11 on this image; installing python3.11 from its archive"
    export DEBIAN_FRONTEND=noninteractive
    for _ in $(seq 1 60); do apt-get -q update >"$STATE_DIR/apt.log" 2>&1 && break; sleep 5; done
    apt-get -q -y -o DPkg::Lock::Timeout=600 install python3.11 python3.11-venv >>"$STATE_DIR/apt.log" 2>&1 &&
      PY=$(image_python) || {{ echo "spotwise: apt-get could not install python3.11: $(grep -m1 '^E:' "$STATE_DIR/apt.log" || echo no python3.11 after it)" >&2; exit 1; }}
  fi
  [ -n "${{PY:-}}" ] || {{ echo "spotwise: no Python >= 3.11 on this image (set SPOTWISE_PYTHON, or use an image that has one)" >&2; exit 1; }}
  WHEEL="$STATE_DIR/{name}"
{_fetch_wheel(b.url)}
  GOT=$(sha256sum "$WHEEL.part" | cut -d' ' -f1)
  if [ "$GOT" != {sha} ]; then
    rm -f "$WHEEL.part"
    echo "spotwise: refusing the shipped build {name}: its sha256 is $GOT, the launch shipped {sha}" >&2; exit 1
  fi
  mv -f "$WHEEL.part" "$WHEEL"
  sw_venv "$PY" "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "$WHEEL"
  # its dependencies only where the image lacks some (the resolver costs seconds per boot)
  if ! "$VENV/bin/python" -m spotwise.build --unmet {extras or ","}; then
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$WHEEL[{extras}]"
  fi
  have_build {bid} || {{ echo "spotwise: installed {name} but $VENV does not report build {bid}" >&2; exit 1; }}
  echo "spotwise build {bid} installed from {name} sha256 {sha} (python $PY)"
fi"""


def _gpu_block(spec: BootstrapSpec) -> str:
    """A GPU node waits (bounded) for its NVIDIA driver, then tells Ray the GPUs it sees. Where it
    sees none when the wait ends (the driver never came up, or ``nvidia-smi`` lists no GPU) the
    boot ends: one line, ``exit 1``, before Ray and the watcher, so the node never joins with
    ``--num-gpus=0`` (Ray Train would then size the run to the cluster's smallest GPU count, 0, and
    train on CPUs at GPU prices); the orchestrator's join watchdog ends a node that never joins.
    ``SPOTWISE_CPU_STANDIN`` (set by the tests' emulators only, whose machines have no GPU) lets
    the node start Ray without GPUs instead."""
    if spec.accelerator_count <= 0:
        return 'NUM_GPUS=0'
    return f"""# GPUs: wait for the driver (an image may install it at first boot), then count them
GPU_WAIT_S="${{SPOTWISE_GPU_WAIT_S:-{GPU_WAIT_S}}}"
NUM_GPUS=0
for _ in $(seq 0 5 "$GPU_WAIT_S"); do
  NUM_GPUS=$({GPU_COUNT} || true)
  [ "${{NUM_GPUS:-0}}" -ge {spec.accelerator_count} ] && break
  [ "$GPU_WAIT_S" -gt 0 ] && sleep 5
done
NUM_GPUS=${{NUM_GPUS:-0}}
echo "spotwise: $NUM_GPUS GPU(s) visible ({spec.accelerator_count} expected for {spec.instance_type})"
if [ "$NUM_GPUS" -lt 1 ]; then
  [ -n "${{SPOTWISE_CPU_STANDIN:-}}" ] || {{ echo "spotwise: no GPU visible after $GPU_WAIT_S s of waiting for the driver ({spec.accelerator_count} expected for {spec.instance_type}): a GPU node does not start Ray without its GPUs" >&2; exit 1; }}
  echo "spotwise: a CPU stand-in for a GPU node (SPOTWISE_CPU_STANDIN): Ray starts with no GPU"
fi
"""


def _torch_fit_block(spec: BootstrapSpec) -> str:
    """After the GPU wait: a GPU node's torch must use its GPUs — the venv's torch passes a real
    CUDA check, or the same torch version built for a CUDA that fits the driver replaces it, or the
    boot ends before Ray (:mod:`~spotwise.provisioner.boot.torch_fit`). Nothing on a CPU node."""
    if spec.accelerator_count <= 0:
        return ""
    return "# the venv's torch must use these GPUs (a build that fits the driver), or the boot ends here\n" \
        + torch_fit_block()


def _env_block(spec: BootstrapSpec) -> str:
    """``export`` of the spec's ``env``, inherited by the install, Ray and the watcher."""
    if not spec.env:
        return ""
    lines = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in sorted(spec.env.items()))
    return f"# the node's settings for its storage (its own identity)\n{lines}\n"


#: the head's user the launcher's cluster key logs in as (``head_path.SSH_USER``: forwards only)
SSH_USER = "spotwise"


def ssh_block(spec: BootstrapSpec) -> str:
    """Bash that authorizes the launcher's cluster key for :data:`SSH_USER` (made without a login
    shell; the key line itself allows port forwarding only), once: the head is reached through ssh
    port forwards (:mod:`spotwise.provisioner.head_path`). ``$SPOTWISE_AUTHORIZED_KEYS`` names
    another file (the emulators' per-head sshd). Empty when the spec carries no key."""
    if not spec.ssh_authorized_key:
        return ""
    line, u = shlex.quote(spec.ssh_authorized_key), SSH_USER
    return f"""
# 0. the launcher's key for this cluster: ssh port forwards to the dashboard and control endpoint
AUTH_KEYS="${{SPOTWISE_AUTHORIZED_KEYS:-}}"
if [ -z "$AUTH_KEYS" ]; then
  id -u {u} >/dev/null 2>&1 || useradd --create-home --shell /usr/sbin/nologin {u}
  install -d -m 700 -o {u} -g {u} /home/{u}/.ssh
  AUTH_KEYS=/home/{u}/.ssh/authorized_keys
fi
grep -qxF {line} "$AUTH_KEYS" 2>/dev/null || echo {line} >>"$AUTH_KEYS"
[ -n "${{SPOTWISE_AUTHORIZED_KEYS:-}}" ] || {{ chown {u}:{u} "$AUTH_KEYS"; chmod 600 "$AUTH_KEYS"; }}
"""


def render_script(spec: BootstrapSpec) -> str:
    """The bash boot script for ``spec`` (plain text; each cloud module encodes it as it needs)."""
    q = shlex.quote
    env_lines = "\n".join(f"SPOTWISE_{k}={q(v)}" for k, v in [
        ("CLOUD", spec.cloud), ("CLUSTER", spec.cluster_id), ("JOB", spec.job_id),
        ("ROLE", spec.role), ("REGION", spec.region), ("ZONE", spec.zone),
        ("MARKET", spec.market), ("INSTANCE_TYPE", spec.instance_type)])
    paths = _MD_PATHS[spec.cloud]
    watch = " ".join(a if a.startswith("$") else q(a) for a in watch_command(spec)[1:])
    watch = watch.replace("$METADATA_URL", '"$METADATA_URL"').replace("$INSTANCE_ID", '"$INSTANCE_ID"') \
                 .replace("$HEAD", '"$HEAD"').replace("$LEASE_DEADLINE", '"$LEASE_DEADLINE"')
    if spec.role == "head":
        head_block = f'HEAD="$NODE_IP:{spec.ray_port}"'
    elif spec.head_address:
        head_block = f"HEAD={q(spec.head_address)}"
    else:
        head_block = (
            "HEAD=\"\"\n"
            "for _ in $(seq 1 120); do\n"
            f"  HEAD=$(md {q(paths['head'])} 2>/dev/null || true)\n"
            '  [ -n "$HEAD" ] && break\n'
            "  sleep 5\n"
            "done\n"
            '[ -n "$HEAD" ] || { echo "spotwise: no head address in metadata key '
            f'{HEAD_KEY}" >&2; exit 1; }}')
    # Ray runs under a small supervisor subshell (the pidfile names it). A worker first waits for its
    # head: a cloud boots a launch's nodes at once, so a worker can get here before its head's GCS
    # listens, and `ray start --address` gives up after ~20 s. The wait is bounded by the boot lease
    # and runs in the background (the watcher, the node's dead man's switch, starts now). Then
    # `ray start --block` (which returns only when Ray ends) gets up to RAY_START_ATTEMPTS tries:
    # a raylet that dies at start (seen: a Unix socket or port already taken) fails `ray start`
    # after Ray's fixed 30 s registration timeout, and a failed start leaves none of its processes
    # behind; without a retry the node would bill unused until the orchestrator's join timeout.
    wait_head = "" if spec.role == "head" else (
        f"    for _ in $(seq 1 {int(BOOT_LEASE_S) // 2}); do\n"
        '      timeout 3 bash -c \'exec 3<>"/dev/tcp/${0%:*}/${0##*:}"\' "$HEAD" 2>/dev/null && break\n'
        '      echo "waiting for the head\'s GCS at $HEAD"; sleep 2\n'
        "    done\n")
    ray_launch = (
        "  ( trap '' HUP\n"
        f"{wait_head}"
        f"    for attempt in $(seq 1 {RAY_START_ATTEMPTS}); do\n"
        f"      {ray_start_command(spec)} && break\n"
        f'      echo "spotwise: ray start ended with status $? (attempt $attempt of {RAY_START_ATTEMPTS})"; sleep 5\n'
        '    done ) >>"$STATE_DIR/ray.log" 2>&1 &')
    return f"""#!/bin/bash
# spotwise node bootstrap ({spec.cloud}, {spec.role}) — idempotent: safe to run on every boot.
set -euo pipefail
STATE_DIR="${{SPOTWISE_STATE_DIR:-/var/lib/spotwise}}"
ETC_DIR="${{SPOTWISE_ETC_DIR:-/etc/spotwise}}"
VENV="${{SPOTWISE_VENV:-/opt/spotwise/venv}}"
METADATA_URL="${{SPOTWISE_METADATA_URL:-{_METADATA_BASE[spec.cloud]}}}"
RAY_START_ARGS="${{SPOTWISE_RAY_START_ARGS:-}}"
mkdir -p "$STATE_DIR" "$ETC_DIR"
exec >>"$STATE_DIR/bootstrap.log" 2>&1
echo "spotwise bootstrap start $(date -u +%FT%TZ)"
{_MD_FUNC[spec.cloud]}
alive() {{ [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }}
{ssh_block(spec)}
# 1. node identity (same bytes on every run; written atomically)
cat >"$ETC_DIR/node.env.tmp" <<'SPOTWISE_ENV'
{env_lines}
SPOTWISE_ENV
mv -f "$ETC_DIR/node.env.tmp" "$ETC_DIR/node.env"

{_env_block(spec)}
# 2. runtime: the build the launch shipped, in a venv over the image's Python
{_install_block(spec)}
export PATH="$VENV/bin:$PATH"   # Ray's job drivers and workers run this venv's python
echo "$VENV" >"$STATE_DIR/venv"  # for the shutdown hold (GCP: clouds/gcp/shutdown.py)
# store keys an image provides where the node has no role for its store (module docstring, step 2)
if [ -f "$ETC_DIR/storage.env" ]; then set -a; . "$ETC_DIR/storage.env"; set +a; fi

# 3. who am I (instance metadata): id for the watcher's label, private address for Ray
INSTANCE_ID=""; NODE_IP=""
for _ in $(seq 1 60); do
  INSTANCE_ID=$(md {q(paths['id'])} 2>/dev/null || true)
  NODE_IP=$(md {q(paths['ip'])} 2>/dev/null || true)
  [ -n "$INSTANCE_ID" ] && [ -n "$NODE_IP" ] && break
  sleep 2
done
[ -n "$INSTANCE_ID" ] && [ -n "$NODE_IP" ] || {{ echo "spotwise: no instance id/address from $METADATA_URL" >&2; exit 1; }}
INSTANCE_LABEL_VALUE=$(printf '%s' "$INSTANCE_ID" | tr -c 'a-zA-Z0-9_.-' '-' | cut -c1-63)

{_gpu_block(spec)}{_torch_fit_block(spec)}
# 4. Ray ({spec.role}) — this node's own Ray, tracked by its pidfile
{head_block}
echo "$HEAD" >"$STATE_DIR/head_address"
if alive "$STATE_DIR/ray.pid"; then
  echo "ray already running"
else
{ray_launch}
  echo $! >"$STATE_DIR/ray.pid"
fi

# 5. interruption watcher
if alive "$STATE_DIR/watch.pid"; then
  echo "watcher already running"
else
  LEASE_DEADLINE=$(( $(date +%s) + {int(BOOT_LEASE_S)} ))
  nohup "$VENV/bin/python" {watch} >>"$STATE_DIR/watch.log" 2>&1 &
  echo $! >"$STATE_DIR/watch.pid"
fi
echo "spotwise bootstrap done"
"""
