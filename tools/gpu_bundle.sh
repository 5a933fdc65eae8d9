#!/bin/bash
# Builds Bazel targets here and gathers what the GPU machine needs to run them into one folder:
# the binaries, every shared library they load (except the ones that must come from the GPU
# machine: glibc, the dynamic loader, libcuda and libnvidia-*), and a run script.
#
#   tools/gpu_bundle.sh [-o DIR] TARGET...        (DIR defaults to .bundle)
#
# Then, with the device tool: run(carry=[".bundle"], command=".bundle/run.sh gpu/probe_test").
# Binaries keep their package path: //gpu:probe_test -> DIR/bin/gpu/probe_test; run.sh takes that
# path (or any path containing a '/', such as a script) and the arguments, and sets
# LD_LIBRARY_PATH. Runfiles are not bundled: targets that read data files at run time need them
# copied in by the caller.
#
# Environment: TUTTI_OUTPUT_BASE (a Bazel --output_base, so the build does not wait on another
# Bazel server's lock), TUTTI_DISK_CACHE (default /root/.cache/tutti-disk). The device tool's carry
# limit is 64 MiB; the script fails if the bundle is larger.
set -euo pipefail

out=.bundle
if [[ "${1:-}" == "-o" ]]; then
  out="$2"
  shift 2
fi
if [[ $# -eq 0 ]]; then
  echo "usage: $0 [-o DIR] TARGET..." >&2
  exit 2
fi

cd "$(git rev-parse --show-toplevel)"
startup=()
[[ -n "${TUTTI_OUTPUT_BASE:-}" ]] && startup=(--output_base="$TUTTI_OUTPUT_BASE")
bazel "${startup[@]}" build --disk_cache="${TUTTI_DISK_CACHE:-/root/.cache/tutti-disk}" "$@"
bin="$(bazel "${startup[@]}" info bazel-bin 2>/dev/null)"

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"

# Libraries the GPU machine provides itself (its glibc is newer; libcuda must match its driver).
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|librt\.so|libpthread\.so|libresolv\.so|libutil\.so|libcuda\.so|libnvidia)'

for target in "$@"; do
  label="${target#//}"
  pkg="${label%%:*}"
  name="${label##*:}"
  [[ "$label" == *:* ]] || name="${pkg##*/}"
  src="$bin/$pkg/$name"
  if [[ ! -f "$src" ]]; then
    echo "gpu_bundle: $target is not a binary ($src missing)" >&2
    exit 1
  fi
  mkdir -p "$out/bin/$pkg"
  cp -L "$src" "$out/bin/$pkg/$name"
  chmod u+w "$out/bin/$pkg/$name"
  strip --strip-debug "$out/bin/$pkg/$name"  # -g1 symbols: the carry limit is 64 MiB
  ldd "$src" | awk '/=> \// { print $3 }' | while read -r lib; do
    base="$(basename "$lib")"
    [[ "$base" =~ $skip ]] && continue
    [[ -f "$out/lib/$base" ]] || cp -L "$lib" "$out/lib/$base"
  done
done

cat > "$out/run.sh" <<'RUN'
#!/bin/sh
# Runs a bundled binary with the bundled libraries: run.sh gpu/probe_test [args...]
here="$(cd "$(dirname "$0")" && pwd)"
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The ready words' release helper, when bundled (gpu/ready_words.h, ForceRelease).
if [ -z "${TUTTI_RELEASE_HELPER:-}" ] && [ -x "$here/bin/gpu/tutti-release" ]; then
  export TUTTI_RELEASE_HELPER="$here/bin/gpu/tutti-release"
fi
prog="$1"
shift
if [ -x "$here/bin/$prog" ]; then exec "$here/bin/$prog" "$@"; fi
exec "$prog" "$@"
RUN
chmod +x "$out/run.sh"
# tuttid as one executable path, for tests and scripts that start it themselves (TUTTID_BIN,
# gpu_e2e.py --tuttid).
if [[ -x "$out/bin/daemon/tuttid" ]]; then
  printf '#!/bin/sh\nexec "$(dirname "$0")/run.sh" daemon/tuttid "$@"\n' > "$out/tuttid.sh"
  chmod +x "$out/tuttid.sh"
fi

exclude="$(git rev-parse --git-dir)/info/exclude"
mkdir -p "$(dirname "$exclude")"
grep -qxF "/$out/" "$exclude" 2>/dev/null || echo "/$out/" >> "$exclude"

size_kib="$(du -sk "$out" | cut -f1)"
echo "gpu_bundle: $out: $(find "$out/bin" -type f | wc -l) binaries, $(ls "$out/lib" | wc -l) libraries, $((size_kib / 1024)) MiB"
if (( size_kib > 64 * 1024 )); then
  echo "gpu_bundle: larger than the 64 MiB the device tool carries" >&2
  exit 1
fi
