"""Sites (``cloud/region``) a run cannot use as the clouds are configured, known before any launch.

The plan ranks only sites a run can reach (issue 30): an offer in a region the run could only fail
in is not a fallback, it is a wasted attempt — or worse, on AWS an opt-in region answers
``AuthFailure``, which reads as "these credentials are bad". What is knowable without credentials:

Each cloud says its own in ``Cloud.site_problem`` (registered with the cloud, never a branch here):

* **AWS opt-in regions** (:data:`AWS_OPT_IN_REGIONS`, ``AwsCloud.opt_in_regions``: ap-southeast-3, me-central-1, ...) are
  disabled on an account until its owner enables them. The plan leaves them out unless the user
  named the region — in the task's ``resources.regions`` or in ``SPOTWISE_AWS_REGIONS`` — which says
  the account has it.
* **Azure regions outside the infra's locations** (``SPOTWISE_AZURE_LOCATIONS``, infra/azure's
  ``var.locations``; unset: its default list): only those get a VNet with a NAT gateway. A VNet
  spotwise would create anywhere else has no outbound access (Azure's VNets made after
  2025-09-30 have no default outbound access: "Default outbound access in Azure",
  learn.microsoft.com/azure/virtual-network/ip-services/default-outbound-access), so its nodes could
  not fetch the build or packages; the plan leaves such a region out, named or not
  (:mod:`spotwise.provisioner.clouds.azure.locations`).
* **GCP with a subnetwork configured** (``SPOTWISE_GCP_SUBNETWORK``, e.g.
  ``regions/us-central1/subnetworks/spotwise``): a subnetwork is regional, so nodes can only be
  created in its region; other GCP regions are left out (:mod:`spotwise.provisioner.clouds.gcp.outbound`).

What one read per region (AWS) or per plan (GCP) tells, asked once per plan where the cloud is
configured to be asked (:func:`outbound`; unanswered: left to the launch):

* **Node subnets without an outbound path** (issue 48, item 5). Workers have no public address,
  yet every node fetches the shipped wheel and PyPI packages at boot. AWS: a configured node subnet
  (``SPOTWISE_AWS_SUBNETS``) whose route table has no 0.0.0.0/0 route to a NAT gateway
  (``AwsCloud.outbound_problem``); GCP: a region where the network has no Cloud NAT
  (:mod:`spotwise.provisioner.clouds.gcp.outbound`). infra/aws and infra/gcp give every region they
  set up a NAT.

What is known only by asking at launch (a region without a configured AWS subnet, a GCP network without a
subnetwork in the region, a missing image) is found at launch: the failover skips that site with
the reason in the attempts (:class:`~spotwise.provisioner.base.SiteError`), never fails the run.
"""

from __future__ import annotations

import logging
from typing import Any

#: AWS regions disabled on an account until enabled (AWS Account Management Reference Guide,
#: "Specify which AWS Regions your account can use"; as listed on 2026-11-27)
AWS_OPT_IN_REGIONS = frozenset({
    "af-south-1", "ap-east-1", "ap-east-2", "ap-south-2", "ap-southeast-3", "ap-southeast-4", "ap-southeast-5",
    "ap-southeast-6", "ap-southeast-7", "ca-west-1", "eu-central-2", "eu-south-1", "eu-south-2", "il-central-1",
    "me-central-1", "me-south-1", "mx-central-1"})

log = logging.getLogger("spotwise.provisioner.sites")

def unreachable(cloud: Any, region: str, *, named: set[str] | frozenset[str] = frozenset()) -> str | None:
    """Why a run cannot use ``region`` of ``cloud`` (a :class:`~spotwise.provisioner.base.Cloud`) as
    it is configured, or None when nothing known up front says so. ``named``: the regions the task
    names (``resources.regions``)."""
    from spotwise.provisioner.head_path import unreachable as head_unreachable

    why = head_unreachable(cloud, region)
    if why:
        return why
    ask = getattr(cloud, "site_problem", None)        # each cloud's own rules (Cloud.site_problem)
    why = ask(region, frozenset(named)) if ask is not None else None
    if why:
        return why
    return outbound(cloud, region)


def outbound(cloud: Any, region: str) -> str | None:
    """Why ``cloud``'s nodes in ``region`` would have no way out to fetch the build and packages, as
    the cloud answers it (``Cloud.outbound_problem``, cached per cloud object, so once per plan), or
    None: nothing says so, the cloud has no such check, or it could not be asked (no credentials,
    an error: logged, and the launch finds out)."""
    from spotwise.errors import InputError
    from spotwise.provisioner.base import ProvisionError

    ask = getattr(cloud, "outbound_problem", None)
    if ask is None:
        return None
    try:
        return ask(region)
    except (ProvisionError, InputError) as e:
        log.info("%s/%s: outbound access not checked: %s", getattr(cloud, "name", "?"), region, e)
        return None


def default_regions(cloud: str) -> list[str]:
    """The regions a plan may rank for ``cloud`` with no region named: every region of the shipped
    catalog with an offer the planner admits by default (not flagged, not stale; spot or
    on-demand), less AWS's opt-in regions. ``infra/`` gives each of them a network
    (``tests/provisioner/test_infra_regions.py``; ``scripts/gen_infra_regions.py`` writes AWS's)."""
    from spotwise.pricing.catalog import Catalog, _admitted
    from spotwise.provisioner.base import CLOUDS

    offers = Catalog.load(use_cache=False)._offers
    regions = {o.region for o in offers if o.cloud == cloud and o.market.value in ("spot", "on-demand")
               and _admitted(o, False, False)}
    hidden = CLOUDS.get(cloud).opt_in_regions if cloud in CLOUDS.names() else frozenset()
    return sorted(regions - hidden)
