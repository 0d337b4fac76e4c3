"""The Kubernetes chart (infra/deploy/helm/parley): its topics are the catalogue's, and what `helm template`
renders is valid against schemas generated from k8s.io/api (kubeconform). helm and kubeconform are built into
the cache dir by infra/deploy/tools.sh, which `infra/parley test` runs; without them these tests fail."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from infra.config.settings import Settings
from infra.deploy.topics import CHART, TOPICS_FILE, deployed_topics, topics_document
from tests.tools import missing, needs

SCHEMA_SRC = Path(__file__).resolve().parents[2] / "infra" / "deploy" / "schemas"


def _tool(name: str) -> str | None:
    cached = Settings.from_env().cache_dir / "go" / "bin" / name
    return str(cached) if os.access(cached, os.X_OK) else shutil.which(name)


HELM, KUBECONFORM = _tool("helm"), _tool("kubeconform")
needs_helm = needs(HELM, "helm", "run infra/deploy/tools.sh")


def _render(*sets: str) -> list[dict[str, Any]]:
    args = [HELM, "template", "parley", str(CHART), "--kube-version", "1.31.0"]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=120).stdout  # type: ignore[list-item]
    return [doc for doc in yaml.safe_load_all(out) if doc]


def _kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_topics_file_is_generated_from_the_catalogue() -> None:
    assert TOPICS_FILE.read_text() == topics_document(), "stale: run `python -m infra.deploy.topics`"


@needs_helm
def test_rendered_topics_equal_the_catalogue() -> None:
    topics = {t["spec"]["topicName"]: t["spec"] for t in _kind(_render(), "KafkaTopic")}
    catalogue = deployed_topics()
    assert set(topics) == {name for name, _ in catalogue} and len(catalogue) == 15  # with the by-plan copy
    for name, t in catalogue:
        spec = topics[name]
        assert (spec["partitions"], spec["replicas"]) == (t.partitions, 3)
        assert spec["config"] == {"retention.ms": t.retention_ms, "cleanup.policy": t.cleanup_policy,
                                  "min.insync.replicas": 2}


@needs_helm
def test_one_deployment_per_stage_and_gpu_workers_scaled_on_their_lanes() -> None:
    from infra.local.stages_cli import STAGES

    docs = _render()
    deployments = {d["metadata"]["name"]: d for d in _kind(docs, "Deployment")}
    for stage in STAGES:
        args = deployments[f"parley-{stage}"]["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[:3] == ["stages", "--only", stage]
    for pool in ("large", "small"):
        container = deployments[f"parley-worker-{pool}"]["spec"]["template"]["spec"]["containers"][0]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert {"startupProbe", "readinessProbe", "livenessProbe"} <= set(container)
    scaled = {s["metadata"]["name"]: s["spec"] for s in _kind(docs, "ScaledObject")}
    large = scaled["parley-worker-large"]
    assert large["minReplicaCount"] == 2
    assert {(t["metadata"]["topic"], t["metadata"]["consumerGroup"]) for t in large["triggers"]} == {
        ("generate.large.paid", "generation.large"), ("generate.large.free", "generation.large")}
    hpa = _kind(docs, "HorizontalPodAutoscaler")[0]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "parley-gateway"}
    assert hpa["minReplicas"] >= 2
    k8ssandra = _kind(docs, "K8ssandraCluster")[0]["spec"]["cassandra"]["datacenters"][0]
    env = _kind(docs, "ConfigMap")[0]["data"]
    assert (k8ssandra["size"], env["PARLEY_CASSANDRA_REPLICATION"], env["PARLEY_CASSANDRA_CONSISTENCY"]) == (
        3, "3", "LOCAL_QUORUM")
    kafka = _kind(docs, "Kafka")[0]["spec"]["kafka"]["config"]
    assert (kafka["default.replication.factor"], kafka["min.insync.replicas"]) == (3, 2)


@needs_helm
def test_each_gateway_pod_reads_its_own_partitions_of_the_token_topic() -> None:
    from producers.gateway.ownership import owned
    from topics.catalogue import TOKENS

    gateway = next(s for s in _kind(_render(), "StatefulSet") if s["metadata"]["name"] == "parley-gateway")
    env = {e["name"]: e for e in gateway["spec"]["template"]["spec"]["containers"][0]["env"]}
    index = env["PARLEY_GATEWAY_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert index == "metadata.labels['apps.kubernetes.io/pod-index']"  # the pod's ordinal
    shards = int(env["PARLEY_GATEWAYS"]["value"])
    assert 2 <= shards <= TOKENS.partitions
    # every partition has a reader among the first `shards` pods, and an extra pod shares, never lacks one
    assert sorted(p for i in range(shards) for p in owned(i, shards, TOKENS.partitions)) == list(
        range(TOKENS.partitions))
    assert owned(shards + 1, shards, TOKENS.partitions) == owned(1, shards, TOKENS.partitions)
    headless = {s["metadata"]["name"] for s in _kind(_render(), "Service") if s["spec"].get("clusterIP") == "None"}
    assert gateway["spec"]["serviceName"] in headless


@needs_helm
@needs(KUBECONFORM, "kubeconform", "run infra/deploy/tools.sh")
def test_rendered_manifests_are_valid_kubernetes(tmp_path: Path) -> None:
    digest = hashlib.sha256((SCHEMA_SRC / "main.go").read_bytes() + (SCHEMA_SRC / "go.mod").read_bytes())
    schemas = Settings.from_env().cache_dir / "k8s-schemas" / digest.hexdigest()[:16]
    if not (schemas / "deployment-apps-v1.json").is_file():
        missing(f"the Kubernetes schemas ({schemas})", "run infra/deploy/tools.sh")
    rendered = tmp_path / "parley.yaml"
    rendered.write_text(yaml.safe_dump_all(_render()))
    broken = tmp_path / "broken.yaml"
    broken.write_text(rendered.read_text().replace("terminationGracePeriodSeconds: 30",
                                                   "terminationGracePeriodSecondz: 30", 1))

    def validate(path: Path) -> tuple[int, dict[str, Any]]:
        done = subprocess.run([KUBECONFORM, "-strict", "-summary", "-output", "json",  # type: ignore[list-item]
                               "-schema-location", f"{schemas}/{{{{ .ResourceKind }}}}{{{{ .KindSuffix }}}}.json",
                               "-ignore-missing-schemas", str(path)], capture_output=True, text=True, timeout=120)
        return done.returncode, json.loads(done.stdout)

    rc, report = validate(rendered)
    assert rc == 0, report
    summary = report["summary"]
    # Every built-in kind is checked; only the operators' own kinds (Strimzi, K8ssandra, KEDA) are skipped.
    assert summary["invalid"] == 0 and summary["errors"] == 0 and summary["valid"] >= 20, summary
    # The schemas do catch a wrong field name.
    rc, report = validate(broken)
    assert rc != 0 and report["summary"]["invalid"] == 1, report["summary"]
