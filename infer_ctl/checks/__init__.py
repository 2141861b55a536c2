"""Checks: gather facts through a connector and judge them with core rules -> findings.

This is the only layer that holds a connector. Each check family module exposes `FAMILY`
(a `registry.CheckFamily`) and is named in `family_names.FAMILY_NAMES` so `inferctl audit` runs it.
"""
