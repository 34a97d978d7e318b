#!/usr/bin/env bash
# One call on the lent GPU: the gpu-marked tests, every kernel test on the real device, the PTX
# check, then the micro-benchmarks and the GEMM maths' accuracy inside the update. Usage (device tool, carry [".whl"]):
#   bash bench/gpu_check.sh        (writes logs and JSON under $OUT when set)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/nvidia-smi.txt"
python3 -c "import numpy, numba, numba_cuda; print('numpy', numpy.__version__, 'numba', numba.__version__)"
python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_kernels.py tests/test_env.py tests/test_backtest.py tests/test_network.py tests/test_rollout.py tests/test_cross_backend.py tests/test_population.py tests/test_trainer_gpu.py tests/test_graph_loop.py tests/test_graph_edges.py tests/test_launch.py 2>&1 | tee "$OUT/pytest.txt"
[ "${SKIP_MICRO:-0}" = 1 ] || python3 bench/micro.py --json "$OUT/micro.json" 2>&1 | tee "$OUT/micro.txt"
python3 bench/train_step.py --json "$OUT/train_step.json" 2>&1 | grep -v Warning | tee "$OUT/train_step.txt"
python3 bench/math_accuracy.py --json "$OUT/math_accuracy.json" 2>&1 | grep -v Warning | tee "$OUT/math_accuracy.txt"
python3 bench/population_schedules.py --json "$OUT/population_schedules.json" 2>&1 | grep -v Warning \
  | tee "$OUT/population_schedules.txt"
( time python3 -m workbench.walkforward data/es_sample.parquet --device gpu --out /tmp/gpu_run --progress plain ) \
  > "$OUT/walkforward.txt" 2>&1; tail -45 "$OUT/walkforward.txt"
cp /tmp/gpu_run/summary.json "$OUT/summary.json" 2>/dev/null
