#!/usr/bin/env bash
# Data parallelism across machines, as this machine can show it: two
# network namespaces, each its own address on a veth pair, are the two
# "hosts"; mpirun starts the rank of the second host through a launch agent
# that enters its namespace (where machines would use ssh), and the ranks
# talk MPI over TCP only (Open MPI's shared-memory transport is left out,
# as between machines). The two ranks must end where one process with the
# same global batch does (within 1e-4 of each tensor's largest value:
# only the order of the gradient's sum differs, tests/dist.t.sh).
# Skips where Open MPI, mptc's MPI library or network namespaces (root
# with CAP_NET_ADMIN, iproute2) are missing.
set -u
MPTC=${MPTC:-build/mptc}
HELPER=${HELPER:-$(dirname "$MPTC")/tests/test_checkpoint}
# the ranks start in the agent's shell: an absolute path (run_all.sh gives one)
MPTC_ABS=$(cd "$(dirname "$MPTC")" && pwd)/$(basename "$MPTC")
command -v mpirun >/dev/null || { echo "skip: no mpirun (apt-get install openmpi-bin libopenmpi-dev)"; exit 77; }
[ -e "$(dirname "$MPTC")/lib/libmptc_mpi.so" ] || { echo "skip: $(dirname "$MPTC")/lib/libmptc_mpi.so not built"; exit 77; }
command -v ip >/dev/null || { echo "skip: no ip (iproute2) for network namespaces"; exit 77; }
tmp=$(mktemp -d)
A=mpa$$ B=mpb$$ # namespace and veth names: 15 characters at most
cleanup() {
  ip netns del "$A" 2>/dev/null; ip netns del "$B" 2>/dev/null
  [ -n "${KEEP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT
if ! { ip netns add "$A" && ip netns add "$B" && ip link add "${A}v" type veth peer name "${B}v" &&
       ip link set "${A}v" netns "$A" && ip link set "${B}v" netns "$B" &&
       ip -n "$A" addr add 10.77.0.1/24 dev "${A}v" && ip -n "$B" addr add 10.77.0.2/24 dev "${B}v" &&
       ip -n "$A" link set "${A}v" up && ip -n "$B" link set "${B}v" up &&
       ip -n "$A" link set lo up && ip -n "$B" link set lo up; } 2>"$tmp/ns.err"; then
  echo "skip: cannot make network namespaces here: $(head -1 "$tmp/ns.err")"; exit 77
fi
# the launch agent: "HOST COMMAND" runs COMMAND in HOST's namespace
cat >"$tmp/agent" <<AGENT
#!/bin/sh
host=\$1; shift
case "\$host" in 10.77.0.1) ns=$A;; 10.77.0.2) ns=$B;; *) echo "agent: unknown host \$host" >&2; exit 1;; esac
exec ip netns exec "\$ns" /bin/sh -c "\$*"
AGENT
chmod +x "$tmp/agent"
fail=0
bad() { echo "FAIL: $*"; fail=1; }
MPI=(mpirun --oversubscribe --host 10.77.0.1,10.77.0.2 -np 2 --mca plm_rsh_agent "$tmp/agent"
     --mca oob_tcp_if_include 10.77.0.0/24 --mca btl self,tcp --mca btl_tcp_if_include 10.77.0.0/24)
[ -n "${MPTC_CACHE_DIR:-}" ] && MPI+=(-x MPTC_CACHE_DIR)
[ "$(id -u)" -eq 0 ] && MPI+=(--allow-run-as-root)
T=(--device cpu --threads 1 --no-test --quiet --batch-size 16 --max-steps 16 --validation-split 0)
M=tests/models/strided.mpt
timeout 300 "$MPTC" train $M "${T[@]}" --save "$tmp/one.st" >"$tmp/one.out" 2>&1 || bad "one process failed: $(tail -3 "$tmp/one.out")"
# the rank on the second host reports its address, so the test knows it ran there
timeout 300 ip netns exec "$A" "${MPI[@]}" /bin/sh -c \
  'ip -4 -o addr show | grep -o "10\.77\.0\.[12]" > '"$tmp"'/rank$OMPI_COMM_WORLD_RANK.addr; exec "$0" "$@"' \
  "$MPTC_ABS" train $M "${T[@]}" --save "$tmp/two.st" >"$tmp/two.out" 2>&1 ||
  bad "two hosts failed: $(tail -8 "$tmp/two.out")"
[ "$(cat "$tmp/rank0.addr" 2>/dev/null)" = 10.77.0.1 ] && [ "$(cat "$tmp/rank1.addr" 2>/dev/null)" = 10.77.0.2 ] ||
  bad "the ranks did not run on the two hosts: rank 0 at '$(cat "$tmp/rank0.addr" 2>/dev/null)', rank 1 at '$(cat "$tmp/rank1.addr" 2>/dev/null)'"
"$HELPER" close "$tmp/one.st" "$tmp/two.st" 1e-4 >"$tmp/close.out" 2>&1 || bad "two hosts differ from one process: $(cat "$tmp/close.out")"
[ $fail -eq 0 ] && echo "dist_hosts: two ranks on two network hosts agree with one process"
exit $fail
