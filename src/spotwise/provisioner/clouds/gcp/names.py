"""GCP: the names spotwise gives a cluster's resources (instances, its network tag, its firewall
rules), as GCE resource names allow: lowercase letters, digits and hyphens, within each length."""

from __future__ import annotations

import uuid

from spotwise.provisioner.boot.script import label_value

FIREWALL_PREFIX = "spotwise-"
#: the key a firewall rule's description names its cluster with (what cleanup and gc find it by)
DESC_KEY = "spotwise-cluster="


def rfc1035(s: str, limit: int) -> str:
    """``s`` as a GCE resource name part: lowercase letters, digits and hyphens."""
    return label_value(s).lower().replace("_", "-").replace(".", "-")[:limit].rstrip("-")


def instance_name(cluster_id: str, role: str) -> str:
    return f"{rfc1035(f'sw-{cluster_id}', 48)}-{role[0]}-{uuid.uuid4().hex[:6]}"


def network_tag(cluster_id: str) -> str:
    """The network tag every node of the cluster carries (what its firewall rules select)."""
    return rfc1035(f"spotwise-{cluster_id}", 63)


def firewall_names(cluster_id: str) -> tuple[str, str]:
    """``(internal, clients)`` firewall rule names of the cluster."""
    base = rfc1035(f"spotwise-{cluster_id}", 52)
    return f"{base}-internal", f"{base}-clients"


def ssh_firewall_name(cluster_id: str) -> str:
    """The cluster's third rule, on the ssh head path: port 22 from the launcher's address."""
    return f"{rfc1035(f'spotwise-{cluster_id}', 52)}-ssh"
