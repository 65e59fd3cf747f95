#!/usr/bin/env bash
# One prepared GPU check: every CUDA-only check of tunedeck in one device call, one Markdown report.
#
#     bash bench/gpu_wheels.sh                  # first, HERE (PyPI answers): the wheels the GPU machine lacks
#     device tool: run(command="bash bench/gpu_check.sh", carry=[".gpu-wheels"], timeout_s=540)
#     bash bench/gpu_check.sh --dry-run         # anywhere: each step it would run; checks every file it needs
#     bash bench/gpu_check.sh --only oom,tricks # a second call: install and facts, then only these sections
#
# On the GPU machine (no network) it installs the carried wheels (.gpu-wheels/, see
# bench/gpu_wheels.sh) into a folder put first on PYTHONPATH (the machine's torch and CUDA stay),
# then runs each section with its own timeout, inside one overall budget (GPU_CHECK_BUDGET_S,
# default 470 s: under 8 minutes, so a 540 s call ends on time; GPU_CHECK_TIMEOUTS=oom=200,... changes
# a section's own); a section that fails or times out
# does not stop the next, and a section the budget cannot fit any more is reported as skipped:
#
#   install    the carried wheels (bench/gpu_env.py --select decides which)
#   facts      nvidia-smi, Python/torch/CUDA/driver, package versions and origins, unmet requirements
#   constants  bench/cuda_constants.py: the CUDA context and the allocator slack (jobs/memory/breakdown.py)
#   oom        bench/oom_gpu.py: a job that really runs out of GPU memory, recovered by the real worker
#   pytest     the tests marked `gpu` (pytest -m gpu over the files that use the marker)
#   memtruth   bench/memory_truth.py --device cuda on four Qwen2.5-0.5B configurations
#   memruns    bench/memory_runs.py --device cuda (when the file exists; else "not present")
#   tricks     bench/tricks_gpu.py, six configurations x 8 steps (the full table takes ~6-8 min)
#   newtricks  bench/tricks_gpu.py on the newer tricks and the presets' combinations, predicted vs
#              measured per row (Liger, offloading, offloaded checkpointing, GaLore, APOLLO, LoRA+,
#              NEFTune, compile, "Low memory" and "Fast" on CUDA): run it with --only newtricks
#   vllm       bench/vllm_gpu.py: GRPO with use_vllm (colocate) vs transformers' generate, 2 steps each,
#              predicted vs measured peak; "skipped" with the reason when vllm is not installed on the
#              machine (its wheel is too large to carry): run it with --only vllm
#
# After every section the report is rewritten, so a call cut short still returns what was done:
# $OUT/gpu_check.md (OUT defaults to ./gpu-check-out), with cuda_constants.json, oom_check.json and
# gpu_check_logs.tar.gz (every log) beside it. Processes a section leaves behind (the worker's
# training children run in their own sessions) are ended by their process id: each carries this
# section's marker in its environment (GPU_CHECK_SECTION), and only those are signalled.
set -uo pipefail

SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO" || exit 2
PY=${PYTHON:-python3}
OUT=${OUT:-$REPO/gpu-check-out}
WHEELS=${GPU_WHEELS:-.gpu-wheels}
WORK=${GPU_CHECK_WORK:-/tmp/tunedeck-gpu-check}
SITE=$WORK/site
LOGS=$WORK/logs
BUDGET=${GPU_CHECK_BUDGET_S:-470}
SECTIONS=(install facts constants oom pytest memtruth memruns tricks newtricks vllm)
# name: own timeout (s), least time worth starting it with (s), title
declare -A OWN=([install]=90 [facts]=45 [constants]=110 [oom]=130 [pytest]=150 [memtruth]=100 [memruns]=80 [tricks]=120 [newtricks]=300 [vllm]=300)
for pair in ${GPU_CHECK_TIMEOUTS:+${GPU_CHECK_TIMEOUTS//,/ }}; do OWN[${pair%%=*}]=${pair#*=}; done  # e.g. GPU_CHECK_TIMEOUTS=oom=200,tricks=60
declare -A LEAST=([install]=20 [facts]=10 [constants]=40 [oom]=60 [pytest]=60 [memtruth]=40 [memruns]=30 [tricks]=45 [newtricks]=60 [vllm]=30)
declare -A TITLE=(
  [install]="Install the carried wheels"
  [facts]="Machine facts"
  [constants]="CUDA constants (bench/cuda_constants.py)"
  [oom]="A real CUDA OOM, recovered by the worker (bench/oom_gpu.py)"
  [pytest]="CUDA tests (pytest -m gpu)"
  [memtruth]="Memory predictor vs CUDA (bench/memory_truth.py --device cuda)"
  [memruns]="Memory of real runs (bench/memory_runs.py --device cuda)"
  [tricks]="Memory tricks (bench/tricks_gpu.py, short)"
  [newtricks]="Newer memory tricks and presets, predicted vs measured (bench/tricks_gpu.py)"
  [vllm]="GRPO with vLLM (colocate), predicted vs measured (bench/vllm_gpu.py)"
)
MEMTRUTH_ONLY="qwen2.5-0.5b lora sft b4,qwen2.5-0.5b full sft b2,qwen2.5-0.5b qlora sft b4,qwen2.5-0.5b lora dpo"
TRICKS_ONLY="baseline,checkpointing,fp16,lora,qlora,paged-adamw-8bit"
NEWTRICKS_ONLY="baseline,liger,offload,offload+ckpt,galore,galore-layerwise,galore-8bit,apollo,loraplus,neftune,compile,preset-low-memory,preset-fast"
MEMRUNS_ONLY="default,short-2048,truncated-256,qlora,full-tiny,ckpt-off-b8"
REQUIRED=(bench/gpu_env.py bench/cuda_constants.py bench/oom_gpu.py bench/memory_truth.py bench/tricks_gpu.py bench/vllm_gpu.py
  tests/conftest.py tests/training_helpers.py tests/chat_helpers.py)

DRY=0
ONLY=""
STEP=""
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) DRY=1 ;;
    --only) ONLY=$2; shift ;;
    --only=*) ONLY=${1#--only=} ;;
    --step) STEP=$2; shift ;;  # internal: run one section's commands (under the runner's timeout)
    -h | --help) sed -n '2,/^set -uo/p' "$SELF" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 TOKENIZERS_PARALLELISM=false MPLBACKEND=Agg
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export TRANSFORMERS_NO_ADVISORY_WARNINGS=1 GRADIO_ANALYTICS_ENABLED=False
export HF_HOME=$WORK/hf TUNEDECK_HOME=$WORK/home
unset TUNEDECK_DATABASE_URL

# x CMD...: run it, or print it (dry run), each word quoted only where the shell needs it
x() {
  if [ "$DRY" = 1 ]; then
    local word line="    \$"
    for word in "$@"; do
      if [[ $word =~ ^[A-Za-z0-9_./=:,+@%-]+$ ]]; then line+=" $word"; else line+=" '${word//\'/\'\\\'\'}'"; fi
    done
    echo "$line"
  else
    "$@"
  fi
}
say() { [ "$DRY" = 1 ] || echo "$@"; }  # report text a dry run leaves out

gpu_test_files() { grep -l "pytest.mark.gpu" tests/test_*.py 2>/dev/null; }

# ---------------------------------------------------------------------- the sections' commands
step_install() {
  local manifest=$WHEELS/manifest.tsv files=()
  if [ ! -f "$manifest" ]; then
    echo "no $manifest: run \`bash bench/gpu_wheels.sh\` before the call and carry [\"$WHEELS\"]" >&2
    return 3
  fi
  x rm -rf "$SITE"
  x mkdir -p "$SITE"
  if [ "$DRY" = 1 ]; then
    echo "    (which wheels this machine needs:) PYTHONPATH= $PY bench/gpu_env.py --select $manifest"
    echo "    \$ $PY -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --target $SITE WHEELS..."
    return 0
  fi
  mapfile -t files < <(PYTHONPATH="" "$PY" bench/gpu_env.py --select "$manifest" 2>"$WORK/select.txt")
  cat "$WORK/select.txt"
  [ ${#files[@]} -gt 0 ] || { echo "nothing selected from $manifest" >&2; return 3; }
  "$PY" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir \
    --target "$SITE" "${files[@]}" || return
  echo "installed: $(for f in "${files[@]}"; do basename "$f" | cut -d- -f1-2; done | paste -sd' ')" \
    "$(grep "keep the machine's" "$WORK/select.txt" | sed "s/ (within.*//; s/: keep the machine's / /" | paste -sd, | sed 's/^./; the machine'"'"'s own: &/')"
}

step_facts() {
  say '```'
  x nvidia-smi
  x nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,compute_cap --format=csv
  say '```'
  x "$PY" bench/gpu_env.py --facts --manifest "$WHEELS/manifest.tsv" --site "$SITE"
  say
  x "$PY" -c "import trl, datasets, sqlalchemy, bitsandbytes, peft, transformers; print('imports: trl, datasets, sqlalchemy, bitsandbytes, peft, transformers: ok')"
}

step_constants() {
  x "$PY" bench/cuda_constants.py --workdir "$WORK" --steps 4 --timeout 45 --json "$LOGS/cuda_constants.json"
}

step_oom() {
  local t=${GPU_CHECK_STEP_TIMEOUT:-${OWN[oom]}}
  x "$PY" bench/oom_gpu.py --workdir "$WORK" --timeout $((t > 100 ? t - 40 : 60)) --json "$LOGS/oom_check.json"
}

step_pytest() {
  local files=() args=(-m pytest -p no:cacheprovider -m gpu -rA -q --junitxml "$LOGS/pytest.xml")
  mapfile -t files < <(gpu_test_files)
  [ ${#files[@]} -gt 0 ] || { echo "no test file uses pytest.mark.gpu" >&2; return 3; }
  # The files in parallel (one pytest process each: module fixtures stay whole), when xdist is there.
  if [ "$DRY" = 1 ] || "$PY" -c "import xdist" 2>/dev/null; then args+=(-n "${#files[@]}" --dist loadfile); fi
  if [ "$DRY" = 1 ] || "$PY" -c "import pytest_timeout" 2>/dev/null; then args+=(--timeout 120); fi
  x "$PY" "${args[@]}" "${files[@]}"
}

step_memtruth() {
  x "$PY" bench/memory_truth.py --device cuda --workdir "$WORK/memtruth" --timeout 45 --only "$MEMTRUTH_ONLY"
}

step_memruns() {
  local t=${GPU_CHECK_STEP_TIMEOUT:-${OWN[memruns]}} only=() listed name
  # A subset that fits; the whole grid (cut by --timeout) when the script no longer has these names.
  if [ "$DRY" = 1 ]; then
    listed=$(tr , '\n' <<<"$MEMRUNS_ONLY")
  else
    listed=$("$PY" bench/memory_runs.py --device cuda --list 2>/dev/null | awk '{print $1}')
  fi
  only=(--only "$MEMRUNS_ONLY")
  for name in ${MEMRUNS_ONLY//,/ }; do grep -qxF "$name" <<<"$listed" || only=(); done
  x "$PY" bench/memory_runs.py --device cuda --steps 2 --timeout $((t > 45 ? t - 25 : 20)) "${only[@]}" \
    --json "$LOGS/memory_runs.json"
}

step_tricks() {
  x "$PY" bench/tricks_gpu.py --workdir "$WORK" --steps 8 --warmup 3 --timeout 50 --only "$TRICKS_ONLY"
}

step_newtricks() {
  x "$PY" bench/tricks_gpu.py --workdir "$WORK" --steps 6 --warmup 2 --timeout 40 --only "$NEWTRICKS_ONLY"
}

step_vllm() {
  local t=${GPU_CHECK_STEP_TIMEOUT:-${OWN[vllm]}}
  x "$PY" bench/vllm_gpu.py --steps 2 --timeout $((t > 60 ? t - 30 : 30)) --workdir "$WORK/vllm"
}

if [ -n "$STEP" ]; then
  "step_$STEP"
  exit
fi

# ---------------------------------------------------------------------- dry run
if [ "$DRY" = 1 ]; then
  missing=0
  echo "gpu_check dry run in $REPO (nothing is installed or started)"
  echo "OUT=$OUT WORK=$WORK budget ${BUDGET} s, PYTHON=$PY"
  echo
  echo "files:"
  for f in "${REQUIRED[@]}"; do
    if [ -f "$f" ]; then echo "  ok       $f"; else echo "  MISSING  $f"; missing=1; fi
  done
  mapfile -t tests < <(gpu_test_files)
  if [ ${#tests[@]} -gt 0 ]; then echo "  ok       ${#tests[@]} test files with pytest.mark.gpu: ${tests[*]}"; else echo "  MISSING  tests marked gpu"; missing=1; fi
  if [ -f bench/memory_runs.py ]; then echo "  ok       bench/memory_runs.py"; else echo "  absent   bench/memory_runs.py (optional: the report will say \"not present\")"; fi
  manifest=$WHEELS/manifest.tsv
  if [ -f "$manifest" ]; then
    echo "  ok       $manifest:"
    wheels_b=0
    while IFS=$'\t' read -r file name version when; do
      if [ -f "$WHEELS/$file" ]; then
        size=$(stat -c %s "$WHEELS/$file")
        wheels_b=$((wheels_b + size))
        awk -v s="$size" -v n="$name" -v v="$version" -v w="$when" 'BEGIN { printf "             %7.2f MiB  %s %s (%s)\n", s / 1048576, n, v, w }'
      else
        echo "  MISSING  $WHEELS/$file"; missing=1
      fi
    done <"$manifest"
    tree_b=$(git ls-files -z -co --exclude-standard 2>/dev/null | xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
    awk -v w="$wheels_b" -v t="$tree_b" 'BEGIN { printf "  sizes    wheels %.1f MiB + working tree %.1f MiB = %.1f MiB (a call sends at most 64 MiB)\n", w / 1048576, t / 1048576, (w + t) / 1048576 }'
    [ $((wheels_b + tree_b)) -le $((64 * 1048576)) ] || { echo "  TOO LARGE for one call"; missing=1; }
    if "$PY" -c "import packaging" 2>/dev/null; then
      echo "  selection on THIS machine (the GPU machine decides for itself):"
      PYTHONPATH="" "$PY" bench/gpu_env.py --select "$manifest" 2>&1 >/dev/null | sed 's/^/             /'
    fi
  else
    echo "  MISSING  $manifest (run: bash bench/gpu_wheels.sh)"; missing=1
  fi
  for tool in timeout nvidia-smi "$PY"; do
    if command -v "$tool" >/dev/null; then echo "  ok       $tool"; else echo "  absent   $tool (needed on the GPU machine)"; fi
  done
  echo
  total=0
  for s in "${SECTIONS[@]}"; do
    if [ -n "$ONLY" ] && [ "$s" != install ] && [ "$s" != facts ] && [[ ",$ONLY," != *",$s,"* ]]; then continue; fi
    total=$((total + OWN[$s]))
    echo "[$s] ${TITLE[$s]}: timeout ${OWN[$s]} s (started only with >= ${LEAST[$s]} s of the budget left)"
    if [ "$s" = memruns ] && [ ! -f bench/memory_runs.py ]; then echo "    (not present: skipped)"; continue; fi
    "step_$s"
  done
  echo
  echo "the sections' own timeouts add up to ${total} s; the budget of ${BUDGET} s stops the last ones first"
  echo "report: $OUT/gpu_check.md (+ cuda_constants.json, oom_check.json, memory_runs.json, gpu_check_logs.tar.gz)"
  exit $missing
fi

# ---------------------------------------------------------------------- the run
START=$(date +%s)
DEADLINE=$((START + BUDGET))
RUN_ID="$$-$START"
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo "unknown (no .git in this copy)")
mkdir -p "$OUT" "$LOGS" "$WORK/home"
rm -f "$LOGS"/* "$OUT/gpu_check.md"
: >"$LOGS/summary.md"
DONE=0

esc() { sed 's/|/\\|/g' | tr '\n' ' ' | sed 's/ *$//'; }

key_figures() {  # one line for the summary table
  local name=$1 out=$LOGS/$1.out
  case $name in
    install) grep '^installed:' "$out" | tail -1 ;;
    facts) grep -E '^- (torch|device 0|NVIDIA driver)' "$out" | sed 's/^- //' | paste -sd';' ;;
    constants) grep '^suggested:' "$out" | sed 's/^suggested: //; s/  #.*//' | paste -sd';' ;;
    oom) grep '^result:' "$out" | tail -1 | sed 's/^result: //' ;;
    pytest) grep -E '(passed|failed|error|skipped).* in [0-9.]+s' "$out" | tail -1 | tr -d '=' | sed 's/^ *//' ;;
    memtruth) grep 'configs within' "$out" | tail -1 ;;
    memruns) grep -E 'within [0-9]+%' "$out" | tail -2 | paste -sd';' ;;
    vllm) grep -E '^(skipped:|grpo-)' "$out" | sed 's/  */ /g' | paste -sd';' ;;
    tricks)
      rows=$(grep -c '^| [a-z0-9]' "$out" 2>/dev/null); failed=$(grep -c '^| .*FAILED' "$out" 2>/dev/null)
      [ "${rows:-0}" -gt 0 ] && echo "$((rows - 1)) configurations, ${failed:-0} failed" ;;
  esac
}

render() {  # a section's output: Markdown tables as they are, everything else in a fenced block
  local file=$1 limit=${2:-150}
  [ -s "$file" ] || return 0
  tail -n "$limit" "$file" | awk '
    /^\|/ { if (fenced) { print "```"; fenced = 0 }; print; next }
    { if (!fenced) { print "```"; fenced = 1 }; print }
    END { if (fenced) print "```" }'
}

write_report() {
  local now=$(($(date +%s) - START)) state
  state=$([ "$DONE" = 1 ] && echo "finished" || echo "PARTIAL (still running, or cut short)")
  {
    echo "# tunedeck GPU check"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC') · commit $COMMIT · host $(hostname) · ${now} s of the ${BUDGET} s budget · $state"
    echo
    echo "| section | status | time | key figures |"
    echo "|---|---|---|---|"
    cat "$LOGS/summary.md"
    for f in "$LOGS"/frag-*.md; do [ -f "$f" ] && { echo; cat "$f"; }; done
  } >"$OUT/gpu_check.md.tmp" && mv "$OUT/gpu_check.md.tmp" "$OUT/gpu_check.md"
}

end_leftovers() {  # NAME MARK: processes of this section that outlived it (own sessions), by pid
  local mark="GPU_CHECK_SECTION=$2" pids=() e pid
  for e in /proc/[0-9]*/environ; do
    pid=${e#/proc/}; pid=${pid%/environ}
    [ "$pid" = "$$" ] && continue
    { tr '\0' '\n' <"$e"; } 2>/dev/null | grep -qxF "$mark" && pids+=("$pid")
  done
  [ ${#pids[@]} -gt 0 ] || return 0
  echo "ending ${#pids[@]} process(es) left by $1: ${pids[*]}" | tee -a "$LOGS/$1.err" >&2
  kill -TERM "${pids[@]}" 2>/dev/null
  sleep 5
  kill -KILL "${pids[@]}" 2>/dev/null
  return 0
}

section() {
  local name=$1 n=$2 left t rc status start took figures frag
  frag=$LOGS/frag-$(printf '%02d' "$n")-$name.md
  left=$((DEADLINE - $(date +%s)))
  t=${OWN[$name]}
  [ "$t" -le $((left - 5)) ] || t=$((left - 5))
  if [ "$name" = memruns ] && [ ! -f bench/memory_runs.py ]; then
    echo "| $name | not present | - | bench/memory_runs.py is not in this tree |" >>"$LOGS/summary.md"
    printf '## %s. %s\n\nnot present: bench/memory_runs.py is not in this tree.\n' "$n" "${TITLE[$name]}" >"$frag"
    write_report
    return
  fi
  if [ $((left - 5)) -lt "${LEAST[$name]}" ]; then
    echo "| $name | skipped: out of time | - | ${left} s of the budget left, $((LEAST[$name] + 5)) s needed |" >>"$LOGS/summary.md"
    printf '## %s. %s\n\nskipped: %s s of the budget left (it needs at least %s s).\n' "$n" "${TITLE[$name]}" "$left" "$((LEAST[$name] + 5))" >"$frag"
    write_report
    return
  fi
  echo "[$name] ${TITLE[$name]} (timeout ${t} s)" >&2
  start=$(date +%s)
  GPU_CHECK_SECTION="$name-$RUN_ID" GPU_CHECK_STEP_TIMEOUT=$t \
    timeout -k 15 "$t" bash "$SELF" --step "$name" >"$LOGS/$name.out" 2>"$LOGS/$name.err"
  rc=$?
  took=$(($(date +%s) - start))
  end_leftovers "$name" "$name-$RUN_ID"
  case $rc in
    0) status="ok" ;;
    124 | 137) status="TIMED OUT after ${t} s" ;;
    *) status="FAILED (exit $rc)" ;;
  esac
  figures=$(key_figures "$name" | esc)
  echo "| $name | $status | ${took} s | ${figures:--} |" >>"$LOGS/summary.md"
  {
    # shellcheck disable=SC2016  # the backquotes are Markdown
    printf '## %s. %s\n\n%s · %s s · `%s`\n\n' "$n" "${TITLE[$name]}" "$status" "$took" \
      "$(DRY=1 "step_$name" 2>/dev/null | grep '^    \$' | tail -1 | sed 's/^    \$ //; s/`/'"'"'/g')"
    [ -n "$figures" ] && printf '%s\n\n' "$figures"
    if [ "$name" = facts ]; then cat "$LOGS/facts.out"; else render "$LOGS/$name.out" 150; fi
    if [ "$rc" != 0 ] || [ "$name" = pytest ]; then
      if [ -s "$LOGS/$name.err" ]; then echo; echo "stderr (last 40 lines):"; echo; render "$LOGS/$name.err" 40; fi
    fi
  } >"$frag"
  write_report
  echo "[$name] $status in ${took} s" >&2
}

finish() {
  DONE=1
  for f in cuda_constants.json oom_check.json memory_runs.json; do
    [ -f "$LOGS/$f" ] && cp "$LOGS/$f" "$OUT/$f"
  done
  write_report
  (cd "$WORK" && find . \( -path ./site -o -path ./hf -o -name 'model-*' -o -name 'qwen2.5-*' -o -name output \) -prune -o \
    -type f \( -name '*.log' -o -name '*.out' -o -name '*.err' -o -name '*.xml' -o -name '*.json' -o -name '*.md' \) \
    -size -8M -print0 | tar -czf "$OUT/gpu_check_logs.tar.gz" --null -T - 2>/dev/null)
  echo "report: $OUT/gpu_check.md" >&2
}
trap finish EXIT
trap 'exit 143' TERM INT

n=0
for s in "${SECTIONS[@]}"; do
  n=$((n + 1))
  if [ -n "$ONLY" ] && [ "$s" != install ] && [ "$s" != facts ] && [[ ",$ONLY," != *",$s,"* ]]; then continue; fi
  section "$s" "$n"
done
