#!/usr/bin/env bash
# Two nodes on one machine: MPICH ranks in two network namespaces joined by a veth pair, each with its
# own host name, talking TCP to each other (no shared memory between the "nodes").
#
#   sudo scripts/two_nodes.sh [--ranks-per-node 2] [--rate 10gbit] [--no-mpiexec] -- COMMAND...
#
# Runs COMMAND under `mpiexec -n 2*R` with R ranks in each namespace (`python ...` in COMMAND runs the
# same interpreter as here).  With --no-mpiexec, COMMAND runs by itself on node-a and starts its own
# launcher (the supervisor, `singa-mpi run`): SINGA_MPI_LAUNCHER_OPTIONS then holds what takes that
# launcher to both nodes, SINGA_TWO_NODES_HOSTS the host list for `--hosts`, and SINGA_TWO_NODES_KILL_B
# a command that kills every process of node-b at once (the node dies: ranks, guardians, MPI's daemon).  --rate shapes the link with tc (a token bucket at that rate: a 10 GbE link
# looks like `--rate 10gbit`).  Between the nodes MPI uses TCP (UCX_TLS=tcp,self: UCX would otherwise
# find the two namespaces on one machine and use its shared memory); within a node MPICH's own.  Needs root (ip netns, unshare) and MPICH's
# Hydra; everything it creates is removed on exit.  Example (the MPI equivalence suite across nodes):
#   sudo scripts/two_nodes.sh -- python -m pytest tests/mpi -q -x -p no:cacheprovider
set -euo pipefail
per_node=2 rate="" outside=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --ranks-per-node) per_node=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --no-mpiexec) outside=1; shift ;;
    --) shift; break ;;
    *) echo "two_nodes.sh: unknown option $1 (expected --ranks-per-node N, --rate R, then -- COMMAND)" >&2; exit 2 ;;
  esac
done
[[ $# -gt 0 ]] || { echo "two_nodes.sh: no command (expected -- COMMAND...)" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "two_nodes.sh: needs root (network namespaces)" >&2; exit 2; }
command -v mpiexec >/dev/null || { echo "two_nodes.sh: no mpiexec on PATH (pip install mpich)" >&2; exit 2; }

tag=$$
ns_a=singa_a$tag ns_b=singa_b$tag ip_a=10.213.$((tag % 250)).1 ip_b=10.213.$((tag % 250)).2
work=$(mktemp -d /tmp/two_nodes.XXXXXX)
cleanup() {
  ip netns del "$ns_a" 2>/dev/null || true
  ip netns del "$ns_b" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

ip netns add "$ns_a"
ip netns add "$ns_b"
ip link add "va$tag" type veth peer name "vb$tag"
ip link set "va$tag" netns "$ns_a"
ip link set "vb$tag" netns "$ns_b"
ip -n "$ns_a" addr add "$ip_a/24" dev "va$tag"
ip -n "$ns_b" addr add "$ip_b/24" dev "vb$tag"
for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
ip -n "$ns_a" link set "va$tag" up
ip -n "$ns_b" link set "vb$tag" up
if [[ -n "$rate" ]]; then
  ip netns exec "$ns_a" tc qdisc add dev "va$tag" root tbf rate "$rate" burst 256kb latency 5ms
  ip netns exec "$ns_b" tc qdisc add dev "vb$tag" root tbf rate "$rate" burst 256kb latency 5ms
fi

# Hydra starts its proxy on each "host" through this instead of ssh: the host name is the
# namespace's address; the proxy runs in that namespace under its own host name (so that MPI sees
# two nodes and uses no shared memory between them).
cat > "$work/enter" <<SCRIPT
#!/usr/bin/env bash
while [[ "\$1" == -* ]]; do shift; done
host=\$1; shift
[[ -e "$work/dead-\$host" ]] && { echo "ssh: connect to host \$host port 22: No route to host" >&2; exit 255; }
case "\$host" in
  $ip_a) ns=$ns_a name=node-a ;;
  $ip_b) ns=$ns_b name=node-b ;;
  *) echo "two_nodes.sh: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" unshare --uts sh -c "hostname \$name; exec \$*"
SCRIPT
chmod +x "$work/enter"

echo "two nodes: $ns_a ($ip_a, node-a) and $ns_b ($ip_b, node-b), $per_node rank(s) each${rate:+, link shaped to $rate}"
reach=(-launcher ssh -launcher-exec "$work/enter" -iface "va$tag" -genv UCX_TLS "${UCX_TLS:-tcp,self}" -genv PATH "$PATH"
       -genv PYTHONPATH "${PYTHONPATH:-}" -genv HOME "$HOME" -genv SINGA_MPI_TEST_TMP "${SINGA_MPI_TEST_TMP:-$work/tmp}")
if [[ -n "$outside" ]]; then
  # and it stays dead: the launcher's way in (enter, our ssh) refuses it from then on
  printf '#!/usr/bin/env bash\ntouch %s\nip netns pids %s | xargs -r kill -9\n' "$work/dead-$ip_b" "$ns_b" > "$work/kill_b"
  chmod +x "$work/kill_b"
  options=$(printf '%q ' "${reach[@]}")
  ip netns exec "$ns_a" unshare --uts sh -c "hostname node-a; exec \"\$@\"" sh \
    env SINGA_MPI_LAUNCHER_OPTIONS="$options" SINGA_TWO_NODES_HOSTS="$ip_a:$per_node,$ip_b:$per_node" \
    SINGA_TWO_NODES_KILL_B="$work/kill_b" UCX_TLS="${UCX_TLS:-tcp,self}" "$@"
  exit
fi
ip netns exec "$ns_a" unshare --uts sh -c "hostname node-a; exec \"\$@\"" sh \
  mpiexec "${reach[@]}" -wdir "$PWD" -hosts "$ip_a:$per_node,$ip_b:$per_node" -n $((2 * per_node)) "$@"
