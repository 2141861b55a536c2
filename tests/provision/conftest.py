"""Namespace-isolated nodes for provisioning tests.

Each node is a real sshd (tests/sshd_harness.py) started inside a private mount namespace by
overlay_sshd.sh: /etc, /opt and /var are overlays whose upper layers are per-node temp directories, so
provisioning writes real files at their real paths (/etc/systemd/system, /etc/sysctl.d,
/opt/inferctl/venvs, ...) without touching this machine. Stand-ins (standins.py) replace systemctl,
sysctl, nvidia-smi, modinfo, timedatectl and mlnx_qos, and record their calls.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pip
import pytest

from infer_ctl.provision import runner
from infer_ctl.provision.selfwheel import BuiltWheel, node_wheels
from tests.provision import standins
from tests.provision.wheels import build_index
from tests.sshd_harness import SshCluster

WRAPPER = Path(__file__).with_name("overlay_sshd.sh")
NETDEV = "eth-standin0"


def _can_isolate() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
         "mount -t tmpfs none /mnt 2>/dev/null || mount -t tmpfs none /media"],
        capture_output=True, check=False,
    )
    return probe.returncode == 0


@dataclass
class ProvisionCluster:
    cluster: SshCluster
    tmp: Path
    #: `sglang.python` of the profiles: the real interpreter behind python_venv_standin
    python: Path

    def node_dir(self, name: str) -> Path:
        return self.cluster.root / name

    def upper(self, name: str) -> Path:
        """The node's writable layer: <upper>/etc/... is the node's /etc/..."""
        return self.node_dir(name) / "upper"

    def node_path(self, name: str, path: str) -> Path:
        top, _, rest = path.lstrip("/").partition("/")
        return self.upper(name) / top / rest

    def calls(self, name: str) -> list[str]:
        log = self.node_dir(name) / "state" / "calls.log"
        return log.read_text().splitlines() if log.exists() else []

    def checksum(self, name: str) -> str:
        """A digest of everything provisioning could have changed on the node: the overlay upper
        layers and the stand-ins' state (their call log excluded: probes are allowed to read)."""
        digest = hashlib.sha256()
        for base in (self.upper(name), self.node_dir(name) / "state", self.node_dir(name) / "sysnet"):
            for path in sorted(base.rglob("*")) if base.exists() else []:
                if path.name == "calls.log":
                    continue
                st = path.lstat()
                digest.update(f"{path.relative_to(base)} {st.st_mode:o}".encode())
                if path.is_symlink():
                    digest.update(os.readlink(path).encode())
                elif path.is_file():
                    digest.update(path.read_bytes())
        return digest.hexdigest()

    def profile(self, path: Path | None = None, **overrides: Any) -> Path:
        data = self.cluster.profile_data()
        # the GID index is pinned: these nodes have no RDMA devices to read it from (the units step reads
        # the GID table when none is pinned: test_units_env.py)
        nodes = [
            {**n, "gpus": 2, "roles": ["prefill", "decode"],
             "rdma": {"devices": ["mlx5_0"], "netdev": NETDEV, "gid_index": 3}}
            for n in data["nodes"]
        ]  # fmt: skip
        base: dict[str, Any] = {
            "nodes": nodes,
            "fabric": {"apply_qos": True},
            "sglang": {"version": "0.5.23", "python": str(self.python)},
        }
        for key, value in overrides.items():
            if isinstance(value, dict) and isinstance(base.get(key), dict):
                base[key] = {**base[key], **value}
            else:
                base[key] = value
        return self.cluster.write_profile(path or self.tmp / "profile.yaml", **base)


@pytest.fixture
def prov_cluster(
    ssh_cluster: Callable[..., SshCluster], tmp_path: Path, venv_python: Path
) -> Callable[..., ProvisionCluster]:
    if not _can_isolate():
        pytest.skip("needs root and unshare/overlayfs to give each test node a private /etc, /opt, /var")

    def make(n_nodes: int = 1, **kwargs: Any) -> ProvisionCluster:
        cluster = ssh_cluster(
            n_nodes, sshd_prefix=["unshare", "--mount", "--propagation", "private", "--", str(WRAPPER)], **kwargs
        )
        for name in cluster.names:
            (cluster.root / name / "state").mkdir()
            for tool, script in standins.ALL.items():
                cluster.add_executable(name, tool, script)
            ecn = cluster.root / name / "sysnet" / NETDEV / "ecn"
            for side in ("roce_np", "roce_rp"):
                (ecn / side / "enable").mkdir(parents=True)
                (ecn / side / "enable" / "3").write_text("0\n")
            # the wrapper mounts sysnet only when it exists at sshd start: restart the node
            cluster.stop(name)
            cluster.start(name)
        return ProvisionCluster(cluster, tmp_path, venv_python)

    return make


@pytest.fixture(scope="session")
def _session_node_wheels() -> list[BuiltWheel]:
    return node_wheels()


@pytest.fixture(autouse=True)
def frozen_node_wheels(monkeypatch: pytest.MonkeyPatch, _session_node_wheels: list[BuiltWheel]) -> list[BuiltWheel]:
    """The `inferctl` step ships wheels of this checkout's code. Build them once per session, so a test
    that expects a second run to be all OK is not broken by someone editing infer_ctl/ in between."""
    monkeypatch.setattr(runner, "node_wheels", lambda: list(_session_node_wheels))
    return _session_node_wheels


def python_venv_standin(bin_dir: Path) -> Path:
    """`python -m venv DIR` costs 5-20 s on a loaded 2-core CI machine, almost all of it ensurepip
    byte-compiling pip into the new venv. This stand-in runs the real `python -m venv --without-pip DIR`
    and makes this machine's own pip importable in it with a .pth file, so the `pip install` that
    provisioning runs next is the real pip, installing for real into the new venv. Every other
    invocation goes to the real interpreter. Used as `sglang.python` in the tests' profiles."""
    # a directory holding only pip (not this machine's whole site-packages, whose packages would
    # leak into the venv and could make a missing install look present)
    pip_home = bin_dir / "pip-only"
    pip_home.mkdir(parents=True, exist_ok=True)
    if not (pip_home / "pip").exists():
        (pip_home / "pip").symlink_to(Path(pip.__file__).parent)
    script = bin_dir / "python-venv-standin"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = -m ] && [ "$2" = venv ] && [ $# -eq 3 ]; then\n'
        f'  {shlex.quote(sys.executable)} -m venv --without-pip "$3" || exit 1\n'
        f'  for d in "$3"/lib/python*/site-packages; do echo {shlex.quote(str(pip_home))} > "$d/_standin_pip.pth"; done\n'
        # a test's index for the node (its private /etc): the venv's own pip.conf wins over this
        # machine's user config, as pip reads global, then user, then the venv's file
        '  if [ -f /etc/inferctl-test/pip.conf ]; then cp /etc/inferctl-test/pip.conf "$3/pip.conf"; fi\n'
        "  exit 0\n"
        "fi\n"
        f'exec {shlex.quote(sys.executable)} "$@"\n'
    )
    script.chmod(0o755)
    return script


@pytest.fixture(scope="session")
def venv_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return python_venv_standin(tmp_path_factory.mktemp("venv-standin"))


@pytest.fixture
def wheel_index(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    def make(version: str) -> Path:
        return build_index(tmp_path_factory.mktemp(f"index-{version}"), version)

    return make
