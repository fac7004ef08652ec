"""Inputs that used to pass without a word: finite inputs whose attention overflows, a diverged training step, a
file-size limit during a save, a device string for ``on_device``, weights changed after ``save_pretrained``, a NaN
or past deadline, a lock file that names no run; and the rest of what a new user meets: a student's teacher named
once, a text table in another encoding, the export's quiet conversion and a misspelled argument's one-line error."""
from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import time
import warnings
from pathlib import Path

import pytest
import torch

import hoformer.functional as HF
from hoformer.models import create_model, from_pretrained

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------ the functional API
def _qkv(scale: float = 1.0):
    g = torch.Generator().manual_seed(0)
    q = [torch.randn(1, 2, n, 8, generator=g) * scale for n in (4, 5)]
    k = [torch.randn(1, 2, n, 8, generator=g) * scale for n in (4, 5)]
    return q, k, torch.randn(1, 2, 4, 5, 8, generator=g)


@pytest.mark.parametrize("call", [
    lambda q, k, v: HF.kronecker_attention(q, k, v),
    lambda q, k, v: HF.kronecker_attention(q, k, v, combine="sum"),
    lambda q, k, v: HF.full_attention(q[0][:, :, :, None].expand(-1, -1, -1, 5, -1),
                                      k[0][:, :, :, None].expand(-1, -1, -1, 5, -1), v),
    lambda q, k, v: HF.block_attention(q[0], k[0], v[:, :, :, 0], block_size=2),
], ids=["kronecker_product", "kronecker_sum", "full", "block"])
def test_the_public_attention_functions_refuse_a_nonfinite_result_of_finite_inputs(call):
    q, k, v = _qkv()
    assert torch.isfinite(call(q, k, v)).all()
    q, k, _ = _qkv(1e30)
    with pytest.raises(FloatingPointError, match=r"the output is not finite \(NaN / inf\) although the inputs "
                                                 r"\(q.*\) are finite: their largest magnitude, [\d.]+e\+30 in `q"):
        call(q, k, v)
    q[0][0, 0, 0, 0] = float("nan")  # a non-finite input is the caller's: its NaN propagates as in torch
    assert not torch.isfinite(call(q, k, v)).all()


# ------------------------------------------------------------------------------------------- training
def test_a_diverged_step_names_the_step_the_learning_rate_and_the_last_finite_loss(tmp_path):
    from _trainer import quiet_trainer

    from hoformer.data import LTSFDataModule
    from hoformer.train import ForecastingTask, NonFiniteError, Optimization

    dm = LTSFDataModule(synthetic=True, synthetic_length=300, seq_len=32, pred_len=16, batch_size=16)
    model = create_model("hot_forecaster", seq_len=32, pred_len=16, num_variates=7, dim=16, depth=1, num_heads=2,
                         patch_size=8)
    task = ForecastingTask(model, Optimization(lr=1e12, schedule="constant"))
    with pytest.raises(NonFiniteError) as info:
        quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=5, limit_val_batches=0).fit(task, dm)
    msg = str(info.value)
    assert re.search(r"training diverged at global step [1-4] \(epoch 0\)", msg), msg
    assert re.search(r"at learning rate 1e\+12", msg) and re.search(r"last finite training loss was [\d.]+ at step "
                                                                    r"\d", msg), msg
    assert "the optimisation, not the input, is the cause" in msg and "lower the learning rate" in msg


# ----------------------------------------------------------------------------------------------- files
def test_a_file_size_limit_during_a_checkpoint_save_names_the_file_and_the_cause(tmp_path):
    resource = pytest.importorskip("resource")
    from hoformer.train.tasks import AtomicCheckpointIO

    target = tmp_path / "last.ckpt"
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))  # this process only; Python ignores SIGXFSZ
    try:
        with pytest.raises(OSError) as info:
            AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.zeros(100_000)}}, target)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    msg = str(info.value)
    assert str(target) in msg and "file-size limit of this process (ulimit -f: 65536 bytes" in msg, msg
    assert "nothing was written" in msg and not target.exists() and not list(tmp_path.iterdir())


def test_weights_changed_after_save_pretrained_are_refused_naming_the_file(tmp_path):
    model = create_model("hot_forecaster", seq_len=16, pred_len=8, num_variates=3, dim=16, depth=1, num_heads=2)
    d = model.save_pretrained(tmp_path / "m")
    assert len(json.loads((d / "config.json").read_text())["weights_sha256"]) == 64
    raw = bytearray((d / "model.safetensors").read_bytes())
    raw[-3] ^= 0x01  # one bit of one weight: every other check passes
    (d / "model.safetensors").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=re.escape(f"from_pretrained: {d / 'model.safetensors'} is not the file "
                                                   "save_pretrained wrote")) as info:
        from_pretrained(d)
    assert "verify_weights=False" in str(info.value)
    loaded = from_pretrained(d, verify_weights=False)  # loaded anyway, as asked: one weight differs
    changed = [k for k, v in loaded.state_dict().items() if not torch.equal(v, model.state_dict()[k])]
    assert len(changed) == 1


def test_on_device_takes_a_bool_not_a_device_name():
    from hoformer.data import LTSFDataModule

    with pytest.raises(TypeError, match=r"`on_device` must be True or False .* got 'cuda:7'"):
        LTSFDataModule(synthetic=True, on_device="cuda:7")
    assert LTSFDataModule(synthetic=True, on_device=True).on_device is True


# --------------------------------------------------------------------------------- deadline, run folder
@pytest.mark.parametrize("at", ["nan", float("nan"), float("inf"), "-inf", "tomorrow"])
def test_a_deadline_that_is_no_point_in_time_is_refused(at):
    from hoformer.train import Deadline

    with pytest.raises(ValueError, match=r"Deadline: `at` must be a Unix time \(seconds\) or an ISO 8601 date-time"):
        Deadline(at=at)


def test_a_past_deadline_is_said_when_training_starts(capsys):
    from types import SimpleNamespace

    from hoformer.train import Deadline

    d = Deadline(at=time.time() - 60)
    d.on_train_start(SimpleNamespace(is_global_zero=True, train_dataloader=[0, 1]), None)
    assert re.search(r"Deadline: at=\S+ is \d+ s in the past: no epoch can end before it, so this attempt trains one "
                     r"epoch, writes its last.ckpt and stops", capsys.readouterr().err)


@pytest.mark.parametrize("content", ["", "{not json", '{"pid": null, "host": null}', "[1, 2]"])
def test_a_lock_file_that_names_no_run_is_stale(tmp_path, capsys, content):
    import os

    from hoformer.train.guards import LOCK_NAME, hold_run_folder

    lock = tmp_path / LOCK_NAME
    lock.write_text(content)
    past = time.time() - 60  # left by a run killed between creating the lock and writing it
    os.utime(lock, (past, past))
    release = hold_run_folder(tmp_path)
    assert json.loads(lock.read_text())["pid"] == os.getpid()
    release()
    err = capsys.readouterr().err
    assert "taking over the lock file" in err and "which names no run" in err and "pid None" not in err


# -------------------------------------------------------------------------------------------- recipes
def test_a_student_names_its_teacher_run_once(tmp_path):
    from hoformer.config import resolve_config

    def linked(cfg):
        init = cfg["model"]["init_args"]
        return (init["teacher"], init["teacher_logits"], init["init_embeddings_from"],
                cfg["data"]["init_args"]["tokenizer"])

    generic = resolve_config(REPO / "configs" / "hoba" / "cpu_student.yaml")
    assert linked(generic) == (None, None, None, None)  # the recipe names no run folder to edit
    mine = resolve_config(REPO / "configs" / "hoba" / "cpu_student.yaml", ["--teacher_run=runs/my_teacher",
                                                                           "--data.init_args.dataset=imdb"])
    p = "runs/my_teacher/pretrained"
    assert linked(mine) == (p, f"{p}/teacher_logits.pt", p, p)
    trec = resolve_config(REPO / "configs" / "hoba" / "cpu_trec_hoba.yaml")  # its file's teacher_run: TREC's teacher
    assert linked(trec)[0] == "runs/hoba/cpu_trec_teacher/pretrained"
    # an explicit argument after the configs still wins
    own = resolve_config(REPO / "configs" / "hoba" / "cpu_trec_hoba.yaml", ["--model.init_args.teacher=/hf/roberta"])
    assert linked(own)[:2] == ("/hf/roberta", "runs/hoba/cpu_trec_teacher/pretrained/teacher_logits.pt")


def test_a_text_table_in_another_encoding_through_the_datamodule(tmp_path):
    from hoformer.data import TextDataModule

    rows = "review,sentiment\n" + "".join(f"caf\xe9 number {i} was {'good' if i % 2 else 'bad'},"
                                          f"{'positive' if i % 2 else 'negative'}\n" for i in range(40))
    for name in ("train.csv", "test.csv"):
        (tmp_path / name).write_bytes(rows.encode("latin-1"))
    with pytest.raises(ValueError, match=r"not valid utf-8 .*TextDataModule\(encoding='latin-1'\), "
                                         r"--data.init_args.encoding latin-1"):
        TextDataModule(dataset="imdb", root=str(tmp_path), verify=False, vocab_size=60).setup("fit")
    dm = TextDataModule(dataset="imdb", root=str(tmp_path), verify=False, vocab_size=60, encoding="latin-1")
    dm.setup("fit")
    assert dm.num_classes == 2 and len(dm.datasets["train"]) + len(dm.datasets["val"]) == 40
    with pytest.raises(ValueError, match="`encoding` applies to dataset='csv' and 'imdb'"):
        TextDataModule(dataset="trec", encoding="latin-1")


def test_the_imdb_reader_takes_gzip_tables_and_lists_what_it_looked_for(tmp_path):
    import gzip

    from hoformer.data import read_text_split

    for name in ("train.csv.gz", "test.csv.gz"):
        with gzip.open(tmp_path / name, "wt") as f:
            f.write("review,sentiment\ngood film,positive\nbad film,negative\n")
    assert read_text_split("imdb", "train", tmp_path, verify=False)[1] == [1, 0]
    other = tmp_path / "other"
    other.mkdir()
    (other / "reviews_2024.csv.gz").write_bytes(b"")
    with pytest.raises(FileNotFoundError) as info:
        read_text_split("imdb", "train", other, verify=False)
    msg = str(info.value)
    assert f"looked for {other / 'train.csv'}, {other / 'train.csv.gz'}, {other / 'IMDB Dataset.csv'}" in msg
    assert f"{other} holds reviews_2024.csv.gz: rename them, or read them as TextDataModule(dataset='csv'" in msg


# --------------------------------------------------------------------------------------- the commands
def test_a_misspelled_model_argument_is_one_line_with_its_suggestion():
    from hoformer import cli

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as e:
        cli.main(["fit", "--config", str(REPO / "configs/hot/ltsf_cpu/etth1_96_96_hot_product.yaml"),
                  "--model.model.init_args.dimm", "64"])
    text = err.getvalue()
    assert e.value.code == 2 and text.count("did you mean 'dim'?") == 1, text
    assert text.startswith("error: hoformer.models.HOTForecaster has no argument 'dimm': did you mean 'dim'?")
    assert "Union" not in text and "usage:" not in text and len(text.splitlines()) == 2


def test_the_onnx_conversion_is_quiet(monkeypatch, capsys):
    from hoformer import export

    with export._quiet_converter():  # what torch.onnx logs and warns about that is not about the model
        logging.getLogger("torch.onnx._internal.exporter._registration").warning(
            "torchvision is not installed. Skipping torchvision::nms")
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated", FutureWarning)
    assert "torchvision" not in capsys.readouterr().err
    ort = pytest.importorskip("onnxruntime")
    seen = {}

    class Session:  # ONNX Runtime's session, as the verification opens it
        def __init__(self, path, sess_options=None, providers=None):
            seen["level"] = sess_options.log_severity_level
            raise RuntimeError("stop")

    monkeypatch.setattr(ort, "InferenceSession", Session)
    with pytest.raises(RuntimeError, match="stop"):
        export._run_file(Path("m.onnx"), "onnx", (torch.zeros(1),), {})
    assert seen["level"] == 3  # errors only: not one "Could not find a CPU kernel" warning per CastLike node
