"""The documentation is executable: the Python blocks of every tutorial and of the concepts page run as written (on the small synthetic data the
pages make themselves), and the site builds with ``mkdocs build --strict`` (a broken link, anchor or API reference
fails)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = sorted((ROOT / "docs" / "tutorials").glob("*.md"))
RUNNABLE = [ROOT / "docs" / "concepts.md", *TUTORIALS]  # pages whose python blocks run as one program


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.S | re.M)


def test_every_tutorial_has_code():
    assert TUTORIALS, "docs/tutorials/ holds no page"
    empty = [p.name for p in TUTORIALS if not python_blocks(p)]
    assert not empty, f"tutorials without a python block: {empty}"


@pytest.mark.parametrize("page", RUNNABLE, ids=[p.stem for p in RUNNABLE])
def test_page_runs(page, tmp_path, monkeypatch):
    """The page's blocks run in order in one namespace, in an empty working directory, as a reader would paste them."""
    import matplotlib  # the `plots` extra, part of `all`

    matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__tutorial__"}
    for i, block in enumerate(python_blocks(page)):
        try:
            exec(compile(block, f"{page.name} python block {i}", "exec"), namespace)
        except Exception as err:  # pragma: no cover - the message is the point
            pytest.fail(f"{page.name} python block {i} failed: {type(err).__name__}: {err}\n{block}")


def test_docs_site_builds_strict(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "--site-dir",
         str(tmp_path / "site")],
        cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    # needs the `docs` extra (part of `all`, which `make test` installs); not --quiet, which hides the warnings
    # that --strict turns into a failure
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "api" / "functional" / "index.html").is_file()
