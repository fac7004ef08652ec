"""The README's code is executable documentation: its Python snippets run as written and give what their comments
promise. (That every config, script, experiment and make target it names exists, and that its commands parse, is
checked with the docs pages in tests/test_docs.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_readme_python_snippets_run(tmp_path, monkeypatch):
    blocks = _blocks("python")
    assert len(blocks) >= 5, "README lost its quickstart snippets"
    monkeypatch.chdir(tmp_path)  # save_pretrained("out/hot") writes relative to the working directory
    namespace: dict = {"__name__": "__readme__"}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"README.md python block {i}", "exec"), namespace)
        except Exception as err:  # pragma: no cover - the message is the point
            pytest.fail(f"README python block {i} failed: {type(err).__name__}: {err}\n{block}")
    # the shapes the README promises in its comments
    assert tuple(namespace["y"].shape) == (4, 12, 207, 1)  # Weaver block (the last `y`)
    assert tuple(namespace["logits"].shape) == (4, 2)
    assert (tmp_path / "out" / "hot" / "config.json").is_file()
    assert [tuple(m.shape) for m in namespace["records"][0][1]] == [(2, 8, 8, 8), (2, 8, 16, 16), (2, 8, 16, 16)]
    assert namespace["fresh"].config == namespace["clf"].config == namespace["clf2"].config


def test_analysis_doc_snippet_prints_what_it_promises(capsys):
    text = (ROOT / "docs" / "analysis.md").read_text()
    block = re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]
    promised = [line.lstrip("# ").strip() for line in block.splitlines() if line.startswith("# ")]
    exec(compile(block, "docs/analysis.md python block 0", "exec"), {"__name__": "__doc__"})
    printed = capsys.readouterr().out
    assert promised and all(p in printed for p in promised), (promised, printed)


def test_readme_forecasts_with_the_model_its_test_command_scores():
    """The own-CSV route: ``test --ckpt_path best`` scores the best checkpoint, and ``forecast`` reads the run's
    ``pretrained/`` folder, which holds that checkpoint's model (ExportPretrained), not ``last.ckpt``."""
    block = next(b for b in _blocks("bash") if "hoformer forecast" in b)
    root = re.search(r"--trainer\.default_root_dir (\S+?)\"?$", block, flags=re.M).group(1)
    assert re.search(r"^hoformer test .*--ckpt_path best", block, flags=re.M), block
    forecast = re.search(r"^hoformer forecast --checkpoint (\S+)", block, flags=re.M).group(1)
    assert forecast == f"{root}/pretrained" and "last.ckpt" not in block, block
