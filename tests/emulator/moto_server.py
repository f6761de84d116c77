"""The emulated AWS: moto's server on loopback, with two behaviours moto lacks (test support).

    python -m emulator.moto_server PORT

* ``DescribeSpotPriceHistory`` answers real-looking prices (moto's are a fixed 0.00001): per
  instance type and AZ from the JSON file ``$SW_EMU_SPOT_PRICES`` (``{type: {az_name: usd}}``),
  timestamped now, in the API's own shape.
* ``CreateFleet`` answers ``InsufficientInstanceCapacity`` in its ``Errors`` list — exactly as EC2
  Fleet ``instant`` does — for the overrides whose (AZ, market) the JSON file
  ``$SW_EMU_CAPACITY`` lists under ``"none"`` (``AZ:market``, the AZ a glob: ``us-east-1*:spot``) (re-read on every call, so a test can take capacity
  away and give it back while a run goes on).

Product code is untouched: it only sees the wire.
"""

from __future__ import annotations

import fnmatch
import json
import os
import sys
from datetime import datetime, timezone


def _read(env: str) -> dict:
    path = os.environ.get(env)
    if not path or not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def _patch() -> None:
    from moto.core.responses import ActionResult
    from moto.ec2.responses.fleets import Fleets
    from moto.ec2.responses.spot_instances import SpotInstances

    def describe_spot_price_history(self) -> ActionResult:
        types = self._get_param("InstanceTypes", [])
        prices = self.ec2_backend.describe_spot_price_history(types, self._filters_from_querystring())
        table = _read("SW_EMU_SPOT_PRICES")
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        history = []
        for p in prices:
            usd = table.get(p["InstanceType"], {}).get(p["Location"])
            if usd is None:
                continue
            history.append({"InstanceType": p["InstanceType"], "ProductDescription": "Linux/UNIX",
                            "SpotPrice": f"{usd:.6f}", "AvailabilityZone": p["Location"], "Timestamp": now})
        return ActionResult({"SpotPriceHistory": history})

    original = Fleets.create_fleet

    def create_fleet(self) -> ActionResult:
        none = [(z, m) for z, m in (x.split(":") for x in _read("SW_EMU_CAPACITY").get("none", []))]
        if not none:
            return original(self)
        market = (self._get_param("TargetCapacitySpecification", {}) or {}).get("DefaultTargetCapacityType", "on-demand")
        configs = self._get_param("LaunchTemplateConfigs", [])
        errors, kept_any = [], False
        for cfg in configs:
            keep = []
            for ov in cfg.get("Overrides") or []:
                az = self.ec2_backend.get_subnet(ov["SubnetId"]).availability_zone
                if any(m == market and fnmatch.fnmatchcase(az, z) for z, m in none):
                    errors.append({"LaunchTemplateAndOverrides": {
                        "LaunchTemplateSpecification": cfg.get("LaunchTemplateSpecification"), "Overrides": ov},
                        "Lifecycle": market, "ErrorCode": "InsufficientInstanceCapacity",
                        "ErrorMessage": f"There is no {market} capacity for {ov.get('InstanceType')} in {az}."})
                else:
                    keep.append(ov)
            cfg["Overrides"] = keep
            kept_any = kept_any or bool(keep)
        if not kept_any:
            return ActionResult({"FleetId": "fleet-00000000-0000-0000-0000-000000000000", "Instances": [],
                                 "Errors": errors})
        real_get = self._get_param

        def get_param(name, *a, **kw):
            return configs if name == "LaunchTemplateConfigs" else real_get(name, *a, **kw)

        self._get_param = get_param
        try:
            result = original(self)
        finally:
            self._get_param = real_get
        if errors:
            result.result["Errors"] = errors   # type: ignore[attr-defined]
        return result

    SpotInstances.describe_spot_price_history = describe_spot_price_history
    Fleets.create_fleet = create_fleet


def main() -> None:
    _patch()
    from moto.server import main as moto_main

    port = sys.argv[1]
    moto_main(["-H", "127.0.0.1", "-p", port])


if __name__ == "__main__":
    main()
