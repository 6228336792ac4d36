"""The benchmark prompt sets as ``{"id", "text"}`` rows (``text``: one user message).

- ``code-edit``, ``humaneval``, ``mtbench``: the sets of ``speclive bench decode``
  (``speclive_bench.datasets``), spread evenly over the set by ``--limit``; ``code-edit-short``
  (edits of 6-10-line functions) when asked for;
- ``chat-heldout``: a held-out ShareGPT-like slice for ``speclive bench talon``: other MT-Bench
  questions (shifted by one from the ``mtbench`` sample) asked together with their follow-up
  turn, as one user message. No ShareGPT dump is available offline; this is the closest
  multi-request chat data here.

``bench_prompt_texts`` and ``held_out_prompts`` say which prompts a ``bench talon --limit N``
run evaluates and which it leaves alone, for building datastores that must not contain them.
"""

from __future__ import annotations

from collections.abc import Sequence

from speclive_bench import datasets

SETS: tuple[str, ...] = ("code-edit", "humaneval", "mtbench")
#: sets ``bench decode --sets`` also takes, not run by default: ``code-edit-short`` (edits of
#: 6-10-line functions, ``datasets.code_edit_short_prompts``)
DECODE_SETS: tuple[str, ...] = (*SETS, "code-edit-short")
#: the sets of ``speclive bench talon``
TALON_SETS: tuple[str, ...] = ("mtbench", "humaneval", "chat-heldout")
#: the prompt every method generates from once before the measured runs
WARMUP_PROMPT = "Write a Python function that returns the sum of two numbers."

HUMANEVAL_TEMPLATE = (
    "Complete the following Python function. Reply with the complete function in a single "
    "```python code block.\n\n```python\n{prompt}```"
)
#: joins an MT-Bench question and its follow-up into one chat-slice prompt
CHAT_JOIN = "\n\nThen: "


def _spread(n: int, limit: int | None) -> list[int]:
    """``limit`` indices spread evenly over ``range(n)`` (all of them without a limit)."""
    if limit is None or limit >= n:
        return list(range(n))
    return [i * n // limit for i in range(max(0, limit))]


def _chat_indices(n: int, limit: int | None) -> list[int]:
    return sorted({(i + 1) % n for i in _spread(n, limit)})


def load_prompts(name: str, limit: int | None = None) -> list[dict[str, str]]:
    """Prompts of one set as ``{"id", "text"}`` (user message text), spread over the set."""
    if name == "code-edit":
        rows = [{"id": r["id"], "text": r["prompt"]} for r in datasets.code_edit_prompts(30)]
    elif name == "code-edit-short":
        rows = [{"id": r["id"], "text": r["prompt"]} for r in datasets.code_edit_short_prompts(30)]
    elif name == "humaneval":
        rows = [
            {"id": r["task_id"], "text": HUMANEVAL_TEMPLATE.format(prompt=r["prompt"])}
            for r in datasets.humaneval_problems()
        ]
    elif name == "mtbench":
        rows = [
            {"id": f"mtbench-{r['id']}-{r['category']}", "text": r["prompt"]}
            for r in datasets.mtbench_questions()
        ]
    elif name == "chat-heldout":
        return chat_heldout_prompts(limit)
    else:
        raise ValueError(f"unknown prompt set {name!r}; known: {', '.join(DECODE_SETS)}")
    return [rows[i] for i in _spread(len(rows), limit)]


def chat_heldout_prompts(limit: int | None = None) -> list[dict[str, str]]:
    """The held-out chat slice (module docstring) as ``{"id", "text"}``."""
    t1 = datasets.mtbench_questions(1)
    t2 = datasets.mtbench_questions(2)
    rows = []
    for i in _chat_indices(len(t1), limit):
        q, f = t1[i], t2[i]
        rows.append(
            {"id": f"chat-{q['id']}-{q['category']}", "text": f"{q['prompt']}{CHAT_JOIN}{f['prompt']}"}
        )
    return rows


def bench_prompt_texts(limit: int | None) -> list[str]:
    """User texts of every prompt a ``bench talon --limit LIMIT`` run evaluates; a chat-slice
    prompt gives its two MT-Bench turns separately (a corpus answer to the first turn alone
    leaks just as much)."""
    out: list[str] = []
    for s in TALON_SETS:
        for r in load_prompts(s, limit):
            out += r["text"].split(CHAT_JOIN) if s == "chat-heldout" else [r["text"]]
    return out


def question_key(prompt_id: str) -> str:
    """``mtbench-97-roleplay`` and ``chat-97-roleplay`` ask the same MT-Bench question."""
    for prefix in ("mtbench-", "chat-"):
        if prompt_id.startswith(prefix):
            return "mt-" + prompt_id[len(prefix) :]
    return prompt_id


def held_out_prompts(sets: Sequence[str], per_set: int, bench_limit: int | None) -> list[dict[str, str]]:
    """Prompts of ``sets`` that a ``bench talon --limit bench_limit`` run does not use (nor their
    MT-Bench questions in the chat slice), ``per_set`` of each, spread over what is left."""
    out: list[dict[str, str]] = []
    for s in sets:
        if s == "mtbench":
            qs = datasets.mtbench_questions(1)
            used = set(_spread(len(qs), bench_limit)) | set(_chat_indices(len(qs), bench_limit))
            free = [i for i in range(len(qs)) if i not in used]
            rows = [
                {"id": f"mtbench-{qs[i]['id']}-{qs[i]['category']}", "text": qs[i]["prompt"]} for i in free
            ]
        elif s == "humaneval":
            ps = datasets.humaneval_problems()
            used = set(_spread(len(ps), bench_limit))
            rows = [
                {"id": ps[i]["task_id"], "text": HUMANEVAL_TEMPLATE.format(prompt=ps[i]["prompt"])}
                for i in range(len(ps))
                if i not in used
            ]
        else:
            raise ValueError(f"held-out prompts exist for mtbench and humaneval, not {s!r}")
        for j in _spread(len(rows), per_set):
            out.append({"set": s, **rows[j]})
    return out
