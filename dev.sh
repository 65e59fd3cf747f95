#!/usr/bin/env bash
# tunedeck's two set-up-everything commands.
#
#   ./dev.sh serve [args]   venv + install + default model, then `tunedeck serve [args]`
#                           (http://127.0.0.1:7860, with its worker)
#   ./dev.sh test [args]    venv + install (+ Chromium / docker-compose / PostgreSQL when root), then
#                           the checks below and every test tier: pytest -m "" [args]
#                           (two xdist workers, whole test files each, one thread a process;
#                           TUNEDECK_TEST_WORKERS=0: serial)
#   ./dev.sh test --loaded  the same set-up, then the integration and browser tiers (not the SmolLM2 one)
#                           with a CPU hog on one core, in a random order (seed printed;
#                           TUNEDECK_TEST_SEED=N replays it)
#   ./dev.sh check          ruff (lint and format) and mypy only
#   ./dev.sh venv           only create/update the virtual environment
#   ./dev.sh gguf           also build llama.cpp's Python binding (llama-cpp-python, from source: minutes)
#                           for the K-quant GGUF exports and llama.cpp's read-back check, keep llama.cpp's
#                           converter from the same source in the venv (share/tunedeck/llama.cpp) and build its
#                           llama-imatrix, llama-quantize and llama-mtmd-cli there (bin/: importance-matrix quants,
#                           the vision GGUF pair's read-back; `test` does it too)
#
# Plain `.venv/bin/python -m pytest` runs the fast tier only (see pyproject.toml).
#
# Environment:
#   TUNEDECK_VENV         venv folder (default ./.venv)
#   TUNEDECK_PYTHON       interpreter that creates it (default python3.11)
#   TUNEDECK_TORCH        torch requirement installed first (default torch==2.13.0, the CPU build
#                         this dev machine has on disk). GPU hosts: e.g. TUNEDECK_TORCH="torch==2.14.1"
#                         (PyPI's Linux x86_64 wheel is a CUDA build).
#   TUNEDECK_TORCH_INDEX  a wheel index for torch only, e.g. https://download.pytorch.org/whl/cu128
#   TUNEDECK_HOME         the data folder of `serve` (default ./data); the tests use a throw-away one
#   TUNEDECK_BUILD_CACHE  where llama.cpp's builds (and mypy's cache) are kept between checkouts
#                         (default ~/.cache/tunedeck/build)
#
# The venv is re-installed only when pyproject.toml, this file or the torch settings change
# (a stamp file in the venv holds their hash), so a second call takes about a second.
set -euo pipefail

cd "$(dirname "$0")"
ROOT="$(pwd)"
VENV="${TUNEDECK_VENV:-$ROOT/.venv}"
PYTHON="${TUNEDECK_PYTHON:-python3.11}"
TORCH_REQ="${TUNEDECK_TORCH:-torch==2.13.0}"
TORCH_INDEX="${TUNEDECK_TORCH_INDEX:-}"
STAMP="$VENV/.tunedeck-stamp"

log() { printf 'dev.sh [%ss]: %s\n' "$SECONDS" "$*" >&2; }

usage() {
    sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

stamp_hash() {
    { cat pyproject.toml dev.sh; printf '%s\n%s\n%s\n' "$TORCH_REQ" "$TORCH_INDEX" "$PYTHON"; } \
        | sha256sum | cut -d' ' -f1
}

ensure_venv() {
    local want
    want="$(stamp_hash)"
    if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" && -x "$VENV/bin/tunedeck" ]]; then
        return 0
    fi
    # Two dev.sh calls at once (serve in one terminal, test in another) must not both pip.
    mkdir -p "$VENV"
    exec 9>"$VENV/.tunedeck-lock"
    if command -v flock >/dev/null 2>&1; then flock 9; fi
    if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" && -x "$VENV/bin/tunedeck" ]]; then
        return 0
    fi
    if ! command -v "$PYTHON" >/dev/null 2>&1; then
        log "$PYTHON not found; install Python 3.11+ or set TUNEDECK_PYTHON"
        exit 1
    fi
    if [[ ! -x "$VENV/bin/python" ]]; then
        log "creating $VENV with $PYTHON"
        "$PYTHON" -m venv "$VENV"
    fi
    rm -f "$STAMP"
    # --no-compile, then compileall on every core below: pip byte-compiles each file on one core (about 60 of the
    # 120 s a fresh install took here).
    local pip=("$VENV/bin/python" -m pip install --disable-pip-version-check -q --no-compile)
    # torch first, pinned: left to pip, `torch>=2.6` would pull a multi-GB CUDA build.
    log "installing $TORCH_REQ${TORCH_INDEX:+ from $TORCH_INDEX}"
    if [[ -n "$TORCH_INDEX" ]]; then
        "${pip[@]}" --index-url "$TORCH_INDEX" "$TORCH_REQ"
    else
        "${pip[@]}" "$TORCH_REQ"
    fi
    log "installing tunedeck (editable, with test extras)"
    "${pip[@]}" -e '.[test]'
    log "byte-compiling the venv's packages (on $(nproc) cores)"
    # What pip would have written, on every core; a file that does not compile is skipped, as pip skips it.
    local packages
    packages="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    "$VENV/bin/python" -m compileall -q -j 0 "$packages" >/dev/null 2>&1 || true
    echo "$want" > "$STAMP"
}

ensure_system_packages() {
    # Browser tests drive Debian's Chromium; the compose test needs docker-compose; the store,
    # worker and fault tests start a throw-away PostgreSQL server; the Slurm tests a throw-away
    # Slurm. Never `playwright install`: it downloads a browser build of its own.
    local missing=()
    [[ -x /usr/bin/chromium ]] || missing+=(chromium)
    command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
    compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || command -v initdb >/dev/null 2>&1 \
        || missing+=(postgresql)
    # The Slurm executor's tests start a single-node Slurm (tests/slurm_helpers.py): its daemons and munge.
    command -v sbatch >/dev/null 2>&1 || missing+=(slurm-wlm munge)
    ((${#missing[@]})) || return 0
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        log "apt-get install ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
        log "missing ${missing[*]} (not root or no apt-get): the tests that need them will skip"
    fi
}

# llama.cpp's Python binding for the K-quant GGUF exports and llama.cpp's read-back check (jobs.export.llamacpp).
# PyPI has only its source, and its default build (llama.cpp, its `common` library and the multimodal one, at -O3
# on one core) took 78 minutes here. The binding loads libllama alone, so: no multimodal library, no tools or
# tests, -O1, every core (the quantizer and the read-back of a small model take seconds either way).
LLAMA_CPP_REQ="llama-cpp-python==0.3.36"
LLAMA_CPP_CMAKE_ARGS="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF \
-DLLAMA_BUILD_SERVER=OFF -DGGML_OPENMP=OFF -DCMAKE_BUILD_TYPE=Release \
-DCMAKE_C_FLAGS_RELEASE='-O1 -DNDEBUG' -DCMAKE_CXX_FLAGS_RELEASE='-O1 -DNDEBUG'"

# llama.cpp's own converter (convert_hf_to_gguf.py, its `conversion` package and gguf-py), the one every GGUF export of
# a family tunedeck's writer does not describe runs (jobs.export.converter): taken from the same sdist pip builds the
# binding from, so one llama.cpp version serves both, kept in the venv, and nothing is fetched when an export runs.
LLAMA_CPP_CONVERTER="share/tunedeck/llama.cpp"
# Its Python dependencies beyond tunedeck's own (torch, numpy, transformers, gguf): the `gguf` extra lists them too.
LLAMA_CPP_CONVERTER_REQS=("sentencepiece>=0.1.98,<0.3.0")

# llama.cpp's llama-imatrix and llama-quantize (jobs.export.imatrix: importance-matrix quants) and llama-mtmd-cli
# (jobs.export.mtmd: the read-back of a vision run's language-model + projector GGUF pair), built from the same sdist's
# llama.cpp: CPU only, those targets and what they link (statically: libllama, ggml, libmtmd), no
# curl/openssl/server/tests/examples, -O1 like the binding, on every core; kept in the converter's bin/ and rebuilt
# only when the pinned version changes or a tool is missing.
LLAMA_CPP_TOOLS=(llama-imatrix llama-quantize llama-mtmd-cli)
LLAMA_CPP_TOOLS_CMAKE_ARGS=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_OPENMP=OFF -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_COMMON=ON
    "-DCMAKE_C_FLAGS_RELEASE=-O1 -DNDEBUG" "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG")

llama_tools_ready() {
    local bin="$1" want="$2" tool
    [[ -f "$bin/.version" && "$(cat "$bin/.version")" == "$want" ]] || return 1
    for tool in "${LLAMA_CPP_TOOLS[@]}"; do [[ -x "$bin/$tool" ]] || return 1; done
}

build_llama_tools() {
    local sdist="$1" want="$2" bin="$3" work start
    if ! command -v cmake >/dev/null 2>&1; then
        log "cmake not found: ${LLAMA_CPP_TOOLS[*]} not built (importance-matrix GGUF quants are refused;"
        log "a vision GGUF pair is checked by gguf-py alone)"
        return 0
    fi
    work="$(mktemp -d)"
    start=$SECONDS
    log "building llama.cpp's ${LLAMA_CPP_TOOLS[*]} (CPU, on $(nproc) cores: minutes)"
    tar -xzf "$sdist" -C "$work" --strip-components=2 "llama_cpp_python-$want/vendor/llama.cpp"
    cmake -S "$work/llama.cpp" -B "$work/build" "${LLAMA_CPP_TOOLS_CMAKE_ARGS[@]}" >"$work/cmake.log" 2>&1 \
        || { tail -20 "$work/cmake.log" >&2; rm -rf "$work"; return 1; }
    cmake --build "$work/build" --target "${LLAMA_CPP_TOOLS[@]}" -j"$(nproc)" >"$work/build.log" 2>&1 \
        || { tail -20 "$work/build.log" >&2; rm -rf "$work"; return 1; }
    rm -rf "$bin" && mkdir -p "$bin"
    local tool
    for tool in "${LLAMA_CPP_TOOLS[@]}"; do cp "$work/build/bin/$tool" "$bin/"; done
    echo "$want" > "$bin/.version"
    rm -rf "$work"
    log "llama.cpp's ${LLAMA_CPP_TOOLS[*]} in $bin ($((SECONDS - start)) s)"
}

# What the llama.cpp builds above produce (the binding's wheel, the tools' bin/) is kept per version and build flags
# in the user's cache, as pip keeps the wheels it builds, so a new checkout or venv on the same machine installs
# them in seconds; TUNEDECK_BUILD_CACHE moves it, and an empty folder builds again.
llama_build_cache() {
    local flags
    flags="$(printf '%s\n' "$LLAMA_CPP_CMAKE_ARGS" "${LLAMA_CPP_TOOLS_CMAKE_ARGS[*]}" "${LLAMA_CPP_TOOLS[*]}" \
        "$("$VENV/bin/python" -c 'import sys; print(sys.version_info[:2])')" | sha256sum | cut -c1-12)"
    printf '%s/llama.cpp-%s-%s' "${TUNEDECK_BUILD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tunedeck/build}" "$1" "$flags"
}

ensure_llama_cpp() {
    local want="${LLAMA_CPP_REQ#*==}" dest="$VENV/$LLAMA_CPP_CONVERTER" have_binding=0 have_converter=0
    if "$VENV/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("llama-cpp-python") != sys.argv[1])' \
        "$want" 2>/dev/null; then
        have_binding=1
    fi
    if [[ -f "$dest/.version" && "$(cat "$dest/.version")" == "$want" ]] \
        && "$VENV/bin/python" -c 'import sentencepiece' 2>/dev/null; then
        have_converter=1
    fi
    if ((have_binding && have_converter)) && llama_tools_ready "$dest/bin" "$want"; then
        return 0
    fi
    local sdist_dir
    sdist_dir="$(mktemp -d)"
    # One download: the sdist the binding is built from is also where the converter comes from.
    log "fetching the $LLAMA_CPP_REQ source distribution"
    "$VENV/bin/python" -m pip download --disable-pip-version-check -q --no-cache-dir --no-deps \
        --no-binary llama-cpp-python -d "$sdist_dir" "$LLAMA_CPP_REQ"
    local sdist
    sdist="$(ls "$sdist_dir"/llama_cpp_python-"$want".tar.gz)"
    local cache
    cache="$(llama_build_cache "$want")"
    if ! ((have_binding)); then
        if ! compgen -G "$cache/llama_cpp_python-$want-*.whl" >/dev/null; then
            log "building $LLAMA_CPP_REQ from source (llama.cpp's library only, on $(nproc) cores: minutes)"
            mkdir -p "$cache"
            CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" CMAKE_ARGS="$LLAMA_CPP_CMAKE_ARGS" \
                "$VENV/bin/python" -m pip wheel --disable-pip-version-check -q --no-cache-dir --no-deps \
                -w "$cache" "$sdist"
        fi
        "$VENV/bin/python" -m pip install --disable-pip-version-check -q "$cache"/llama_cpp_python-"$want"-*.whl
    fi
    if ! llama_tools_ready "$dest/bin" "$want"; then
        if llama_tools_ready "$cache/bin" "$want"; then
            mkdir -p "$dest" && rm -rf "$dest/bin" && cp -a "$cache/bin" "$dest/bin"
        else
            build_llama_tools "$sdist" "$want" "$dest/bin"
            if llama_tools_ready "$dest/bin" "$want"; then rm -rf "$cache/bin" && cp -a "$dest/bin" "$cache/bin"; fi
        fi
    fi
    if ((have_converter)); then
        rm -rf "$sdist_dir"
        return 0
    fi
    local top="llama_cpp_python-$want/vendor/llama.cpp"
    mkdir -p "$dest" && find "$dest" -mindepth 1 -maxdepth 1 ! -name bin -exec rm -rf {} +
    tar -xzf "$sdist" -C "$dest" --strip-components=3 "$top/convert_hf_to_gguf.py" "$top/conversion" "$top/gguf-py" \
        "$top/LICENSE" "$top/requirements/requirements-convert_hf_to_gguf.txt" \
        "$top/requirements/requirements-convert_legacy_llama.txt"
    echo "$want" > "$dest/.version"
    rm -rf "$sdist_dir"
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q "${LLAMA_CPP_CONVERTER_REQS[@]}"
    "$VENV/bin/python" -c 'import llama_cpp; print("dev.sh: llama.cpp", llama_cpp.__version__, "ready")' >&2
    "$VENV/bin/python" "$dest/convert_hf_to_gguf.py" --print-supported-models 2>&1 | grep -c '^  - ' \
        | xargs -I{} printf 'dev.sh: llama.cpp converter in %s (%s architectures)\n' "$dest" {} >&2
}

run_checks() {
    # Lint, format and types first: they take seconds and fail before a long test run starts.
    log "ruff check, ruff format --check, mypy"
    "$VENV/bin/ruff" check .
    "$VENV/bin/ruff" format --check .
    # mypy's cache beside llama.cpp's builds: a fresh checkout re-checks only what changed (it compares each file).
    MYPY_CACHE_DIR="${MYPY_CACHE_DIR:-${TUNEDECK_BUILD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tunedeck/build}/mypy}" \
        "$VENV/bin/mypy"
}

run_loaded() {
    # CI's machine is loaded; a quiet one hides races (a page that reaches "succeeded" before the test
    # looks, a heartbeat that goes stale before the clean-up runs). So: the integration and browser
    # tiers with one core kept busy by a hog, in a random order (modules shuffled, and the tests in each)
    # that a printed seed replays: TUNEDECK_TEST_SEED=N ./dev.sh test --loaded. Extra args go to pytest
    # (a later -m replaces the tiers). Fix what fails by waiting for states, never by longer sleeps.
    # The SmolLM2 tier is left out: under the hog its one real model trains at ~48 s a step (~6 quiet), an
    # hour before the first of its tests; the full `./dev.sh test` (CI) runs it.
    local seed="${TUNEDECK_TEST_SEED:-$RANDOM$RANDOM}" hog rc=0
    local pin=()
    command -v taskset >/dev/null 2>&1 && pin=(taskset -c 0)
    "${pin[@]}" "$VENV/bin/python" -c 'while True: pass' &
    hog=$!
    trap 'kill '"$hog"' 2>/dev/null || true' EXIT  # also on Ctrl-C
    log "loaded run: a CPU hog (pid $hog) on core 0; random order, seed $seed (replay: TUNEDECK_TEST_SEED=$seed)"
    "$VENV/bin/python" -m pytest -m "(integration or browser) and not smollm2" -p random_order --random-order-bucket=module \
        --random-order-seed="$seed" --durations=25 "$@" || rc=$?
    kill "$hog" 2>/dev/null || true
    wait "$hog" 2>/dev/null || true
    log "loaded run: exit $rc, seed $seed"
    return "$rc"
}

cmd="${1:-}"
[[ $# -gt 0 ]] && shift
case "$cmd" in
    serve)
        ensure_venv
        # The checkout's own data folder (the installed command's default is the user data folder).
        export TUNEDECK_HOME="${TUNEDECK_HOME:-$ROOT/data}"
        export GRADIO_ANALYTICS_ENABLED="${GRADIO_ANALYTICS_ENABLED:-False}"
        export HF_HUB_DISABLE_TELEMETRY="${HF_HUB_DISABLE_TELEMETRY:-1}"
        "$VENV/bin/tunedeck" setup
        exec "$VENV/bin/tunedeck" serve "$@"
        ;;
    test)
        # apt-get (Chromium, PostgreSQL, docker-compose) and pip both wait on downloads: side by side.
        ensure_system_packages &
        apt_pid=$!
        ensure_venv
        # The K-quant tests need llama.cpp's binding: built while the checks run.
        ensure_llama_cpp &
        llama_pid=$!
        run_checks
        wait "$apt_pid" || { log "installing the system packages failed (see above)"; exit 1; }
        wait "$llama_pid" || { log "building llama-cpp-python failed (see above)"; exit 1; }
        export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 GRADIO_ANALYTICS_ENABLED=False
        # Two xdist workers by default (TUNEDECK_TEST_WORKERS=0: serial), handed whole test files, costliest
        # first (`--dist loadfile` with tests/scheduling.py's scheduler), the files reading the session's trained
        # runs as one unit: a module fixture, and the SmolLM2 run, is built once. Every torch and llama.cpp process
        # of the run gets one thread: two workers whose training children each spun two threads oversubscribed the
        # 2 cores (a full run with default threads took 2,560 s against ~1,900 s serial; with one thread, 1,614 s
        # against 2,203 s serial on 2026-12-05).
        workers="${TUNEDECK_TEST_WORKERS:-2}"
        xdist=()
        if [[ "$workers" != "0" ]]; then
            xdist=(-n "$workers" --dist loadfile)
            export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}"
        fi
        if [[ "${1:-}" == "--loaded" ]]; then
            shift
            run_loaded "${xdist[@]}" "$@"
            exit $?
        fi
        exec "$VENV/bin/python" -m pytest -m "" "${xdist[@]}" --durations=25 "$@"
        ;;
    check)
        ensure_venv
        run_checks
        ;;
    venv)
        ensure_venv
        log "ready: $VENV"
        ;;
    gguf)
        ensure_venv
        ensure_llama_cpp
        ;;
    *)
        usage
        ;;
esac
