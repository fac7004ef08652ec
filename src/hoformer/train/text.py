"""Text classification with knowledge distillation (HOBA paper 004 section 3.3, eq 8).

* :func:`kd_loss` - ``(1 - alpha) CE(z_S, y) + alpha tau^2 KL(p_T^tau || p_S^tau)`` (the paper's alpha 0.3, tau 2.0);
  the KL is ``F.kl_div(log_softmax(z_S / tau), softmax(z_T / tau), "batchmean")``. Deviation: eq 8 writes the
  arguments in the other order, ``KL(softmax(z_S / tau) || softmax(z_T / tau))``; we keep Hinton et al.'s
  distillation direction (teacher distribution as the target, its mass-covering gradient ``p_S - p_T`` w.r.t.
  ``z_S / tau``), which the paper's "KL divergence between teacher and student distributions" also reads as.
* :class:`TextClassificationTask` - trains a registered text model (default ``hoba_classifier``) on the batches of
  :class:`hoformer.data.TextDataModule` (or plain ``DataLoader`` s over its datasets), distilled from a teacher when
  a batch carries ``teacher_logits``.
* :class:`TeacherLogits` - the callback that puts them there (attached by the task's ``teacher`` /
  ``teacher_logits`` arguments): teacher logits come from a teacher ``save_pretrained`` directory (a 2D model trained
  by this project: same tokenizer) or a local Hugging Face sequence-classification checkpoint (e.g. a fine-tuned
  RoBERTa, the paper's teacher; needs the ``hf`` extra: it reads the raw texts with its own tokenizer, never the
  network), and are cached on disk (``teacher_logits``) so student epochs never re-run the teacher; a logits file
  produced elsewhere can be given alone: ``{"train": (N_train, C), "val": ..., "test": ...}`` in the datamodule's
  split order (``torch.save``). The student can inherit the teacher's embeddings and head (``init_embeddings_from``,
  ``init_head_from_teacher``; Hugging Face BERT / RoBERTa too).

Metric names: ``{train,val,test}/{loss,ce,kl,acc}`` (``kl`` only where teacher logits exist).
"""
from __future__ import annotations

import hashlib
import re
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torchmetrics.classification import MulticlassAccuracy

from hoformer._io import atomic_write
from hoformer.data import sha256sum
from hoformer.models.hf import hf_config, hf_position_offset

from hoformer.models import HoformerModel

from .base import TaskModule, check_labels
from .optim import Optimization
from .class_balance import BalancedAccuracy, ClassWeighting

__all__ = ["kd_loss", "TextClassificationTask", "TeacherLogits", "teacher_logits_fingerprint"]


def kd_loss(student_logits: torch.Tensor, labels: torch.Tensor, teacher_logits: torch.Tensor | None = None, *,
            alpha: float = 0.3, temperature: float = 2.0, weight: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eq 8: returns ``(total, ce, kl)``; without teacher logits ``total = ce`` and ``kl = 0``.

    Args:
        student_logits, teacher_logits: ``(B, C)``.
        labels: ``(B,)`` class ids.
        alpha: weight of the distillation term in ``[0, 1]``.
        temperature: softening temperature ``tau > 0`` (the KL is scaled by ``tau^2``).
        weight: optional per-class weights ``(C,)`` of the cross-entropy term (class weighting).
    """
    if not isinstance(student_logits, torch.Tensor) or not student_logits.is_floating_point():
        got = getattr(student_logits, "dtype", type(student_logits).__name__)
        raise TypeError(f"kd_loss: `student_logits` must be a floating-point tensor (B, C), got {got}")
    if student_logits.ndim != 2:
        raise ValueError(f"kd_loss: `student_logits` must be (B, C), got {tuple(student_logits.shape)}")
    if not isinstance(labels, torch.Tensor) or labels.is_floating_point() or labels.is_complex() \
            or labels.dtype == torch.bool:
        raise TypeError(f"kd_loss: `labels` must be an integer tensor (B,) of class ids, got "
                        f"{getattr(labels, 'dtype', type(labels).__name__)}")
    if labels.shape != student_logits.shape[:1]:
        raise ValueError(f"kd_loss: `labels` must be ({student_logits.shape[0]},), got {tuple(labels.shape)}")
    # cross_entropy would silently skip -100 (its ignore_index) and fail obscurely on other values
    check_labels(labels, student_logits.shape[1], "kd_loss")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"kd_loss: `alpha` must be in [0, 1], got {alpha}")
    if temperature <= 0:
        raise ValueError(f"kd_loss: `temperature` must be > 0, got {temperature}")
    ce = F.cross_entropy(student_logits.float(), labels, weight=None if weight is None else weight.float())
    if teacher_logits is None:
        return ce, ce, ce.new_zeros(())
    if teacher_logits.shape != student_logits.shape:
        raise ValueError(f"kd_loss: `teacher_logits` {tuple(teacher_logits.shape)} must match the student's "
                         f"{tuple(student_logits.shape)}")
    t = temperature
    kl = F.kl_div(F.log_softmax(student_logits.float() / t, -1), F.softmax(teacher_logits.float() / t, -1),
                  reduction="batchmean")
    return (1 - alpha) * ce + alpha * t * t * kl, ce, kl


def _ids_fingerprint(dataset) -> str:
    h = hashlib.sha256()
    for ids, lab in zip(dataset.ids, dataset.labels):
        h.update(torch.tensor(ids + [-1, lab], dtype=torch.int64).numpy().tobytes())
    return h.hexdigest()


def _hf_max_length(tok, config) -> int:
    """Tokens a Hugging Face teacher reads: its tokenizer's ``model_max_length`` (large "no limit" sentinels
    ignored), at most its position table (``max_position_embeddings``, or an alias such as ``n_positions``, less the
    RoBERTa family's ``pad + 1`` offset), 512 when neither says."""
    stated = getattr(tok, "model_max_length", None)
    limits = [int(stated)] if isinstance(stated, (int, float)) and 0 < stated <= 100_000 else []
    positions = getattr(config, "max_position_embeddings", None)
    if positions:
        limits.append(int(positions) - hf_position_offset(config.to_dict()))
    return min(limits) if limits else 512


def _teacher_fingerprint(tdir: Path, hf: bool) -> dict:
    """What a teacher's logits depend on besides the data: its weights and config (and, for a Hugging Face teacher,
    ``hf``, its tokenizer files). A hoformer teacher keeps the digests of its ``model.safetensors`` / ``config.json``
    as before, so caches written earlier stay valid."""
    if not hf:
        return {"teacher": sha256sum(tdir / "model.safetensors"), "teacher_config": sha256sum(tdir / "config.json")}
    files = sorted(p for p in tdir.iterdir() if p.is_file() and p.suffix in (".safetensors", ".bin", ".json", ".txt",
                                                                               ".model"))
    if not any(p.suffix in (".safetensors", ".bin") for p in files):
        raise FileNotFoundError(f"TextClassificationTask: Hugging Face teacher {str(tdir)!r} has no weights "
                                "(*.safetensors / *.bin)")
    return {"teacher": {p.name: sha256sum(p) for p in files}}


def _data_fingerprint(dm, hf: bool = False) -> dict:
    """What the teacher logits of every split depend on in the data: the student's token ids (and ``max_len``) for a
    teacher that shares the student's tokenizer; the raw texts and labels for a Hugging Face teacher, which reads the
    texts with its own tokenizer (a retrained student vocabulary, not bit-reproducible, must not re-run it)."""
    if not hf:
        return {"max_len": dm.max_len, **{s: _ids_fingerprint(dm.datasets[s]) for s in ("train", "val", "test")}}
    out = {}
    for s in ("train", "val", "test"):
        h = hashlib.sha256()
        for text, label in zip(dm.texts(s), dm.datasets[s].labels):
            h.update(text.encode("utf-8") + b"\0" + str(int(label)).encode() + b"\0")
        out[f"{s}_texts"] = h.hexdigest()
    return out


def teacher_logits_fingerprint(datamodule) -> dict:
    """The data part of a teacher-logits cache's ``fingerprint`` (``max_len`` and a hash of every split's token ids
    and labels, in order): store it as ``{"train": (N, C), "val": ..., "test": ..., "fingerprint": this}`` when the
    logits come from elsewhere (e.g. a local Hugging Face teacher), so a student run on other data is refused."""
    datamodule.setup()
    return _data_fingerprint(datamodule)


class TeacherLogits(pl.Callback):
    """Puts the teacher's logits of every example into its batch, ``batch["teacher_logits"] (B, C)``, the rows of
    the batch's ``index`` in its split, for the distillation term of :class:`TextClassificationTask`.

    :class:`TextClassificationTask` attaches one (``configure_callbacks``) when it is given ``teacher`` or
    ``teacher_logits``; the task itself reads batches only. The logits of a split are computed once (or read from
    ``cache``) when ``fit`` / ``validate`` / ``test`` starts, from the text data: ``data`` when given, else the
    trainer's datamodule (a :class:`hoformer.data.TextDataModule`: its splits, their order and, for a Hugging Face
    teacher, their raw texts and class names).

    Args:
        teacher: ``save_pretrained`` directory of the teacher (same tokenizer as the data), or a local Hugging Face
            ``AutoModelForSequenceClassification`` directory (its own tokenizer in the same directory).
        cache: file of the teacher's logits per split (written when ``teacher`` is given and the file is missing
            or stale; read alone when ``teacher`` is None). Keyed by a fingerprint of the data (and of the
            teacher's files): a file computed on other data is recomputed (with ``teacher``) or refused (without).
        data: the text datamodule the logits are for (default: the trainer's).
    """

    def __init__(self, teacher: str | None = None, cache: str | None = None, data: Any = None) -> None:
        if teacher is None and cache is None:
            raise ValueError("TeacherLogits: give `teacher` (a teacher directory), `cache` (a logits file) or both")
        self.teacher, self.cache, self.data = teacher, cache, data
        self.logits: dict[str, torch.Tensor] = {}
        self.data_fingerprint: dict | None = None  # the data the in-memory logits belong to

    def _text_data(self, trainer):
        dm = self.data if self.data is not None else getattr(trainer, "datamodule", None)
        if dm is None or not hasattr(dm, "datasets"):
            raise RuntimeError("TeacherLogits: teacher logits are computed on the text data: train with a "
                               "hoformer.data.TextDataModule as the datamodule or pass it as TeacherLogits(data=...); "
                               f"got {type(dm).__name__}")
        dm.setup()
        return dm

    def load(self, splits, data, num_classes: int, device: torch.device | str = "cpu") -> None:
        """Make ``self.logits[s]`` ``(len(split s), num_classes)`` for ``s`` in ``splits`` (every split is loaded or
        computed together), on ``device``."""
        cache_path = Path(self.cache) if self.cache else None
        # the cache is keyed by the data it was computed on (token ids + labels of every split, in order, and max_len;
        # for a Hugging Face teacher the raw texts + labels) and, when the teacher directory is known, by the
        # teacher's weights *and* config; logits loaded without a teacher keep the kind of key they were stored with
        hf = (hf_config(Path(self.teacher)) is not None if self.teacher else
              "train_texts" in (self.data_fingerprint or {}))
        data_fp = _data_fingerprint(data, hf=hf)
        if all(s in self.logits for s in splits) and self.data_fingerprint == data_fp:
            return  # the in-memory logits are for this very data (a task reused with other data is not)
        self.logits.clear()
        fp = None
        if self.teacher:
            fp = {**_teacher_fingerprint(Path(self.teacher), hf), **data_fp}
        cached = {}
        if cache_path is not None and cache_path.is_file():
            from hoformer.checkpoint import read_checkpoint

            cached = read_checkpoint(cache_path, fn="TextClassificationTask", what="teacher_logits cache")
            stored = cached.get("fingerprint")
            if fp is not None and stored != fp:
                cached = {}  # stale: other teacher weights / config or other data / tokenizer: recomputed below
            elif fp is None and stored is None:
                warnings.warn(f"TextClassificationTask: teacher_logits {cache_path} carries no fingerprint, so it "
                              "cannot be checked against this data (order, tokenizer, max_len); only shapes are "
                              "checked. Store one with hoformer.train.text.teacher_logits_fingerprint(datamodule).",
                              stacklevel=2)
            elif fp is None and "train_texts" in stored:  # written by a Hugging Face teacher: keyed to the texts
                data_fp = _data_fingerprint(data, hf=True)
            if fp is None and stored is not None and {k: stored.get(k) for k in data_fp} != data_fp:
                bad = sorted(k for k in data_fp if stored.get(k) != data_fp[k])
                raise ValueError(f"TextClassificationTask: teacher_logits {cache_path} was computed on other data "
                                 f"(fingerprint differs for {bad}: another tokenizer, max_len, split or order); "
                                 "pass `teacher` to recompute it or delete the file")
        missing = [s for s in ("train", "val", "test") if s not in cached]
        if missing and self.teacher is None:
            raise FileNotFoundError(f"TextClassificationTask: teacher_logits {cache_path} lacks splits {missing} "
                                    "and no `teacher` directory was given to compute them")
        if missing:
            run = _run_hf_teacher if hf else _run_teacher
            cached.update(run(Path(self.teacher), data, missing, num_classes, device))
            cached["fingerprint"] = fp
            if cache_path is not None:
                atomic_write(cache_path, lambda p: torch.save(cached, p))
        for s in ("train", "val", "test"):
            t = cached[s]
            if t.shape != (len(data.datasets[s]), num_classes):
                raise ValueError(f"TextClassificationTask: teacher logits for {s!r} have shape {tuple(t.shape)}, "
                                 f"expected {(len(data.datasets[s]), num_classes)}")
            self.logits[s] = t.float().to(device)
        self.data_fingerprint = data_fp

    def _load(self, trainer, pl_module, splits) -> None:
        self.load(splits, self._text_data(trainer), int(pl_module.num_classes), pl_module.device)

    def on_fit_start(self, trainer, pl_module) -> None:
        self._load(trainer, pl_module, ("train", "val"))

    def on_validation_start(self, trainer, pl_module) -> None:
        self._load(trainer, pl_module, ("val",))

    def on_test_start(self, trainer, pl_module) -> None:
        self._load(trainer, pl_module, ("test",))

    def attach(self, batch: dict, split: str) -> dict:
        """``batch`` with ``teacher_logits``: the rows of its ``index`` in ``split``'s logits."""
        batch["teacher_logits"] = self.logits[split][batch["index"].to(self.logits[split].device)]
        return batch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.attach(batch, "train")

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self.attach(batch, "val")

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self.attach(batch, "test")


@torch.no_grad()
def _run_teacher(tdir: Path, dm, splits, num_classes: int, device) -> dict[str, torch.Tensor]:
    from hoformer.models import from_pretrained

    teacher = from_pretrained(tdir, map_location="cpu").to(device).eval()
    out = {}
    loaders = {"train": dm.ordered_train_dataloader, "val": dm.val_dataloader, "test": dm.test_dataloader}
    for s in splits:
        logits = torch.empty(len(dm.datasets[s]), num_classes)
        for b in loaders[s]():
            logits[b["index"]] = teacher(b["ids"].to(device), b["mask"].to(device)).float().cpu()
        out[s] = logits
    return out


@torch.no_grad()
def _run_hf_teacher(tdir: Path, dm, splits, num_classes: int, device) -> dict[str, torch.Tensor]:
    """Logits of a local Hugging Face sequence classifier on the raw texts of ``splits`` (its own tokenizer,
    truncated to its own maximum length), in the datamodule's order; ``local_files_only``: never the network."""
    try:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer
    except ImportError as e:
        raise ImportError(f"TextClassificationTask: teacher {str(tdir)!r} is a Hugging Face checkpoint; running it "
                          "needs the `transformers` package (pip install 'hoformer[hf]')") from e
    teacher = AutoModelForSequenceClassification.from_pretrained(tdir, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(tdir, local_files_only=True)
    n = teacher.config.num_labels
    names = [str(teacher.config.id2label[i]) for i in range(n)]
    if n != num_classes:
        raise ValueError(f"TextClassificationTask: teacher {str(tdir)!r} has num_labels={n}, the data "
                         f"{len(dm.class_names)} classes {dm.class_names}")
    generic = all(re.fullmatch(r"LABEL_\d+", x) for x in names)
    if not generic and [x.lower() for x in names] != [c.lower() for c in dm.class_names]:
        raise ValueError(f"TextClassificationTask: teacher {str(tdir)!r} labels {names} (config.json id2label) are "
                         f"not the data's classes {dm.class_names} in that order; a teacher trained with another "
                         "label order would distil swapped classes (fix id2label if only the names differ)")
    teacher = teacher.to(device).eval()
    limit = _hf_max_length(tok, teacher.config)
    bs = dm.eval_batch_size or dm.batch_size
    out = {}
    for s in splits:
        texts = dm.texts(s)
        logits = torch.empty(len(texts), n)
        for i in range(0, len(texts), bs):
            enc = tok(texts[i:i + bs], padding=True, truncation=True, max_length=limit, return_tensors="pt")
            logits[i:i + bs] = teacher(**enc.to(device)).logits.float().cpu()
        out[s] = logits
    return out


class TextClassificationTask(ClassWeighting, TaskModule):
    """Sequence classification (``ids, mask -> logits``) with optional distillation (eq 8).

    Batches (:func:`hoformer.data.text.collate_text`): dicts with ``ids (B, L)``, ``mask (B, L)`` bool, ``label (B,)``
    and, for distillation, ``teacher_logits (B, C)`` (added by the :class:`TeacherLogits` callback that ``teacher`` /
    ``teacher_logits`` attach, or by the data itself). The task reads nothing else: the model's ``vocab_size``,
    ``pad_id``, ``max_len`` and ``num_classes`` come from the data through the CLI's links, and the first batch of a
    run is checked against them (token ids below ``vocab_size``, padding with ``pad_id``).

    Args:
        model, optim: see :class:`~hoformer.train.base.TaskModule` (paper: AdamW, weight decay 0.01, 10% linear
            warm-up).
        kd_alpha, kd_temperature: eq 8 (paper: 0.3, 2.0). Ignored without teacher logits.
        teacher: ``save_pretrained`` directory of the teacher (same tokenizer as the datamodule), or a local Hugging
            Face ``AutoModelForSequenceClassification`` directory (``config.json`` with a ``model_type``; its own
            tokenizer in the same directory; its ``num_labels`` and, unless generic ``LABEL_k``, its ``id2label``
            names must match the dataset's classes in order).
        teacher_logits: cache file of the teacher's logits per split (written when ``teacher`` is given and the
            cache is missing or stale; read alone when ``teacher`` is None). See :class:`TeacherLogits`.
        init_embeddings_from: ``save_pretrained`` directory whose ``embed.*`` weights initialise the student, or a
            local Hugging Face BERT / RoBERTa checkpoint (the student then needs its width and, through the
            datamodule's ``tokenizer``, its vocabulary and pad id; see ``HOBAClassifier.load_embeddings_from``).
        init_head_from_teacher: also copy the classifier head (``head.*``) from ``init_embeddings_from`` (the paper
            initialises "embeddings and classification heads" from the teacher; needs the same width and classes).
        class_weight: None, ``"balanced"`` or one cross-entropy weight per class
            (:mod:`hoformer.train.class_balance`); ``{stage}/bacc`` (balanced accuracy) is logged beside
            ``{stage}/acc`` either way.

    The trained model with its tokenizer is exported by the :class:`~hoformer.train.callbacks.ExportPretrained` callback.
    """

    selection = ("val/acc", "max")

    def __init__(
        self,
        model: HoformerModel,
        optim: Optimization | None = Optimization(lr=1e-3, weight_decay=0.01),
        kd_alpha: float = 0.3,
        kd_temperature: float = 2.0,
        teacher: str | None = None,
        teacher_logits: str | None = None,
        init_embeddings_from: str | None = None,
        init_head_from_teacher: bool = False,
        class_weight: str | list[float] | None = None,
    ) -> None:
        if not 0.0 <= kd_alpha <= 1.0 or kd_temperature <= 0:
            raise ValueError(f"TextClassificationTask: need kd_alpha in [0, 1] and kd_temperature > 0, got "
                             f"{kd_alpha}, {kd_temperature}")
        if init_head_from_teacher and not init_embeddings_from:
            raise ValueError("TextClassificationTask: init_head_from_teacher=True needs init_embeddings_from (the "
                             "teacher's save_pretrained directory)")
        super().__init__(model, optim)
        n_cls = getattr(self.model, "num_classes", None)
        if n_cls is None:
            raise ValueError(f"TextClassificationTask: model {self.model_name!r} has no `num_classes`")
        # validate_args=False: kd_loss validates the labels (torchmetrics' own check is a host sync per step on GPU)
        self.acc = torch.nn.ModuleDict({s: MulticlassAccuracy(n_cls, average="micro", validate_args=False)
                                        for s in ("fit", "val", "test")})
        self.bacc = torch.nn.ModuleDict({s: BalancedAccuracy(n_cls) for s in ("fit", "val", "test")})
        self.num_classes = n_cls
        self._init_class_weight(class_weight, n_cls)
        #: the :class:`TeacherLogits` callback that adds ``teacher_logits`` to the batches (None without a teacher)
        self.distillation = TeacherLogits(teacher, teacher_logits) if teacher or teacher_logits else None
        self._embeddings_loaded = False
        self._batch_checked = False

    def configure_callbacks(self):
        return super().configure_callbacks() + ([self.distillation] if self.distillation is not None else [])

    def setup(self, stage: str) -> None:
        super().setup(stage)
        self._batch_checked = False  # the first batch of every run is checked against the model
        if stage == "fit" and self.hparams.init_embeddings_from and not self._embeddings_loaded:
            self.model.load_embeddings_from(self.hparams.init_embeddings_from, head=self.hparams.init_head_from_teacher)
            self._embeddings_loaded = True

    def _check_batch(self, ids: torch.Tensor, mask: torch.Tensor) -> None:
        """Token ids inside the model's vocabulary and padding with its ``pad_id`` (else padding trains and a real
        token does not); one host sync, on the first batch of a run."""
        vocab, pad = getattr(self.model, "vocab_size", None), getattr(self.model, "pad_id", None)
        top = int(ids.max()) if ids.numel() else -1
        if vocab is not None and top >= vocab:
            raise ValueError(f"TextClassificationTask: the batch holds token id {top} but the model's vocab_size is "
                             f"{vocab}; set the model's vocab_size to the tokenizer's vocab_size (> {top})")
        pads = torch.unique(ids[~mask]) if pad is not None else ids.new_empty(0)
        if pads.numel() and pads.tolist() != [pad]:
            raise ValueError(f"TextClassificationTask: the batch pads with id(s) {pads.tolist()[:5]} but the model's "
                             f"pad_id is {pad}; set the model's pad_id to the tokenizer's pad_id")

    # -------------------------------------------------------------------------------------------- steps
    def shared_step(self, batch, stage: str) -> torch.Tensor:
        if not isinstance(batch, dict) or not {"ids", "mask", "label"} <= set(batch):
            raise TypeError("TextClassificationTask: batches must be dicts with 'ids', 'mask', 'label' "
                            "(hoformer.data.TextDataModule)")
        if not self._batch_checked:
            self._check_batch(batch["ids"], batch["mask"])
            self._batch_checked = True
        logits = self.model(batch["ids"], batch["mask"])
        t = batch.get("teacher_logits")
        loss, ce, kl = kd_loss(logits, batch["label"], t, alpha=self.hparams.kd_alpha,
                               temperature=self.hparams.kd_temperature, weight=self.class_weights())
        bs = batch["ids"].shape[0]
        acc = self.acc["fit" if stage == "train" else stage]
        acc.update(logits.detach(), batch["label"])  # the epoch value only (forward would also compute a batch one)
        bacc = self.bacc["fit" if stage == "train" else stage]
        bacc.update(logits.detach(), batch["label"])
        on_step, sync = stage == "train", stage != "train"  # evaluation means over all ranks under DDP
        self.log(f"{stage}/loss", loss, on_step=on_step, on_epoch=True, prog_bar=True, batch_size=bs, sync_dist=sync)
        self.log(f"{stage}/ce", ce, on_step=False, on_epoch=True, batch_size=bs, sync_dist=sync)
        if t is not None:
            self.log(f"{stage}/kl", kl, on_step=False, on_epoch=True, batch_size=bs, sync_dist=sync)
        self.log(f"{stage}/acc", acc, on_step=False, on_epoch=True, prog_bar=stage != "train", batch_size=bs)
        self.log(f"{stage}/bacc", bacc, on_step=False, on_epoch=True, batch_size=bs)
        return loss

    def _train_labels(self, batch) -> torch.Tensor:
        return batch["label"]
