"""The check families, by name: the one list both `inferctl check <family>` (cli/main.py) and the audit
registry (checks/registry.py) read. Kept free of imports so the CLI can list the families without
loading any family's module (their libraries can be heavy).

Family `NAME` lives in `infer_ctl/checks/NAME.py` (exposes `FAMILY`) and `infer_ctl/cli/check_NAME.py`
(adds `inferctl check NAME`). The order is the order families run in and are reported in.
"""

FAMILY_NAMES: tuple[str, ...] = ("gpu", "fabric", "servers", "tokenizer", "spec")
#: other names `--only` accepts: `spec` is the speculative-decoding family (`inferctl check spec`)
FAMILY_ALIASES: dict[str, str] = {"speculative": "spec"}
