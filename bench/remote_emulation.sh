#!/usr/bin/env bash
# Emulate an object store on this machine: nginx serving a directory of shards
# with a per-connection bandwidth cap (like one S3 connection) and, in a
# network namespace of its own, an aggregate cap (like the instance's NIC).
#
#   bench/remote_emulation.sh up DIR [PER_CONN_MBPS] [AGGREGATE_MBPS]
#       Start it; prints the base URL (http://ADDR:PORT) on stdout.
#       PER_CONN_MBPS   nginx `limit_rate` per connection, MB/s (default 20)
#       AGGREGATE_MBPS  `tc tbf` rate for all connections together, MB/s
#                       (default 160; 0 = no aggregate cap)
#   bench/remote_emulation.sh down
#       Stop nginx and remove the namespace and the veth pair.
#
# How: a veth pair joins the host (10.211.0.1) to the namespace `skremote`
# (10.211.0.2), where nginx listens on 10.211.0.2:8089. A token bucket filter
# on the namespace's end shapes everything the server sends. Without the
# rights to create namespaces (no CAP_NET_ADMIN), nginx listens on
# 127.0.0.1:8089 with the per-connection cap only, and the script says so on
# stderr (SHARDKIT_EMULATION_NO_NETNS=1 forces that mode).
# SHARDKIT_EMULATION_EXTRA_CONF=FILE adds `include FILE;` to the server block
# (more locations: bench/ingest_servers.py's image/jpeg answers). Needs root
# (apt-get, ip netns, tc). Installs Debian's nginx if it is missing. Nothing
# listens beyond this machine.
set -euo pipefail

NS=skremote
HOST_IF=skr-host
NS_IF=skr-ns
HOST_ADDR=10.211.0.1
NS_ADDR=10.211.0.2
PORT=8089
STATE=${SHARDKIT_EMULATION_DIR:-/tmp/shardkit-remote-emulation}

log() { echo "remote_emulation: $*" >&2; }

ensure_nginx() {
    if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
        log "installing nginx (apt-get)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null
    fi
}

nginx_bin() { command -v nginx 2>/dev/null || echo /usr/sbin/nginx; }

write_conf() {  # $1 root dir, $2 listen address, $3 per-connection MB/s
    mkdir -p "$STATE"
    cat >"$STATE/nginx.conf" <<CONF
user root;
worker_processes 2;
daemon on;
pid $STATE/nginx.pid;
error_log $STATE/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 100000;
    client_body_temp_path $STATE/body;
    proxy_temp_path $STATE/proxy;
    fastcgi_temp_path $STATE/fastcgi;
    uwsgi_temp_path $STATE/uwsgi;
    scgi_temp_path $STATE/scgi;
    types { application/x-tar tar; application/json json; application/octet-stream idx; }
    server {
        listen $2:$PORT;
        root $1;
        location / { limit_rate ${3}m; }
$(if [ -n "${SHARDKIT_EMULATION_EXTRA_CONF:-}" ]; then echo "        include $SHARDKIT_EMULATION_EXTRA_CONF;"; fi)
    }
}
CONF
}

down() {
    if [ -f "$STATE/nginx.pid" ]; then
        kill "$(cat "$STATE/nginx.pid")" 2>/dev/null || true
        for _ in $(seq 50); do [ -f "$STATE/nginx.pid" ] || break; sleep 0.1; done
        rm -f "$STATE/nginx.pid"
    fi
    ip netns del "$NS" 2>/dev/null || true
    ip link del "$HOST_IF" 2>/dev/null || true
}

up() {
    local dir per_conn aggregate addr
    dir=$(cd "$1" && pwd)
    per_conn=${2:-20}
    aggregate=${3:-160}
    ensure_nginx
    down
    if [ "${SHARDKIT_EMULATION_NO_NETNS:-0}" != 1 ] && ip netns add "$NS" 2>/dev/null; then
        ip link add "$HOST_IF" type veth peer name "$NS_IF"
        ip link set "$NS_IF" netns "$NS"
        ip addr add "$HOST_ADDR/30" dev "$HOST_IF"
        ip link set "$HOST_IF" up
        ip netns exec "$NS" ip addr add "$NS_ADDR/30" dev "$NS_IF"
        ip netns exec "$NS" ip link set "$NS_IF" up
        ip netns exec "$NS" ip link set lo up
        if [ "$aggregate" != 0 ]; then
            # rate in MB/s -> mbit; burst a few ms of traffic (at least 1 MiB
            # so offloaded 64 KiB segments pass).
            ip netns exec "$NS" tc qdisc add dev "$NS_IF" root tbf \
                rate "$((aggregate * 8))mbit" burst 2mb latency 100ms
        fi
        addr=$NS_ADDR
        write_conf "$dir" "$addr" "$per_conn"
        ip netns exec "$NS" "$(nginx_bin)" -c "$STATE/nginx.conf"
    else
        log "cannot create a network namespace: serving on 127.0.0.1 with the per-connection cap only"
        addr=127.0.0.1
        write_conf "$dir" "$addr" "$per_conn"
        "$(nginx_bin)" -c "$STATE/nginx.conf"
    fi
    for _ in $(seq 100); do
        if curl -s -o /dev/null "http://$addr:$PORT/"; then break; fi
        sleep 0.1
    done
    echo "http://$addr:$PORT"
}

case "${1:-}" in
    up) shift; up "$@" ;;
    down) down ;;
    *) echo "usage: $0 up DIR [PER_CONN_MBPS] [AGGREGATE_MBPS] | down" >&2; exit 2 ;;
esac
