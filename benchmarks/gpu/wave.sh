#!/usr/bin/env bash
# Every single-GPU measurement of the contention, per-op, kernel-rate and memory questions,
# in one call of a GPU machine (its time is scarce): each part under its own time limit and
# log, so that one failing part loses nothing of the others. Writes everything under
# $OUT/gpu and packs it into $OUT/gpu_wave.tgz.
#
#   OUT=/tmp/out bash benchmarks/gpu/wave.sh [part ...]
#   parts: order kernels memory gpt5b llama2_7b llama3_8b_flash mixtral_1l llama3_8b_fp8 mixtral_grouped probes grouped tiles
#   (default: the first six; mixtral_1l and llama3_8b_fp8 are the MoE and fp8 steps of issue 47,
#   probes the paced and reducing contention probes, grouped the MoE grouped-GEMM kernels, tiles their tile sweep)
#
# Needs: an NVIDIA GPU, JAX with its CUDA plugin, CuPy. lagom_jax is imported from this
# checkout (copied into a site folder as the package layout maps it), nothing is installed.
set -u
OUT=${OUT:-/tmp/lagom_gpu_wave}
W=${WAVE_DIR:-$OUT/gpu}  # WAVE_DIR: keep the loose files elsewhere, only the tarball under $OUT
mkdir -p "$W"
export PYTHONUNBUFFERED=1
SITE=$(mktemp -d)
cp -r lagom_jax "$SITE/" && cp -r passes "$SITE/lagom_jax/passes" && cp -r models "$SITE/lagom_jax/models"
export PYTHONPATH=$SITE:$PWD
PY="${PYTHON:-python3} -P"  # -P: the site copy, not the checkout's lagom_jax, comes first
# The measured H100 profile prices "after"; on another card leave ACC_PROFILE empty (its preset only).
ACC_PROFILE=${ACC_PROFILE-benchmarks/results/gpu/hardware.json}
parts=${*:-order gpt5b llama2_7b memory kernels llama3_8b_flash}

{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  $PY -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, jax.devices())"
  $PY -c "import cupy; print('cupy', cupy.__version__)"; } > "$W/machine.txt" 2>&1
cat "$W/machine.txt"

part() {  # name limit_s command...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "== $name (limit ${limit}s)"
  timeout "$limit" "$@" > "$W/$name.log" 2>&1
  echo "rc=$? after $((SECONDS - t0)) s" >> "$W/$name.log"
  grep -v "^I0000\|^W0000\|absl::InitializeLog" "$W/$name.log" | tail -n 25
  tar czf "$OUT/gpu_wave.tgz" -C "$W" .  # after every part: a call stopped at its limit keeps the rest
}

acc() {  # tag model config batch seq attention
  part "acc_$1" "${ACC_LIMIT:-100}" $PY -m benchmarks.gpu.accuracy --out "$W" --tag "$1" --model "$2" --config "$3" \
    --batch-size "$4" --seq-len "$5" --attention "$6" ${ACC_PROFILE:+--profile "$ACC_PROFILE"} \
    --warmup 2 --repeats 6
}

for p in $parts; do
  case $p in
    order) part order 80 $PY -m benchmarks.gpu.order --out "$W" ;;
    # Contention probes: a copy paced to one NCCL channel's rate and one that reduces as it
    # copies, beside the unpaced copy and the SM hold they are told apart from.
    probes) part probes "${PROBES_LIMIT:-120}" $PY -m benchmarks.gpu.order --out "$W" --orders first,dep \
      --priorities normal --kinds copy,hold,paced,reduce,paced-reduce --ctas "${PROBE_CTAS:-1,4,16,32,64}" ;;
    tiles) part grouped_tiles "${TILES_LIMIT:-270}" $PY -m benchmarks.gpu.grouped_tiles --out "$W" ;;
    # The grouped-GEMM kernels of moe="grouped" against XLA's ragged_dot (forward and backward).
    grouped) part grouped "${GROUPED_LIMIT:-240}" $PY -m benchmarks.gpu.kernels --out "$W/grouped" --parts grouped \
      --repeats "${KERNEL_REPEATS:-8}" --inner 3 ;;
    kernels) part kernels "${KERNEL_LIMIT:-180}" env ${KERNEL_XLA_FLAGS:+XLA_FLAGS="$KERNEL_XLA_FLAGS"} \
      $PY -m benchmarks.gpu.kernels --out "$W" --parts "${KERNEL_PARTS:-attention,fp8,ragged,dispatch}" \
      ${KERNEL_GEMMS:+--gemms "$KERNEL_GEMMS"} --repeats "${KERNEL_REPEATS:-10}" --inner 4 ;;
    memory) XLA_PYTHON_CLIENT_MEM_FRACTION=0.92 part memory 110 $PY -m benchmarks.gpu.kernels --out "$W/mem" --parts memory --memory-layers "${MEMORY_LAYERS:-6,10}" ;;
    gpt5b) acc gpt5b gpt2 "layers=2,d_model=4096,heads=32,d_ff=16384,max_len=2048" 4 2048 xla ;;
    llama2_7b) acc llama2_7b llama "layers=2,d_model=4096,heads=32,kv_heads=32,d_ff=11008,vocab=32000,max_len=4096" 2 4096 xla ;;
    llama3_8b_flash) ACC_LIMIT=80 acc llama3_8b_flash llama "layers=2,d_model=4096,heads=32,kv_heads=8,d_ff=14336,vocab=128256,max_len=8192" 1 8192 flash ;;
    # One Mixtral 8x7b layer (GShard dispatch, 8 experts, top-2; two layers at batch 2 x 4096 asked
    # for 55 GiB of temporaries and did not fit an H200) and two llama3-8b layers on MaxText's fp8 path.
    mixtral_1l) acc mixtral_1l mixtral "layers=1,max_len=4096" 2 4096 xla ;;
    # The same layer with its experts on JAX's grouped-GEMM kernels (moe="grouped").
    mixtral_grouped) ACC_LIMIT=150 acc mixtral_grouped mixtral "layers=1,max_len=4096,moe=grouped" 2 4096 xla ;;
    llama3_8b_fp8) acc llama3_8b_fp8 llama "layers=2,d_model=4096,heads=32,kv_heads=8,d_ff=14336,vocab=128256,max_len=4096,quantization=fp8" 2 4096 xla ;;
    *) echo "unknown part $p" ;;
  esac
done
ls -la "$W" "$W/mem" 2>/dev/null
