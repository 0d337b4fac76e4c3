"""`parley up --gateways N`: N gateways on the ports after the gateway port, each told its share of
chat.tokens, and HAProxy on the gateway port in front of them (its config, its place in the stop order)."""
from __future__ import annotations

from pathlib import Path

from infra.config.settings import Settings
from infra.local import balancer, prometheus
from infra.local.services import apps


def test_one_gateway_is_what_it_was_no_balancer_no_index() -> None:
    settings = Settings()
    (gateway,) = apps.gateway_specs(settings)
    assert (gateway.name, gateway.port, gateway.env) == ("gateway", 8000, {})
    assert balancer.gateway_ports(settings) == [8000]


def test_several_gateways_listen_after_the_gateway_port_each_with_its_index(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path).with_(gateway_count=3)
    found = apps.gateway_specs(settings)
    assert [(s.name, s.port, s.ready_url) for s in found] == [
        ("gateway-0", 8001, "http://127.0.0.1:8001/healthz"), ("gateway-1", 8002, "http://127.0.0.1:8002/healthz"),
        ("gateway-2", 8003, "http://127.0.0.1:8003/healthz")]
    assert [s.env for s in found] == [{"PARLEY_GATEWAY_INDEX": str(i), "PARLEY_GATEWAYS": "3"} for i in range(3)]
    assert [Settings.from_env(s.env).gateway_index for s in found] == [0, 1, 2]
    assert all(("gateway", "--port", str(s.port)) == s.markers for s in found)


def test_the_balancer_takes_the_gateway_port_and_checks_every_gateway(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path).with_(gateway_count=2)
    path = balancer.write_config(settings)
    text = path.read_text()
    assert "bind 127.0.0.1:8000" in text and "balance leastconn" in text and "option httpchk GET /healthz" in text
    assert "server gw0 127.0.0.1:8001 check" in text and "server gw1 127.0.0.1:8002 check" in text
    assert "compression" not in text and "http-buffer-request" not in text  # SSE passes as it comes
    spec = apps.balancer_spec(settings, balancer.command("/usr/sbin/haproxy", path))
    assert spec.command == ("/usr/sbin/haproxy", "-db", "-f", str(path)) and spec.port == 8000
    assert spec.ready_url == "http://127.0.0.1:8000/healthz"


def test_down_stops_the_balancer_and_the_gateways_first() -> None:
    names = ["worker-large", "stages", "gateway-1", "balancer", "gateway-0", "prometheus"]
    assert apps.stop_tiers(names) == [["balancer", "gateway-0", "gateway-1"], ["stages"], ["worker-large"],
                                      ["prometheus"]]


def test_prometheus_scrapes_each_gateway_not_the_balancer(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path).with_(gateway_count=2)
    assert prometheus.targets(settings, {})["gateway"] == ["127.0.0.1:8001", "127.0.0.1:8002"]
