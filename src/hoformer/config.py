"""Configs: the one reader of ``hoformer`` configs (:func:`resolve_config`, composition included).

* :func:`expand_configs` - ``--config X`` -> ``--config BASE ... --config X`` for the configs ``X`` extends (its
  leading ``# extends: <relative path>`` lines), as LightningCLI reads several ``--config`` files: later values
  override earlier ones, a list written ``key+:`` extends the earlier list, a list written ``key:`` replaces it; and a
  distilled student's ``teacher_run`` -> the teacher, logits cache, embeddings and tokenizer it links.
* :func:`resolve_config` - the effective configuration of ``hoformer fit --config X [overrides]``, resolved by the
  very parser of the commands; every command that takes a config reads it here.

The datamodule a config or a checkpoint describes is built by :mod:`hoformer.inference` (``build_datamodule``,
``checkpoint_datamodule``).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

__all__ = ["expand_configs", "resolve_config"]


def _check_yaml(path: Path, data: bytes) -> None:
    """A config that is not UTF-8 text or not YAML raises a ``ValueError`` naming the file (and the line)."""
    import yaml

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"hoformer: config {str(path)!r} is not a text file (byte {e.start} is not UTF-8); expected "
                         "a YAML config") from None
    try:
        yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ValueError(f"hoformer: config {str(path)!r} is not valid YAML{where}: {problem}") from None


def _bases(path: Path, seen: tuple[Path, ...] = ()) -> list[str]:
    """The configs ``path`` extends (its leading ``# extends: <relative path>`` comment lines), bases first,
    recursively; ``path`` itself last."""
    path = Path(path)
    if path in seen:
        raise ValueError(f"hoformer: config {path} extends itself ({' -> '.join(map(str, seen + (path,)))})")
    out: list[str] = []
    try:
        text = path.read_bytes()
    except OSError:  # LightningCLI reports a missing / unreadable config
        return [str(path)]
    _check_yaml(path, text)
    lines = text.decode().splitlines()
    for line in lines:
        if not line.startswith("#"):
            break
        if line.startswith("# extends:"):
            base = Path(os.path.normpath(path.parent / line.split(":", 1)[1].strip()))
            if not base.is_file():
                raise FileNotFoundError(f"hoformer: config {path} extends {base}, which does not exist")
            out += _bases(base, seen + (path,))
    return out + [str(path)]


#: what ``teacher_run: DIR`` (a config's top-level key or ``--teacher_run DIR``) sets: ``(argument, path in DIR)``
TEACHER_RUN_LINKS = (
    ("--model.init_args.teacher", "pretrained"),
    ("--model.init_args.teacher_logits", "pretrained/teacher_logits.pt"),
    ("--model.init_args.init_embeddings_from", "pretrained"),
    ("--data.init_args.tokenizer", "pretrained"),
)


def _top_level(path: str, key: str):
    """The top-level ``key`` of the YAML file ``path`` (``None`` when absent or unreadable)."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return None
    return data.get(key) if isinstance(data, dict) else None


def teacher_run_overrides(argv: list[str]) -> list[str]:
    """The overrides that ``teacher_run`` stands for in the ``hoformer fit|...`` arguments ``argv`` (its configs
    already expanded): a distilled student's teacher is one run folder, ``DIR``, whose ``save_pretrained`` export
    gives the teacher (``DIR/pretrained``), the logits cache (``DIR/pretrained/teacher_logits.pt``), the embeddings
    the student starts from and the data's tokenizer (:data:`TEACHER_RUN_LINKS`). ``--teacher_run DIR`` on the command
    line wins over a config's ``teacher_run:``; an explicit ``--model.init_args.teacher ...`` after the configs wins
    over both."""
    run = None
    for i, a in enumerate(argv):
        if a in ("--config", "-c") and i + 1 < len(argv):
            run = _top_level(argv[i + 1], "teacher_run") or run
        elif a.startswith("--config="):
            run = _top_level(a.split("=", 1)[1], "teacher_run") or run
    for i, a in enumerate(argv):
        if a == "--teacher_run" and i + 1 < len(argv):
            run = argv[i + 1]
        elif a.startswith("--teacher_run="):
            run = a.split("=", 1)[1]
    if run in (None, "", "null", "None"):
        return []
    return [f"{arg}={Path(str(run)) / sub}" for arg, sub in TEACHER_RUN_LINKS]


def expand_configs(argv: list[str]) -> list[str]:
    """``--config X`` -> ``--config BASE ... --config X`` for each base config ``X`` extends (a shared trainer, a
    family's protocol), so an experiment file holds only what differs; and a ``teacher_run`` (a config's or
    ``--teacher_run``) -> the four arguments it links (:func:`teacher_run_overrides`), placed right after the last
    config so that they override the configs and later command-line arguments override them."""
    out, i, last = [], 0, None
    while i < len(argv):
        a = argv[i]
        if a in ("--config", "-c") and i + 1 < len(argv):
            for p in _bases(Path(argv[i + 1])):
                out += [a, p]
            i += 2
            last = len(out)
            continue
        if a.startswith("--config="):
            out += [f"--config={p}" for p in _bases(Path(a.split("=", 1)[1]))]
            last = len(out)
        else:
            out.append(a)
        i += 1
    links = teacher_run_overrides(out)
    if links:
        at = last if last is not None else len(out)
        out = out[:at] + links + out[at:]
    return out


_PARSER = None  # the parser of `hoformer fit`, built at the first resolve


def resolve_config(config, overrides: Sequence[str] = (), *, partial: bool = False) -> dict:
    """The effective configuration of ``hoformer fit --config CONFIG [OVERRIDES...]`` as a plain dict (``trainer``,
    ``model``, ``data``, ``seed_everything``, ... with every default filled in), resolved by the very parser of the
    ``fit`` / ``test`` / ... commands: the configs ``CONFIG`` extends come first, a list key written ``key+:`` extends
    the list of the configs before it, ``--section.key=value`` overrides apply last. Nothing is instantiated.
    Every command that takes a config (``analyze``, ``export``, ``forecast``, the benchmark launchers) reads it here.
    A missing file, a file that is not YAML, or an invalid value raise a ``ValueError`` naming the file.
    ``partial``: a config of some sections only (e.g. a ``data`` section for ``hoformer forecast``) is not refused for
    the sections it lacks (their values are then not validated either)."""
    global _PARSER
    path = Path(config)
    if not path.is_file():
        raise FileNotFoundError(f"config {str(path)!r} does not exist" if not path.exists() else
                                f"config {str(path)!r} is not a file")
    argv = expand_configs(["fit", "--config", str(path), *overrides])
    if _PARSER is None:
        from hoformer.lightning_cli import HoformerCLI

        _PARSER = HoformerCLI(parse_only=True).parser
    import io
    from contextlib import redirect_stderr

    err = io.StringIO()
    try:
        with redirect_stderr(err):
            ns = _PARSER.parse_args(argv, _skip_validation=partial)
    except SystemExit:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        msg = next((ln for ln in lines if "error:" in ln), lines[-1] if lines else "invalid config")
        raise ValueError(f"config {str(path)!r}: {msg.split('error:', 1)[-1].strip()}") from None
    out = ns["fit"].as_dict()
    # the arguments of Trainer.fit and of the command, not of the configuration
    for key in ("config", "ckpt_path", "weights_only", "overwrite", "allow_data_mismatch", "teacher_run"):
        out.pop(key, None)
    return out
