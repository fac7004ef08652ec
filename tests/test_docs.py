"""The documentation is executable: the Python blocks of every tutorial and of the concepts page run as written (on the small synthetic data the
pages make themselves), the site builds with ``mkdocs build --strict`` (a broken link, anchor or API reference
fails), the commands of README.md, CONTRIBUTING.md and the pages parse, and what they name exists."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
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


#: top-level modules without an API page: the command line (its --help and the pages document it) and the shims
#: over versions of Lightning and PyTorch
NO_API_PAGE = {"cli", "lightning_cli", "compat"}


def test_api_reference_lists_each_public_module_once():
    """The API pages of ``mkdocs.yml``: each public module of the package once in the navigation and once in a
    ``::: module`` directive, every public top-level module or subpackage with its page."""
    nav = re.findall(r"^ +- (hoformer[\w.]*): (api/[\w/]+\.md)$", (ROOT / "mkdocs.yml").read_text(), flags=re.M)
    titles, pages = [t for t, _ in nav], [p for _, p in nav]
    assert len(set(titles)) == len(titles) and len(set(pages)) == len(pages), f"listed twice: {nav}"
    directives = [d for page in sorted((ROOT / "docs").rglob("*.md"))
                  for d in re.findall(r"^::: ([\w.]+)$", page.read_text(), flags=re.M)]
    assert len(set(directives)) == len(directives), sorted(d for d in directives if directives.count(d) > 1)
    package = ROOT / "src" / "hoformer"
    public = {p.stem for p in package.glob("*.py") if not p.name.startswith("_")}
    public |= {p.name for p in package.iterdir() if (p / "__init__.py").is_file() and not p.name.startswith("_")}
    missing = sorted(f"hoformer.{m}" for m in public - NO_API_PAGE if f"hoformer.{m}" not in titles)
    assert not missing, f"public modules without an API page in mkdocs.yml: {missing}"
    for title, page in nav:
        assert f"::: {title}" in (ROOT / "docs" / page).read_text(), (title, page)


# ------------------------------------------------------------------------------ what the pages name must exist
#: every page a reader follows commands from (the changelog is history: the paths it names may be gone)
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md",
         *sorted(p for p in (ROOT / "docs").rglob("*.md") if p.name != "changelog.md")]
#: a repository path: configs/..., benchmarks/..., tests/..., docs/... (shell-style `*`, `{a,b}`, `<placeholder>` and
#: shell variables `$x` / `${x}` stand for any text)
_PATH = re.compile(r"(?<![\w./$-])((?:configs|benchmarks|tests|docs)/(?:[\w./*<>{},-]|\$\{?\w+\}?)*[\w*>}/])")
#: an experiment of benchmarks/paper_configs.py named on its own (`hot/ltsf_cpu/etth1_96_*`)
_EXPERIMENT = re.compile(r"(?<![\w./$-])((?:hot|weaver|hoba)/(?:[\w/*<>{},-]|\$\{?\w+\}?)*[\w*>}])(?![\w./])")


def _paper_experiments() -> list[str]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("_paper_configs", ROOT / "benchmarks" / "paper_configs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.experiments())


def _expand(pattern: str) -> list[str]:
    """Brace expansion (`a_{b,c}` -> `a_b`, `a_c`); `<placeholder>` and shell variables -> `*`."""
    pattern = re.sub(r"\$\{?\w+\}?", "*", pattern)
    m = re.search(r"\{([^{}]*)\}", pattern)
    if m:
        return [x for alt in m.group(1).split(",") for x in _expand(pattern[:m.start()] + alt + pattern[m.end():])]
    return [re.sub(r"<[^<>]*>", "*", pattern)]


#: folders of files a documented command writes (`hoformer tune --export-best` -> configs/hot/tuned/): named before
#: they are committed
WRITTEN = ("configs/hot/tuned/",)


def dangling_references(text: str, experiments: list[str]) -> list[str]:
    """What ``text`` names that does not exist: a repository path that is no file or folder, a pattern that matches
    none, a ``configs/...yaml`` pattern that also covers experiments of ``benchmarks/paper_configs.py`` that are no
    file (a shell would silently run only the files; patterns with shell variables excepted), an experiment name or
    pattern the grid lacks."""
    import fnmatch

    text = re.sub(r"<!-- (ledger|paper):[\w./:-]+ -->", "", text)  # a generated table's name, a paper reference
    bad = []
    for ref in sorted(set(_PATH.findall(text))):
        for path in _expand(ref):
            if path.startswith(WRITTEN):
                continue
            if not any(c in path for c in "*?["):
                if not (ROOT / path).exists():
                    bad.append(f"{ref}: {path} does not exist")
                continue
            top = ROOT / path.split("/")[0]
            files = [f for f in (p.relative_to(ROOT).as_posix() for p in top.rglob("*"))
                     if fnmatch.fnmatchcase(f, path.rstrip("/"))]
            if not files:
                bad.append(f"{ref}: no file matches {path}")
            elif path.startswith("configs/") and path.endswith(".yaml") and "$" not in ref:
                # (a shell variable's values are checked where bash expands them: test_documented_commands_parse)
                grid = [e for e in experiments if fnmatch.fnmatchcase(f"configs/{e}.yaml", path)]
                missing = [e for e in grid if f"configs/{e}.yaml" not in files]
                if missing:
                    bad.append(f"{ref}: matches {len(files)} file(s) but also {len(missing)} experiment(s) of "
                               f"benchmarks/paper_configs.py that are not files (e.g. {missing[0]}): name the "
                               "experiments, not files")
    for ref in sorted(set(_EXPERIMENT.findall(text))):
        if not any(fnmatch.fnmatchcase(e, p) for p in _expand(ref) for e in experiments):
            bad.append(f"{ref}: no experiment of benchmarks/paper_configs.py matches")
    return bad


def test_named_files_and_experiments_exist():
    experiments = _paper_experiments()
    bad = {p.relative_to(ROOT).as_posix(): dangling_references(p.read_text(), experiments) for p in PAGES}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, "pages name files, configs or experiments that do not exist:\n" + "\n".join(
        f"{page}: {line}" for page, lines in bad.items() for line in lines)


#: a path of the package or of the results (`src/hoformer/data/series/`, `results/ledger.jsonl`)
_SOURCE = re.compile(r"(?<![\w./$-])((?:src|results)/[\w./*-]*[\w*/])")
#: a dotted name of the package: a module, or an attribute of one (`hoformer.data.unscale`)
_DOTTED = re.compile(r"(?<![\w./-])(hoformer(?:\.[A-Za-z_]\w*)+)")


def dangling_names(text: str) -> list[str]:
    """What ``text`` names of the package and its results that does not exist: a ``src/...`` or ``results/...`` path
    that matches no file, a ``hoformer.x.y`` that is neither a module nor an attribute of one (or only a deprecated
    one)."""
    import importlib
    import warnings

    text = re.sub(r"<!-- (ledger|paper):[\w./:-]+ -->", "", text)  # a generated table's name, a paper reference
    bad = [f"{ref}: no such file" for ref in sorted(set(_SOURCE.findall(text))) if not any(ROOT.glob(ref.rstrip("/")))]
    for ref in sorted(set(_DOTTED.findall(text))):
        parts = ref.split(".")
        for i in range(len(parts), 0, -1):  # the longest prefix that is a module, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:i]))
                break
            except ImportError:
                continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", DeprecationWarning)
                for name in parts[i:]:
                    obj = getattr(obj, name)
        except (AttributeError, DeprecationWarning):
            bad.append(f"{ref}: no such module or attribute")
    return bad


def test_named_modules_and_sources_exist():
    bad = {p.relative_to(ROOT).as_posix(): dangling_names(p.read_text()) for p in PAGES}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, "pages name modules or files of the package that do not exist:\n" + "\n".join(
        f"{page}: {line}" for page, lines in bad.items() for line in lines)


def test_dangling_name_is_caught():
    assert dangling_names("`hoformer.data.unscale`, `hoformer.inference`, `src/hoformer/data/series/`, "
                          "`results/ledger.jsonl`, <!-- ledger:results/overview -->") == []
    for text in ("hoformer.config.build_datamodule", "hoformer.data.nothing", "src/hoformer/data/series.py",
                 "results/nothing.jsonl", "hoformer.analysis.load_checkpoint"):  # the last: a deprecated alias
        assert dangling_names(text), text


def test_contributing_names_the_layout():
    """CONTRIBUTING.md describes every part of the repository and how to add a model, a dataset and a ledger
    experiment, with the commands that do it."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    for part in ("functional/", "layers/", "models/", "data/", "train/", "analysis/", "cli.py", "configs/",
                 "benchmarks/", "tests/", "docs/"):
        assert part in text, part
    for words in ("## Adding a model", "register_model", "create_model", "## Adding a dataset", "unscale",
                  "## Adding a ledger experiment", "benchmarks/paper_configs.py", "campaign.py --plan",
                  "results/ledger.jsonl", "campaign.py --tables", "make install", "make test", "make test-slow",
                  "make docs"):
        assert words in text, words


def test_dangling_reference_is_caught():
    """The check above fails on what it is meant to catch (so a page cannot pass it by accident)."""
    experiments = _paper_experiments()
    assert dangling_references("`configs/hot/ltsf/etth1_96_96_hot_product.yaml`, `benchmarks/paper_configs.py`, "
                               "`hot/ltsf_cpu/etth1_96_*`, `configs/hot/ltsf/`", experiments) == []
    assert dangling_references("<!-- ledger:hot/paper_runs -->\n<!-- /ledger -->", experiments) == []  # a table name
    for text in ("configs/hot/ltsf_cpu/etth1_96_192_hot_product.yaml",  # a grid entry, not a file
                 "configs/hot/ltsf/weather_96_*.yaml",  # the files 96_hot_sum / 336_hot_sum, not 96_full
                 "configs/hot/generate.py", "python benchmarks/nothing.py", "configs/hoba/{cpu,gpu}_trec_hoba.yaml",
                 "`hot/ltsf/etth1_96_97_*`", "configs/nothing/"):
        assert dangling_references(text, experiments), text


def test_make_targets_exist():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.M))
    named = {t for p in PAGES for t in re.findall(r"(?:^|`)make ([a-z][\w-]*)", p.read_text(), flags=re.M)}
    assert {"demo", "test", "docs"} <= named
    assert named <= targets, f"pages name make targets the Makefile lacks: {sorted(named - targets)}"


# ------------------------------------------------------------------------------ the commands of the pages parse
_LIGHTNING = ("fit", "validate", "test", "predict")


def documented_commands(tmp_path: Path) -> list[tuple[str, list[str]]]:
    """Every ``hoformer ...`` and ``python ...`` call of the pages' ``bash`` blocks, as bash expands it (variables,
    loops, ``$(...)``): each block runs in bash with ``hoformer`` / ``python`` replaced by stubs that record their
    arguments (``python benchmarks/paper_configs.py NAME`` without ``--run`` also prints its command, for the pages
    that capture it) and ``make`` / ``pip`` / ``cat`` by stubs that do nothing. Returns ``(page, argv)`` pairs."""
    import json

    bindir, log = tmp_path / "bin", tmp_path / "calls.jsonl"
    bindir.mkdir()
    for name in ("hoformer", "python", "python3", "make", "pip", "cat", "mkdocs"):
        stub = bindir / name
        stub.write_text(
            f"#!{sys.executable}\nimport json, subprocess, sys\n"
            f"open({str(log)!r}, 'a').write(json.dumps(['{name}', *sys.argv[1:]]) + '\\n')\n"
            f"if sys.argv[1:2] == ['benchmarks/paper_configs.py'] and '--run' not in sys.argv:\n"
            f"    sys.exit(subprocess.run([{sys.executable!r}, {str(ROOT)!r} + '/' + sys.argv[1], *sys.argv[2:]])"
            f".returncode)\n")
        stub.chmod(0o755)
    calls = []
    for page in PAGES:
        for indent, block in re.findall(r"^( *)```bash\n(.*?)^\1```", page.read_text(), flags=re.S | re.M):
            block = textwrap.dedent(block)  # a block inside a list item is indented
            log.write_text("")
            subprocess.run([shutil.which("bash"), "-c", block], cwd=tmp_path,
                           env={"PATH": str(bindir), "HOME": str(tmp_path)}, capture_output=True, text=True, timeout=120)
            calls += [(page.relative_to(ROOT).as_posix(), json.loads(line)) for line in log.read_text().splitlines()]
    return [(page, argv) for page, argv in calls if argv[0] in ("hoformer", "python", "python3")]


def _shape(argv: list[str]) -> tuple:
    """A ``hoformer fit|...`` call without the values of its options (the configs kept): the loops of a page (seeds,
    datasets) parse the same way, one of them is enough."""
    configs = [v for k, v in zip(argv, argv[1:]) if k == "--config"]
    return (*argv[:2], *configs, *sorted({a.split("=")[0] for a in argv[2:] if a.startswith("--")}))


class _Parsed(Exception):
    pass


def _parses(argv: list[str], monkeypatch) -> str | None:
    """Run the command ``argv`` (``hoformer SUB ...`` or ``python SCRIPT ...``) in this process until its argument
    parser has parsed the arguments (argparse checks names, types and choices there), then stop; the error, or None."""
    import argparse
    import importlib.util

    from hoformer import cli

    path = ROOT / argv[1]
    if argv[0] != "hoformer" and not path.is_file():
        return f"{argv[1]} does not exist"
    parse_args, parse_known_args, depth = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args, [0]

    def stop_after_parse_args(self, *a, **k):
        depth[0] += 1
        try:
            parse_args(self, *a, **k)
        finally:
            depth[0] -= 1
        raise _Parsed

    def stop_after_parse_known_args(self, *a, **k):
        out = parse_known_args(self, *a, **k)
        if depth[0]:
            return out
        raise _Parsed

    with monkeypatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_args", stop_after_parse_args)
        m.setattr(argparse.ArgumentParser, "parse_known_args", stop_after_parse_known_args)
        try:
            if argv[0] == "hoformer":
                cli.main(argv[1:])
            else:
                m.syspath_prepend(str(path.parent))
                m.setattr(sys, "argv", [str(path), *argv[2:]])
                spec = importlib.util.spec_from_file_location(f"_documented_{path.stem}", path)
                module = importlib.util.module_from_spec(spec)
                m.setitem(sys.modules, spec.name, module)  # as `python script.py` has it (dataclasses look it up)
                spec.loader.exec_module(module)
                module.main()
        except _Parsed:
            return None
        except SystemExit as e:
            return None if e.code in (0, None) else f"exit {e.code}"
    return "main() returned without parsing arguments"


@pytest.mark.skipif(shutil.which("bash") is None, reason="the pages' commands are bash")
def test_documented_commands_parse(tmp_path, monkeypatch, capsys):
    """Each ``hoformer fit|validate|test|predict`` command of the pages parses with its config and overrides
    (``--print_config``: config files, class paths, argument names and types are checked, nothing is trained); the
    argument parser of every other ``hoformer`` command and of every ``python benchmarks/...`` script accepts its
    arguments (nothing runs past the parser)."""
    from hoformer import cli

    monkeypatch.chdir(ROOT)
    calls = documented_commands(tmp_path)
    assert any(argv[:2] == ["hoformer", "fit"] for _, argv in calls), "found no `hoformer fit` in the pages"
    seen, failed = set(), []
    for page, argv in calls:
        lightning = argv[0] == "hoformer" and argv[1] in _LIGHTNING
        key = _shape(argv) if lightning else tuple(argv)  # LightningCLI parses are the slow ones
        if key in seen:
            continue
        seen.add(key)
        if lightning:
            try:
                code = cli.main([*argv[1:], "--print_config"])
            except SystemExit as e:
                code = e.code
            error = None if code in (0, None) else f"exit {code}"
        else:
            error = _parses(argv, monkeypatch)
        out = capsys.readouterr()
        if error:
            failed.append(f"{page}: {' '.join(argv)}\n    {error}: {out.err.strip().splitlines()[-1:]}")
    assert not failed, "commands of the pages that do not parse:\n" + "\n".join(failed)


def test_pages_speak_of_the_project_not_its_history():
    """README and docs describe the current project; how it got there is the changelog's (which this skips)."""
    words = re.compile(r"\b(?:sessions?|helpers?|development rounds?|rounds? \d+|issues? #?\d+)\b|(?<![\w&])#\d+\b",
                       flags=re.I)
    labels = re.compile(r"\bR\d{1,2}\b")  # numbered rounds
    found = [f"{p.relative_to(ROOT).as_posix()}:{i}: {line.strip()}" for p in PAGES
             for i, line in enumerate(p.read_text().splitlines(), 1) if words.search(line) or labels.search(line)]
    assert not found, "pages that speak of development history:\n" + "\n".join(found)
