"""OS, kernel, driver and CUDA report. inferctl never installs drivers: wrong ones are MANUAL."""

from __future__ import annotations

from infer_ctl.core.provision.driver import version_tuple
from infer_ctl.core.provision.model import EntryKind
from infer_ctl.facts.gpu_driver import (
    KERNEL_RELEASE,
    MODINFO_NVIDIA_VERSION,
    NVIDIA_SMI_BANNER,
    NVIDIA_SMI_QUERY_GPU,
    OS_RELEASE,
    parse_cuda_version,
    parse_gpu_csv,
    parse_os_release,
)
from infer_ctl.provision.context import Planned, StepContext

NOT_FOUND = 127


class DriverStep:
    name = "driver"
    title = "OS, kernel, NVIDIA driver and CUDA: report and check minimums (never installs drivers)"
    needs_sudo = False

    def plan(self, ctx: StepContext) -> list[Planned]:
        conn, node = ctx.conn, ctx.node
        if node.gpus == 0:
            return [Planned(ctx.entry(self.name, "driver", EntryKind.SKIP, "node has no GPUs (gpus: 0)"))]
        kernel = conn.run(KERNEL_RELEASE, timeout=30).out.strip() or None
        os_release = conn.run(OS_RELEASE, timeout=30)
        os_name = parse_os_release(os_release.out) if os_release.ok else None
        query = conn.run(NVIDIA_SMI_QUERY_GPU, timeout=60)
        where = f"{os_name or 'unknown OS'}, kernel {kernel or '?'}"
        if not query.ok:
            reason = "nvidia-smi not found" if query.exit_code == NOT_FOUND else f"nvidia-smi failed: {query.err.strip()[:200]}"
            return [
                Planned(
                    ctx.entry(
                        self.name,
                        "driver",
                        EntryKind.MANUAL,
                        f"no working NVIDIA driver ({reason}); {where}",
                        remedy="install the NVIDIA datacenter driver (and fabric manager on NVSwitch systems) "
                        "from your distribution or NVIDIA's repository, reboot, then rerun provision",
                    )
                )
            ]
        gpus, loaded = parse_gpu_csv(query.out)
        cuda = parse_cuda_version(conn.run(NVIDIA_SMI_BANNER, timeout=60).out)
        modinfo = conn.run(MODINFO_NVIDIA_VERSION, timeout=30)
        installed = modinfo.out.strip() or None if modinfo.ok else None
        details = {
            "os": os_name,
            "kernel": kernel,
            "driver_loaded": loaded,
            "driver_installed": installed,
            "cuda_max": cuda,
            "gpus": len(gpus),
        }
        summary = f"{where}, driver {loaded or '?'}, CUDA {cuda or '?'}, {len(gpus)} GPU(s)"
        policy = ctx.profile.gpu_policy_for(node)
        entries: list[Planned] = []
        if policy.min_driver_version and loaded and version_tuple(loaded) < version_tuple(policy.min_driver_version):
            entries.append(
                Planned(
                    ctx.entry(
                        self.name,
                        "driver",
                        EntryKind.MANUAL,
                        f"driver {loaded} is older than gpu.min_driver_version {policy.min_driver_version}; {summary}",
                        before=loaded,
                        after=f">= {policy.min_driver_version}",
                        remedy="upgrade the driver package (drain the node first), reboot, rerun provision",
                        details=details,
                    )
                )
            )
        elif installed and loaded and installed != loaded:
            entries.append(
                Planned(
                    ctx.entry(
                        self.name,
                        "driver",
                        EntryKind.REBOOT_REQUIRED,
                        f"driver {installed} is installed but {loaded} is loaded; {summary}",
                        before=loaded,
                        after=installed,
                        remedy="drain the node and reboot it to load the installed driver",
                        details=details,
                    )
                )
            )
        else:
            entries.append(Planned(ctx.entry(self.name, "driver", EntryKind.OK, summary, details=details)))
        if len(gpus) != node.gpus:
            entries.append(
                Planned(
                    ctx.entry(
                        self.name,
                        "gpus",
                        EntryKind.WARN,
                        f"nvidia-smi lists {len(gpus)} GPU(s), the profile says {node.gpus}",
                        remedy="fix nodes[].gpus in the profile, or run `inferctl check gpu` on this node",
                    )
                )
            )
        return entries
