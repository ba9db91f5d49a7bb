# shellcheck shell=bash
# ports.sh - loopback ports for the servers and doubles the tests start.
# Source it (scripts/test.sh and tests/cli/lib.sh do); it defines
#
#   pick_port    sets PORT to a free loopback TCP port and remembers it
#   free_port    prints one (in $(...) the memory stays in the subshell:
#                prefer pick_port where two ports are taken before either
#                is bound)
#
# A port is drawn below the kernel's ephemeral range: one inside it may be
# taken at any moment as the local end of an outgoing connection (every
# client and etcd member opens many), and a server's bind then fails with
# EADDRINUSE even with SO_REUSEADDR. Nothing may listen on it, no socket in
# any state may use it, and this shell has not handed it out before.
# Bounded: 200 random candidates.

PORTS_TAKEN=${PORTS_TAKEN:-" "}

pick_port() {
    local p i lo=10000 hi=32767 eph
    read -r eph _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || eph=""
    if [[ $eph =~ ^[0-9]+$ ]] && [ "$eph" -gt $((lo + 1000)) ]; then
        hi=$((eph - 1))
    fi
    for ((i = 0; i < 200; i++)); do
        p=$(shuf -i "$lo-$hi" -n 1)
        case $PORTS_TAKEN in *" $p "*) continue ;; esac
        if [ -z "$(ss -Htan "sport = :$p" 2>/dev/null)" ]; then
            PORTS_TAKEN="$PORTS_TAKEN$p "
            PORT=$p
            return 0
        fi
    done
    echo "pick_port: no free loopback port found" >&2
    return 1
}

free_port() {
    pick_port && echo "$PORT"
}
