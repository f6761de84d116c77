"""Launch, find and end the instances a run needs, on any cloud behind one interface."""

from spotwise.provisioner.base import (
    AuthError,
    CapacityError,
    Cloud,
    LaunchRequest,
    Node,
    ProvisionError,
    QuotaError,
    get_cloud,
    register_cloud,
)

__all__ = [
    "AuthError",
    "CapacityError",
    "Cloud",
    "LaunchRequest",
    "Node",
    "ProvisionError",
    "QuotaError",
    "get_cloud",
    "register_cloud",
]
