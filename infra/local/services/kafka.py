"""Single-node Kafka (KRaft, combined broker + controller) from Maven Central jars on Java 17."""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import subprocess
import uuid
from pathlib import Path

from rich.console import Console

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


def server_properties(host: str, port: int, controller_port: int, data_dir: Path) -> dict[str, str]:
    """The broker's config: one node that is both broker and controller, with a static quorum
    (so ``kafka-storage format`` needs no ``--standalone``), replication factors of 1."""
    return {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{host}:{controller_port}",
        "controller.listener.names": "CONTROLLER",
        "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{host}:{port}",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(data_dir),
        "num.partitions": "1",
        "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "num.network.threads": "2",
        "num.io.threads": "4",
    }


def render_properties(props: dict[str, str]) -> str:
    return "# written by `parley up`; edits are overwritten\n" + "".join(
        f"{k}={v}\n" for k, v in props.items()
    )


class Kafka(Service):
    name = "kafka"
    exe_names = ("java",)

    @property
    def port(self) -> int:
        return self.settings.ports.kafka

    @property
    def ports(self) -> dict[str, int]:
        return {"client": self.port, "controller": self.settings.ports.kafka_controller}

    @property
    def version(self) -> str:
        return maven.pom_property(POM, "kafka.version")

    @property
    def lib(self) -> Path:
        return maven.lib_dir(self.settings.cache_dir, self.name, self.version)

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
            self.name, POM, self.settings.cache_dir, java_home=java.java_home(jvm), console=console
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
        props = server_properties(
            self.settings.host, self.port, self.settings.ports.kafka_controller, self.data_dir
        )
        self.config_file.write_text(render_properties(props))
        if (self.data_dir / "meta.properties").exists():
            return  # formatted once already; formatting again would refuse or wipe nothing
        id_file = self.home / "cluster.id"
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
            brokers = asyncio.run(asyncio.wait_for(_describe_cluster(self.settings.kafka_bootstrap), timeout))
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready yet"
            return Probe(False, detail=f"metadata request failed: {type(exc).__name__}: {exc}"[:200])
        version = self.version_hint()
        return Probe(True, version=version, detail=f"{brokers} broker(s), metadata ok")


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
