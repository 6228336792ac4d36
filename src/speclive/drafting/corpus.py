"""Corpora for the global suffix datastore: files, folders and chat transcripts -> token ids.

A corpus entry is a path:

- a folder: every file below it with a known text suffix (``TEXT_SUFFIXES``), sorted;
- ``.jsonl``: one document per line — ``{"messages": [...]}`` (a chat, rendered with the model's
  chat template so that retrieval matches the decode-time context), ``{"conversations": [...]}``
  (ShareGPT style, ``from``/``value``) or ``{"text": ...}``;
- any other file: its text is one document.

``max_tokens`` caps the corpus (documents are taken in order until the cap);
``exclude_texts`` drops documents containing any of the given strings (benchmark prompts).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from speclive.drafting.datastore import DatastoreError
from speclive.tokenizer import Tokenizer

TEXT_SUFFIXES = (
    ".py",
    ".jsonl",
    ".md",
    ".rst",
    ".txt",
    ".json",
    ".toml",
    ".cfg",
    ".ini",
    ".yaml",
    ".yml",
    ".html",
)
_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
}


@dataclass
class CorpusReport:
    files: int = 0
    documents: int = 0
    tokens: int = 0
    skipped: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    prompt_ids: list[str] = field(default_factory=list)


def _files(path: Path) -> Iterator[Path]:
    if path.is_dir():
        for p in sorted(path.rglob("*")):
            if p.is_file() and p.suffix in TEXT_SUFFIXES and "__pycache__" not in p.parts:
                yield p
    elif path.is_file():
        yield path
    else:
        raise DatastoreError(f"corpus path not found: {path}")


def _chat(tok: Tokenizer, messages: Sequence[dict]) -> list[int]:
    return tok.chat(
        [{"role": m["role"], "content": m["content"]} for m in messages], add_generation_prompt=False
    )


def _jsonl_docs(
    path: Path, tok: Tokenizer, report: CorpusReport
) -> Iterator[tuple[str, list[int], str | None]]:
    """(text, token ids, the row's ``id`` if any) per row."""
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatastoreError(f"{path}:{n}: not JSON ({e})") from None
            pid = str(row["id"]) if "id" in row else None
            if "messages" in row:
                text = " ".join(m["content"] for m in row["messages"])
                yield text, _chat(tok, row["messages"]), pid
            elif "conversations" in row:
                msgs = [
                    {"role": _SHAREGPT_ROLES.get(c.get("from", ""), "user"), "content": c.get("value", "")}
                    for c in row["conversations"]
                ]
                yield " ".join(m["content"] for m in msgs), _chat(tok, msgs), pid
            elif "text" in row:
                yield row["text"], tok.encode(row["text"]), pid
            else:
                report.skipped.append(f"{path}:{n}: no messages/conversations/text field")


def corpus_documents(
    paths: Sequence[str | Path],
    tok: Tokenizer,
    max_tokens: int | None = None,
    exclude_texts: Sequence[str] = (),
    report: CorpusReport | None = None,
) -> Iterator[list[int]]:
    """Token ids of every document of the corpus, in order, up to ``max_tokens`` in total."""
    report = report if report is not None else CorpusReport()
    excl = [e for e in (x.strip() for x in exclude_texts) if len(e) >= 20]
    for raw in paths:
        path = Path(raw)
        report.sources.append(str(path))
        for f in _files(path):
            if max_tokens is not None and report.tokens >= max_tokens:
                return
            report.files += 1
            if f.suffix == ".jsonl":
                docs: Iterator[tuple[str, list[int], str | None]] = _jsonl_docs(f, tok, report)
            else:
                try:
                    text = f.read_text(encoding="utf-8")
                except (UnicodeDecodeError, OSError):
                    report.skipped.append(f"{f}: not UTF-8 text")
                    continue
                docs = iter([(text, tok.encode(text), None)]) if text.strip() else iter([])
            for text, ids, pid in docs:
                if any(e in text for e in excl):
                    report.skipped.append(f"{f}: contains an excluded (benchmark) text")
                    continue
                if not ids:
                    continue
                if pid is not None:  # ids of the documents kept (checked against benchmarks)
                    report.prompt_ids.append(pid)
                report.documents += 1
                report.tokens += len(ids)
                yield ids
                if max_tokens is not None and report.tokens >= max_tokens:
                    return
