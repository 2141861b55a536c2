"""Pure provisioning logic: the plan-entry model, diffs, desired host state and lockfile math.

Nothing here touches a host: the I/O layer (`infer_ctl.provision`) probes, calls these functions to
compute what should change, and executes the resulting plan.
"""
