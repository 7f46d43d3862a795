#!/usr/bin/env bash
# bench-healthz.sh - requests/s of the controller's GET /healthz under wrk,
# next to nginx serving a small static file in the same run, same settings.
#
#   scripts/bench-healthz.sh [BUILD]          (make bench-healthz)
#   WRK_ARGS="-t1 -c64 -d5s" scripts/bench-healthz.sh build
#
# Starts a fresh meshrun-controller (temp data dir, port 0) and a private
# nginx (worker_processes 1, like the controller's single loop thread; its
# config, pid, logs and the served file live in a temp dir; not a daemon),
# runs wrk against each in turn, stops both and prints both rates and the
# ratio controller/nginx. The last line is
# `healthz controller_rps=<r> nginx_rps=<r> ratio=<r>`.
#
# Non-goals: tuning nginx, latency distributions (wrk prints them above).
set -u
build=${1:-build}
ctl="$build/meshrun-controller"
wrk_args=${WRK_ARGS:-"-t1 -c64 -d5s"}

for t in wrk nginx curl python3; do
	command -v "$t" >/dev/null 2>&1 ||
		{ echo "bench-healthz: '$t' is not installed: run scripts/deps.sh bench" >&2; exit 1; }
done
[ -x "$ctl" ] || { echo "bench-healthz: '$ctl' is missing: run make BUILD=$build" >&2; exit 1; }

tmp=$(mktemp -d /tmp/meshrun-bench-healthz.XXXXXX)
ctl_pid="" nginx_pid=""
cleanup() {
	[ -n "$ctl_pid" ] && kill "$ctl_pid" 2>/dev/null && wait "$ctl_pid" 2>/dev/null
	[ -n "$nginx_pid" ] && kill -QUIT "$nginx_pid" 2>/dev/null && wait "$nginx_pid" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT

free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_http URL: until it answers, at most 10 s
wait_http() {
	for _ in $(seq 100); do
		curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
		sleep 0.1
	done
	return 1
}

# rps URL: requests/s that wrk reports
rps() {
	local out
	# shellcheck disable=SC2086 # WRK_ARGS is a list of flags
	out=$(wrk $wrk_args "$1") || return 1
	printf '  %s\n' "${out//$'\n'/$'\n'  }" >&2
	echo "$out" | awk '/^Requests\/sec:/ { print $2 }'
}

# ---- controller ----
mkdir -p "$tmp/data"
"$ctl" --listen 127.0.0.1 --port 0 --port-file "$tmp/ctl.port" --data-dir "$tmp/data" \
	>"$tmp/controller.log" 2>&1 &
ctl_pid=$!
for _ in $(seq 100); do
	[ -s "$tmp/ctl.port" ] && break
	sleep 0.1
done
ctl_port=$(cat "$tmp/ctl.port" 2>/dev/null)
if [ -z "$ctl_port" ] || ! wait_http "http://127.0.0.1:$ctl_port/healthz"; then
	echo "bench-healthz: the controller did not come up; its log:" >&2
	cat "$tmp/controller.log" >&2
	exit 1
fi

# ---- nginx ----
nginx_port=$(free_port)
mkdir -p "$tmp/www"
printf 'ok\n' >"$tmp/www/healthz"
# nginx started by root serves as nobody: it must be able to read the file
chmod 755 "$tmp" "$tmp/www"
chmod 644 "$tmp/www/healthz"
cat >"$tmp/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $tmp/nginx.pid;
error_log $tmp/nginx-error.log;
events { worker_connections 1024; }
http {
	access_log off;
	client_body_temp_path $tmp/client_body;
	proxy_temp_path $tmp/proxy;
	fastcgi_temp_path $tmp/fastcgi;
	uwsgi_temp_path $tmp/uwsgi;
	scgi_temp_path $tmp/scgi;
	default_type text/plain;
	server {
		listen 127.0.0.1:$nginx_port;
		root $tmp/www;
	}
}
EOF
nginx -p "$tmp" -c "$tmp/nginx.conf" >"$tmp/nginx.out" 2>&1 &
nginx_pid=$!
if ! wait_http "http://127.0.0.1:$nginx_port/healthz"; then
	echo "bench-healthz: nginx did not come up:" >&2
	cat "$tmp/nginx.out" "$tmp/nginx-error.log" >&2 2>/dev/null
	exit 1
fi

echo "bench-healthz: wrk $wrk_args against the controller (127.0.0.1:$ctl_port/healthz)"
c_rps=$(rps "http://127.0.0.1:$ctl_port/healthz") || exit 1
echo "bench-healthz: wrk $wrk_args against nginx 1 worker (127.0.0.1:$nginx_port/healthz)"
n_rps=$(rps "http://127.0.0.1:$nginx_port/healthz") || exit 1
ratio=$(awk -v c="$c_rps" -v n="$n_rps" 'BEGIN { if (n > 0) printf "%.2f", c / n; else print "nan" }')
echo "controller /healthz: $c_rps requests/s"
echo "nginx static file:   $n_rps requests/s"
echo "healthz controller_rps=$c_rps nginx_rps=$n_rps ratio=$ratio"
