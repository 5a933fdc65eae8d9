#!/bin/bash
# Builds the Debian package tutti_VERSION_amd64.deb with dpkg-deb from Bazel's outputs:
#   /usr/bin/tuttid, /usr/bin/tuttictl, /usr/libexec/tutti/tutti-release (if //gpu:tutti-release
#   builds), every deploy/*.service in /usr/lib/systemd/system, sysusers.d and tmpfiles.d files,
#   the conffiles /etc/tutti/tuttid.textproto and /etc/default/tuttid, docs in /usr/share/doc/tutti
#   (the Prometheus alerting rules deploy/prometheus/tutti-alerts.yml among its examples);
#   the Python package `tutti` (client and vLLM connector) for the system Python in
#   /usr/lib/python3/dist-packages, unpacked from the wheel //client/python:wheel (with its
#   .dist-info, as Debian's own Python packages have it; byte-compiled by postinst);
#   maintainer scripts from deploy/debian/ (create the user, enable nothing, stop on removal,
#   remove /etc/tutti and /var/lib/tutti on purge).
# Depends: the Debian packages that own the libraries the binaries and the Python package's
# extension modules load (ldd, then dpkg -S).
# Recommends: the Python package's (python3-grpcio, python3-protobuf): tuttid itself runs without.
#
# Usage: tools/make_deb.sh [--version V] [--out DIR] [--no-build]
#   --version  package version (default 0.1.N, N the commit count of HEAD)
#   --out      directory for the .deb (default: the repository root)
#   --no-build use bazel-bin as it is (the caller built the targets)
# Prints the .deb's path on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
version="0.1.$(git rev-list --count HEAD 2>/dev/null || echo 0)"
out="$PWD"
build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --version) version="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    *) echo "make_deb.sh: unknown argument '$1' (see the header)" >&2; exit 2 ;;
  esac
done
log() { echo "make_deb: $*" >&2; }

release=1
if [ "$build" -eq 1 ]; then
  bazel build //daemon:tuttid //client:tuttictl //client/python:wheel >&2
  if ! bazel build //gpu:tutti-release >&2; then
    log "//gpu:tutti-release did not build: the package goes without the release helper"
    release=0
  fi
fi
bin="$(bazel info bazel-bin 2>/dev/null)"
[ -x "$bin/gpu/tutti-release" ] || release=0
# The wheel of this version (version.bzl; bazel-bin may hold older ones).
tutti_version="$(sed -n 's/^TUTTI_VERSION = "\(.*\)"$/\1/p' version.bzl)"
wheel="$bin/client/python/tutti-${tutti_version}-py3-none-any.whl"
[ -f "$wheel" ] || { log "no $wheel: bazel build //client/python:wheel"; exit 1; }

mkdir -p "$out"
stage="$(mktemp -d /tmp/tutti-deb.XXXXXX)"
trap 'rm -rf "$stage"' EXIT
root="$stage/root"
install -d "$root/DEBIAN" "$root/usr/bin" "$root/usr/lib/systemd/system" \
  "$root/usr/lib/sysusers.d" "$root/usr/lib/tmpfiles.d" "$root/etc/tutti" "$root/etc/default" \
  "$root/usr/share/doc/tutti/examples"
install -m 0755 "$bin/daemon/tuttid" "$bin/client/tuttictl" "$root/usr/bin/"
if [ "$release" -eq 1 ]; then
  install -D -m 0755 "$bin/gpu/tutti-release" "$root/usr/libexec/tutti/tutti-release"
fi
strip --strip-debug "$root"/usr/bin/* "$root"/usr/libexec/tutti/* 2>/dev/null || true
for unit in deploy/*.service deploy/*.timer; do
  install -m 0644 "$unit" "$root/usr/lib/systemd/system/"
done
install -m 0644 deploy/tutti.sysusers "$root/usr/lib/sysusers.d/tutti.conf"
install -m 0644 deploy/tutti.tmpfiles "$root/usr/lib/tmpfiles.d/tutti.conf"
install -m 0644 deploy/debian/tuttid.textproto "$root/etc/tutti/tuttid.textproto"
install -m 0644 deploy/debian/default-tuttid "$root/etc/default/tuttid"
install -m 0644 README.md docs/*.md "$root/usr/share/doc/tutti/"
install -m 0644 config/default.textproto "$root/usr/share/doc/tutti/default.textproto"
install -m 0644 config/examples/*.textproto "$root/usr/share/doc/tutti/examples/"
for example in deploy/*.textproto; do  # per-instance examples (tuttid@0.textproto)
  [ -f "$example" ] && install -m 0644 "$example" "$root/usr/share/doc/tutti/examples/"
done
install -m 0644 deploy/prometheus/tutti-alerts.yml "$root/usr/share/doc/tutti/examples/"
# The Python package: a pure wheel unpacked is the package installed (its files at the top, its
# .dist-info beside them). No __pycache__ is shipped: postinst byte-compiles, prerm removes them.
pydist="$root/usr/lib/python3/dist-packages"
install -d "$pydist"
/usr/bin/python3 -m zipfile -e "$wheel" "$pydist"
find "$pydist" -name __pycache__ -prune -exec rm -rf {} +
find "$pydist" -type d -exec chmod 0755 {} +
find "$pydist" -type f -exec chmod 0644 {} +
[ -f "$pydist/tutti/v1/kvcache_pb2_grpc.py" ] && [ -f "$pydist/tutti/vllm/__init__.py" ] &&
  [ -d "$pydist/tutti-${tutti_version}.dist-info" ] ||
  { log "the wheel $wheel did not unpack into the package, its modules and its .dist-info"; exit 1; }
install -m 0755 deploy/debian/postinst deploy/debian/prerm deploy/debian/postrm "$root/DEBIAN/"
printf '/etc/tutti/tuttid.textproto\n/etc/default/tuttid\n' >"$root/DEBIAN/conffiles"

# The packages owning the libraries that ldd names, for the binaries and the Python package's
# extension modules (tutti._lookup loads libgrpc++). dpkg records /lib/... for some libraries and
# /usr/lib/... for others (usr-merge): each library is looked up as given, resolved, and with the
# /usr prefix dropped or added, in one dpkg -S call. libpython is not linked (the interpreter
# provides it).
libs="$(for exe in "$root"/usr/bin/* "$root"/usr/libexec/tutti/* $(find "$pydist" -name '*.so'); do
          [ -f "$exe" ] || continue  # no release helper: the glob stays unexpanded
          ldd "$exe" | awk '$3 ~ /^\// {print $3}'
        done | sort -u)"
deps=()
candidates=()
for lib in $libs; do
  real="$(readlink -f "$lib")"
  candidates+=("$lib" "$real" "${lib#/usr}" "/usr$lib" "${real#/usr}" "/usr$real")
done
owners="$(dpkg -S "${candidates[@]}" 2>/dev/null || true)"
for lib in $libs; do
  real="$(readlink -f "$lib")"
  pkg=""
  for c in "$lib" "$real" "${lib#/usr}" "/usr$lib" "${real#/usr}" "/usr$real"; do
    pkg="$(awk -v f="$c" '{p=$0; sub(/^[^ ]*: /, "", p)} p == f {sub(/:.*/, ""); print; exit}' \
             <<<"$owners")"
    [ -n "$pkg" ] && break
  done
  [ -n "$pkg" ] || { log "no Debian package owns $lib (needed by the binaries)"; exit 1; }
  deps+=("$pkg")
done
depends="$(printf '%s\n' "${deps[@]}" | sort -u | paste -sd, | sed 's/,/, /g')"

cat >"$root/DEBIAN/control" <<CONTROL
Package: tutti
Version: $version
Architecture: amd64
Maintainer: tutti project <tutti@localhost>
Section: misc
Priority: optional
Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)
Depends: $depends
Recommends: systemd, nvme-cli, python3-grpcio (>= 1.51.1), python3-protobuf (>= 3.21.12)
Description: SSD-backed KV cache daemon for LLM serving
 tuttid keeps inference engines' KV blocks in a pool of files on local NVMe
 SSDs (with a host-DRAM tier) and moves them straight between the pool and
 the engine's paged KV memory, layer by layer. One instance per GPU
 (tuttid.service, tuttid@.service where shipped); tuttictl operates it.
 Installing enables and starts nothing. The Python package tutti (client and
 vLLM KV connector) is installed for the system Python 3.
CONTROL
(cd "$root" && find . -type f ! -path './DEBIAN/*' ! -path './etc/*' -printf '%P\0' |
   sort -z | xargs -0 md5sum >DEBIAN/md5sums)
deb="$out/tutti_${version}_amd64.deb"
dpkg-deb --root-owner-group -Zxz -z6 --build "$root" "$deb" >&2
log "built $deb (Depends: $depends)"
echo "$deb"
