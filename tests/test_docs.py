"""The README is a front page and docs/ a manual that builds: the README's length and the two code
blocks that `.ci/run` and newcomers rely on, `mkdocs build --strict` over mkdocs.yml, and no
narration of the project's own history in its documents (README.md, BENCHMARKS.md, docs/**/*.md,
the notebooks, and the comments and docstrings of fbt_probe/**/*.py).

Each check is a function of a text or a folder, applied to the real files and to a crafted bad
input that it must reject."""

from __future__ import annotations

import ast
import io
import os
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from tests.notebook_helpers import (
    NOTEBOOK_DIR,
    RECORDS,
    figure_calls,
    notebooks,
    png_images,
    read_record,
    record_problems,
)

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 300


# ---- the README ------------------------------------------------------------------------------


def fenced_blocks(text: str) -> list[str]:
    """The contents of the ``` fenced code blocks of a Markdown text, in order."""
    blocks, current = [], None
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            if current is None:
                current = []
            else:
                blocks.append("\n".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def readme_problems(path: Path) -> list[str]:
    """What keeps `path` from being the front page: too long, or its first two code blocks are not
    the main job (`make demo`) and the tests (`make test`)."""
    text = path.read_text(encoding="utf-8")
    problems = []
    n = len(text.splitlines())
    if n > README_MAX_LINES:
        problems.append(f"{path.name}: {n} lines, more than {README_MAX_LINES}")
    blocks = fenced_blocks(text)
    for i, command in enumerate(("make demo", "make test")):
        if len(blocks) <= i or command not in blocks[i]:
            got = blocks[i] if len(blocks) > i else "no such block"
            problems.append(f"{path.name}: code block {i + 1} should run `{command}`, got {got!r}")
    return problems


def test_readme_is_a_front_page():
    assert readme_problems(ROOT / "README.md") == []


def test_readme_check_rejects_bad_readmes(tmp_path):
    good = (ROOT / "README.md").read_text(encoding="utf-8")
    long = tmp_path / "README.md"
    long.write_text("# x\n\n```bash\nmake demo\n```\n\n```bash\nmake test\n```\n" + "line\n" * 292)
    assert len(long.read_text().splitlines()) == 301
    assert readme_problems(long) == ["README.md: 301 lines, more than 300"]
    swapped = tmp_path / "swapped.md"
    swapped.write_text(good.replace("make demo", "@@").replace("make test", "make demo").replace("@@", "make test"))
    assert len(readme_problems(swapped)) == 2
    one_block = tmp_path / "one.md"
    one_block.write_text("# x\n\n```bash\nmake demo\n```\n")
    assert readme_problems(one_block) == ["one.md: code block 2 should run `make test`, got 'no such block'"]


def test_fenced_blocks():
    text = "a\n```bash\nmake demo\n```\nb\n  ```python\nx = 1\ny = 2\n  ```\n"
    assert fenced_blocks(text) == ["make demo", "x = 1\ny = 2"]


# ---- the rendered manual ---------------------------------------------------------------------


def build_docs(config: Path, site: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` (not -q: a quiet build does not count the warnings that --strict fails on).
    The build runs the notebooks (docs/notebooks/, about a minute of CPU): `env` adds to their environment."""
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=config.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )


@pytest.mark.slow
def test_the_manual_builds_strict(tmp_path):
    """Every page in the nav, every link between pages, every `::: object` of docs/api.md; every
    notebook run top to bottom (a cell that raises fails the build), its page showing each of its
    figures, and the numbers it recorded passing their checks (tests/notebook_helpers.py), the
    first notebook's logit differences recomputed here from the tokens it recorded."""
    records = tmp_path / "records"
    # one BLAS thread in the notebooks' kernels, as in every worker of the suite (tests/conftest.py)
    r = build_docs(ROOT / "mkdocs.yml", tmp_path / "site", env={RECORDS: str(records), "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    for name in ("fbt_probe.load_model", "FeedbackTransformer", "fbt_probe.surface.tl_native"):
        assert name in api, name
    assert (tmp_path / "site" / "research" / "index.html").exists()
    assert len(notebooks()) == 3
    for nb in notebooks():
        page = (tmp_path / "site" / "notebooks" / nb.stem / "index.html").read_text(encoding="utf-8")
        shown = figure_calls(nb.read_text(encoding="utf-8"))
        assert shown >= 2 and png_images(page) == shown, (nb.name, png_images(page), shown)
        assert record_problems(nb.stem, read_record(records, nb)) == [], nb.name
    modes = read_record(records, NOTEBOOK_DIR / "model-and-modes.py")
    import torch

    from fbt_probe.loading import load_model
    from fbt_probe.tasks import load_spec

    model = load_model("ref:tiny-feedback").eval()
    ids = [model.to_single_token(w) for w in load_spec("completion").label_words]  # the answers of labels 0, 1
    with torch.no_grad():
        for mode, recorded in modes["logit_diff"].items():
            last = model(torch.tensor(modes["tokens"]), mode=mode)[:, -1]
            own = [float(last[i, ids[y]] - last[i, ids[1 - y]]) for i, y in enumerate(modes["labels"])]
            assert max(abs(a - b) for a, b in zip(own, recorded)) < 1e-4, (mode, own, recorded)


def test_every_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = [p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")]
    pages += [p.relative_to(ROOT / "docs").as_posix() for p in notebooks()]
    assert [p for p in pages if p not in nav] == []


def test_a_broken_link_fails_the_build(tmp_path):
    """--strict fails on a link to a missing page and on one that leaves docs/ (../BENCHMARKS.md)."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "mkdocs.yml").write_text("site_name: t\ndocs_dir: docs\n")
    (tmp_path / "docs" / "index.md").write_text("# t\n\n[fine](other.md)\n")
    (tmp_path / "docs" / "other.md").write_text("# o\n")
    assert build_docs(tmp_path / "mkdocs.yml", tmp_path / "site").returncode == 0
    for bad in ("[gone](missing.md)", "[outside](../BENCHMARKS.md)"):
        (tmp_path / "docs" / "index.md").write_text(f"# t\n\n{bad}\n")
        r = build_docs(tmp_path / "mkdocs.yml", tmp_path / "site")
        assert r.returncode != 0, bad
        assert bad.split("(")[1].rstrip(")") in r.stdout + r.stderr


# ---- no history narration --------------------------------------------------------------------

# Words that narrate how the project was made (work periods, review rounds, tickets, who did what
# when) rather than what it is. Technical uses are left out by construction: `session()` and
# `fbt_probe.distributed.session` (the torchrun process group), "torchrun session",
# round(...) / round-robin, "helpers" (helper functions), "every helper here".
NARRATION = [
    re.compile(p, re.IGNORECASE)
    for p in (
        r"\bround[- ]\d",
        r"\brounds \d",
        r"(?<![.\w])(?<!torchrun )(?<!distributed )sessions?\b(?!\s*\()",
        r"\bissues? #?\d",
        r"\bthis issue\b",
        r"\bthe issue's\b",
        r"\bwork ?periods?\b",
        r"\b(?:a|the|our|my|one|another) helper\b(?!\s+(?:function|module|class|method|script)s?\b)",
        r"\bsub-?agents?\b",
        r"\breviewers?\b",
        r"\bpreviously\b",
        r"\bthis PR\b",
        r"\bpull request\b",
        r"\bsuperseded\b",
        r"\b(?:rule|default|behaviou?r) (?:before|until) \d{4}-\d\d-\d\d\b",
    )
]


def narration_hits(text: str) -> list[tuple[int, str]]:
    """(line number, matched text) of every narration pattern in `text`."""
    hits = []
    for n, line in enumerate(text.splitlines(), 1):
        for pattern in NARRATION:
            hits += [(n, m.group(0)) for m in pattern.finditer(line)]
    return hits


def prose_of_python(source: str) -> list[tuple[int, str]]:
    """(first line, text) of each comment and docstring of a Python source: its prose, not its code."""
    out = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                out.append((body[0].lineno, body[0].value.value))
    return out


def documents() -> list[Path]:
    return [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md")), *notebooks()]


def test_no_history_narration_in_the_documents():
    found = [
        f"{p.relative_to(ROOT)}:{n}: {m!r}"
        for p in documents()
        for n, m in narration_hits(p.read_text(encoding="utf-8"))
    ]
    assert found == [], "\n".join(found)


def test_no_history_narration_in_comments_and_docstrings():
    found = []
    for p in sorted((ROOT / "fbt_probe").rglob("*.py")):
        for start, text in prose_of_python(p.read_text(encoding="utf-8")):
            found += [f"{p.relative_to(ROOT)}:{start + n - 1}: {m!r}" for n, m in narration_hits(text)]
    assert found == [], "\n".join(found)


@pytest.mark.parametrize(
    "text",
    [
        "Measured in round 3 of the recipe.",
        "Rounds 1–3 are in the record.",
        "on the round-4 models",
        "the targets of issue 15",
        "before issue #19",
        "a dependency since this issue",
        "inside the issue's 30 minutes",
        "in the second work period",
        "a helper measured it",
        "the subagent wrote",
        "the reviewer asked for it",
        "as previously measured",
        "this PR adds",
        "a superseded measurement",
        "the rule before 2026-11-30",
        "an earlier session measured it",
    ],
)
def test_narration_is_caught(text):
    assert narration_hits(text), text


@pytest.mark.parametrize(
    "text",
    [
        "`fbt_probe.distributed.session()`, entered once by the CLI",
        "`session()` (entered once)",
        "one torchrun session per job",
        "one torchrun session per rank",
        "round(x, 3)",
        "round-robin over groups",
        "the tokenizer helpers (`to_tokens`)",
        "every helper here answers",
        "the helper function below",
        "an issue with the cache",
        "rounded to bf16",
        "the run before 2026-12-01 on this host",
    ],
)
def test_technical_words_are_not_narration(text):
    assert narration_hits(text) == [], text


def test_python_prose_is_comments_and_docstrings_only():
    source = (
        '"""Module doc: round 2."""\n'
        "from x import session  # issue 7\n"
        "def f():\n"
        '    """Docstring."""\n'
        "    return session()\n"
        'MSG = "a string literal, not prose: round 3"\n'
    )
    prose = prose_of_python(source)
    assert sorted(prose) == [(1, "Module doc: round 2."), (2, "# issue 7"), (4, "Docstring.")]
    assert sorted(m for _, t in prose for _, m in narration_hits(t)) == ["issue 7", "round 2"]
