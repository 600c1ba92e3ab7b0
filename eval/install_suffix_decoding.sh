#!/usr/bin/env bash
# Install SuffixDecoding (Snowflake's arctic-inference, the implementation behind
# vLLM's speculative_config={"method": "suffix"}) into an existing virtualenv, as a
# comparison peer for ngramspec.
#
#   usage: eval/install_suffix_decoding.sh [VENV]      (default: .venv-vllm)
#   env:   ARCTIC_INFERENCE_VERSION  sdist version to fetch (default 0.1.1, the
#                                    version vLLM's error message asks for; its
#                                    suffix_decoding sources equal 0.3.0's)
#          FORCE=1                   rebuild/reinstall even if the import works
#          JOBS                      build parallelism (default 2)
#
# What it does (nothing from arctic-inference is vendored into this repo):
#   1. fetches the arctic-inference sdist from PyPI into a temp dir;
#   2. builds ONLY csrc/suffix_decoding (nanobind module `_C`) with CMake, Release,
#      using nanobind==2.9.2 installed into the temp build dir (not the venv);
#   3. copies only `arctic_inference/__init__.py` and `arctic_inference/suffix_decoding/`
#      (+ the built _C*.so) into the venv's site-packages, with a minimal
#      dist-info that has NO entry_points.txt. So the CUDA ops are never built and
#      the `vllm.general_plugins` entry point (which patches vLLM) is never
#      registered. `pip uninstall arctic-inference` removes it cleanly.
set -euo pipefail

VENV="${1:-.venv-vllm}"
VERSION="${ARCTIC_INFERENCE_VERSION:-0.1.1}"
NANOBIND_VERSION="2.9.2"
JOBS="${JOBS:-2}"
PY="$VENV/bin/python"

log() { printf '[install_suffix_decoding] %s\n' "$*"; }
die() { printf '[install_suffix_decoding] ERROR: %s\n' "$*" >&2; exit 1; }

[[ -x "$PY" ]] || die "no python at $PY (create the venv first)"
command -v cmake >/dev/null || die "cmake not found"
command -v c++ >/dev/null || command -v g++ >/dev/null || die "no C++ compiler found"

IMPORT_CHECK='from arctic_inference.suffix_decoding import SuffixDecodingCache'
if [[ "${FORCE:-0}" != 1 ]] && "$PY" -c "$IMPORT_CHECK" 2>/dev/null; then
    log "arctic_inference.suffix_decoding already importable in $VENV; nothing to do (FORCE=1 to reinstall)"
    exit 0
fi

SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
PKG_DIR="$SITE/arctic_inference"
DIST_INFO="$SITE/arctic_inference-$VERSION.dist-info"
MARKER="ngramspec-install_suffix_decoding"

# Refuse to clobber a regular pip install of arctic-inference (which would also carry
# the vLLM plugin entry point); replace only what this script installed before.
for d in "$SITE"/arctic_inference-*.dist-info; do
    [[ -e "$d" ]] || continue
    if [[ "$(cat "$d/INSTALLER" 2>/dev/null)" != "$MARKER" ]]; then
        die "$d was installed by something else; run '$PY -m pip uninstall arctic-inference' first"
    fi
done
if [[ -e "$PKG_DIR" ]] && ! compgen -G "$SITE/arctic_inference-*.dist-info" >/dev/null; then
    die "$PKG_DIR exists but has no dist-info; remove it by hand first"
fi

START=$SECONDS
TMP="$(mktemp -d "${TMPDIR:-/tmp}/suffix_decoding.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

log "fetching arctic-inference==$VERSION sdist from PyPI"
# --no-build-isolation: pip only runs the sdist's metadata step with the venv's
# setuptools instead of installing its heavy build requirements (torch, cmake, ...).
"$PY" -m pip download --quiet --no-deps --no-binary :all: --no-build-isolation \
    "arctic-inference==$VERSION" -d "$TMP/dl" \
    || die "pip download of arctic-inference==$VERSION failed"
SDIST="$(ls "$TMP"/dl/arctic_inference-"$VERSION".tar.gz 2>/dev/null || ls "$TMP"/dl/arctic*inference-*.tar.gz)"
tar -xzf "$SDIST" -C "$TMP"
SRC="$(find "$TMP" -mindepth 1 -maxdepth 1 -type d -name 'arctic*inference-*' | head -1)"
[[ -f "$SRC/csrc/suffix_decoding/CMakeLists.txt" ]] || die "unexpected sdist layout (no csrc/suffix_decoding)"
[[ -f "$SRC/arctic_inference/suffix_decoding/cache.py" ]] || die "unexpected sdist layout (no suffix_decoding/cache.py)"

log "installing nanobind==$NANOBIND_VERSION into the build dir"
"$PY" -m pip install --quiet --no-deps --target "$TMP/nanobind" "nanobind==$NANOBIND_VERSION"
NB_CMAKE_DIR="$(PYTHONPATH="$TMP/nanobind" "$PY" -m nanobind --cmake_dir)"

log "building csrc/suffix_decoding (Release, -j$JOBS)"
# The upstream CMakeLists.txt asks `python -m nanobind --cmake_dir`; PYTHONPATH lets
# that find our build-dir nanobind. Only this one subproject is configured.
PYTHONPATH="$TMP/nanobind" cmake -S "$SRC/csrc/suffix_decoding" -B "$TMP/build" \
    -DCMAKE_BUILD_TYPE=Release \
    -DPython_EXECUTABLE="$("$PY" -c 'import sys; print(sys.executable)')" \
    -Dnanobind_DIR="$NB_CMAKE_DIR" \
    -DCMAKE_LIBRARY_OUTPUT_DIRECTORY="$TMP/out" \
    > "$TMP/cmake-configure.log" 2>&1 \
    || { cat "$TMP/cmake-configure.log" >&2; die "cmake configure failed"; }
cmake --build "$TMP/build" -j "$JOBS" > "$TMP/cmake-build.log" 2>&1 \
    || { cat "$TMP/cmake-build.log" >&2; die "cmake build failed"; }
SO="$(ls "$TMP"/out/_C*.so 2>/dev/null | head -1)"
[[ -n "$SO" ]] || die "build produced no _C*.so"

log "staging package (suffix_decoding only, no vLLM plugin entry point)"
STAGE="$TMP/stage"
mkdir -p "$STAGE/arctic_inference/suffix_decoding" "$STAGE/dist-info"
cp "$SRC/arctic_inference/__init__.py" "$STAGE/arctic_inference/"
cp "$SRC"/arctic_inference/suffix_decoding/*.py "$STAGE/arctic_inference/suffix_decoding/"
cp "$SO" "$STAGE/arctic_inference/suffix_decoding/"
if [[ -f "$SRC/LICENSE" ]]; then cp "$SRC/LICENSE" "$STAGE/dist-info/LICENSE"; fi
cat > "$STAGE/dist-info/METADATA" <<EOF
Metadata-Version: 2.1
Name: arctic_inference
Version: $VERSION
Summary: Snowflake arctic-inference: suffix_decoding subpackage only (installed by ngramspec eval/install_suffix_decoding.sh; no vLLM plugin)
License: Apache-2.0
Requires-Dist: numpy
EOF
printf '%s\n' "$MARKER" > "$STAGE/dist-info/INSTALLER"

log "installing into $SITE"
# Remove a previous install made by this script (checked above), then copy.
for d in "$SITE"/arctic_inference-*.dist-info; do
    if [[ -e "$d" ]]; then rm -rf "$d"; fi
done
rm -rf "$PKG_DIR"
cp -r "$STAGE/arctic_inference" "$PKG_DIR"
cp -r "$STAGE/dist-info" "$DIST_INFO"
# RECORD (paths only) so that `pip uninstall arctic-inference` works.
(
    cd "$SITE"
    find arctic_inference "$(basename "$DIST_INFO")" -type f | sed 's/$/,,/'
    echo "$(basename "$DIST_INFO")/RECORD,,"
) > "$DIST_INFO/RECORD.tmp"
mv "$DIST_INFO/RECORD.tmp" "$DIST_INFO/RECORD"

log "verifying"
"$PY" - <<'EOF'
import numpy as np
from arctic_inference.suffix_decoding import SuffixDecodingCache

c = SuffixDecodingCache(max_tree_depth=24, max_cached_requests=100)
c.start_request("a", np.array([1, 2, 3, 1, 2], dtype=np.int32))
c.add_active_response("a", [3])
d = c.speculate("a", np.array([1, 2, 3], dtype=np.int32), max_spec_tokens=8)
assert d.token_ids and d.token_ids[0] == 1, d
c.stop_request("a")
print(f"  smoke test ok: speculate -> token_ids={d.token_ids} probs={d.probs} match_len={d.match_len}")

try:
    from importlib.metadata import entry_points
    eps = [e for e in entry_points(group="vllm.general_plugins") if "arctic" in e.value]
    assert not eps, f"arctic vLLM plugin entry point registered: {eps}"
    from vllm.utils.import_utils import has_arctic_inference
except ImportError:
    print("  (vllm not installed in this venv; skipped vLLM check)")
else:
    assert has_arctic_inference(), "vllm.utils.import_utils.has_arctic_inference() is False"
    print("  vllm has_arctic_inference() ok; no arctic vLLM plugin registered")
EOF

log "done in $((SECONDS - START))s: arctic-inference $VERSION suffix_decoding -> $PKG_DIR"
