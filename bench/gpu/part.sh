# Sourced by the bench/gpu/h200_call*.sh scripts: `part NAME LIMIT_S CMD...` runs one part of
# a call on the lent GPU. CMD runs under its own time limit with its output in $W/NAME.log;
# then one line gives its exit code and time, and the log's last lines follow. A part that
# fails does not stop the others.
#
# Set by the calling script: W (the call's work folder); PART_TAIL (log lines shown, default
# 15; TAIL=N before one `part` overrides it); PART_OUT (when set, CMD runs with OUT=PART_OUT,
# where the benchmarks write their JSON); PART_RESULTS (names of result files CMD leaves in
# $W: each is renamed NAME.FILE, so the next part writing the same name does not replace it).
part() {  # part NAME LIMIT_S CMD...
  local name=$1 limit=$2; shift 2; local t0 rc f
  t0=$(date +%s)
  OUT=${PART_OUT:-${OUT:-}} timeout "$limit" "$@" >"$W/$name.log" 2>&1; rc=$?
  echo "== $name: rc=$rc in $(( $(date +%s) - t0 )) s (limit $limit s)"
  tail -n "${TAIL:-${PART_TAIL:-15}}" "$W/$name.log"
  for f in ${PART_RESULTS:-}; do
    [ -f "$W/$f" ] && mv "$W/$f" "$W/$name.$f"
  done
  return 0
}
