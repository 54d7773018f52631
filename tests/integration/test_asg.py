"""Peers from an Auto Scaling group, without a coordinator (moto's EC2/Auto Scaling server).

moto places the group's instances in the subnet we give it; a 127.0.0.0/24 subnet makes
their private IPs loopback addresses, where real swarm daemons then listen: a real fetch
finds them only through the group listing.
"""

from __future__ import annotations

import hashlib
import os

import boto3
import pytest

from swarm.errors import NotFoundError
from swarm.sources.asg import asg_peer_ips
from tests.conftest import SIZE
from tests.swarmnet import Swarm, done_event

FETCH_TIMEOUT = 120


@pytest.fixture
def group(env) -> list[str]:
    ec2, autoscaling = boto3.client("ec2"), boto3.client("autoscaling")
    vpc = ec2.create_vpc(CidrBlock="127.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="127.0.0.0/24")["Subnet"]["SubnetId"]
    name = f"node-{os.getpid()}"
    ec2.create_launch_template(
        LaunchTemplateName=name,
        LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "t3.micro"},
    )
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=name,
        LaunchTemplate={"LaunchTemplateName": name},
        MinSize=2,
        MaxSize=2,
        DesiredCapacity=2,
        VPCZoneIdentifier=subnet,
    )
    ips = asg_peer_ips(name)
    assert len(ips) == 2 and all(ip.startswith("127.0.0.") for ip in ips)
    return [name, *ips]


def test_unknown_group_is_not_found(env):
    with pytest.raises(NotFoundError, match="no Auto Scaling group"):
        asg_peer_ips("no-such-group")


def test_fetch_finds_seeders_through_the_group(env, artifact, group, tmp_path):
    name, *ips = group
    env.pop("SWARM_COORDINATOR", None)
    with Swarm(tmp_path / "fleet", env) as fleet:
        (tmp_path / "fleet").mkdir()
        seeders = []
        for ip in ips:  # the group's instances, seeding after their own fetch from S3
            node = fleet.node(len(fleet.nodes))
            node.ip = ip
            node.env.pop("SWARM_COORDINATOR")
            done_event(node.fetch("index.db", tmp_path / f"{ip}.db"), FETCH_TIMEOUT)
            seeders.append(node)
        new = fleet.node(40)
        new.env.pop("SWARM_COORDINATOR")
        done = done_event(
            new.fetch(
                "index.db", tmp_path / "new.db", "--source", "peers", "--peers-from-asg", name
            ),
            FETCH_TIMEOUT,
        )
    assert done["bytes_by_source"]["peers"] >= SIZE and done["bytes_by_source"]["s3"] == 0
    assert (
        hashlib.sha256((tmp_path / "new.db").read_bytes()).digest()
        == hashlib.sha256(artifact.read_bytes()).digest()
    )
