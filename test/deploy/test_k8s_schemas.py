"""The Kubernetes manifests validate strictly against the Kubernetes API schemas (scripts/k8s_validate.py).

The schemas come with the `kubernetes-validate` wheel: nothing is downloaded.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "k8s_validate.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def write(folder: Path, name: str, text: str) -> None:
    (folder / name).write_text(textwrap.dedent(text))


DEPLOYMENT = """\
    apiVersion: apps/v1
    kind: Deployment
    metadata: {name: web}
    spec:
      selector: {matchLabels: {app: web}}
      template:
        metadata: {labels: {app: web}}
        spec:
          containers:
            - name: web
              image: localhost/web
              %s
"""


def test_every_kubernetes_manifest_is_valid_against_the_api_schemas(k8s_validate):
    result = run()
    assert result.returncode == 0, result.stdout + result.stderr
    match = re.search(r"Kubernetes (.+): (\d+) resource validations passed, 0 failed", result.stdout)
    assert match, result.stdout
    versions = match.group(1).split(", ")
    rendered = [r for folder in ("base", "gpu") for r in k8s_validate.render(ROOT / "deploy" / "k8s" / folder)]
    assert int(match.group(2)) == len(versions) * len(rendered) >= 2 * 20
    # Only the Prometheus Operator's custom resources lack a schema in the package.
    assert re.findall(r"not validated \(no schema in the package\): .*", result.stdout) == [
        f"not validated (no schema in the package): deploy/k8s/monitoring: PodMonitor/{name} (monitoring.coreos.com/v1)"
        for name in ("lynx-router", "lynx-servers")
    ]


@pytest.mark.parametrize(
    "line, reported",
    [
        ("imagePullPolcy: Always", "Additional properties are not allowed ('imagePullPolcy' was unexpected)"),
        ("ports: [{containerPort: http}]", "'http' is not of type 'integer'"),
    ],
)
def test_an_unknown_field_or_a_wrong_type_fails_the_check(tmp_path, line, reported):
    write(tmp_path, "web.yaml", DEPLOYMENT % line)
    result = run(str(tmp_path))
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(r"ERROR .*: Deployment/web \(Kubernetes [\d.]+\): ", result.stdout) and reported in result.stdout


def test_overlay_patches_merge_lists_by_their_kubernetes_merge_key(k8s_validate):
    resources = k8s_validate.render(ROOT / "deploy" / "k8s" / "gpu")
    (prefill,) = [r for r in resources if r["kind"] == "Deployment" and r["metadata"]["name"] == "lynx-prefill"]
    assert prefill["metadata"]["namespace"] == "lynx" and prefill["spec"]["replicas"] == 2
    (server,) = prefill["spec"]["template"]["spec"]["containers"]
    assert server["image"] == "localhost/lynx:gpu"
    assert {"POD_IP", "SGLANG_HOST_IP", "HF_TOKEN"} <= {e["name"] for e in server["env"]}
    mounts = {m["mountPath"] for m in server["volumeMounts"]}
    assert {"/run/secrets/lynx", "/home/lynx/.cache/huggingface"} <= mounts
    assert server["startupProbe"]["httpGet"]["path"] == "/health"  # the base's probe, the overlay's threshold
    assert server["startupProbe"]["failureThreshold"] == 180
    volumes = {v["name"]: v for v in prefill["spec"]["template"]["spec"]["volumes"]}
    assert volumes["shm"]["emptyDir"]["sizeLimit"] == "16Gi" and "transfer-secret" in volumes


def test_kustomize_fields_it_does_not_render_are_refused(tmp_path, k8s_validate):
    write(tmp_path, "web.yaml", DEPLOYMENT % "")
    write(tmp_path, "kustomization.yaml", "resources: [web.yaml]\nimages: [{name: localhost/web, newTag: v2}]\n")
    with pytest.raises(k8s_validate.RenderError, match="images"):
        k8s_validate.render(tmp_path)
    result = run(str(tmp_path))
    assert result.returncode == 2 and "cannot render" in result.stdout
