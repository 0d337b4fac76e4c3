"""Single-node Cassandra 5.0 (cassandra-all from Maven Central) on Java 17."""

from __future__ import annotations

import contextlib
import logging
import string
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console

from infra.local.services import java, maven, process
from infra.local.services.base import Probe, Service

CONFIG_DIR = Path(__file__).resolve().parent.parent / "cassandra"
POM = CONFIG_DIR / "pom.xml"
YAML_TEMPLATE = CONFIG_DIR / "cassandra.yaml"
LOGBACK = CONFIG_DIR / "logback.xml"

# Cassandra 5.0's conf/jvm-server.options + conf/jvm17-server.options + cassandra-env.sh, for Java 17.
GC_AND_RUNTIME = [
    "-Xss256k",
    "-XX:+UseG1GC",
    "-XX:+ParallelRefProcEnabled",
    "-XX:MaxTenuringThreshold=1",
    "-XX:G1RSetUpdatingPauseTimePercent=5",
    "-XX:MaxGCPauseMillis=300",
    "-XX:InitiatingHeapOccupancyPercent=70",
    "-ea",
    "-da:net.openhft...",
    "-XX:+UseThreadPriorities",
    "-XX:+HeapDumpOnOutOfMemoryError",
    "-XX:+ExitOnOutOfMemoryError",  # StartupChecks warns without one of Exit/Crash/OnOutOfMemoryError
    "-XX:+UseTLAB",
    "-XX:+ResizeTLAB",
    "-XX:+PerfDisableSharedMem",
    "-Djava.net.preferIPv4Stack=true",
    "-Djdk.attach.allowAttachSelf=true",
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Dio.netty.allocator.useCacheForAllThreads=true",
    "-Dio.netty.allocator.maxOrder=11",
    "-Dchronicle.analytics.disable=true",
]
MODULE_FLAGS = [
    "--add-exports",
    "java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-exports",
    "java.management.rmi/com.sun.jmx.remote.internal.rmi=ALL-UNNAMED",
    "--add-exports",
    "java.management/com.sun.jmx.remote.security=ALL-UNNAMED",
    "--add-exports",
    "java.rmi/sun.rmi.registry=ALL-UNNAMED",
    "--add-exports",
    "java.rmi/sun.rmi.server=ALL-UNNAMED",
    "--add-exports",
    "java.sql/java.sql=ALL-UNNAMED",
    "--add-exports",
    "java.base/java.lang.ref=ALL-UNNAMED",
    "--add-exports",
    "jdk.unsupported/sun.misc=ALL-UNNAMED",
    "--add-opens",
    "java.base/java.lang.module=ALL-UNNAMED",
    "--add-opens",
    "java.base/jdk.internal.loader=ALL-UNNAMED",
    "--add-opens",
    "java.base/jdk.internal.ref=ALL-UNNAMED",
    "--add-opens",
    "java.base/jdk.internal.reflect=ALL-UNNAMED",
    "--add-opens",
    "java.base/jdk.internal.math=ALL-UNNAMED",
    "--add-opens",
    "java.base/jdk.internal.module=ALL-UNNAMED",
    "--add-opens",
    "java.base/jdk.internal.util.jar=ALL-UNNAMED",
    "--add-opens",
    "jdk.management/com.sun.management.internal=ALL-UNNAMED",
    "--add-opens",
    "java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens",
    "java.base/java.io=ALL-UNNAMED",
    "--add-opens",
    "java.base/java.lang.reflect=ALL-UNNAMED",
    "--add-opens",
    "java.base/java.lang=ALL-UNNAMED",
    "--add-opens",
    "java.base/java.util=ALL-UNNAMED",
    "--add-opens",
    "java.base/java.nio=ALL-UNNAMED",
]
# Only valid with a full JDK (the jdk.compiler / jdk.attach modules exist only where javac does).
JDK_ONLY_FLAGS = [
    "--add-exports",
    "jdk.compiler/com.sun.tools.javac.file=ALL-UNNAMED",
    "--add-exports",
    "jdk.attach/sun.tools.attach=ALL-UNNAMED",
    "--add-opens",
    "jdk.compiler/com.sun.tools.javac=ALL-UNNAMED",
]


def render_yaml(template: str, *, host: str, storage_port: int, native_port: int, home: Path) -> str:
    """Fill the template's placeholders with absolute paths under ``home`` and the configured ports."""
    return string.Template(template).substitute(
        host=host,
        storage_port=storage_port,
        native_port=native_port,
        data_dir=home / "data",
        commitlog_dir=home / "commitlog",
        saved_caches_dir=home / "saved_caches",
        hints_dir=home / "hints",
        cdc_raw_dir=home / "cdc_raw",
    )


@contextlib.contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    log = logging.getLogger(logger_name)
    before = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(before)


class Cassandra(Service):
    name = "cassandra"
    exe_names = ("java",)

    @property
    def port(self) -> int:
        return self.settings.ports.cassandra

    @property
    def ports(self) -> dict[str, int]:
        p = self.settings.ports
        return {"native": p.cassandra, "storage": p.cassandra_storage, "jmx": p.cassandra_jmx}

    @property
    def version(self) -> str:
        return maven.pom_property(POM, "cassandra.version")

    @property
    def lib(self) -> Path:
        return maven.lib_dir(self.settings.cache_dir, self.name, self.version)

    @property
    def config_file(self) -> Path:
        return self.home / "cassandra.yaml"

    def markers(self) -> list[str]:
        return ["org.apache.cassandra.service.CassandraDaemon", str(self.config_file)]

    def install(self, console: Console | None = None) -> None:
        jvm = java.find_java17()
        maven.ensure_libs(
            self.name, POM, self.settings.cache_dir, java_home=java.java_home(jvm), console=console
        )

    def prepare(self) -> None:
        for sub in ("data", "commitlog", "saved_caches", "hints", "cdc_raw", "logs", "tmp", "triggers"):
            (self.home / sub).mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(
            render_yaml(
                YAML_TEMPLATE.read_text(),
                host=self.settings.host,
                storage_port=self.settings.ports.cassandra_storage,
                native_port=self.port,
                home=self.home,
            )
        )

    def command(self) -> list[str]:
        jvm = java.find_java17()
        heap = self.settings.cassandra_heap_mb
        jamm = sorted(self.lib.glob("jamm-*.jar"))
        return [
            str(jvm),
            f"-Xms{heap}m",
            f"-Xmx{heap}m",
            *GC_AND_RUNTIME,
            f"-XX:HeapDumpPath={self.home / 'logs'}",
            *MODULE_FLAGS,
            *(JDK_ONLY_FLAGS if java.has_javac(jvm) else []),
            *([f"-javaagent:{jamm[-1]}"] if jamm else []),
            f"-Dcassandra.jmx.local.port={self.settings.ports.cassandra_jmx}",
            "-Dcom.sun.management.jmxremote.authenticate=false",
            f"-Dcassandra.config={self.config_file.resolve().as_uri()}",
            f"-Dlogback.configurationFile={LOGBACK}",
            f"-Dcassandra.storagedir={self.home}",
            f"-Dcassandra.logdir={self.home / 'logs'}",
            f"-Djna.tmpdir={self.home / 'tmp'}",
            f"-Dcassandra.triggers_dir={self.home / 'triggers'}",
            "-Dcassandra-foreground=yes",
            "-Dcassandra.skip_wait_for_gossip_to_settle=0",
            "-Dcassandra.initial_token=0",
            "-cp",
            f"{self.lib}/*",
            "org.apache.cassandra.service.CassandraDaemon",
        ]

    def probe(self, timeout: float = 3.0) -> Probe:
        if not process.port_open(self.settings.host, self.port, timeout=min(timeout, 1.0)):
            return Probe(False, detail="not listening")
        from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
        from cassandra.policies import DCAwareRoundRobinPolicy

        with _quiet("cassandra"):
            cluster = Cluster(
                [self.settings.host],
                port=self.port,
                execution_profiles={
                    EXEC_PROFILE_DEFAULT: ExecutionProfile(
                        load_balancing_policy=DCAwareRoundRobinPolicy(local_dc="datacenter1"),
                        request_timeout=timeout,
                    )
                },
                connect_timeout=timeout,
                control_connection_timeout=timeout,
            )
            try:
                session = cluster.connect()
                row = session.execute("SELECT release_version FROM system.local").one()
                return Probe(True, version=row.release_version, detail="CQL ok")
            except Exception as exc:  # noqa: BLE001 - any failure means "not ready yet"
                return Probe(False, detail=f"CQL query failed: {type(exc).__name__}: {exc}"[:200])
            finally:
                cluster.shutdown()
