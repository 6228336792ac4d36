"""Tests of the benchmark prompt sets (MT-Bench, HumanEval, HumanEval code edits)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from speclive_bench.datasets import (
    chat_messages,
    code_edit_prompts,
    code_edit_short_prompts,
    humaneval_problems,
    mtbench_questions,
)


@pytest.fixture(scope="module", autouse=True)
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One temporary SPECLIVE_HOME for the module (the data sets are installed into it once)."""
    h = tmp_path_factory.mktemp("speclive_home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECLIVE_HOME", str(h))
        yield h


def test_mtbench() -> None:
    qs = mtbench_questions()
    assert len(qs) == 80
    assert len({q["id"] for q in qs}) == 80
    assert len({q["category"] for q in qs}) == 8
    assert all(set(q) == {"id", "category", "prompt"} and q["prompt"].strip() for q in qs)
    assert qs[0]["prompt"].startswith("Compose an engaging travel blog post about a recent trip to Hawaii")
    second = mtbench_questions(turn=2)
    assert [q["id"] for q in second] == [q["id"] for q in qs]
    assert second[0]["prompt"] != qs[0]["prompt"]
    with pytest.raises(ValueError):
        mtbench_questions(turn=3)


def test_humaneval() -> None:
    ps = humaneval_problems()
    assert len(ps) == 164
    assert ps[0]["task_id"] == "HumanEval/0" and ps[-1]["task_id"] == "HumanEval/163"
    for p in ps:
        assert {"task_id", "prompt", "canonical_solution", "entry_point"} <= set(p)
        assert f"def {p['entry_point']}(" in p["prompt"]


def test_code_edit_prompts() -> None:
    items = code_edit_prompts()
    assert len(items) == 30
    assert items == code_edit_prompts(30)  # deterministic
    assert len({i["id"] for i in items}) == 30
    assert len({i["task_id"] for i in items}) == 30
    assert len({i["edit"] for i in items}) >= 6  # a real mix of edit kinds
    by_id = {p["task_id"]: p for p in humaneval_problems()}
    for item in items:
        problem = by_id[item["task_id"]]
        prompt = item["prompt"]
        code = item["code"]
        ast.parse(code)
        assert code.strip() == (problem["prompt"] + problem["canonical_solution"]).strip()
        assert f"```python\n{code}```" in prompt  # the whole function is given
        assert "```python" in prompt.split("```", 2)[2]  # and the answer format is asked for
        change = prompt.split("Change: ", 1)[1].split("\n", 1)[0]
        assert f"`{problem['entry_point']}`" in change
        for name in re.findall(r"`([A-Za-z_]\w*)`", change):
            if not name.endswith(("_v2", "_value", "_tmp")) and name not in (
                "for",
                "while",
                "return",
                "result",
            ):
                assert name in code, (item["id"], name)
    assert [i["task_id"] for i in code_edit_prompts(3)] == ["HumanEval/0", "HumanEval/54", "HumanEval/109"]
    with pytest.raises(ValueError):
        code_edit_prompts(0)


def test_short_code_edits_show_a_6_to_10_line_function() -> None:
    items = code_edit_short_prompts(16)
    assert items == code_edit_short_prompts(16) and len({i["task_id"] for i in items}) == 16
    assert all(i["id"].startswith("code-edit-short-") for i in items)
    assert len({i["edit"] for i in items}) >= 5
    for item in items:
        tree = ast.parse(item["code"])
        (func,) = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
        assert ast.get_docstring(func) is None  # the docstring is left out
        lines = ast.unparse(func).splitlines()
        assert 6 <= len(lines) <= 10, (item["id"], len(lines))
        assert f"```python\n{item['code']}```" in item["prompt"]
        exec(compile(tree, item["id"], "exec"), {})  # the imports it needs are there
    with pytest.raises(ValueError):
        code_edit_short_prompts(1000)


def test_chat_messages() -> None:
    assert chat_messages("hi") == [{"role": "user", "content": "hi"}]
