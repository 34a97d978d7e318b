#!/usr/bin/env bash
# One device call that measures this tree against another (the tree before a change) side by side:
# the kernels (bench/kernel_probe.py --old: times alone and 16 at once, and whether the outputs are the
# same bit for bit), the population of 16 and the single update (each tree in turn, PyTorch's CUDA
# graph in each run), the sample walk-forward (process walls, the trees alternated, and whether their
# stitched out-of-sample results are identical). Usage (device tool; carry [".whl", "<old tree dir>"]):
#   bash bench/ab_check.sh OLD_TREE [parts]
#   OLD_TREE: a directory holding the other tree (e.g. `git archive <rev> | tar -x -C .ab/old`)
#   parts: any of tests kernels population step walkforward (default: all), in the order given
#   MATHS (default tf32), SIZES (default 16), RUNS (walk-forward pairs, default 2) from the environment.
# Writes logs and JSON under $OUT (/tmp/ab_check without it); each part has its own time limit, so a
# call cut short still returns what the parts before it measured.
set -uo pipefail
OLD=$(cd "${1:?usage: bash bench/ab_check.sh OLD_TREE [parts]}" && pwd) || exit 2
shift
PARTS=${*:-tests kernels population step walkforward}
NEW=$PWD
OUT=${OUT:-/tmp/ab_check}; mkdir -p "$OUT"
MATHS=${MATHS:-tf32}; SIZES=${SIZES:-16}; RUNS=${RUNS:-2}
for part in $PARTS; do
  case $part in tests|kernels|population|step|walkforward) ;;
    *) echo "unknown part: $part (tests kernels population step walkforward)" >&2; exit 2 ;;
  esac
done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONUNBUFFERED=1
# The device machines set PYTHONDONTWRITEBYTECODE and the wheels go in --no-compile: compile both trees'
# bytecode once, as a user's install does, so the walls below do not include compiling ~340 modules.
for dir in "$NEW" "$OLD" /tmp/site; do python3 -m compileall -q "$dir" > /dev/null; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
echo "new: $(git -C "$NEW" rev-parse --short HEAD 2>/dev/null || echo "$NEW") (with its uncommitted changes); old: $OLD" \
  | tee -a "$OUT/device.txt"

in_tree() {  # tree dir, then the command: run it from that tree with that tree's packages first
  local dir=$1; shift
  (cd "$dir" && PYTHONPATH="/tmp/site:$dir" "$@")
}

for part in $PARTS; do
  case $part in
    tests)
      in_tree "$NEW" timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_launch.py tests/test_gpu.py \
        tests/test_trainer_gpu.py tests/test_population.py tests/test_kernels.py tests/test_network.py \
        tests/test_graph_edges.py 2>&1 | tail -6 | tee "$OUT/pytest.txt" ;;
    kernels)
      in_tree "$NEW" timeout 150 python3 bench/kernel_probe.py --old "$OLD/cuda_kernels" --json "$OUT/kernel_probe.json" \
        2>&1 | grep -v Warning | tee "$OUT/kernel_probe.txt" ;;
    population)
      for t in new old; do
        dir=$NEW; [ $t = old ] && dir=$OLD
        in_tree "$dir" timeout 150 python3 bench/population_step.py --sizes "$SIZES" --maths "$MATHS" --pdl "" \
          --json "$OUT/population_$t.json" 2>&1 | grep -v Warning | tail -3 | sed "s/^/[$t] /"
      done ;;
    step)
      for t in new old; do
        dir=$NEW; [ $t = old ] && dir=$OLD
        in_tree "$dir" timeout 150 python3 bench/train_step.py --pdl "" --maths "$MATHS" --json "$OUT/train_step_$t.json" \
          2>&1 | grep -v Warning | grep "^ours.*graph\|CUDA graph" | sed "s/^/[$t] /"
      done ;;
    walkforward)
      for i in $(seq "$RUNS"); do
        for t in old new; do
          dir=$NEW; [ $t = old ] && dir=$OLD
          TIMEFORMAT="[$t] sample walk-forward, process wall %R s"
          time (in_tree "$dir" timeout 120 python3 -m workbench.walkforward data/es_sample.parquet --device gpu \
                  --out "/tmp/ab_wf_$t$i" --force --progress plain > "$OUT/walkforward_$t$i.log" 2>&1)
        done
      done
      python3 - "$RUNS" <<'EOF'
import json, sys
runs = int(sys.argv[1])
got = {}
for t in ("old", "new"):
    for i in range(1, runs + 1):
        try:
            got[f"{t}{i}"] = json.load(open(f"/tmp/ab_wf_{t}{i}/summary.json"))["stitched_oos"]
        except (OSError, KeyError, ValueError) as exc:
            sys.exit(f"walk-forward {t} run {i} left no result ({exc}): see walkforward_{t}{i}.log")
print("stitched_oos identical, new vs old:", got["new1"] == got["old1"],
      "| new runs alike:", all(got[f"new{i}"] == got["new1"] for i in range(1, runs + 1)),
      "| Sharpe new", got["new1"].get("sharpe"), "old", got["old1"].get("sharpe"))
EOF
      ;;
  esac
done
