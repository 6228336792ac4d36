"""Benchmark prompt sets: MT-Bench, HumanEval and a code-editing set derived from HumanEval.

The data files come from the registry entries ``mt-bench`` and ``humaneval`` (installed on first
use, a few KB each).  ``code_edit_prompts`` builds a deterministic code-editing task set whose
answers copy most of the given code, the case prompt-lookup drafting is made for.
"""

from __future__ import annotations

import ast
import gzip
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from speclive.models.install import install, installed_path


def _dataset_file(name: str) -> Path:
    install(name, progress=False)  # no-op when installed
    return installed_path(name)


def _read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def chat_messages(prompt: str) -> list[dict]:
    """A one-turn chat: ``[{"role": "user", "content": prompt}]``."""
    return [{"role": "user", "content": prompt}]


def mtbench_questions(turn: int = 1) -> list[dict]:
    """The 80 MT-Bench questions as ``{"id", "category", "prompt"}``; ``prompt`` is turn 1 or 2's text."""
    if turn not in (1, 2):
        raise ValueError(f"MT-Bench questions have turns 1 and 2, not {turn}")
    rows = _read_jsonl(_dataset_file("mt-bench"))
    return [{"id": r["question_id"], "category": r["category"], "prompt": r["turns"][turn - 1]} for r in rows]


def humaneval_problems() -> list[dict]:
    """The 164 HumanEval problems: ``{"task_id", "prompt", "canonical_solution", "entry_point", "test"}``."""
    keys = ("task_id", "prompt", "canonical_solution", "entry_point", "test")
    return [{k: r[k] for k in keys} for r in _read_jsonl(_dataset_file("humaneval"))]


# --------------------------------------------------------------------------------- code editing


@dataclass(frozen=True)
class _Code:
    """A HumanEval program (prompt + canonical solution) and facts about its entry function."""

    source: str
    func: ast.FunctionDef

    @property
    def name(self) -> str:
        return self.func.name

    def params(self) -> list[ast.arg]:
        a = self.func.args
        return [*a.posonlyargs, *a.args, *a.kwonlyargs]

    def nodes(self, kind: type | tuple[type, ...]) -> list[ast.AST]:
        found = [n for n in ast.walk(self.func) if isinstance(n, kind)]
        return sorted(found, key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)))

    def local_names(self) -> list[str]:
        params = {p.arg for p in self.params()}
        seen: list[str] = []
        for n in self.nodes(ast.Name):
            assert isinstance(n, ast.Name)
            if isinstance(n.ctx, ast.Store) and n.id not in params and n.id not in seen and n.id != "_":
                seen.append(n.id)
        return seen


def _parse(problem: dict) -> _Code:
    source = (problem["prompt"] + problem["canonical_solution"]).strip("\n") + "\n"
    tree = ast.parse(source)
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == problem["entry_point"]]
    if not funcs:
        raise ValueError(f"{problem['task_id']}: no top-level function {problem['entry_point']!r}")
    return _Code(source, funcs[-1])


def _rename_function(c: _Code) -> str | None:
    return f"Rename the function `{c.name}` to `{c.name}_v2`, including any place where it calls itself."


def _rename_param(c: _Code) -> str | None:
    ps = c.params()
    if not ps:
        return None
    p = ps[0].arg
    return f"Rename the parameter `{p}` of `{c.name}` to `{p}_value` everywhere it is used inside `{c.name}`."


def _docstring_line(c: _Code) -> str | None:
    if ast.get_docstring(c.func) is None:
        return None
    return f"Add the line `Reviewed: yes.` as the last line of the docstring of `{c.name}`."


def _for_to_while(c: _Code) -> str | None:
    if not c.nodes(ast.For):
        return None
    return (
        f"Rewrite the first `for` loop in `{c.name}` as an equivalent `while` loop that uses an explicit "
        "index variable; leave the rest of the body unchanged."
    )


def _comprehension_to_loop(c: _Code) -> str | None:
    if not c.nodes(ast.ListComp):
        return None
    return (
        f"Replace the first list comprehension in `{c.name}` with an explicit `for` loop that appends to a "
        "new list, and use that list where the comprehension was."
    )


def _add_type_hints(c: _Code) -> str | None:
    if c.func.returns is not None and all(p.annotation is not None for p in c.params()):
        return None
    return (
        f"Add type hints to every parameter of `{c.name}` that has none, and a return type annotation "
        "if it is missing."
    )


def _remove_type_hints(c: _Code) -> str | None:
    if c.func.returns is None and all(p.annotation is None for p in c.params()):
        return None
    return f"Remove all type hints from the signature of `{c.name}` (parameters and return type)."


def _comment_returns(c: _Code) -> str | None:
    if not c.nodes(ast.Return):
        return None
    return f"Add the comment line `# result` directly above every `return` statement in `{c.name}`."


def _rename_local(c: _Code) -> str | None:
    names = c.local_names()
    if not names:
        return None
    v = names[0]
    return f"Rename the local variable `{v}` in `{c.name}` to `{v}_tmp` everywhere it is used."


_EDITS: tuple[tuple[str, Callable[[_Code], str | None]], ...] = (
    ("rename_function", _rename_function),
    ("rename_param", _rename_param),
    ("docstring_line", _docstring_line),
    ("for_to_while", _for_to_while),
    ("add_type_hints", _add_type_hints),
    ("comment_returns", _comment_returns),
    ("comprehension_to_loop", _comprehension_to_loop),
    ("rename_local", _rename_local),
    ("remove_type_hints", _remove_type_hints),
)

_TEMPLATE = """Rewrite the following Python code with one small change.

```python
{code}```

Change: {instruction}
Keep everything else exactly as it is, including docstrings, comments, imports and any other \
functions. Output the complete rewritten code in a single ```python code block and nothing else."""


#: the lines of a short edit's function (``code_edit_short_prompts``)
SHORT_LINES = (6, 10)


def _short_code(problem: dict) -> _Code | None:
    """The problem's imports and its function without the docstring, when that is 6-10 lines."""
    code = _parse(problem)  # a fresh parse: its function may be edited here
    imports = [n for n in ast.parse(code.source).body if isinstance(n, ast.Import | ast.ImportFrom)]
    func = code.func
    if ast.get_docstring(func) is not None:
        func.body = func.body[1:] or [ast.Pass()]
    body = ast.unparse(func)
    if not SHORT_LINES[0] <= len(body.splitlines()) <= SHORT_LINES[1]:
        return None
    head = "".join(ast.unparse(i) + "\n" for i in imports)
    source = (head + "\n\n" if head else "") + body + "\n"
    return _Code(source, next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)))


def code_edit_short_prompts(n: int = 30) -> list[dict]:
    """``n`` short code edits: as ``code_edit_prompts``, on HumanEval functions of 6-10 lines once
    their docstring is left out (with the imports they need), spread over those problems. Their
    answers copy only a few dozen tokens, the case where a drafter has little to learn from.
    Items: ``{"id", "prompt", "task_id", "edit", "code"}``."""
    short = [(p, c) for p in humaneval_problems() if (c := _short_code(p)) is not None]
    if not 1 <= n <= len(short):
        raise ValueError(f"n must be between 1 and {len(short)}, not {n}")
    return _edits([short[i * len(short) // n] for i in range(n)], "code-edit-short")


def code_edit_prompts(n: int = 30) -> list[dict]:
    """``n`` deterministic code-editing prompts built from HumanEval canonical solutions.

    Prompt ``i`` takes problem ``i * 164 // n`` (spread over the whole set), shows the full code
    (prompt + canonical solution) and asks for one small, specified edit and for the whole
    rewritten code in a ```python block.  The edit kind comes from a fixed list: the least used so
    far among those that apply to that code, ties broken by cycling through the list.
    Items: ``{"id", "prompt", "task_id", "edit", "code"}``.
    """
    problems = humaneval_problems()
    if not 1 <= n <= len(problems):
        raise ValueError(f"n must be between 1 and {len(problems)}, not {n}")
    picked = [problems[i * len(problems) // n] for i in range(n)]
    return _edits([(p, _parse(p)) for p in picked], "code-edit")


def _edits(codes: list[tuple[dict, _Code]], prefix: str) -> list[dict]:
    """One edit prompt per (problem, code): the least used applicable edit kind so far."""
    out = []
    used: Counter[str] = Counter()
    for i, (problem, code) in enumerate(codes):
        applicable = [(k, e, text) for k, (e, make) in enumerate(_EDITS) if (text := make(code)) is not None]
        # The least-used applicable edit kind so far; ties go to the kind next in the cycle from i.
        _, edit, instruction = min(applicable, key=lambda a: (used[a[1]], (a[0] - i) % len(_EDITS)))
        used[edit] += 1
        out.append(
            {
                "id": f"{prefix}-{i:03d}",
                "prompt": _TEMPLATE.format(code=code.source, instruction=instruction),
                "task_id": problem["task_id"],
                "edit": edit,
                "code": code.source,
            }
        )
    return out
