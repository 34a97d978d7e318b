#!/usr/bin/env bash
# One device call for the probes and walls of sessions 13-15 (#15, #16), each part with its
# own time limit so a call cut short still returns what the parts before it measured. Usage (device tool;
# carry [".whl"]):
#   bash bench/experiments.sh [parts]
#   parts, in the order given (default: all): bytes groups fused-backward walls nodes layouts picks
#     bytes         bench/ncu_bytes.py: one agent's update kernel by kernel, and a population of 32 as one graph
#     groups        bench/group_probe.py TF32: G agents' GEMM as one batched cuBLASLt call
#     fused-backward population_step P = 32 with TF32's backward fusing its ReLU and bias gradients (cuBLASLt)
#     walls         #15's wall targets as a user meets them (the card's own profile, bytecode compiled, warm
#                   kernel cache after one run that fills it): the sample walk-forward three times, then
#                   240,000 synthetic bars (35 folds) once; process walls, and each run's stitched Sharpe
#     nodes         bench/node_floor.py: how fast a population's loop graph runs near-empty kernel nodes
#     layouts       bench/lt_algo_probe.py --layouts: the weight gradient (and the GEMMs that would write its
#                   operands) with feature-major operands, 32 lanes: which layouts run Hopper's TF32 kernels
#     picks         population_step --quick with other SM targets and heuristic algorithms for the update's
#                   GEMM problems (cublaslt.PICKS), each sweep from a baseline: fp32 at P = 16, TF32 at
#                   P = 32 (SIZES and MATHS are not read; FP32_PICKS and TF32_PICKS replace the lists, an
#                   empty TF32_PICKS skips TF32)
# SIZES (default 32), MATHS (default tf32) and QUICK (where set, population_step --quick: sm_share and the
# loop only, no breakdowns) from the environment. Writes logs and JSON under $OUT
# (/tmp/experiments without it).
set -uo pipefail
PARTS=${*:-bytes groups fused-backward walls nodes layouts picks}
OUT=${OUT:-/tmp/experiments}; mkdir -p "$OUT"
SIZES=${SIZES:-32}; MATHS=${MATHS:-tf32}
for part in $PARTS; do
  case $part in bytes|groups|fused-backward|walls|nodes|layouts|picks) ;;
    *) echo "unknown part: $part (bytes groups fused-backward walls nodes layouts picks)" >&2; exit 2 ;;
  esac
done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m compileall -q workbench cuda_kernels bench /tmp/site > /dev/null
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
echo "tree: $(git rev-parse --short HEAD 2>/dev/null) (with its uncommitted changes)" | tee -a "$OUT/device.txt"

pop() {  # label, then population_step's extra arguments
  local label=$1; shift
  echo "== $label"
  timeout 150 python3 bench/population_step.py --sizes "$SIZES" --maths "$MATHS" --pdl "" --json "$OUT/pop_$label.json" \
    ${QUICK:+--quick} \
    "$@" 2>&1 | grep -v Warning | tail -1
}

sweep() {  # math, population size, then picks (each a population_step --pick, or "base"): sm_share agent-updates/s
  local math=$1 size=$2 pick label n=0; shift 2
  for pick in "$@"; do
    n=$((n + 1)); label="${math}_p${size}_${n}_$(echo "$pick" | tr ':=' '_.')"
    args=(); [ "$pick" = base ] || args=(--pick "$math:$pick")
    [ "$n" = 1 ] || args+=(--no-torch)  # PyTorch's baseline once a sweep
    timeout 150 python3 bench/population_step.py --sizes "$size" --maths "$math" --pdl "" --quick \
      --json "$OUT/picks_$label.json" "${args[@]}" > "/tmp/picks_$label.log" 2>&1
    python3 -c "import json; r = json.load(open('$OUT/picks_$label.json'))['rows'][0]['$math']
print(f\"$math P=$size $pick: sm_share {r['sm_share_agent_updates_per_s']:,.0f} agent-updates/s, graph {r['agent_updates_per_s']:,.0f}\")" \
      2>/dev/null | tee -a "$OUT/picks.txt" || echo "$math P=$size $pick: failed, $(tail -1 "/tmp/picks_$label.log")" | tee -a "$OUT/picks.txt"
  done
}

wf() {  # label, data file: one walk-forward, its process wall, stitched Sharpe and fold 1's epoch phases
  local label=$1 data=$2 start end
  start=$(date +%s.%N)
  timeout 120 python3 -m workbench.walkforward "$data" --device gpu --out "/tmp/wf_$label" --force --progress plain \
    > "$OUT/walkforward_$label.log" 2>&1
  end=$(date +%s.%N)
  python3 -c "import json, sys; s = json.load(open('/tmp/wf_$label/summary.json'))['stitched_oos']
ms = [e['ms'] for e in json.load(open('/tmp/wf_$label/fold_001/epochs.json'))['epochs']]
phases = ', '.join(f'{k} {sum(m.get(k, 0) for m in ms) / 1e3:.2f}' for k in ('experience', 'training', 'validation'))
print(f'$label: process wall {$end - $start:.2f} s, stitched Sharpe {s.get(\"sharpe\")!r}; fold 1 epochs, s: {phases}')" 2>&1 \
    | tee -a "$OUT/walls.txt" || echo "$label: no result, see walkforward_$label.log" | tee -a "$OUT/walls.txt"
}

for part in $PARTS; do
  case $part in
    bytes)
      timeout 200 python3 bench/ncu_bytes.py --maths "$MATHS" --json "$OUT/ncu_bytes_update.json" 2>&1 \
        | tail -40 | tee "$OUT/ncu_bytes_update.txt"
      timeout 200 python3 bench/ncu_bytes.py --maths "$MATHS" --population "$SIZES" \
        --json "$OUT/ncu_bytes_population.json" 2>&1 | tail -5 | tee "$OUT/ncu_bytes_population.txt" ;;
    groups)
      (cd bench && timeout 200 python3 group_probe.py --maths "$MATHS" --json "$OUT/group_probe.json" 2>&1 \
        | grep -v Warning > "$OUT/group_probe.txt"); cut -c1-160 "$OUT/group_probe.txt" ;;
    fused-backward)
      pop fused_backward --fused-backward "fp32,$MATHS" ;;
    walls)
      wf sample_fill data/es_sample.parquet  # fills the kernel cache
      for i in 1 2 3; do wf "sample$i" data/es_sample.parquet; done
      timeout 60 python3 -m workbench.synthetic --bars 240000 /tmp/syn240k.parquet > /dev/null && wf syn240k /tmp/syn240k.parquet ;;
    layouts)
      (cd bench && timeout 240 python3 lt_algo_probe.py --layouts --lanes "$SIZES" --maths "$MATHS" \
        --json "$OUT/lt_layouts.json" 2>&1 | grep -v Warning | tee "$OUT/lt_layouts.txt") ;;
    picks)  # the rule's targets (fp32: 2048 rows 64, 1024 rows 32, weight gradients 16; TF32: 32, 16, 8)
      sweep fp32 16 ${FP32_PICKS:-base 2048x512x512=0:1 512x512x1024=33:0}
      [ "${TF32_PICKS-x}" = "" ] || sweep tf32 32 ${TF32_PICKS:-base 1024x512x512=-:1} ;;
    nodes)
      (cd bench && timeout 120 python3 node_floor.py --json "$OUT/node_floor.json" 2>&1 | grep -v Warning) ;;
  esac
done
