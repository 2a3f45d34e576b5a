"""Validate the Kubernetes manifests against the Kubernetes API schemas, offline.

    python scripts/k8s_validate.py [--kubernetes-version V ...] [FOLDER ...]

Each FOLDER (default: deploy/k8s/base, deploy/k8s/gpu, deploy/k8s/monitoring)
is rendered the way `kubectl apply -k` renders it: a folder with a
kustomization.yaml by its resources, namespace, labels, replicas and
strategic-merge patches (other kustomize fields are refused, not ignored); a
folder without one by its YAML files. Every rendered resource is then
validated strictly (unknown fields are errors) with `kubernetes-validate`,
whose wheel carries the JSON schemas of Kubernetes 1.25-1.37, so no schema is
downloaded (the pinned package itself is installed into this Python's
environment first where it is missing). Default versions: the oldest and the
newest the package holds. Custom resources (e.g. the Prometheus Operator's PodMonitor) have no schema
there; they are listed as not validated.

Exit status: 0 all valid, 1 a resource failed, 2 a folder could not be rendered.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
VALIDATOR = "kubernetes-validate==1.37.0"  # its wheel carries the schemas
DEFAULT_FOLDERS = ("deploy/k8s/base", "deploy/k8s/gpu", "deploy/k8s/monitoring")
KUSTOMIZE_FIELDS = {"apiVersion", "kind", "namespace", "labels", "resources", "replicas", "patches"}
SCALABLE = {"Deployment", "ReplicaSet", "ReplicationController", "StatefulSet"}
# Strategic merge: lists under these keys merge item by item on the given key
# (Kubernetes' patchMergeKey); every other list is replaced by the patch's.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "env": "name",
    "envFrom": None,
    "volumeMounts": "mountPath",
    "ports": "containerPort",
}


class RenderError(Exception):
    """A folder that cannot be rendered faithfully."""


def merge(base, patch, key: str | None = None):
    """`patch` merged into `base` with Kubernetes' strategic-merge rules for the fields above."""
    if isinstance(base, dict) and isinstance(patch, dict):
        if any(k.startswith("$") for k in patch):
            raise RenderError(f"patch directive {sorted(patch)} is not supported")
        out = dict(base)
        for name, value in patch.items():
            out[name] = merge(base[name], value, name) if name in base else value
        return out
    merge_key = MERGE_KEYS.get(key or "")
    if isinstance(base, list) and isinstance(patch, list) and merge_key:
        out = list(base)
        for item in patch:
            index = next((i for i, old in enumerate(out) if old.get(merge_key) == item.get(merge_key)), None)
            if index is None:
                out.append(item)
            else:
                out[index] = merge(out[index], item)
        return out
    return patch


def _documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def render(folder: Path) -> list[dict]:
    """The resources `kubectl apply -k folder` would send (or the folder's YAML files as they are)."""
    kustomization_path = folder / "kustomization.yaml"
    if not kustomization_path.exists():
        return [doc for path in sorted(folder.glob("*.yaml")) for doc in _documents(path)]
    kustomization = yaml.safe_load(kustomization_path.read_text())
    unknown = set(kustomization) - KUSTOMIZE_FIELDS
    if unknown:
        raise RenderError(f"{kustomization_path}: kustomize fields not rendered here: {sorted(unknown)}")
    resources: list[dict] = []
    for entry in kustomization.get("resources", []):
        path = folder / entry
        resources.extend(render(path) if path.is_dir() else _documents(path))
    for patch in kustomization.get("patches", []):
        if set(patch) != {"path"}:
            raise RenderError(f"{kustomization_path}: only patches given by path are rendered: {patch}")
        for doc in _documents(folder / patch["path"]):
            key = (doc["kind"], doc["metadata"]["name"])
            index = next((i for i, r in enumerate(resources) if (r["kind"], r["metadata"]["name"]) == key), None)
            if index is None:
                raise RenderError(f"{folder / patch['path']}: no {key[0]} {key[1]} to patch")
            resources[index] = merge(resources[index], doc)
    resources = copy.deepcopy(resources)
    for resource in resources:
        metadata = resource.setdefault("metadata", {})
        if "namespace" in kustomization:
            metadata["namespace"] = kustomization["namespace"]
        for entry in kustomization.get("labels", []):
            if entry.get("includeSelectors") or entry.get("includeTemplates"):
                raise RenderError(f"{kustomization_path}: labels into selectors or templates are not rendered here")
            metadata.setdefault("labels", {}).update(entry["pairs"])
    for entry in kustomization.get("replicas", []):
        targets = [r for r in resources if r["metadata"]["name"] == entry["name"] and r["kind"] in SCALABLE]
        if not targets:
            raise RenderError(f"{kustomization_path}: replicas for {entry['name']}, which is not a workload here")
        for resource in targets:
            resource["spec"]["replicas"] = entry["count"]
    return resources


def ensure_validator() -> None:
    """Install the pinned kubernetes-validate into this interpreter's environment where it is missing."""
    if importlib.util.find_spec("kubernetes_validate") is None:
        print(f"installing {VALIDATOR} into {sys.prefix}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", VALIDATOR], check=True)


def main() -> int:
    ensure_validator()
    import kubernetes_validate
    from kubernetes_validate.utils import SchemaNotFoundError, ValidationError, all_versions

    shipped = all_versions()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", default=list(DEFAULT_FOLDERS), help="folders to render and check")
    parser.add_argument(
        "--kubernetes-version", "-k", action="append", metavar="V",
        help=f"Kubernetes version to validate against, repeatable (shipped: {shipped[0]}..{shipped[-1]})",
    )
    args = parser.parse_args()
    versions = args.kubernetes_version or [shipped[0], shipped[-1]]

    failed = validated = 0
    no_schema: set[str] = set()
    for folder in args.folders:
        try:
            resources = render(ROOT / folder if not Path(folder).is_absolute() else Path(folder))
        except (RenderError, OSError, KeyError, yaml.YAMLError) as exc:
            print(f"ERROR {folder}: cannot render: {exc}")
            return 2
        for resource in resources:
            name = f"{folder}: {resource.get('kind')}/{resource.get('metadata', {}).get('name')}"
            for version in versions:
                try:
                    kubernetes_validate.validate(resource, version, strict=True)
                except ValidationError as exc:
                    path = ".".join(str(p) for p in exc.path)
                    print(f"ERROR {name} (Kubernetes {version}): {path}: {exc.message}")
                    failed += 1
                except SchemaNotFoundError:
                    no_schema.add(f"{name} ({resource.get('apiVersion')})")
                    break
                else:
                    validated += 1
    print(
        f"kubernetes-validate {kubernetes_validate.__version__}, strict, Kubernetes {', '.join(versions)}: "
        f"{validated} resource validations passed, {failed} failed"
    )
    for name in sorted(no_schema):
        print(f"not validated (no schema in the package): {name}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
