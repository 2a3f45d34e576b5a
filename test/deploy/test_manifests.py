"""The compose file and the Kubernetes manifests parse, use only `--lynx-*` options the server
accepts, and keep their timeouts, addresses, secret and metrics consistent (docs/DEPLOY.md).

Three deployments are checked: `deploy/compose.yaml` (one node), `deploy/k8s/base`
(the CPU image) and `deploy/k8s/gpu` (the base with the GPU overlay's patches merged in).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from lynx.config import LynxConfig
from lynx.options import options

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
OPTIONS = {opt.flag: opt for opt in options()}
SWITCHES = {"--lynx"} | {flag for flag, opt in OPTIONS.items() if opt.is_switch}
SGLANG_HEALTH_DEFAULT = 20
LOOPBACK = "127.0.0.1"


@dataclass
class Container:
    """One container of a deployment, its command resolved against its environment."""

    role: str  # prefill, decode or router
    tokens: list[str]
    env: dict[str, str]
    probes: dict[str, dict] = field(default_factory=dict)
    pod: dict = field(default_factory=dict)  # the pod template (Kubernetes) or the service (compose)

    def flags(self) -> dict[str, str | None]:
        """`--flag` -> its value (None for a switch); the last occurrence wins."""
        found: dict[str, str | None] = {}
        for i, token in enumerate(self.tokens):
            if not token.startswith("--"):
                continue
            if "=" in token:
                name, value = token.split("=", 1)
            else:
                following = self.tokens[i + 1] if i + 1 < len(self.tokens) else None
                name, value = token, following if following and not following.startswith("--") else None
            found[name] = value
        return found

    def values_after(self, flag: str) -> list[str]:
        """Every non-flag token after each occurrence of `flag` (e.g. `--prefill URL PORT`)."""
        out = []
        for i, token in enumerate(self.tokens):
            if token == flag:
                for following in self.tokens[i + 1 :]:
                    if following.startswith("--"):
                        break
                    out.append(following)
        return out


@dataclass
class Deployment:
    name: str
    containers: list[Container]
    documents: list[dict]
    health_timeout_outside_probes: int | None = None  # the image's HEALTHCHECK, where no probe is declared

    def servers(self) -> list[Container]:
        return [c for c in self.containers if c.role in ("prefill", "decode")]

    def one(self, role: str) -> Container:
        (found,) = [c for c in self.containers if c.role == role]
        return found

    def of_kind(self, kind: str) -> list[dict]:
        return [doc for doc in self.documents if doc.get("kind") == kind]


def _resolve(text: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), text)


def _role(tokens: list[str]) -> str:
    if tokens and tokens[0] == "smg":
        return "router"
    joined = " ".join(tokens)
    match = re.search(r"--disaggregation-mode[= ](\w+)", joined)
    assert "sglang.launch_server" in joined and match, f"not a PD server or router: {joined}"
    return match.group(1)


def _kubernetes(folder: Path, render) -> Deployment:
    """`render`: scripts/k8s_validate.py's kustomize rendering (the `k8s_validate` fixture)."""
    documents = render(folder)
    config = {
        doc["metadata"]["name"]: {k: str(v) for k, v in doc.get("data", {}).items()}
        for doc in documents
        if doc["kind"] == "ConfigMap"
    }
    containers = []
    for doc in documents:
        if doc["kind"] != "Deployment":
            continue
        pod = doc["spec"]["template"]
        for spec in pod["spec"]["containers"]:
            env: dict[str, str] = {}
            for source in spec.get("envFrom", []):
                env.update(config[source["configMapRef"]["name"]])
            for item in spec.get("env", []):
                if "value" in item:
                    env[item["name"]] = _resolve(str(item["value"]), env)
            tokens = [_resolve(str(t), env) for t in spec.get("command", []) + spec.get("args", [])]
            probes = {kind: spec[kind] for kind in ("startupProbe", "readinessProbe", "livenessProbe") if kind in spec}
            containers.append(Container(_role(tokens), tokens, env, probes, pod))
    return Deployment(f"k8s/{folder.name}", containers, documents)


def _compose() -> Deployment:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    containers = []
    for service in compose["services"].values():
        command = service["command"]
        tokens = command.split() if isinstance(command, str) else [str(t) for t in command]
        env = {k: str(v) for k, v in (service.get("environment") or {}).items()}
        probes = {"healthcheck": service["healthcheck"]} if "healthcheck" in service else {}
        containers.append(Container(_role(tokens), tokens, env, probes, service))
    match = re.search(r"^HEALTHCHECK .*--timeout=(\d+)s", (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    return Deployment("compose", containers, [compose], health_timeout_outside_probes=int(match.group(1)))


DEPLOYMENTS = {
    "compose": lambda render: _compose(),
    "k8s-base": lambda render: _kubernetes(K8S / "base", render),
    "k8s-gpu": lambda render: _kubernetes(K8S / "gpu", render),
}


@pytest.fixture(params=sorted(DEPLOYMENTS), scope="module")
def deployment(request, k8s_validate) -> Deployment:
    return DEPLOYMENTS[request.param](k8s_validate.render)


@pytest.fixture(params=sorted(name for name in DEPLOYMENTS if name.startswith("k8s")), scope="module")
def cluster(request, k8s_validate) -> Deployment:
    return DEPLOYMENTS[request.param](k8s_validate.render)


def _strings(node):
    if isinstance(node, dict):
        for value in node.values():
            yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)
    elif isinstance(node, str):
        yield node


def test_every_manifest_parses():
    files = sorted(DEPLOY.rglob("*.yaml"))
    assert len(files) >= 10, files
    for path in files:
        documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
        assert documents and all(isinstance(doc, dict) for doc in documents), path


def test_every_lynx_flag_anywhere_is_one_the_server_accepts():
    for path in sorted(DEPLOY.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            for text in _strings(doc):
                for token in re.findall(r"--lynx[\w-]*", text):
                    assert token in OPTIONS or token == "--lynx", f"{path.relative_to(ROOT)}: unknown option {token}"


def test_lynx_options_have_values_and_make_a_valid_config(deployment):
    for server in deployment.servers():
        flags = server.flags()
        assert "--lynx" in flags, f"{deployment.name} {server.role}: no --lynx"
        kwargs = {}
        for flag, value in flags.items():
            if not flag.startswith("--lynx"):
                continue
            if flag in SWITCHES:
                assert value is None, f"{deployment.name} {server.role}: {flag} takes no value"
                if flag != "--lynx":
                    kwargs[OPTIONS[flag].field] = True
            else:
                assert value is not None, f"{deployment.name} {server.role}: {flag} needs a value"
                assert "$(" not in value, f"{deployment.name} {server.role}: {flag}={value} is not resolved"
                kwargs[OPTIONS[flag].field] = OPTIONS[flag].type(value)
        LynxConfig(**kwargs)  # raises ValueError on a value the server would refuse


def test_prefill_and_decode_agree_on_model_and_wire(deployment):
    prefill, decode = deployment.one("prefill").flags(), deployment.one("decode").flags()
    for flag in ("--model-path", "--served-model-name", "--lynx-mode", "--lynx-preset", "--lynx-chunk-bytes"):
        assert prefill.get(flag) == decode.get(flag), f"{deployment.name}: {flag} differs"
    assert prefill["--served-model-name"], f"{deployment.name}: the router routes by --served-model-name"
    assert prefill.get("--disaggregation-bootstrap-port"), f"{deployment.name}: prefill bootstrap port"


def test_timeouts_are_consistent(deployment):
    prefill, decode = deployment.one("prefill"), deployment.one("decode")
    names = ("SGLANG_HEALTH_CHECK_TIMEOUT", "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "SGLANG_DISAGGREGATION_WAITING_TIMEOUT")
    for name in names:
        assert name in prefill.env and prefill.env[name] == decode.env.get(name), f"{deployment.name}: {name}"
    health = int(prefill.env.get("SGLANG_HEALTH_CHECK_TIMEOUT", SGLANG_HEALTH_DEFAULT))
    for server in (prefill, decode):
        transfer = float(server.flags()["--lynx-transfer-timeout"])
        waiting = int(server.env["SGLANG_DISAGGREGATION_WAITING_TIMEOUT"])
        assert waiting >= health + transfer, f"{deployment.name}: waiting timeout {waiting} s leaves no room for a prefill"
        timeouts = [probe["timeoutSeconds"] for probe in server.probes.values() if "timeoutSeconds" in probe]
        if deployment.health_timeout_outside_probes is not None and not server.probes:
            timeouts.append(deployment.health_timeout_outside_probes)
        assert timeouts, f"{deployment.name} {server.role}: no health probe"
        assert min(timeouts) > health, f"{deployment.name} {server.role}: a probe gives up before SGLang's /health answers"
    router = deployment.one("router").flags()
    assert int(router["--health-check-timeout-secs"]) > health, f"{deployment.name}: the router drops busy workers"


def test_kubernetes_probes_hit_health_and_allow_for_start_up(cluster):
    for server in cluster.servers():
        assert set(server.probes) == {"startupProbe", "readinessProbe", "livenessProbe"}
        for probe in server.probes.values():
            assert probe["httpGet"]["path"] == "/health"
        startup = server.probes["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 300, f"{cluster.name}: start-up budget"


def test_transfer_secret_comes_from_a_mounted_secret(deployment):
    for server in deployment.servers():
        path = server.flags().get("--lynx-secret-file")
        assert path, f"{deployment.name} {server.role}: no --lynx-secret-file"
        assert "--lynx-insecure" not in server.flags()
        assert "LYNX_SECRET" not in server.env, f"{deployment.name}: LYNX_SECRET given as a literal value"
        if deployment.name == "compose":
            targets = [s["target"] if isinstance(s, dict) else s for s in server.pod.get("secrets", [])]
            assert path in {f"/run/secrets/{t}" for t in targets}, f"compose {server.role}: {path} is not a secret"
        else:
            spec = server.pod["spec"]
            secret_volumes = {v["name"] for v in spec["volumes"] if "secret" in v}
            (container,) = [c for c in spec["containers"] if c["name"] == "server"]
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            assert mounts.get(str(Path(path).parent)) in secret_volumes, f"{deployment.name}: {path} is not a Secret"
    if deployment.name == "compose":
        for secret in deployment.documents[0]["secrets"].values():
            default = re.sub(r"^\$\{\w+:-(.*)\}$", r"\1", secret["file"])  # ${VAR:-default}
            assert default.lstrip("./") in (DEPLOY / ".gitignore").read_text().split()


def test_local_deployment_stays_on_loopback():
    deployment = _compose()
    for server in deployment.servers():
        assert server.pod["network_mode"] == "host"
        assert server.flags()["--host"] == LOOPBACK and server.env["SGLANG_HOST_IP"] == LOOPBACK
    router = deployment.one("router")
    assert router.flags()["--host"] == LOOPBACK and router.flags()["--prometheus-host"] == LOOPBACK
    urls = router.values_after("--prefill") + router.values_after("--decode")
    assert all(url.startswith(f"http://{LOOPBACK}:") for url in urls if url.startswith("http")), urls


def test_router_reaches_every_server(deployment):
    prefill, decode = deployment.one("prefill").flags(), deployment.one("decode").flags()
    router = deployment.one("router")
    if deployment.name == "compose":
        assert router.values_after("--prefill") == [f"http://{LOOPBACK}:{prefill['--port']}", prefill["--disaggregation-bootstrap-port"]]
        assert router.values_after("--decode") == [f"http://{LOOPBACK}:{decode['--port']}"]
        return
    assert router.flags()["--service-discovery-port"] == prefill["--port"] == decode["--port"]
    for role in ("prefill", "decode"):
        selector = dict(item.split("=") for item in router.values_after(f"--{role}-selector"))
        labels = deployment.one(role).pod["metadata"]["labels"]
        assert selector and selector.items() <= labels.items(), f"{deployment.name}: {role} selector {selector}"
    annotations = deployment.one("prefill").pod["metadata"]["annotations"]
    assert annotations["sglang.ai/bootstrap-port"] == prefill["--disaggregation-bootstrap-port"]
    account = router.pod["spec"]["serviceAccountName"]
    bindings = [b for b in deployment.of_kind("RoleBinding") if any(s["name"] == account for s in b["subjects"])]
    roles = {b["roleRef"]["name"] for b in bindings}
    rules = [r for role in deployment.of_kind("Role") if role["metadata"]["name"] in roles for r in role["rules"]]
    assert any("pods" in r["resources"] and {"list", "watch"} <= set(r["verbs"]) for r in rules)


def test_cluster_pods_advertise_their_own_address(cluster):
    for server in cluster.servers():
        assert server.env["SGLANG_HOST_IP"] == "$(POD_IP)" and server.flags()["--host"] == "$(POD_IP)"
        (container,) = [c for c in server.pod["spec"]["containers"] if c["name"] == "server"]
        pod_ip = next(e for e in container["env"] if e["name"] == "POD_IP")
        assert pod_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


def test_servers_export_metrics_for_prometheus(deployment):
    for server in deployment.servers():
        assert "--enable-metrics" in server.flags(), f"{deployment.name} {server.role}: no --enable-metrics"
        if deployment.name != "compose":
            annotations = server.pod["metadata"]["annotations"]
            assert annotations["prometheus.io/scrape"] == "true"
            assert annotations["prometheus.io/port"] == server.flags()["--port"]
    if deployment.name != "compose":
        ports = {p["name"] for c in deployment.containers for container in c.pod["spec"]["containers"] for p in container["ports"]}
        for monitor in yaml.safe_load_all((K8S / "monitoring" / "podmonitor.yaml").read_text()):
            assert all(endpoint["port"] in ports for endpoint in monitor["spec"]["podMetricsEndpoints"])


def test_pods_run_as_non_root(cluster):
    for container in cluster.containers:
        context = container.pod["spec"]["securityContext"]
        assert context["runAsNonRoot"] is True and context["runAsUser"] != 0
