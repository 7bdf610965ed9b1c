"""The README's "Using gdnconv from vLLM / transformers / torch.compile" snippets run as written
and print the output shown under each."""
import os
import re

import pytest

from conftest import run_python

README = os.path.join(os.path.dirname(__file__), os.pardir, "README.md")
SECTION = "## Using gdnconv from vLLM / transformers / torch.compile"


def _snippets():
    text = open(README, encoding="utf-8").read()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start:end if end >= 0 else None]
    return re.findall(r"```python\n(.*?)```\n```\n(.*?)```", section, re.S)


def test_section_has_the_three_snippets():
    assert len(_snippets()) == 3


@pytest.mark.parametrize("index", range(3), ids=["vllm", "transformers", "torch_compile"])
def test_snippet_prints_what_the_readme_shows(index):
    pytest.importorskip("torch")
    code, shown = _snippets()[index]
    if "transformers" in code:
        pytest.importorskip("transformers")
    r = run_python(code)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout == shown
