#!/bin/sh
# A bare port (--listen :0) listens on loopback only: the address printed and
# every listening socket on that port (/proc/net/tcp, tcp6) are 127.0.0.1.
#
#   listen_bare_port.sh FAIRGATE COMMAND [ARGS...]   e.g. ... fairgate mock-llm
#
# Starts `FAIRGATE COMMAND ARGS --listen :0`, reads its "listening on" line,
# checks, then stops it (SIGTERM to the pid it started; SIGKILL after 10 s).
set -u
fairgate=$1
shift
cmdline="$fairgate $* --listen :0"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$fairgate" "$@" --listen :0 >"$out" 2>&1 &
pid=$!
i=0
while [ "$i" -lt 400 ] && ! grep -q 'listening on http://' "$out" && kill -0 "$pid" 2>/dev/null; do
  sleep 0.05
  i=$((i + 1))
done
url=$(grep -o 'listening on http://[^ ]*' "$out" | head -n 1 | sed 's/^listening on //')
port=${url##*:}
sockets=""
if [ -n "$url" ]; then
  hex=$(printf '%04X' "$port")
  # Local addresses of the listening (state 0A) sockets on that port.
  sockets=$(cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk -v p=":$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { print $2 }')
fi
kill -TERM "$pid" 2>/dev/null
i=0
while [ "$i" -lt 200 ] && kill -0 "$pid" 2>/dev/null; do
  sleep 0.05
  i=$((i + 1))
done
kill -KILL "$pid" 2>/dev/null
wait "$pid" 2>/dev/null

fail() {
  echo "$*" >&2
  echo "--- output of $cmdline ---" >&2
  cat "$out" >&2
  exit 1
}
case "$url" in
  http://127.0.0.1:[0-9]*) ;;
  *) fail "listens on '$url', expected http://127.0.0.1:PORT" ;;
esac
[ -n "$sockets" ] || fail "no listening socket on port $port in /proc/net/tcp"
for s in $sockets; do
  [ "${s%:*}" = 0100007F ] || fail "a listening socket on port $port is on $s, not 127.0.0.1 (0100007F)"
done
echo "ok: $url ($sockets)"
