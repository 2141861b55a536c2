"""Stand-in executables for hardware and system managers that do not exist (or must not be touched)
on the test machine. Each records its calls in <node>/state/calls.log and keeps its state in files
under <node>/state, so a second probe sees what a first apply did. What is real in these tests: sshd,
SSH, SFTP, sh, cp/mv/ln, python -m venv, pip, and the files written under the node's overlays."""

from __future__ import annotations

STATE = 'S="$(dirname "$0")/../state"; echo "$(basename "$0") $*" >> "$S/calls.log"\n'

SYSTEMCTL = STATE + r"""
cmd=$1; shift || true
case "$cmd" in
  daemon-reload)
    # a test holds this call (to interrupt an apply mid-way) until it removes the hang file
    if [ -e "$S/hang-daemon-reload" ]; then touch "$S/hanging"; n=0
      while [ -e "$S/hang-daemon-reload" ] && [ $n -lt 600 ]; do sleep 0.1; n=$((n+1)); done; fi ;;
  enable) mkdir -p "$S/enabled"; for u in "$@"; do touch "$S/enabled/$u"; done ;;
  start|restart|try-restart) mkdir -p "$S/active"; for u in "$@"; do touch "$S/active/$u"; done ;;
  is-enabled) if [ -e "$S/enabled/$1" ]; then echo enabled; else echo disabled; exit 1; fi ;;
  is-active) if [ -e "$S/active/$1" ]; then echo active; else echo inactive; exit 3; fi ;;
  *) echo "standin systemctl: unsupported $cmd" >&2; exit 1 ;;
esac
"""

SYSCTL = STATE + r"""
get() { if [ -e "$S/sysctl/$1" ]; then cat "$S/sysctl/$1"; else
  case "$1" in vm.max_map_count) echo 65530;; net.ipv4.ip_local_port_range) printf '32768\t60999\n';;
  net.ipv4.ip_local_reserved_ports) echo;; vm.nr_hugepages) echo 0;; *) return 1;; esac; fi; }
case "$1" in
  -n) get "$2" ;;
  -p) mkdir -p "$S/sysctl"; grep -v '^#' "$2" | while IFS='=' read -r k v; do
        k=$(echo $k); v=$(echo $v); [ -n "$k" ] && printf '%s\n' "$v" | tr ' ' '\t' > "$S/sysctl/$k"; done ;;
  *) echo "standin sysctl: unsupported $*" >&2; exit 1 ;;
esac
"""

NVIDIA_SMI = STATE + r"""
case "$*" in
  --query-gpu=*) echo "0, NVIDIA H100 80GB HBM3, 550.90.07, Enabled"; echo "1, NVIDIA H100 80GB HBM3, 550.90.07, Enabled" ;;
  *) echo "| NVIDIA-SMI 550.90.07              Driver Version: 550.90.07      CUDA Version: 12.4     |" ;;
esac
"""

MODINFO = STATE + 'echo 550.90.07\n'
TIMEDATECTL = STATE + 'echo yes\n'

MLNX_QOS = STATE + r"""
trust=$(cat "$S/qos-trust" 2>/dev/null || echo pcp); pfc=$(cat "$S/qos-pfc" 2>/dev/null || echo 0,0,0,0,0,0,0,0)
while [ $# -gt 0 ]; do case "$1" in
  --trust) echo "$2" > "$S/qos-trust"; trust=$2; shift ;;
  --pfc) echo "$2" > "$S/qos-pfc"; pfc=$2; shift ;;
esac; shift; done
echo "DCBX mode: OS controlled"
echo "Priority trust state: $trust"
echo "PFC configuration:"
echo "        priority    0   1   2   3   4   5   6   7"
echo "        enabled     $(echo $pfc | tr ',' ' ' | sed 's/ /   /g')   "
"""

ALL = {
    "systemctl": SYSTEMCTL,
    "sysctl": SYSCTL,
    "nvidia-smi": NVIDIA_SMI,
    "modinfo": MODINFO,
    "timedatectl": TIMEDATECTL,
    "mlnx_qos": MLNX_QOS,
}

# A node where the SSH user has no passwordless sudo: what real sudo -n prints.
SUDO_NEEDS_PASSWORD = 'echo "sudo: a password is required" >&2; exit 1\n'
