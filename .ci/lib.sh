# shellcheck shell=bash
# The bookkeeping of CI scripts whose steps all run and report, and which
# fail at the end if any step did (.ci/cross.sh, .ci/wheels.sh). Sourced
# after `set -euo pipefail`, from the repository's root:
#   step NAME COMMAND...   run a step
#   finish LABEL           print the summary; exit 1 if a step failed
#   binfmt_aarch64         let the kernel hand aarch64 ELF files to qemu-user

summary=()
failed=0

# step NAME COMMAND...: run COMMAND in a subshell under set -e, print its
# result and the seconds it took, and carry on whatever it did.
step() {
  local name=$1 start rc
  shift
  echo
  echo "== $name"
  start=$SECONDS
  set +e
  (set -e; "$@")
  rc=$?
  set -e
  local took=$((SECONDS - start)) result=ok
  if [ "$rc" -ne 0 ]; then
    result="FAILED (exit $rc)"
    failed=1
  fi
  echo "-- $name: $result, ${took}s"
  summary+=("$(printf '%5ss  %-18s %s' "$took" "$result" "$name")")
}

# finish LABEL: every step's seconds and result; exit 1 if any failed.
finish() {
  local label=$1
  echo
  echo "== $label summary (seconds, result, step)"
  printf '%s\n' "${summary[@]}"
  if [ "$failed" -ne 0 ]; then
    echo "$label: some steps failed"
    exit 1
  fi
  echo "$label: every step passed"
}

# binfmt_aarch64: programs the tests start (the command, the C test program,
# the interpreter again through sys.executable) are aarch64 ELF files; the
# kernel hands them to qemu-user through binfmt_misc, registered here from
# Debian's qemu-user-static when it is not yet (needs root). QEMU_LD_PREFIX
# names the root their libraries come from.
binfmt_aarch64() {
  local dir=/proc/sys/fs/binfmt_misc
  if [ ! -e "$dir/qemu-aarch64" ]; then
    [ -e "$dir/register" ] || mount -t binfmt_misc binfmt_misc "$dir"
    cat /usr/lib/binfmt.d/qemu-aarch64.conf >"$dir/register"
  fi
  cat "$dir/qemu-aarch64"
}
