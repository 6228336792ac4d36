#!/usr/bin/env bash
# The *-cuda results were made on a lent GPU machine that reaches no network. The offline
# bundle travels there as two tar files (A: Whisper base + tiny.en, datasets, test clips, the
# gguf wheel and Qwen's tokenizer folder; B: the Qwen 0.5B GGUF) cut into 50 MB chunks, one
# chunk folder per call (.gpu/cNN, git-ignored), with their SHA-256 sums in .gpu/c01.
#
#   benchmarks/gpu_session.sh receive        # move this call's chunks out of the tree copy
#   benchmarks/gpu_session.sh assemble A     # join, check the SHA-256, unpack into /tmp/sl
#   . benchmarks/gpu_session.sh env          # SPECLIVE_HOME, PYTHONPATH (src + the gguf wheel)
#   python3 -m speclive.cli bench asr --device cuda --clips /tmp/sl/clips ...
#
# Locally: `speclive bench asr --save-clips DIR` writes the clips; the rest is tar and split.
set -eu
X=/tmp/speclive-xfer
mkdir -p "$X" /tmp/sl
case "${1:-}" in
receive)
    for d in .gpu/c*; do
        [ -d "$d" ] || continue
        mv "$d"/* "$X"/
        rmdir "$d"
    done
    ls "$X" | tr '\n' ' '
    echo
    ;;
assemble)
    part="$2"
    cat "$X/$part".?? >"$X/$part.tar"
    want=$(grep "/$part.tar" "$X/sums.txt" | cut -d' ' -f1)
    got=$(sha256sum "$X/$part.tar" | cut -d' ' -f1)
    if [ "$want" != "$got" ]; then
        echo "$part.tar: SHA-256 $got, expected $want" >&2
        exit 1
    fi
    tar xf "$X/$part.tar" -C /tmp/sl
    rm -f "$X/$part".?? "$X/$part.tar"
    echo "$part: SHA-256 ok, unpacked"
    ;;
env)
    if [ ! -d /tmp/site/gguf ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/sl/whl/*.whl
    fi
    export SPECLIVE_HOME=/tmp/sl/home PYTHONPATH="/tmp/site:$PWD/src" PYTHONUNBUFFERED=1
    ;;
*)
    echo "usage: $0 receive | assemble A|B | env" >&2
    exit 2
    ;;
esac
