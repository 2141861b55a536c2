"""nvidia-peermem: loaded only when the transfer path needs it; Mooncake uses DMA-BUF otherwise."""

from __future__ import annotations

from infer_ctl.core.provision.desired import peermem_file, peermem_needed
from infer_ctl.core.provision.model import EntryKind
from infer_ctl.provision.context import Planned, StepContext
from infer_ctl.provision.remote_files import run_checked
from infer_ctl.provision.steps.base import plan_file
from infer_ctl.remote.base import Command


class PeermemStep:
    name = "peermem"
    title = "nvidia-peermem module only when WITH_NVIDIA_PEERMEM=1 (else DMA-BUF is used)"
    needs_sudo = True

    def plan(self, ctx: StepContext) -> list[Planned]:
        sg = ctx.profile.sglang
        if not peermem_needed(sg.transfer_backend, sg.env):
            return [
                Planned(
                    ctx.entry(
                        self.name,
                        "nvidia-peermem",
                        EntryKind.OK,
                        "not needed: Mooncake registers GPU memory through DMA-BUF (WITH_NVIDIA_PEERMEM unset)",
                    )
                )
            ]
        legacy = ctx.conn.run(Command("test", "-d", "/sys/module/nv_peer_mem"), timeout=30)
        if legacy.ok:
            return [
                Planned(
                    ctx.entry(
                        self.name,
                        "nv_peer_mem",
                        EntryKind.MANUAL,
                        "the legacy nv_peer_mem module is loaded and conflicts with nvidia-peermem",
                        remedy="stop and disable the nv_peer_mem service, unload the module, rerun provision",
                    )
                )
            ]
        planned = [plan_file(ctx, self.name, peermem_file())]
        loaded = ctx.conn.run(Command("test", "-d", "/sys/module/nvidia_peermem"), timeout=30).ok
        if loaded:
            planned.append(Planned(ctx.entry(self.name, "nvidia-peermem", EntryKind.OK, "module loaded")))
        else:
            modprobe = Command("modprobe", "nvidia-peermem")

            def load() -> None:
                run_checked(ctx.conn, modprobe, sudo=True, what="modprobe nvidia-peermem")

            planned.append(
                Planned(
                    ctx.entry(
                        self.name,
                        "nvidia-peermem",
                        EntryKind.CHANGE,
                        "load the module",
                        before="not loaded",
                        after="loaded",
                        commands=(modprobe.shell(),),
                        needs_sudo=True,
                    ),
                    load,
                )
            )
        return planned
