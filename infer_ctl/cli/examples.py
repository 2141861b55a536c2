"""One or more runnable examples for every command's `--help` (issue 29: no help had one).

Kept in one table rather than in each command's docstring so that `tests/cli/test_help.py` can check,
over the whole command tree, that every command has an example and that each example names only
options the command really has: an example that rots fails the test, not a user."""

from __future__ import annotations

#: command path ("" is the root) -> examples, each a shell line that starts with `inferctl <path>`
EXAMPLES: dict[str, tuple[str, ...]] = {
    "": (
        "inferctl demo",
        "inferctl profile init --prefill pf-01=10.0.0.11 --decode dc-01=10.0.0.21 --out inferctl.yaml",
        "inferctl nodes -p inferctl.yaml",
    ),
    # profile
    "profile": ("inferctl profile validate -p inferctl.yaml",),
    "profile init": (
        "inferctl profile init --prefill pf-01=10.0.0.11 --decode dc-01=10.0.0.21 --out inferctl.yaml",
        "inferctl profile init --mixed box-01=10.0.1.5 --gpus 8 --model /models/Llama-3.1-8B-Instruct",
    ),
    "profile validate": ("inferctl profile validate -p inferctl.yaml", "inferctl profile validate --json"),
    "profile show": ("inferctl profile show -p builtin:local > mine.yaml", "inferctl profile show --json"),
    # fleet
    "nodes": ("inferctl nodes", "inferctl nodes --role decode --json"),
    "exec": ("inferctl exec --role decode -- nvidia-smi -L", "inferctl exec -n 'pf-*' --sudo -- dmesg -T | tail"),
    "provision": ("inferctl provision --plan -n dc-01", "inferctl provision --apply --rolling 2"),
    "provision steps": ("inferctl provision steps",),
    "provision lock": ("inferctl provision lock --out requirements.lock",),
    "provision rollback": ("inferctl provision rollback -n dc-01",),
    "provision wheelhouse": ("inferctl provision wheelhouse build --out wheelhouse",),
    "provision wheelhouse build": ("inferctl provision wheelhouse build --out wheelhouse --lock requirements.lock",),
    # checks
    "check": ("inferctl check gpu",),
    "check gpu": ("inferctl check gpu", "inferctl check gpu -n dc-01 --diag 2"),
    "check fabric": ("inferctl check fabric --pingpong",),
    "check servers": ("inferctl check servers --role decode",),
    "check spec": ("inferctl check spec --url 127.0.0.1:8000",),
    "check tokenizer": ("inferctl check tokenizer --target /models/target --draft /models/draft",),
    "audit": (
        "inferctl audit --json",
        "inferctl audit --textfile /var/lib/node_exporter/textfile/inferctl.prom --history audit.jsonl --since-last",
    ),
    # servers
    "launch": ("inferctl launch --dry-run", "inferctl launch --rolling"),
    "status": ("inferctl status", "inferctl status --role decode --json"),
    "stop": ("inferctl stop --role decode",),
    "logs": ("inferctl logs dc-01-decode --follow", "inferctl logs pf-01-prefill --lines 200"),
    # router
    "router": ("inferctl router serve",),
    "router serve": (
        "inferctl router serve",
        "inferctl router serve --prefill http://10.0.0.11:30000 --decode http://10.0.0.21:30001",
    ),
    "router status": ("inferctl router status", "inferctl router status --url 127.0.0.1:8000 --json"),
    "router workers": ("inferctl router workers", "inferctl router workers drain http://10.0.0.21:30001"),
    "router prefixes": (
        "inferctl router prefixes list",
        "inferctl router prefixes add corp-policy --file prompts/policy.txt --replicas 2 --pin --ttl 21600",
    ),
    "router spec": ("inferctl router spec",),
    "router tenants": ("inferctl router tenants --json",),
    "router tenant-key": ("inferctl router tenant-key",),
    "spec": ("inferctl spec control --once --advise",),
    "spec control": ("inferctl spec control --once --advise", "inferctl spec control --interval 60"),
    "pd": ("inferctl pd control --once --advise",),
    "pd control": ("inferctl pd control --once --advise", "inferctl pd control --interval 5 --history pd.jsonl"),
    "pd clear-fatal": ("inferctl pd clear-fatal http://10.0.0.11:30000", "inferctl pd clear-fatal --all-fatal --json"),
    # sizing
    "plan": ("inferctl plan kv --model llama-3.1-70b --context 8192",),
    "plan kv": ("inferctl plan kv --model llama-3.1-70b --context 8192 --hbm-gb 640 --tp 8", "inferctl plan kv --list-presets"),
    "plan spec": ("inferctl plan spec --alpha 0.8 --gamma 4 --cost-ratio 0.05 --table",),
    "plan transfer": ("inferctl plan transfer --model llama-3.1-70b --prompt-tokens 8192 --bandwidth-gbps 400",),
    "plan roofline": ("inferctl plan roofline --model llama-3.1-70b --accelerator h200 --gpus 8",),
    "plan tiers": ("inferctl plan tiers --model llama-3.1-70b --accelerator h100-sxm --tp 8 --prefix 4096",),
    "plan pd": ("inferctl plan pd --rate 20 --ttft-ms 800 --itl-ms 40 --gpus 16 --model llama-3.1-70b",),
    "plan cost": ("inferctl plan cost --scenario disagg-spec-radix",
                  "inferctl plan cost --scenario disaggregated --pool decode:accelerator=l40s,gpu_hour=1.5,gpus=8"),
    # simulation and load
    "sim": ("inferctl sim serve --prefill 2 --decode 2",),
    "sim serve": ("inferctl sim serve --prefill 2 --decode 2", "inferctl sim serve --from-profile -p builtin:local"),
    "bench": (
        "inferctl bench --url http://127.0.0.1:8000 --workload shared-prefix --requests 500 --concurrency 32",
        "inferctl bench --url http://127.0.0.1:8000 --requests 50 --tenant-key-env ACME_KEY",
    ),
    "demo": ("inferctl demo", "inferctl demo --scenario spec-drift"),
}
