"""Kafka in KRaft mode from Maven Central jars on Java 17: one node that is broker and controller, or
(``Settings.kafka_brokers`` = 3) three such nodes on loopback forming one cluster with a static three-voter
quorum. Node 1 is ``kafka`` (state folder ``kafka/``, the configured ports); nodes 2 and 3 are ``kafka-2``
and ``kafka-3`` on the port pairs two and four above. All nodes share node 1's cluster id."""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import subprocess
import time
import uuid
from pathlib import Path

from rich.console import Console

from infra.config.settings import Settings, env_var
from infra.local.errors import ServiceFailed
from infra.local.services import java, maven, process
from infra.local.services.base import Probe, Service

CONFIG_DIR = Path(__file__).resolve().parent.parent / "kafka"
POM = CONFIG_DIR / "pom.xml"
LOG4J2 = CONFIG_DIR / "log4j2.properties"
_CORE_JAR = re.compile(r"kafka_[0-9.]+-(.+)\.jar$")

# kafka-run-class.sh's default JVM flags (G1, short pauses), minus its JMX and GC-log options.
JVM_FLAGS = [
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
]


def running_version(cmdline: list[str]) -> str | None:
    """The Kafka version of a ``java ... -cp DIR/* kafka.Kafka`` command line: the version of
    ``kafka_<scala>-<version>.jar`` in DIR."""
    if "-cp" not in cmdline or cmdline.index("-cp") + 1 >= len(cmdline):
        return None
    for entry in cmdline[cmdline.index("-cp") + 1].split(":"):
        folder = Path(entry[:-2]) if entry.endswith("/*") else Path(entry).parent
        for jar in sorted(folder.glob("kafka_*.jar")):
            m = _CORE_JAR.match(jar.name)
            if m:
                return m.group(1)
    return None


def random_cluster_id() -> str:
    """Kafka's Uuid text form: 16 random bytes, URL-safe base64 without padding (22 characters).
    Like Kafka's own ``Uuid.randomUuid``, never one that starts with "-": ``kafka-storage format
    --cluster-id -x...`` reads it as an option and fails (1 fresh start in 64 did)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def server_properties(host: str, node: int, ports: dict[int, tuple[int, int]], data_dir: Path,
                      replication: int = 1, min_insync: int = 1) -> dict[str, str]:
    """Node ``node``'s config: broker and controller at once, with a static quorum of every node in
    ``ports`` (node -> (client, controller) port), so ``kafka-storage format`` needs no ``--standalone``;
    internal topics and new topics get ``replication`` replicas and ``min_insync`` in-sync replicas."""
    port, controller_port = ports[node]
    r, isr = str(replication), str(min_insync)
    return {
        "process.roles": "broker,controller",
        "node.id": str(node),
        "controller.quorum.voters": ",".join(f"{n}@{host}:{c}" for n, (_, c) in sorted(ports.items())),
        "controller.listener.names": "CONTROLLER",
        "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{host}:{port}",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(data_dir),
        "num.partitions": "1",
        "auto.create.topics.enable": "false",
        "default.replication.factor": r,
        "min.insync.replicas": isr,
        "offsets.topic.replication.factor": r,
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": r,
        "transaction.state.log.min.isr": isr,
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": r,
        "share.coordinator.state.topic.min.isr": isr,
        "group.initial.rebalance.delay.ms": "0",
        "num.network.threads": "2",
        "num.io.threads": "4",
        # A broker that stops heartbeating is fenced (its partitions led elsewhere) after this long; Kafka's
        # 9 s default is the longest stall a client sees when a broker of three dies. A lone broker has nowhere
        # else to lead its partitions: fencing it only takes every leader away (and back, a metadata change per
        # partition each way), so it is given 18 s, past the 5-10 s stalls of a loaded 2-core machine. The
        # session is also how long a broker restarted after a crash waits to register (the controller holds
        # the dead incarnation's session until then), so registration may take far longer than the session.
        "broker.heartbeat.interval.ms": "1000",
        "initial.broker.registration.timeout.ms": "150000",
        "broker.session.timeout.ms": "4500" if len(ports) > 1 else "18000",
    }


def render_properties(props: dict[str, str]) -> str:
    return "# written by `parley up`; edits are overwritten\n" + "".join(
        f"{k}={v}\n" for k, v in props.items()
    )


class Kafka(Service):
    name = "kafka"
    exe_names = ("java",)

    def __init__(self, settings: Settings, node: int = 1) -> None:
        super().__init__(settings)
        self.node = node
        self.name = "kafka" if node == 1 else f"kafka-{node}"

    @property
    def port(self) -> int:
        return self.settings.kafka_node_ports(self.node)[0]

    @property
    def ports(self) -> dict[str, int]:
        return {"client": self.port, "controller": self.settings.kafka_node_ports(self.node)[1]}

    @property
    def cluster_home(self) -> Path:
        """Node 1's folder, where the cluster id and the node count every node was formatted with live."""
        return self.settings.state_dir / "kafka"

    @property
    def version(self) -> str:
        return maven.pom_property(POM, "kafka.version")

    @property
    def lib(self) -> Path:
        return maven.lib_dir(self.settings.cache_dir, type(self).name, self.version)

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def config_file(self) -> Path:
        return self.home / "server.properties"

    def markers(self) -> list[str]:
        return ["kafka.Kafka", str(self.config_file)]

    def install(self, console: Console | None = None) -> None:
        jvm = java.find_java17()
        maven.ensure_libs(
            type(self).name, POM, self.settings.cache_dir, java_home=java.java_home(jvm), console=console
        )

    def _java(self, heap_mb: int) -> list[str]:
        return [
            str(java.find_java17()),
            f"-Xms{heap_mb}m",
            f"-Xmx{heap_mb}m",
            *JVM_FLAGS,
            f"-Dlog4j2.configurationFile={LOG4J2}",
            "-cp",
            f"{self.lib}/*",
        ]

    def prepare(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        count = self.settings.kafka_brokers
        nodes = {n: self.settings.kafka_node_ports(n) for n in range(1, count + 1)}
        props = server_properties(self.settings.host, self.node, nodes, self.data_dir,
                                  self.settings.kafka_replication, self.settings.kafka_min_insync)
        self.config_file.write_text(render_properties(props))
        self.cluster_home.mkdir(parents=True, exist_ok=True)
        count_file = self.cluster_home / "brokers"
        formatted = (self.data_dir / "meta.properties").exists()
        if formatted:
            was = int(count_file.read_text()) if count_file.exists() else 1
            if was != count:
                raise ServiceFailed(
                    f"kafka: {self.data_dir} belongs to a {was}-broker cluster; {env_var('KAFKA_BROKERS')} is {count}",
                    hint=f"set {env_var('KAFKA_BROKERS')}={was}, or `parley down` and remove "
                         f"{self.settings.state_dir}/kafka* to start an empty {count}-broker cluster",
                )
            return  # formatted once already; formatting again would refuse or wipe nothing
        if self.node == 1 and not count_file.exists():
            count_file.write_text(f"{count}\n")
        id_file = self.cluster_home / "cluster.id"
        if not id_file.exists() or id_file.read_text().startswith("-"):  # never formatted with that one
            id_file.write_text(random_cluster_id() + "\n")
        cluster_id = id_file.read_text().strip()
        cmd = [
            *self._java(256),
            "kafka.tools.StorageTool",
            "format",
            "-t",
            cluster_id,
            "-c",
            str(self.config_file),
            "--ignore-formatted",
        ]
        out = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=self.home, timeout=120)
        if out.returncode != 0:
            raise ServiceFailed(
                f"kafka: formatting the storage in {self.data_dir} failed (exit {out.returncode})",
                hint=f"remove {self.home} to start from scratch",
                log_tail="\n".join((out.stdout + out.stderr).splitlines()[-20:]),
            )

    def command(self) -> list[str]:
        return [*self._java(self.settings.kafka_heap_mb), "kafka.Kafka", str(self.config_file)]

    def version_hint(self) -> str | None:
        """Kafka's protocol reports no server version: read it from the kafka_2.13 jar on the
        classpath of the broker process we started (what runs, even if the POM changed since)."""
        pid = self.our_pid()
        if pid is None:
            return None
        return running_version(process.proc_cmdline(pid))

    def probe(self, timeout: float = 3.0) -> Probe:
        if not process.port_open(self.settings.host, self.port, timeout=min(timeout, 1.0)):
            return Probe(False, detail="not listening")
        try:
            brokers = asyncio.run(asyncio.wait_for(_describe_cluster(self.address), timeout))
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready yet"
            return Probe(False, detail=f"metadata request failed: {type(exc).__name__}: {exc}"[:200])
        version = self.version_hint()
        return Probe(True, version=version, detail=f"{brokers} of {self.settings.kafka_brokers} broker(s), metadata ok")


def wait_for_brokers(settings: Settings, timeout: float = 90.0) -> int:
    """Block until the cluster's metadata lists every configured broker (a topic with 3 replicas cannot be
    made before); returns how many are registered. Raises ServiceFailed naming the count seen."""
    began, seen = time.monotonic(), 0
    while time.monotonic() - began < timeout:
        try:
            seen = asyncio.run(asyncio.wait_for(_describe_cluster(settings.kafka_bootstrap), 5.0))
        except Exception:  # noqa: BLE001 - not ready yet
            seen = 0
        if seen >= settings.kafka_brokers:
            return seen
        time.sleep(0.5)
    raise ServiceFailed(f"kafka: {seen} of {settings.kafka_brokers} brokers registered after {timeout:.0f} s",
                        hint=f"read {settings.state_dir}/logs/kafka*.log")


async def _describe_cluster(bootstrap: str) -> int:
    from aiokafka.admin import AIOKafkaAdminClient

    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000)
    try:
        await admin.start()
        described = await admin.describe_cluster()
        return len(described["brokers"])
    finally:
        await admin.close()
