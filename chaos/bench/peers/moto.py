"""A moto of ``make bench-peers``' own, holding the storm's instances (NTH maps instance id to
``PrivateDnsName`` with DescribeInstances)."""

from __future__ import annotations

import random
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.bench.peers.common import REGION, ZONE, BenchError
from chaos.ports import free_port as _free_port

# --- a moto of the bench's own, with the instances ----------------------------------------------


@dataclass
class Moto:
    """``moto_server`` on a free loopback port: SQS queues and EC2 instances of this bench
    only (the stack's moto keeps every earlier run's state)."""

    workdir: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    ec2: Any = None
    subnet: str = ""
    octet: int = field(default_factory=lambda: random.randint(1, 250))
    launched: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30) -> None:
        import boto3

        server = Path(sys.executable).parent / "moto_server"
        if not server.exists():
            raise BenchError(f"{server} missing: run `make venv`")
        self.port = _free_port()
        log = (self.workdir / "moto.log").open("ab")
        # Its own session: a Ctrl-C meant for the bench must not take moto down mid-cleanup.
        self.proc = subprocess.Popen(
            [str(server), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        log.close()
        end = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(self.url + "/moto-api/", timeout=2):
                    break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > end:
                    log_path = self.workdir / "moto.log"
                    raise BenchError(f"moto did not start; log: {log_path}") from None
                time.sleep(0.2)
        self.ec2 = boto3.client(
            "ec2", endpoint_url=self.url, region_name=REGION,
            aws_access_key_id="testing", aws_secret_access_key="testing",
        )  # fmt: skip
        vpc = self.ec2.create_vpc(CidrBlock=f"10.{self.octet}.0.0/16")["Vpc"]["VpcId"]
        self.subnet = self.ec2.create_subnet(
            VpcId=vpc, CidrBlock=f"10.{self.octet}.0.0/16", AvailabilityZone=ZONE
        )["Subnet"]["SubnetId"]

    def launch(self, n: int) -> list[tuple[str, str]]:
        """``n`` running instances with addresses of their own: (instance id, PrivateDnsName)."""
        from concurrent.futures import ThreadPoolExecutor

        # Explicit addresses: moto picks random ones, and a repeated name would be one node.
        ips = []
        for _ in range(n):
            k = self.launched + 16
            self.launched += 1
            ips.append(f"10.{self.octet}.{k >> 8}.{k & 255}")

        def one(ip: str) -> tuple[str, str]:
            inst = self.ec2.run_instances(
                ImageId="ami-12c6146b", MinCount=1, MaxCount=1, InstanceType="p5.48xlarge",
                SubnetId=self.subnet, PrivateIpAddress=ip,
            )["Instances"][0]  # fmt: skip
            return str(inst["InstanceId"]), str(inst["PrivateDnsName"])

        with ThreadPoolExecutor(8) as pool:
            return list(pool.map(one, ips))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
