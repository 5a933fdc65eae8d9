#!/bin/bash
# Runs the README's Quick start (tools/demo.sh, then tools/test.sh) as root in a fresh Debian 12
# minbase root filesystem made by debootstrap, so a package missing from
# deploy/debian-packages.txt fails here instead of on a user's machine.
#
#   tools/fresh_root_test.sh [--with-cuda] [--keep] [--worktree]
#
#   (default)    without the CUDA toolkit: the build leaves the GPU code out (host mode only).
#   --with-cuda  also run it once more with this machine's /usr/local/cuda bind-mounted read-only
#                at /usr/local/cuda in the root (skipped, with a note, where there is none).
#   --keep       leave the root filesystem(s) in place for a look (the path is printed).
#   --worktree   copy the working tree (tracked and untracked, not ignored files) instead of the
#                committed HEAD (git archive).
#
# Needs root, debootstrap and network access to the Debian mirror. Caches under
# $TUTTI_FRESH_CACHE (default /var/cache/tutti-fresh-root): the pristine debootstrap root as a
# tarball (made once, about 20 s of CPU) and the .deb files apt downloads (bind-mounted at the
# root's /var/cache/apt/archives), so re-runs download nothing. Every run unpacks a new root from
# the tarball and builds from nothing: no Bazel cache is shared with this machine.
#
# Output: each step's log under the run's directory; one closing line per run,
# "fresh-root (no CUDA): PASSED in N s" or "... FAILED (step) in N s". Exit status 0 only if
# every run passed.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO="$(pwd)"
CACHE="${TUTTI_FRESH_CACHE:-/var/cache/tutti-fresh-root}"
SUITE=bookworm
TARBALL="$CACHE/$SUITE-minbase.tar"

with_cuda=0
keep=0
source_mode=head
for arg in "$@"; do
  case "$arg" in
    --with-cuda) with_cuda=1 ;;
    --keep) keep=1 ;;
    --worktree) source_mode=worktree ;;
    *) echo "fresh-root: unknown argument $arg (see the header of $0)" >&2; exit 2 ;;
  esac
done
if [ "$(id -u)" -ne 0 ]; then
  echo "fresh-root: must run as root (debootstrap, chroot, mount)" >&2; exit 2
fi
if ! command -v debootstrap >/dev/null; then
  echo "fresh-root: debootstrap is missing: apt-get install --no-install-recommends debootstrap" >&2
  exit 2
fi
mkdir -p "$CACHE/apt-archives/partial"

# The pristine root, made once.
if [ ! -s "$TARBALL" ]; then
  echo "fresh-root: debootstrap --variant=minbase $SUITE (cached as $TARBALL)"
  tmp="$CACHE/debootstrap.$$"
  rm -rf "$tmp"
  if ! debootstrap --variant=minbase "$SUITE" "$tmp" >"$CACHE/debootstrap.log" 2>&1; then
    echo "fresh-root: debootstrap failed; see $CACHE/debootstrap.log" >&2
    rm -rf "$tmp"; exit 1
  fi
  # A standard Debian 12 installation's sources: main with its updates and security suites.
  cat >"$tmp/etc/apt/sources.list" <<EOF
deb http://deb.debian.org/debian $SUITE main
deb http://deb.debian.org/debian $SUITE-updates main
deb http://deb.debian.org/debian-security $SUITE-security main
EOF
  tar -C "$tmp" -cf "$TARBALL.part" . && mv "$TARBALL.part" "$TARBALL"
  rm -rf "$tmp"
fi

# What the root's mounts are, innermost last (unmounted in reverse).
mounts=()
root=""
unmount_all() {
  local i
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    umount -R "${mounts[$i]}" 2>/dev/null || umount -lR "${mounts[$i]}" 2>/dev/null
  done
  mounts=()
}

# Ends the processes whose root directory is $root (a Bazel server left behind), by pid.
stop_root_processes() {
  local p target
  for p in /proc/[0-9]*; do
    target="$(readlink "$p/root" 2>/dev/null)" || continue
    if [ "$target" = "$root" ]; then kill -TERM "${p#/proc/}" 2>/dev/null; fi
  done
}

cleanup() {
  [ -n "$root" ] || return 0
  stop_root_processes
  sleep 1
  unmount_all
  [ "$keep" -eq 0 ] || return 0
  # Never delete through a mount still there (the apt cache and the toolkit are bind mounts).
  if grep -qF " $(dirname "$root")/" /proc/mounts; then
    echo "fresh-root: $(dirname "$root") still has mounts; not deleting it" >&2
    return 0
  fi
  rm -rf --one-file-system "$(dirname "$root")"
}
trap cleanup EXIT

bind() {  # bind SRC DST [ro]
  mkdir -p "$2"
  mount --rbind "$1" "$2" && mount --make-rslave "$2" && mounts+=("$2") || return 1
  if [ "${3:-}" = ro ]; then mount -o remount,bind,ro "$2"; fi
}

# One run: a new root, the repository at /root/tutti, the two Quick start commands.
run_once() {  # run_once LABEL CUDA(0|1)
  local label="$1" cuda="$2" start dir step rc
  start=$(date +%s)
  dir="$(mktemp -d "$CACHE/run.XXXXXX")"
  root="$dir/root"
  mkdir -p "$root"
  tar -C "$root" -xf "$TARBALL"
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  mkdir -p "$root/root/tutti"
  if [ "$source_mode" = head ]; then
    git -C "$REPO" archive HEAD | tar -C "$root/root/tutti" -xf -
  else
    git -C "$REPO" ls-files -z -co --exclude-standard |
      tar -C "$REPO" --null -T - -cf - | tar -C "$root/root/tutti" -xf -
  fi
  mount -t proc proc "$root/proc" && mounts+=("$root/proc")
  bind /sys "$root/sys"
  bind /dev "$root/dev"
  bind "$CACHE/apt-archives" "$root/var/cache/apt/archives"
  if [ "$cuda" -eq 1 ]; then bind "$(readlink -f /usr/local/cuda)" "$root/usr/local/cuda" ro; fi
  echo "fresh-root ($label): root $root; logs in $dir"
  rc=0
  for step in demo.sh test.sh; do
    echo "fresh-root ($label): tools/$step"
    # A clean environment, as a root login on a new machine would have.
    env -i HOME=/root TERM=dumb PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      LANG=C.UTF-8 chroot "$root" /bin/bash -c "cd /root/tutti && tools/$step" \
      >"$dir/$step.log" 2>&1
    rc=$?
    tail -n 5 "$dir/$step.log" | sed "s/^/fresh-root ($label):   /"
    if [ "$rc" -ne 0 ]; then break; fi
  done
  chroot "$root" /bin/bash -c "cd /root/tutti && bazel shutdown" >/dev/null 2>&1
  local took=$(( $(date +%s) - start ))
  if [ "$rc" -eq 0 ]; then
    echo "fresh-root ($label): PASSED in ${took} s"
  else
    # The root goes with the cleanup: keep the failing step's log where CI can show it.
    local saved="$CACHE/last-failure-${label// /-}.log"
    cp "$dir/$step.log" "$saved"
    tail -n 40 "$saved" | sed "s/^/fresh-root ($label): | /"
    echo "fresh-root ($label): FAILED (tools/$step, exit $rc; log $saved) in ${took} s"
  fi
  cleanup
  root=""
  return "$rc"
}

overall=0
run_once "no CUDA" 0 || overall=1
if [ "$with_cuda" -eq 1 ]; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then
    run_once "with CUDA" 1 || overall=1
  else
    echo "fresh-root (with CUDA): skipped: this machine has no /usr/local/cuda/bin/nvcc"
  fi
fi
exit "$overall"
