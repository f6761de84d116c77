"""AWS: GPU nodes from one EC2 Fleet ``Type=instant`` call per launch.

Why EC2 Fleet instant: one synchronous call tries several instance types × subnets (AZs) with
an allocation strategy — ``price-capacity-optimized`` for spot by default (the pools least likely
to be interrupted among the cheap ones; ``lowest-price`` only when asked), ``lowest-price`` or
``prioritized`` for on-demand — and reports per-override errors in the response's ``Errors`` list
instead of failing the whole call. Those errors, and raised ``ClientError``s, are mapped to the
typed errors of :mod:`spotwise.provisioner.base` **by error code**, never by message text.

Every resource carries the spotwise tags: the launch template, the fleet, the instances and
their volumes. The launch template is deleted right after the instant fleet returns (an instant
fleet no longer needs it); ``gc`` also sweeps templates a crash left behind. Instances require
IMDSv2 (``HttpTokens=required``) and expose their tags to IMDS so a worker can read the head
address from its ``spotwise-head`` tag.

The SDK is the ``spotwise[aws]`` extra (boto3), imported where it is used.

Endpoint: boto3 honours ``AWS_ENDPOINT_URL`` natively (moto_server in tests).
Configuration (constructor argument, else environment): ``image_id``/``SPOTWISE_AWS_AMI``,
``subnet_ids``/``SPOTWISE_AWS_SUBNETS``, ``regions``/``SPOTWISE_AWS_REGIONS`` (scanned by
``gc``/``down``; a run lists only its own regions), ``spot_strategy``/``SPOTWISE_AWS_SPOT_STRATEGY``.

Eventual consistency: EC2 may answer ``InvalidInstanceID.NotFound`` to a describe or tag right after
``CreateFleet``, and ``InvalidGroup.NotFound`` to an ingress rule right after
``CreateSecurityGroup`` ("Eventual consistency in the Amazon EC2 API"). Those reads are retried
with backoff for at most :data:`~spotwise.provisioner.clouds.aws.network.CONSISTENCY_WAIT_S` of sleeping
(:meth:`~spotwise.provisioner.clouds.aws.network.ClusterNetwork._after_create`); instances still not
described then are ended before the launch fails, so nothing launched is left billing unknown.
"""

from __future__ import annotations

import base64
import logging
import time
import uuid
from datetime import datetime, timezone
from types import ModuleType
from typing import Any, Callable

from spotwise.config import setting
from spotwise.errors import InputError, Problem
from spotwise.extras import require
from spotwise.pricing.offer import Market, Offer
from spotwise.provisioner import base
from spotwise.provisioner.base import (
    TAG_CLUSTER, TAG_JOB, TAG_MARKET, TAG_ROLE, AuthError, CapacityError, Cloud, ErrorCodes, LaunchRequest,
    Node, ProvisionError, SiteError, cluster_tags, env_cidrs, env_list, env_ports, most_severe, register_cloud)
from spotwise.provisioner.clouds.aws.network import ClusterNetwork
from spotwise.provisioner.clouds.aws.network import ec2_tags as _tags
from spotwise.provisioner.boot.script import BootstrapSpec, render_script
from spotwise.provisioner.head_path import authorized_key_line, head_path
from spotwise.utils.retry import with_backoff

log = logging.getLogger(__name__)

TAG_PRICE = "spotwise-usd-per-hour"
TAG_PRICE_SOURCE = "spotwise-price-source"
DEFAULT_HEAD_TYPE = "m6i.large"
TAG_TYPE_LIVE = ("pending", "running", "stopping", "stopped")
INSTANCE_NOT_FOUND = frozenset({"InvalidInstanceID.NotFound"})

def _sdk(module: str = "boto3") -> ModuleType:
    """boto3 (or one of its modules), or a MissingExtra naming ``spotwise[aws]``."""
    return require(module, "aws", "the AWS cloud")


CAPACITY_CODES = frozenset({
    "InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientHostCapacity",
    "InsufficientReservedInstanceCapacity", "InsufficientCapacityOnOutpost", "UnfulfillableCapacity",
    "SpotMaxPriceTooLow", "MaxSpotInstanceCountExceeded_Pool", "Unsupported",
    "InsufficientFreeAddressesInSubnet", "capacity-not-available", "price-too-low",
})
QUOTA_CODES = frozenset({
    "VcpuLimitExceeded", "InstanceLimitExceeded", "MaxSpotInstanceCountExceeded",
    "MaxSpotFleetRequestCountExceeded", "MaxFleetCountExceeded", "TargetCapacityLimitExceededException",
    "LaunchTemplateLimitExceeded", "ResourceLimitExceeded",
})
AUTH_CODES = frozenset({
    "AuthFailure", "UnauthorizedOperation", "InvalidClientTokenId", "SignatureDoesNotMatch",
    "ExpiredToken", "RequestExpired", "OptInRequired", "Blocked", "AccessDenied",
    "AccessDeniedException", "UnrecognizedClientException", "PendingVerification",
})
THROTTLE_CODES = frozenset({
    "RequestLimitExceeded", "Throttling", "ThrottlingException", "TooManyRequestsException",
    "EC2ThrottledException", "RequestThrottled", "ServiceUnavailable", "Unavailable",
})

SPOT_STRATEGIES = ("price-capacity-optimized", "lowest-price", "capacity-optimized",
                   "capacity-optimized-prioritized", "diversified")
ON_DEMAND_STRATEGIES = ("lowest-price", "prioritized")

# The Deep Learning AMI (NVIDIA driver, CUDA, PyTorch in /opt/pytorch; Ubuntu 24.04, so Python 3.12)
# through the SSM parameter Amazon publishes for its latest release in each region, not a name
# pattern (anyone can name an AMI anything). SPOTWISE_AWS_AMI_PARAMETER picks another one.
DLAMI_PARAMETER = "/aws/service/deeplearning/ami/x86_64/oss-nvidia-driver-gpu-pytorch-2.9-ubuntu-24.04/latest/ami-id"


CODES = ErrorCodes(auth=AUTH_CODES, quota=QUOTA_CODES, capacity=CAPACITY_CODES, throttle=THROTTLE_CODES)


def error_code(exc: BaseException) -> str | None:
    """The AWS error code of a botocore ``ClientError`` (None for anything else)."""
    resp = getattr(exc, "response", None)
    if isinstance(resp, dict):
        return (resp.get("Error") or {}).get("Code")
    return None


def _is_throttle(exc: BaseException) -> bool:
    return error_code(exc) in THROTTLE_CODES


@register_cloud("aws")
class AwsCloud(ClusterNetwork, Cloud):
    """EC2 through boto3. Stateless apart from cached clients (and the security group of each
    cluster it prepared); the cluster's network lifecycle is :class:`~spotwise.provisioner.clouds.aws.network.ClusterNetwork`'s."""

    supports_alternatives = True  # one fleet call tries every offer of the site (overrides)
    notice_window_s = 120.0       # the two-minute spot interruption notice
    head_over_ssh = True          # the launcher reaches the head over ssh unless SPOTWISE_HEAD_PATH=private
    listing_lag_s = 60.0          # DescribeInstances may lack an instance for a while after CreateFleet
    default_storage_setting = "SPOTWISE_AWS_STORAGE"

    def __init__(self, *, session: Any = None, image_id: str | None = None,
                 subnet_ids: list[str] | None = None, regions: list[str] | None = None,
                 spot_strategy: str | None = None, on_demand_strategy: str = "lowest-price",
                 iam_instance_profile: str | None = None, key_name: str | None = None,
                 security_group_ids: list[str] | None = None, root_volume_gib: int = 200,
                 sleep: Callable[[float], None] = time.sleep, attempts: int = 6) -> None:
        self._session = session or _sdk().session.Session()
        self.image_id = image_id or setting("SPOTWISE_AWS_AMI") or None
        self.ami_parameter = setting("SPOTWISE_AWS_AMI_PARAMETER") or DLAMI_PARAMETER
        self.subnet_ids = subnet_ids or env_list("SPOTWISE_AWS_SUBNETS")
        # public subnets for a head the launcher reaches over ssh (infra/aws head_subnet_ids)
        self.head_subnet_ids = env_list("SPOTWISE_AWS_HEAD_SUBNETS")
        self.regions = regions or env_list("SPOTWISE_AWS_REGIONS")
        self.spot_strategy = spot_strategy or setting("SPOTWISE_AWS_SPOT_STRATEGY") or "price-capacity-optimized"
        if self.spot_strategy not in SPOT_STRATEGIES:
            raise InputError(Problem("spot_strategy", self.spot_strategy, ", ".join(SPOT_STRATEGIES)), source="aws")
        if on_demand_strategy not in ON_DEMAND_STRATEGIES:
            raise InputError(Problem("on_demand_strategy", on_demand_strategy, ", ".join(ON_DEMAND_STRATEGIES)),
                             source="aws")
        self.on_demand_strategy = on_demand_strategy
        self.iam_instance_profile = iam_instance_profile or setting("SPOTWISE_AWS_INSTANCE_PROFILE")
        self.key_name = key_name
        self.security_group_ids = security_group_ids or env_list("SPOTWISE_AWS_SECURITY_GROUPS")
        self.root_volume_gib = root_volume_gib
        self._sleep = sleep
        self._attempts = attempts
        self._clients: dict[str, Any] = {}
        self.head_type = setting("SPOTWISE_AWS_HEAD_TYPE") or DEFAULT_HEAD_TYPE
        # The orchestrator reaches the head's dashboard and control endpoint at its private address
        # (from inside the VPC: see docs/orchestrator.md); these CIDRs may reach those ports.
        self.client_cidrs = env_cidrs("SPOTWISE_AWS_CLIENT_CIDRS", "aws")
        self.ray_port, self.dashboard_port, self.control_port = env_ports("aws")
        self._groups: dict[tuple[str, str], str] = {}   # (cluster id, region) -> its security group id
        self._root_devices: dict[tuple[str, str], str] = {}   # (region, image id) -> its root device name
        self.skipped_regions: dict[str, str] = {}
        self._enabled: list[str] | None = None
        self._home_region = getattr(self._session, "region_name", None) or "us-east-1"

    # -- what a run needs beyond launch/terminate ------------------------------------------------
    def head_offer(self, region: str, zone: str) -> Offer:
        """The on-demand head (``m6i.large`` unless ``SPOTWISE_AWS_HEAD_TYPE``); a region without a
        price row is charged us-east-1's price and says so."""
        return base.head_offer("aws", self.head_type, region, zone, fallback_region="us-east-1",
                               env_var="SPOTWISE_AWS_HEAD_TYPE")

    def leftovers(self, cluster_ids: set[str], *, match: bool, dry_run: bool) -> list[str]:
        """Launch templates a crash left and security groups (with the network interfaces they
        still hold) of ``cluster_ids`` (``match``) or of every other cluster."""
        out: list[str] = []
        tpls = [t for t in self.list_templates() if (t[2] in cluster_ids) == match]
        if tpls and not dry_run:
            self.delete_templates(tpls)
        out += [f"aws launch template {t[1]} ({t[0]})" for t in tpls]
        groups = [g for g in self.list_security_groups() if (g[2] in cluster_ids) == match]
        if groups and not dry_run:
            out += self.delete_security_groups(groups)
        elif groups:
            out += [f"aws security group {g[1]} ({g[0]})" for g in groups]
        return out

    # -- plumbing --------------------------------------------------------------------------------
    def client(self, region: str):
        if region not in self._clients:
            self._clients[region] = self._session.client("ec2", region_name=region)
        return self._clients[region]

    def classify(self, exc: BaseException) -> type[ProvisionError]:
        """By the botocore error code (:data:`CODES`); no credentials at all is an AuthError."""
        if isinstance(exc, ProvisionError):
            return type(exc)
        if isinstance(exc, _sdk("botocore.exceptions").NoCredentialsError):
            return AuthError
        return CODES.kind(error_code(exc))

    def _call(self, region: str, op: str, **kw) -> dict:
        """One EC2 call: throttling retried with backoff, other ClientErrors mapped by code."""
        errors = _sdk("botocore.exceptions")
        fn = getattr(self.client(region), op)
        try:
            return with_backoff(lambda: fn(**kw), should_retry=_is_throttle, attempts=self._attempts,
                                sleep=self._sleep)
        except errors.NoCredentialsError:
            raise self._no_credentials() from None
        except errors.ClientError as e:
            code = error_code(e)
            cls = self.classify(e)
            raise cls(f"aws {op} in {region} failed: {code}: {e.response['Error'].get('Message', '')}",
                      cloud="aws", region=region, code=code) from None

    def _no_credentials(self) -> AuthError:
        return AuthError("aws: no credentials found; set AWS_PROFILE or AWS_ACCESS_KEY_ID/"
                         "AWS_SECRET_ACCESS_KEY (or run on an instance with a role)", cloud="aws")

    def check_credentials(self) -> None:
        """The session has credentials (a profile, keys, an instance role); they are not called."""
        if self._session.get_credentials() is None:
            raise self._no_credentials()

    # -- validation (before anything is created) ------------------------------------------------
    def _offer_problems(self, req: LaunchRequest, offer: Offer) -> list[Problem]:
        """One fleet call is one region and one market: every alternative must share them."""
        problems = []
        if offer.region != req.offer.region:
            problems.append(Problem("offer.region", offer.region, f"{req.offer.region} (one region per launch)"))
        if offer.market != req.offer.market:
            problems.append(Problem("offer.market", offer.market.value,
                                    f"{req.offer.market.value} (one market per launch)"))
        return problems

    @classmethod
    def storage_identity_problem(cls, storage_uri: str) -> Problem | None:
        """An AWS node reaches ``s3://`` storage with its instance profile's role (IMDS
        credentials), never with keys: without ``SPOTWISE_AWS_INSTANCE_PROFILE`` it could fetch
        nothing and checkpoint nothing, so the launch is refused before anything starts."""
        if storage_uri.startswith("s3://") and not setting("SPOTWISE_AWS_INSTANCE_PROFILE"):
            return Problem("SPOTWISE_AWS_INSTANCE_PROFILE", None,
                           f"the instance profile AWS nodes carry, whose role may read and write {storage_uri} "
                           "(infra/aws creates 'spotwise-node'); nodes reach storage with their own identity")
        return None

    def _image(self, region: str) -> str:
        if self.image_id:
            return self.image_id
        errors = _sdk("botocore.exceptions")
        ssm = self._session.client("ssm", region_name=region)
        try:
            return str(with_backoff(lambda: ssm.get_parameter(Name=self.ami_parameter), should_retry=_is_throttle,
                                    attempts=self._attempts, sleep=self._sleep)["Parameter"]["Value"])
        except errors.ClientError as e:
            if error_code(e) != "ParameterNotFound":
                raise self.classify(e)(f"aws ssm GetParameter {self.ami_parameter} in {region} failed: "
                                       f"{error_code(e)}", cloud="aws", region=region, code=error_code(e)) from None
            raise SiteError(Problem("SPOTWISE_AWS_AMI", None,
                                    f"an AMI id for {region} (Amazon publishes no {self.ami_parameter} there; "
                                    "or set SPOTWISE_AWS_AMI_PARAMETER)"), cloud="aws", region=region) from None

    def _root_device(self, region: str, image_id: str) -> str:
        """The image's own root device name (DescribeImages' ``RootDeviceName``: ``/dev/sda1`` on
        Ubuntu images, ``/dev/xvda`` on Amazon Linux), once per (region, image). EC2 sizes the root
        volume only through a block device mapping at that name; a mapping at another name becomes
        a second, empty volume (EC2 user guide, "Block device mappings"). An image the region does
        not hold is a site error naming the setting."""
        key = (region, image_id)
        if key not in self._root_devices:
            try:
                images = self._call(region, "describe_images", ImageIds=[image_id]).get("Images") or []
            except ProvisionError as e:
                if not str(e.code or "").startswith("InvalidAMIID"):
                    raise
                images = []
            if not images:
                raise SiteError(Problem("SPOTWISE_AWS_AMI", image_id, f"an AMI that exists in {region}"),
                                cloud="aws", region=region)
            self._root_devices[key] = str(images[0].get("RootDeviceName") or "/dev/sda1")
        return self._root_devices[key]

    # -- the request ------------------------------------------------------------------------------
    def _overrides(self, req: LaunchRequest, subnets: list[dict]) -> list[dict]:
        """One override per (offer, subnet in the offer's zone); ``Priority`` follows plan order."""
        out, seen = [], set()
        for prio, o in enumerate(req.offers):
            for s in subnets:
                if o.zone and o.zone not in (s["AvailabilityZone"], s.get("AvailabilityZoneId")):
                    continue
                key = (o.instance_type, s["SubnetId"])
                if key in seen:
                    continue
                seen.add(key)
                ov: dict[str, Any] = {"InstanceType": o.instance_type, "SubnetId": s["SubnetId"],
                                      "Priority": float(prio)}
                if req.max_price is not None and o.market is Market.SPOT:
                    ov["MaxPrice"] = f"{req.max_price:.4f}"
                out.append(ov)
        if not out:
            zones = sorted({o.zone for o in req.offers})
            raise SiteError(Problem("offer.zone", ", ".join(zones),
                                    "an AZ (name or id) with a subnet: "
                                    + ", ".join(f"{s['AvailabilityZone']}/{s.get('AvailabilityZoneId')}" for s in subnets)),
                            cloud="aws", region=req.offer.region)
        return out

    def cluster_tags(self, req: LaunchRequest) -> dict[str, str]:
        """The common tags plus the offer's price and a ``Name``; the head's address is a tag too
        (workers read it through IMDS)."""
        return cluster_tags(req, {TAG_PRICE: f"{req.offer.usd_per_hour:.6f}",
                                  "Name": f"spotwise-{req.cluster_id}-{req.role}"})

    def _user_data(self, req: LaunchRequest) -> str:
        o = req.offer
        script = render_script(BootstrapSpec(
            cloud="aws", cluster_id=req.cluster_id, job_id=req.job_id, role=req.role,
            region=o.region, zone=o.zone or "any", market=o.market.value, instance_type=o.instance_type,
            accelerator_count=o.accelerator_count, head_address=req.head_address,
            ray_port=self.ray_port, dashboard_port=self.dashboard_port,
            build=self.node_build.for_boot() if self.node_build else None,
            ssh_authorized_key=authorized_key_line(req.cluster_id) if self._head_over_ssh(req) else None))
        return base64.b64encode(script.encode()).decode()

    def _head_over_ssh(self, req: LaunchRequest) -> bool:
        """Whether ``req`` is a head the launcher reaches over ssh (a public address, the key)."""
        return req.role == "head" and head_path().ssh

    def fleet_request(self, req: LaunchRequest, template_id: str, subnets: list[dict]) -> dict:
        """The CreateFleet parameters for ``req`` (public so tests and docs can show them)."""
        spot = req.offer.market is Market.SPOT
        params: dict[str, Any] = {
            "Type": "instant",
            "LaunchTemplateConfigs": [{
                "LaunchTemplateSpecification": {"LaunchTemplateId": template_id, "Version": "$Latest"},
                "Overrides": self._overrides(req, subnets)}],
            "TargetCapacitySpecification": {"TotalTargetCapacity": req.count,
                                            "DefaultTargetCapacityType": "spot" if spot else "on-demand"},
            "TagSpecifications": [{"ResourceType": "fleet", "Tags": _tags(self.cluster_tags(req))}],
        }
        if spot:
            params["SpotOptions"] = {"AllocationStrategy": self.spot_strategy}
            if self.spot_strategy == "capacity-optimized" and len(req.offers) > 1:
                params["SpotOptions"]["AllocationStrategy"] = "capacity-optimized-prioritized"
        else:
            strategy = "prioritized" if len(req.offers) > 1 and self.on_demand_strategy == "prioritized" else self.on_demand_strategy
            params["OnDemandOptions"] = {"AllocationStrategy": strategy}
        return params

    def _template_data(self, req: LaunchRequest, image_id: str) -> dict:
        tags = _tags(self.cluster_tags(req))
        data: dict[str, Any] = {
            "ImageId": image_id,
            "UserData": self._user_data(req),
            # a node's dead man's switch ends it with `shutdown -h now`: that must end the bill too
            "InstanceInitiatedShutdownBehavior": "terminate",
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled",
                                "HttpPutResponseHopLimit": 2, "InstanceMetadataTags": "enabled"},
            "BlockDeviceMappings": [{"DeviceName": self._root_device(req.offer.region, image_id),
                                     "Ebs": {"VolumeSize": self.root_volume_gib, "VolumeType": "gp3",
                                             "DeleteOnTermination": True, "Encrypted": True}}],
            "TagSpecifications": [{"ResourceType": "instance", "Tags": tags},
                                  {"ResourceType": "volume", "Tags": tags}],
        }
        if self.iam_instance_profile:
            data["IamInstanceProfile"] = {"Name": self.iam_instance_profile}
        if self.key_name:
            data["KeyName"] = self.key_name
        key = (req.cluster_id, req.offer.region)
        groups = ([self._groups[key]] if key in self._groups else []) + self.security_group_ids
        if self._head_over_ssh(req):
            # the head's public address: asked on its interface, whatever the subnet's
            # MapPublicIpOnLaunch (EC2 User Guide, "Assign a public IPv4 address during instance
            # launch"; honoured with a fleet's SubnetId overrides: aws/karpenter-provider-aws#3819);
            # the interface then carries the groups (EC2 refuses both on one launch)
            data["NetworkInterfaces"] = [{"DeviceIndex": 0, "AssociatePublicIpAddress": True, "Groups": groups}]
        elif groups:
            data["SecurityGroupIds"] = groups
        return data

    # -- Cloud interface --------------------------------------------------------------------------
    def launch(self, request: LaunchRequest) -> list[Node]:
        """Launch up to ``request.count`` nodes in one instant fleet.

        Returns the nodes that came up (possibly fewer than asked: the caller tops up or
        releases). Raises the typed error for the fleet's errors when none came up.
        """
        self._validate(request)
        region = request.offer.region
        image_id = self._image(region)
        subnets = self._subnets(region, head=self._head_over_ssh(request))
        self._overrides(request, subnets)  # validates zones before anything is created
        name = f"spotwise-{request.cluster_id}-{request.role}-{uuid.uuid4().hex[:8]}"[:128]
        lt = self._call(region, "create_launch_template", LaunchTemplateName=name,
                        LaunchTemplateData=self._template_data(request, image_id),
                        TagSpecifications=[{"ResourceType": "launch-template",
                                            "Tags": _tags(self.cluster_tags(request))}])
        template_id = lt["LaunchTemplate"]["LaunchTemplateId"]
        try:
            resp = self._call(region, "create_fleet", **self.fleet_request(request, template_id, subnets))
        finally:
            self._delete_template(region, template_id)
        ids = [i for group in resp.get("Instances") or [] for i in group.get("InstanceIds") or []]
        errors = resp.get("Errors") or []
        if not ids:
            raise self._fleet_error(request, errors)
        try:
            nodes = self._after_create(lambda: self._describe(region, ids), INSTANCE_NOT_FOUND)
        except ProvisionError:
            self._release_unseen(region, ids)
            raise
        if len(nodes) < request.count:
            log.warning("aws fleet in %s gave %d of %d nodes: %s", region, len(nodes), request.count,
                        sorted({e.get("ErrorCode") for e in errors}))
        self._price_nodes(request, nodes, subnets)
        failed = self._failed_offers(request, errors, subnets)
        for n in nodes:
            n.extra["fleet_errors"] = sorted({str(e.get("ErrorCode")) for e in errors})
            n.extra["capacity_errors"] = failed
        return nodes

    def _failed_offers(self, req: LaunchRequest, errors: list[dict], subnets: list[dict]) -> dict[str, str]:
        """``{offer key: "CODE: message"}`` for the overrides the fleet reported a capacity error
        for, though it filled the request from others (the report lists every attempt)."""
        by_subnet = {s["SubnetId"]: {s["AvailabilityZone"], s.get("AvailabilityZoneId")} for s in subnets}
        out: dict[str, str] = {}
        for e in errors:
            if CODES.kind(e.get("ErrorCode")) is not CapacityError:
                continue
            ov = ((e.get("LaunchTemplateAndOverrides") or {}).get("Overrides") or {})
            zones = by_subnet.get(ov.get("SubnetId", ""), set())
            o = offer_for_node(list(req.offers), ov.get("InstanceType", ""), zones)
            if o is not None:
                out[o.key] = f"{e.get('ErrorCode')}: {e.get('ErrorMessage', '')}"
        return out

    def _price_nodes(self, req: LaunchRequest, nodes: list[Node], subnets: list[dict]) -> None:
        """Give each node the price in force when it launched, and record it in its tags.

        Spot: the zone's current spot price from ``DescribeSpotPriceHistory`` (what the bill will
        say), falling back to the plan's offer price when the API has none. On-demand: the list
        price of the offer it was filled from (an alternative type or AZ may differ from
        ``req.offer``), with that offer's source and date."""
        az_id = {s["AvailabilityZone"]: s.get("AvailabilityZoneId") for s in subnets}
        spot_cache: dict[tuple[str, str], tuple[float, str, str] | None] = {}
        for n in nodes:
            o = offer_for_node(list(req.offers), n.instance_type, {n.zone, az_id.get(n.zone) or n.zone}) or req.offer
            price, source, as_of = o.usd_per_hour, o.source, o.as_of
            if o.market is Market.SPOT:
                key = (n.instance_type, n.zone)
                if key not in spot_cache:
                    spot_cache[key] = self.spot_price_now(o.region, n.instance_type, n.zone)
                spot = spot_cache[key]
                if spot is not None:
                    price, source, as_of = spot
            n.usd_per_hour = price
            n.extra["price_source"], n.extra["price_as_of"] = source, as_of
            self._after_create(lambda: self._call(
                req.offer.region, "create_tags", Resources=[n.instance_id],
                Tags=[{"Key": TAG_PRICE, "Value": f"{price:.6f}"},
                      {"Key": TAG_PRICE_SOURCE, "Value": f"{source} @ {as_of}"[:255]}]), INSTANCE_NOT_FOUND)

    def spot_price_now(self, region: str, instance_type: str, zone: str) -> tuple[float, str, str] | None:
        """``(usd_per_hour, source, timestamp)`` of the newest Linux spot price of the type in the
        AZ (``DescribeSpotPriceHistory``), or None when AWS reports none."""
        resp = self._call(region, "describe_spot_price_history", InstanceTypes=[instance_type],
                          AvailabilityZone=zone, StartTime=datetime.now(timezone.utc),
                          ProductDescriptions=["Linux/UNIX", "Linux/UNIX (Amazon VPC)"], MaxResults=20)
        rows = [r for r in resp.get("SpotPriceHistory", []) if r.get("AvailabilityZone") == zone]
        if not rows:
            return None
        newest = max(rows, key=lambda r: r["Timestamp"])
        ts = newest["Timestamp"]
        when = ts.isoformat() if hasattr(ts, "isoformat") else str(ts)
        return float(newest["SpotPrice"]), f"aws DescribeSpotPriceHistory {zone}", when

    def _fleet_error(self, req: LaunchRequest, errors: list[dict]) -> ProvisionError:
        codes = [e.get("ErrorCode") for e in errors]
        classes = [CODES.kind(c) for c in codes]
        cls = most_severe(classes)
        detail = "; ".join(sorted({f"{e.get('ErrorCode')}: {e.get('ErrorMessage', '')}" for e in errors})) or "no instances and no errors"
        code = next((c for c, k in zip(codes, classes) if k is cls), None)
        return cls(f"aws fleet for {req.offer.key} launched nothing: {detail}", offer_key=req.offer.key,
                   cloud="aws", region=req.offer.region, code=code)

    def _release_unseen(self, region: str, ids: list[str]) -> None:
        """End instances a fleet launched that EC2 would not describe in time (they bill; their tags
        let ``gc`` find them if this fails too)."""
        try:
            self._call(region, "terminate_instances", InstanceIds=ids)
        except ProvisionError as e:
            log.error("could not end %s after EC2 did not describe them (gc will): %s", ids, e)

    def _delete_template(self, region: str, template_id: str) -> None:
        try:
            self._call(region, "delete_launch_template", LaunchTemplateId=template_id)
        except ProvisionError as e:  # the gc sweep will find it by tag
            log.warning("could not delete launch template %s: %s", template_id, e)

    def _node(self, region: str, inst: dict) -> Node:
        tags = {t["Key"]: t["Value"] for t in inst.get("Tags") or []}
        try:
            price = float(tags.get(TAG_PRICE, "0"))
        except ValueError:
            price = 0.0
        launched = inst.get("LaunchTime")
        src, _, when = tags.get(TAG_PRICE_SOURCE, "").rpartition(" @ ")
        extra: dict = {"price_source": src, "price_as_of": when} if src else {}
        extra["public_ip"] = bool(inst.get("PublicIpAddress"))     # billed by the hour since 2024-02-01
        if inst.get("PublicIpAddress"):
            extra["public_address"] = inst["PublicIpAddress"]       # where the launcher's ssh reaches a head
        return Node(extra=extra, cloud="aws", instance_id=inst["InstanceId"], instance_type=inst["InstanceType"],
                    region=region, zone=inst.get("Placement", {}).get("AvailabilityZone", ""),
                    market=tags.get(TAG_MARKET) or ("spot" if inst.get("InstanceLifecycle") == "spot" else "on-demand"),
                    usd_per_hour=price, cluster_id=tags.get(TAG_CLUSTER, ""), job_id=tags.get(TAG_JOB, ""),
                    role=tags.get(TAG_ROLE, "worker"), state=inst.get("State", {}).get("Name", "unknown"),
                    launched_at=launched.timestamp() if isinstance(launched, datetime) else None,
                    address=inst.get("PrivateIpAddress"))

    def _describe(self, region: str, ids: list[str] | None = None,
                  filters: list[dict] | None = None) -> list[Node]:
        kw: dict[str, Any] = {}
        if ids:
            kw["InstanceIds"] = ids
        if filters:
            kw["Filters"] = filters
        nodes: list[Node] = []
        token = None
        while True:
            page = self._call(region, "describe_instances", **kw, **({"NextToken": token} if token else {}))
            for res in page.get("Reservations", []):
                nodes.extend(self._node(region, i) for i in res.get("Instances", []))
            token = page.get("NextToken")
            if not token:
                return nodes

    def terminate(self, nodes: list[Node]) -> None:
        by_region: dict[str, list[str]] = {}
        for n in nodes:
            by_region.setdefault(n.region, []).append(n.instance_id)
        for region, ids in by_region.items():
            for i in range(0, len(ids), 500):
                try:
                    self._call(region, "terminate_instances", InstanceIds=ids[i:i + 500])
                except ProvisionError as e:
                    if e.code != "InvalidInstanceID.NotFound":
                        raise
                    for one in ids[i:i + 500]:  # some already gone: end the rest one by one
                        try:
                            self._call(region, "terminate_instances", InstanceIds=[one])
                        except ProvisionError as e1:
                            if e1.code != "InvalidInstanceID.NotFound":
                                raise

    def list_nodes(self, cluster_id: str | None = None, *, regions: list[str] | None = None) -> list[Node]:
        """Live instances carrying our cluster tag (one cluster's when ``cluster_id`` is given).

        ``regions``: look only there (a run's own regions; an error there is raised: the caller
        must not read a region it could not ask as empty). None: every region :meth:`scan_regions`
        names, a region that cannot be asked skipped and named in :attr:`skipped_regions` (a
        disabled opt-in region, an SCP that denies one): one region never fails ``gc`` or ``down``."""
        filters = [{"Name": "instance-state-name", "Values": list(TAG_TYPE_LIVE)}]
        filters.append({"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster_id]} if cluster_id
                       else {"Name": "tag-key", "Values": [TAG_CLUSTER]})
        if regions is not None:
            return [n for region in regions for n in self._describe(region, filters=filters)]
        return self.each_region(lambda region: self._describe(region, filters=filters))

    def wait_until_running(self, nodes: list[Node], timeout_s: float = 900.0) -> list[Node]:
        deadline = time.monotonic() + timeout_s
        by_region: dict[str, list[str]] = {}
        for n in nodes:
            by_region.setdefault(n.region, []).append(n.instance_id)
        out: list[Node] = []
        for region, ids in by_region.items():
            while True:
                fresh = self._after_create(lambda: self._describe(region, ids), INSTANCE_NOT_FOUND)
                if all(n.state == "running" for n in fresh) or time.monotonic() > deadline:
                    break
                if any(n.state in ("shutting-down", "terminated") for n in fresh):
                    break
                self._sleep(5)
            out.extend(fresh)
        return out

    def list_templates(self, cluster_id: str | None = None) -> list[tuple[str, str, str]]:
        """``(region, template_id, cluster_id)`` of every spotwise launch template left behind."""
        return self._list_tagged("describe_launch_templates", "LaunchTemplates", "LaunchTemplateId", cluster_id)

    def delete_templates(self, templates: list[tuple[str, str, str]]) -> None:
        for region, tid, _ in templates:
            self._delete_template(region, tid)


def offer_for_node(offers: list[Offer], instance_type: str, zones: set[str]) -> Offer | None:
    """The first offer matching an instance's type and AZ (name or id)."""
    for o in offers:
        if o.instance_type == instance_type and (not o.zone or o.zone in zones):
            return o
    return None
