#!/bin/sh
# sshd wrapper for provisioning tests (passed as the harness's `sshd_prefix`, after
# `unshare --mount --propagation private --`). It runs in a private mount namespace, so nothing here is
# visible to the rest of the machine: /etc, /opt and /var become overlays whose writable upper layer is
# the node's own directory (<node>/upper/{etc,opt,var}). Every write provisioning makes on the "node"
# lands there, and the real /etc, /opt and /var of this machine are never modified.
set -eu
cfg=""; prev=""
for a in "$@"; do
  if [ "$prev" = "-f" ]; then cfg=$a; fi
  prev=$a
done
node_dir=$(dirname "$cfg")
for d in etc opt var; do
  mkdir -p "$node_dir/upper/$d" "$node_dir/work/$d"
  mount -t overlay overlay -o "lowerdir=/$d,upperdir=$node_dir/upper/$d,workdir=$node_dir/work/$d" "/$d"
done
# stand-in sysfs for the NIC's ECN knobs (MLNX_OFED layout), when the test made one
if [ -d "$node_dir/sysnet" ]; then mount --bind "$node_dir/sysnet" /sys/class/net; fi
exec "$@"
