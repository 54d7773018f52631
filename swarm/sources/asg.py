"""Peers without a coordinator: the running instances of an Auto Scaling group.

A fleet that runs no coordinator (or loses it) can still find its seeders: every
instance of the group runs a daemon on the same BitTorrent port, so the group's member
list *is* the peer list. Needs ``autoscaling:DescribeAutoScalingGroups`` and
``ec2:DescribeInstances``.
"""

from __future__ import annotations

from typing import Any

import boto3

from swarm.errors import AccessDeniedError, NotFoundError, SwarmError
from swarm.objectstore import S3_ERRORS

REFRESH_SECONDS = 30.0
"""How often a daemon lists the group again (scale-out adds peers within this)."""


def asg_peer_ips(
    group: str,
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    exclude: set[str] | None = None,
) -> list[str]:
    """Private IPv4 addresses of the group's InService instances, minus ``exclude``."""
    session = boto3.session.Session(region_name=region)
    region = session.region_name or "us-east-1"
    autoscaling: Any = session.client("autoscaling", endpoint_url=endpoint_url, region_name=region)
    ec2: Any = session.client("ec2", endpoint_url=endpoint_url, region_name=region)
    try:
        groups = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[group])
        found = groups["AutoScalingGroups"]
        if not found:
            raise NotFoundError(
                f"swarm: no Auto Scaling group named {group!r} in {region}: check "
                "--peers-from-asg and the region"
            )
        ids = [
            i["InstanceId"] for i in found[0]["Instances"] if i.get("LifecycleState") == "InService"
        ]
        if not ids:
            return []
        ips: list[str] = []
        for page in ec2.get_paginator("describe_instances").paginate(InstanceIds=ids):
            for reservation in page["Reservations"]:
                for instance in reservation["Instances"]:
                    ip = instance.get("PrivateIpAddress")
                    if ip and instance.get("State", {}).get("Name") == "running":
                        ips.append(ip)
    except S3_ERRORS as error:
        code = getattr(error, "response", {}).get("Error", {}).get("Code", "")
        if "AccessDenied" in code or "Unauthorized" in code:
            raise AccessDeniedError(
                f"swarm: cannot list Auto Scaling group {group!r} ({code}): the instance "
                "role needs autoscaling:DescribeAutoScalingGroups and ec2:DescribeInstances"
            ) from error
        raise SwarmError(f"swarm: cannot list Auto Scaling group {group!r}: {error}") from error
    return sorted(set(ips) - (exclude or set()))
