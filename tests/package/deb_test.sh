#!/usr/bin/env bash
# tests/package/deb_test.sh — the .deb, end to end (ctest -L package; docs/packaging.md).
#
#   deb_test.sh BUILD_DIR SOURCE_DIR PYTHON
#
# Builds the package with cpack, checks its control data and contents, runs
# `systemd-analyze verify` on the unit as installed, installs it with
# `dpkg --root` into a temporary root (never the machine's own /usr, /etc or
# dpkg database; the maintainer scripts see DPKG_ROOT and leave the running
# system alone), starts the installed binary with the installed config the way
# the unit does (the config as a credential, an unprivileged user), acquires a
# permit once, stops it with SIGTERM (exit 0), purges the package and checks
# that no file is left. Only the server this script started is signalled.
# Exit 77 (skipped) when not root: dpkg --root needs to chown.
set -euo pipefail
build=$1 src=$2 python=$3
[[ $(id -u) -eq 0 ]] || { echo "deb_test: needs root (dpkg --root); skipped"; exit 77; }

tmp=$(mktemp -d /tmp/fairgate-deb-XXXXXX)
server_pid=""
cleanup() {
  if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then kill -KILL "$server_pid"; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
step() { echo "--- $* ($SECONDS s)"; }

step "cpack -G DEB"
cpack -G DEB --config "$build/CPackConfig.cmake" -B "$tmp/pkg" >"$tmp/cpack.log" 2>&1 || { cat "$tmp/cpack.log"; fail "cpack failed"; }
deb=$(ls "$tmp"/pkg/fairgate_*.deb)
echo "built $(basename "$deb") ($(du -k "$deb" | cut -f1) KiB)"

step "control data"
dpkg-deb -f "$deb" Package Version Architecture Depends Section
[[ $(dpkg-deb -f "$deb" Package) == fairgate ]] || fail "Package is not fairgate"
depends=$(dpkg-deb -f "$deb" Depends)
for lib in libhiredis0.14 libtomlplusplus3 libc6 libstdc++6; do
  [[ $depends == *"$lib"* ]] || fail "Depends lacks $lib: $depends"
done
# Every dependency (the first of each alternative) is installed on this
# machine, as a package or as a virtual package an installed one provides
# (libspdlog1.10 provides libspdlog1.10-fmt9, the name its shlibs file gives).
IFS=',' read -ra deps <<<"$depends"
provided=$(dpkg-query -W -f='${db:Status-Abbrev} ${Provides}\n' 2>/dev/null | awk '$1 == "ii" { $1 = ""; print }' |
  tr ',' '\n' | sed -E 's/\(.*\)//; s/:any//; s/ //g')
for d in "${deps[@]}"; do
  name=$(echo "${d%%|*}" | sed -E 's/\(.*\)//; s/:any//; s/ //g')
  dpkg-query -W -f='${Status}' "$name" 2>/dev/null | grep -q "install ok installed" ||
    grep -qxF "$name" <<<"$provided" || fail "dependency $name is not installed here"
done
dpkg-deb -e "$deb" "$tmp/control"
[[ $(cat "$tmp/control/conffiles") == /etc/fairgate/fairgate.toml ]] || fail "conffiles: $(cat "$tmp/control/conffiles")"
for s in postinst prerm postrm; do [[ -x $tmp/control/$s ]] || fail "maintainer script $s missing or not executable"; done
dpkg-deb -c "$deb" >"$tmp/contents"
for f in ./usr/bin/fairgate ./etc/fairgate/fairgate.toml ./usr/lib/systemd/system/fairgate.service \
         ./usr/share/man/man1/fairgate.1.gz ./usr/share/doc/fairgate/copyright ./usr/share/doc/fairgate/LICENSE \
         ./usr/share/doc/fairgate/NOTICE ./usr/share/doc/fairgate/openapi.yaml ./usr/share/doc/fairgate/clients.md \
         ./usr/share/doc/fairgate/examples/config/redis.toml; do
  grep -q " $f\$" "$tmp/contents" || fail "the package lacks $f"
done
if grep -vE ' \./(usr/bin|usr/lib/systemd|usr/share/(man|doc)|etc/fairgate)(/|$)| \./(usr|usr/lib|usr/share|etc)?/?$' "$tmp/contents"; then
  fail "files outside the expected places (above)"
fi

step "dpkg --root: install"
root=$tmp/root
mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates" "$root/var/lib/dpkg/triggers" "$root/var/log"
touch "$root/var/lib/dpkg/status" "$root/var/lib/dpkg/available"
dpkgr=(dpkg --root="$root" --log="$tmp/dpkg.log" --force-script-chrootless --force-depends --force-not-root)
"${dpkgr[@]}" -i "$deb" >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; fail "dpkg -i failed"; }
# (The root has no libraries, hence --force-depends; the dependencies were checked on this machine above.)
grep -E "^(Unpacking|Setting up|fairgate:)" "$tmp/install.log" | sed 's/^/  /'
"${dpkgr[@]}" -s fairgate | grep -q "^Status: install ok installed" || fail "not installed in the root"
[[ -x $root/usr/bin/fairgate ]] || fail "no executable /usr/bin/fairgate"
"$root/usr/bin/fairgate" --version
unit=$root/usr/lib/systemd/system/fairgate.service
grep -q '^DynamicUser=yes$' "$unit" || fail "the unit does not run as a DynamicUser"
grep -q '^LoadCredential=fairgate.toml:/etc/fairgate/fairgate.toml$' "$unit" || fail "the unit does not load /etc/fairgate/fairgate.toml"
zcat "$root/usr/share/man/man1/fairgate.1.gz" | grep -q '^\.SS "fairgate serve"' || fail "the man page lacks 'fairgate serve'"

step "systemd-analyze verify"
command -v systemd-analyze >/dev/null || fail "systemd-analyze not found (apt install systemd)"
# A root with systemd's own units (sysinit.target, ...) beside the installed package, so the
# unit is verified as installed: ExecStart's binary, and man:fairgate(1) from the package.
vroot=$tmp/verify-root
mkdir -p "$vroot/usr/lib/systemd"
cp -a /usr/lib/systemd/system "$vroot/usr/lib/systemd/"
cp -a "$root/." "$vroot/"
MANPATH=$root/usr/share/man systemd-analyze verify --root="$vroot" /usr/lib/systemd/system/fairgate.service \
  >"$tmp/verify.log" 2>&1 || { cat "$tmp/verify.log"; fail "systemd-analyze verify failed"; }
if [[ -s $tmp/verify.log ]]; then cat "$tmp/verify.log"; fail "systemd-analyze verify printed warnings"; fi
rm -rf "$vroot"
echo "systemd-analyze verify: clean"

step "start the installed binary as the unit does"
# ExecStart with %d = the credentials directory (LoadCredential copies the config there, read-only).
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
creds=$tmp/credentials
mkdir -p "$creds"
cp "$root/etc/fairgate/fairgate.toml" "$creds/fairgate.toml"
chmod 0444 "$creds/fairgate.toml"
chmod 0555 "$creds"
chmod 0755 "$tmp"
read -ra argv <<<"${exec_start//%d/$creds}"
argv[0]=$root${argv[0]}
# An unprivileged user (like the DynamicUser), on a free port (a flag wins over the config's listen).
setpriv --reuid=65534 --regid=65534 --clear-groups -- "${argv[@]}" --listen 127.0.0.1:0 >"$tmp/serve.log" 2>&1 &
server_pid=$!
url=""
for _ in $(seq 1 300); do
  url=$(grep -o 'listening on http://127\.0\.0\.1:[0-9]*' "$tmp/serve.log" | sed 's/listening on //' || true)
  [[ -n $url ]] && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$tmp/serve.log"; fail "fairgate serve exited at start"; }
  sleep 0.1
done
[[ -n $url ]] || { cat "$tmp/serve.log"; fail "fairgate serve did not start"; }
head -1 "$tmp/serve.log"
PYTHONPATH=$src/clients/python/src "$python" - "$url" <<'PY' || fail "acquire against the installed server failed"
import sys, time, fairgate
client = fairgate.Client(sys.argv[1])
names = sorted(l["name"] for l in client.limiters())
assert names == ["chat", "document-upload"], names
chat = client.limiter("chat")
assert (chat["max_concurrent"], chat["max_wait_ms"]) == (3, 20000), chat
upload = client.limiter("document-upload")
assert (upload["max_concurrent"], upload["max_wait_ms"]) == (10, 30000), upload
with client.acquire("chat", max_wait=5) as permit:
    assert client.limiter("chat")["in_use"] == 1
# The permit rides on its event stream: the server sees the close a moment
# after release() returns (it once failed read at once). Bounded wait.
deadline = time.monotonic() + 10
while client.limiter("chat")["in_use"] != 0 and time.monotonic() < deadline:
    time.sleep(0.02)
assert client.limiter("chat")["in_use"] == 0, "the permit was not given back"
print(f"acquired and released permit {permit.id} of chat")
PY
kill -TERM "$server_pid"
code=0
wait "$server_pid" || code=$?
server_pid=""
[[ $code -eq 0 ]] || { cat "$tmp/serve.log"; fail "SIGTERM: exit code $code, expected 0"; }
echo "stopped with SIGTERM: exit 0"

step "enable (as an administrator would), then purge"
systemctl --root="$root" enable fairgate.service >/dev/null 2>&1 || fail "systemctl --root enable failed"
[[ -L $root/etc/systemd/system/multi-user.target.wants/fairgate.service ]] || fail "enable made no symlink"
"${dpkgr[@]}" -P fairgate >"$tmp/purge.log" 2>&1 || { cat "$tmp/purge.log"; fail "dpkg -P failed"; }
left=$(cd "$root" && find . -mindepth 1 \( -type f -o -type l \) -not -path './var/lib/dpkg/*' -not -path './var/log/*')
[[ -z $left ]] || fail "files left after purge: $left"
# /etc/systemd/... was made by `systemctl enable`, not by the package.
left_dirs=$(cd "$root" && find . -mindepth 1 -type d -not -path './var*' -not -path './etc/systemd*' -not -path ./etc | sort)
[[ -z $left_dirs ]] || fail "directories left after purge: $left_dirs"
"${dpkgr[@]}" -s fairgate 2>&1 | grep -q "^Status: install ok installed" && fail "still installed after purge"
echo "purged: no file left"
step "ok"
