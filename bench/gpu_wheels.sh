#!/usr/bin/env bash
# Download the wheels the GPU machine lacks, for bench/gpu_check.sh to install there (it has no network).
#
#     bash bench/gpu_wheels.sh            # into .gpu-wheels/ (ignored by git), then prints the sizes
#     bash bench/gpu_wheels.sh DIR        # somewhere else
#     PYTHON=.venv/bin/python bash bench/gpu_wheels.sh
#
# Run it HERE (where PyPI answers), in the root of the checkout that the device call sends, before
# the call; the call carries the folder: carry [".gpu-wheels"]. The GPU machine (docs: the device
# tool's README, "nvidia-h200") has Python 3.12 with torch 2.11 (CUDA 13), transformers, peft,
# accelerate, nvidia-ml-py, pytest, hypothesis, pandas, pyarrow, psutil, PyYAML; it lacks trl,
# datasets, bitsandbytes and SQLAlchemy (gradio is not needed by any GPU check: none imports it).
#
# Every wheel is fetched with --no-deps, so pip never brings a second torch; the dependencies the
# machine does not have are named here one by one (datasets needs dill and multiprocess). The
# versions are the ones the project's venv runs, inside pyproject.toml's ranges.
#
# manifest.tsv (written here, read by bench/gpu_env.py --select there) says when each wheel is
# installed: `always` (the machine lacks it), or a requirement such as `>=5.24,<6`: installed only
# when the machine's own copy is missing or outside it (transformers, peft, fsspec, regex,
# tokenizers, huggingface_hub: the machine has them, maybe at versions our pins or the carried
# packages' needs exclude). pyarrow (datasets needs >=24) is too large to carry (~40 MiB): its
# version there is reported by bench/gpu_env.py.
#
# bitsandbytes' wheel (41 MiB) holds a library per CUDA version; the machine's torch is built for
# CUDA 13, so the copy kept here holds only the CPU and CUDA 13.x libraries (~4 MiB), which keeps
# everything inside one call's 64 MiB (working tree + carried paths).
set -euo pipefail

cd "$(dirname "$0")/.."
DEST=${1:-.gpu-wheels}
PY=${PYTHON:-python3}
LIMIT_MIB=64

# name==version  when-to-install
WHEELS=(
  "trl==1.16.0 always"
  "datasets==5.2.0 always"
  "dill==0.4.1 always"             # datasets: dill>=0.3.0,<0.4.2
  "multiprocess==0.70.19 always"   # datasets: multiprocess<0.70.20
  "bitsandbytes==0.50.2 always"
  "SQLAlchemy==2.1.9 always"       # its only need, typing-extensions, is there; greenlet is optional
  "transformers==5.24.0 >=5.24,<6"              # pyproject.toml
  "peft==0.21.2 >=0.21.2,<0.22"                 # pyproject.toml
  "fsspec==2026.9.0 >=2023.1.0,<=2026.9.0"      # datasets 5.2.0
  "regex==2026.11.19 >=2025.10.22"              # transformers 5.24.0
  "tokenizers==0.23.3 >=0.23.1,<0.24"           # transformers 5.24.0
  "huggingface_hub==2.4.0 >=1.31.0,<3.0"        # transformers 5.24.0, datasets 5.2.0
  "liger-kernel==0.8.5 always"     # use_liger_kernel (needs triton: the GPU machine's torch brings it)
  "galore-torch==1.0 always"       # optim galore_adamw* (needs torch, transformers, bitsandbytes)
  "apollo-torch==1.0.3 always"     # optim apollo_adamw*
)

mkdir -p "$DEST"
rm -f "$DEST"/*.whl "$DEST"/manifest.tsv
specs=()
for entry in "${WHEELS[@]}"; do specs+=("${entry%% *}"); done
"$PY" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  --platform any -d "$DEST" "${specs[@]}"

# bitsandbytes: keep the CPU and CUDA 13.x libraries only (RECORD rewritten to match).
"$PY" - "$DEST" <<'EOF'
import re, sys, zipfile
from pathlib import Path

dest = Path(sys.argv[1])
(wheel,) = dest.glob("bitsandbytes-*.whl")
keep = re.compile(r"libbitsandbytes_(cpu|cuda13\d)\.so$")
dropped = 0
slim = wheel.with_suffix(".slim")
with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as out:
    names = [n for n in src.namelist() if not (n.endswith(".so") and not keep.search(n))]
    dropped = len(src.namelist()) - len(names)
    for name in names:
        data = src.read(name)
        if name.endswith(".dist-info/RECORD"):
            lines = data.decode().splitlines()
            data = ("\n".join(l for l in lines if l.split(",")[0] in names) + "\n").encode()
        out.writestr(src.getinfo(name), data)
before = wheel.stat().st_size
slim.replace(wheel)
print(f"bitsandbytes: kept {', '.join(sorted(n.rsplit('/', 1)[-1] for n in names if n.endswith('.so')))}; "
      f"dropped {dropped} other libraries ({before / 2**20:.1f} -> {wheel.stat().st_size / 2**20:.1f} MiB)")
EOF

# manifest.tsv: wheel file, distribution, version, when to install
for entry in "${WHEELS[@]}"; do
  spec=${entry%% *} when=${entry#* }
  name=${spec%%==*} version=${spec#*==}
  norm=$(echo "$name" | tr 'A-Z-' 'a-z_')
  file=$(find "$DEST" -maxdepth 1 -iname "${norm}-${version}-*.whl" -printf '%f\n' | head -1)
  [ -n "$file" ] || { echo "no wheel for $spec in $DEST" >&2; exit 1; }
  printf '%s\t%s\t%s\t%s\n' "$file" "$name" "$version" "$when" >>"$DEST/manifest.tsv"
done

echo
echo "wheels in $DEST:"
find "$DEST" -maxdepth 1 -name '*.whl' -printf '%s %f\n' | sort -k2 | awk '{printf "  %8.2f MiB  %s\n", $1 / 1048576, $2}'
wheels_b=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
tree_b=0
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  # what the device call sends besides the carried folder: tracked and untracked-not-ignored files
  tree_b=$(git ls-files -z -co --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
fi
total_b=$((wheels_b + tree_b))
awk -v w="$wheels_b" -v t="$tree_b" -v s="$total_b" -v l="$LIMIT_MIB" 'BEGIN {
  printf "wheels %.1f MiB + working tree %.1f MiB = %.1f MiB of the %d MiB a device call may send\n",
    w / 1048576, t / 1048576, s / 1048576, l }'
if [ "$total_b" -gt $((LIMIT_MIB * 1048576)) ]; then
  echo "too large for one device call: see bench/README.md (GPU check) for the split" >&2
  exit 1
fi
