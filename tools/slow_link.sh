#!/usr/bin/env bash
# slow_link.sh: MPI ranks on a slow link, on one machine. Each rank gets a network namespace
# of its own, joined to a switch namespace by a veth pair; tc's tbf limits every port in both
# directions, as a switch with NICs of that rate would. MPI then runs over TCP between the
# namespaces (OpenMPI's ob1 and tcp BTL only: no shared memory path around the link).
#
#   tools/slow_link.sh up RANKS RATE        create the namespaces, e.g. `up 2 1gbit`
#   tools/slow_link.sh rate RATE            change every port's rate (`10gbit`)
#   tools/slow_link.sh mpirun ARGS...       mpirun in rank 0's namespace over the link
#   tools/slow_link.sh down                 remove everything `up` created
#   tools/slow_link.sh check                exit 0 when this machine can run it (root, netns, tbf)
#
# Needs root (ip netns, tc). Addresses are 198.18.0.0/24, the benchmarking range of RFC 2544,
# and exist only inside these namespaces; nothing leaves them. Names start with "gzl-".
set -euo pipefail
prefix=gzl
subnet=198.18.0
state=/tmp/${prefix}-link.ranks
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")

ns() { echo "${prefix}-r$1"; }
address() { echo "${subnet}.$(($1 + 1))"; }

# tbf's bucket is the burst a port may send at full speed after an idle spell. A real NIC
# has none, and a training step idles the link while it computes: a bucket of a millisecond
# (or of a 64 KiB GSO segment) refills during backprop and lets each step's first bytes through
# at memory speed, so that MPI measured 2.1 Gb/s through a 1 Gb/s limit. 50 microseconds of the
# rate, and at least 16 KiB, keeps the burst under 5 % of a 400 KB message; tbf segments GSO
# packets larger than its bucket (Linux 3.13 and later) instead of dropping them. Smaller
# buckets cost more than they model: with 4 KiB, MPI reached 0.55 Gb/s through 1 Gb/s.
shape() {  # shape NAMESPACE DEVICE RATE
  local bits
  bits=$(numfmt --from=si "$(echo "${3%bit}" | tr a-z A-Z)")
  local burst=$((bits / 8 / 20000))
  ((burst < 16384)) && burst=16384
  ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "$3" burst "$burst" limit $((64 * burst))
}

down() {
  for n in $(ip netns list | awk '{print $1}' | grep "^${prefix}-" || true); do ip netns del "$n"; done
  rm -f "$state"
}

up() {
  local ranks=$1 rate=$2
  down
  ip netns add "${prefix}-sw"
  ip -n "${prefix}-sw" link add br0 type bridge
  ip -n "${prefix}-sw" link set br0 up
  for ((r = 0; r < ranks; ++r)); do
    local n
    n=$(ns "$r")
    ip netns add "$n"
    ip link add "${prefix}-p$r" type veth peer name eth0 netns "$n"
    ip link set "${prefix}-p$r" netns "${prefix}-sw"
    ip -n "${prefix}-sw" link set "${prefix}-p$r" master br0 up
    ip -n "$n" addr add "$(address "$r")/24" dev eth0
    ip -n "$n" link set eth0 up
    ip -n "$n" link set lo up
  done
  echo "$ranks" >"$state"
  set_rate "$rate"
}

set_rate() {
  local ranks
  ranks=$(cat "$state")
  for ((r = 0; r < ranks; ++r)); do
    shape "$(ns "$r")" eth0 "$1"
    shape "${prefix}-sw" "${prefix}-p$r" "$1"
  done
}

# OpenMPI's launcher calls its rsh agent as `agent HOST COMMAND...`; the host is a rank's
# address, and the command runs in that rank's namespace.
agent() {
  local host=$1
  shift
  local r=$((${host##*.} - 1))
  exec ip netns exec "$(ns "$r")" /bin/sh -c "$*"
}

run_mpi() {
  local ranks hosts=""
  ranks=$(cat "$state")
  for ((r = 0; r < ranks; ++r)); do hosts+="${hosts:+,}$(address "$r")"; done
  # --bind-to none: each namespace looks like a node of its own to OpenMPI, which would bind
  # every rank to core 0 of "its" node; two ranks on one core then wait 4 ms scheduler slices
  # for each other (an 8 ms round trip instead of 14 us).
  exec ip netns exec "$(ns 0)" mpirun --allow-run-as-root --bind-to none --host "$hosts" -np "$ranks" \
    --mca plm_rsh_agent "$self agent" --mca pml ob1 --mca btl tcp,self \
    --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 "$@"
}

check() {
  [ "$(id -u)" = 0 ] || { echo "slow_link: needs root" >&2; return 1; }
  command -v tc >/dev/null || { echo "slow_link: needs tc (iproute2)" >&2; return 1; }
  ip netns add "${prefix}-probe" 2>/dev/null || { echo "slow_link: cannot create a network namespace" >&2; return 1; }
  local ok=0
  ip -n "${prefix}-probe" link add d0 type veth peer name d1 && ip -n "${prefix}-probe" link set d0 up &&
    ip netns exec "${prefix}-probe" tc qdisc add dev d0 root tbf rate 1gbit burst 16384 limit 1048576 || ok=1
  ip netns del "${prefix}-probe"
  [ $ok = 0 ] || echo "slow_link: tc tbf does not work in a namespace here" >&2
  return $ok
}

case "${1:-}" in
  up) up "$2" "$3" ;;
  rate) set_rate "$2" ;;
  down) down ;;
  agent) shift; agent "$@" ;;
  mpirun) shift; run_mpi "$@" ;;
  check) check ;;
  *) sed -n '2,14p' "$0"; exit 2 ;;
esac
