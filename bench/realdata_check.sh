#!/usr/bin/env bash
# The main job with default settings (the agent) on every real bar file: exit code, market chosen,
# folds, wall time, stitched out-of-sample Sharpe and net PnL. The two-product DBN file must be
# refused (exit 65) and is then run with --symbol ES. Usage:
#   bash bench/realdata_check.sh [REALDATA_DIR] [extra walkforward args...]
#   (default ../shared/realdata; on the lent GPU copy the files into an ignored folder and carry it)
set -uo pipefail
DIR=${1:-../shared/realdata}; shift || true
OUT=${OUT:-/tmp/realdata_check}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
printf '%-58s %4s %6s  %s\n' file rc secs "market / splits / stitched out-of-sample (or the error)" | tee "$OUT/summary.txt"
run() {  # name, then extra args
  local f=$1; shift
  local tag; tag=$(basename "$f" | tr -c 'A-Za-z0-9._\n-' '_')
  local t0; t0=$(date +%s.%N)
  python3 -m workbench.walkforward "$f" --out "/tmp/rd_$tag" --force --json --progress plain "$@" \
    > "$OUT/$tag.json" 2> "$OUT/$tag.err"
  local rc=$?
  local secs; secs=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
  local what
  if [ $rc -eq 0 ]; then
    what=$(python3 - "$OUT/$tag.json" "$OUT/$tag.err" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
err = open(sys.argv[2]).read().splitlines()
market = next((l.split("market: ", 1)[1].split(" ")[0].rstrip(",") for l in err if "market: " in l), "?")
splits = next((l.split("splits: ", 1)[1].split(" (")[0] for l in err if "splits: " in l), "?")
m = d["stitched_oos"]
f = lambda v, spec: "n/a" if v is None else format(v, spec)  # noqa: E731  (a refused figure is null)
print(f"{market} | {splits} | Sharpe {f(m['sharpe'], '.2f')} over {m['days']} days, net {f(m['net_pnl_usd'], ',.0f')} "
      f"USD, {m['trades']} trades")
EOF
)
  else
    what=$(grep 'workbench: error' "$OUT/$tag.err" | head -1)
  fi
  printf '%-58s %4s %6s  %s\n' "$(basename "$f") $*" "$rc" "$secs" "$what" | tee -a "$OUT/summary.txt"
}
for f in "$DIR"/*; do
  case "$f" in *.md) continue ;; esac
  run "$f" "$@"
done
for f in "$DIR"/glbx_esu4_nqu4_*; do run "$f" --symbol ES "$@"; done
