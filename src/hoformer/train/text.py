"""Text classification with knowledge distillation (HOBA paper 004 section 3.3, eq 8).

* :func:`kd_loss` - ``(1 - alpha) CE(z_S, y) + alpha tau^2 KL(p_T^tau || p_S^tau)`` (the paper's alpha 0.3, tau 2.0);
  the KL is ``F.kl_div(log_softmax(z_S / tau), softmax(z_T / tau), "batchmean")``. Deviation: eq 8 writes the
  arguments in the other order, ``KL(softmax(z_S / tau) || softmax(z_T / tau))``; we keep Hinton et al.'s
  distillation direction (teacher distribution as the target, its mass-covering gradient ``p_S - p_T`` w.r.t.
  ``z_S / tau``), which the paper's "KL divergence between teacher and student distributions" also reads as.
* :class:`TextClassificationTask` - trains a registered text model (default ``hoba_classifier``) on
  :class:`hoformer.data.TextDataModule` batches, optionally distilled from a teacher. Teacher logits come from a
  teacher ``save_pretrained`` directory (a 2D model trained by this project: same tokenizer) or a local Hugging Face
  sequence-classification checkpoint (e.g. a fine-tuned RoBERTa, the paper's teacher; needs the ``hf`` extra: it reads
  the raw texts with its own tokenizer, never the network), and are cached on disk (``teacher_logits``) so student
  epochs never re-run the teacher; a logits file produced elsewhere can be given alone: ``{"train": (N_train, C),
  "val": ..., "test": ...}`` in the datamodule's split order (``torch.save``). The student can inherit the teacher's
  embeddings and head (``init_embeddings_from``, ``init_head_from_teacher``; Hugging Face BERT / RoBERTa too).

Metric names: ``{train,val,test}/{loss,ce,kl,acc}`` (``kl`` only where teacher logits exist).
"""
from __future__ import annotations

import hashlib
import re
import warnings
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torchmetrics.classification import MulticlassAccuracy

from hoformer._io import atomic_write
from hoformer.data._utils import sha256sum
from hoformer.models.hf import hf_config, hf_position_offset

from .base import TaskModule, check_labels
from .class_balance import BalancedAccuracy, ClassWeighting

__all__ = ["kd_loss", "TextClassificationTask", "teacher_logits_fingerprint"]


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


class TextClassificationTask(ClassWeighting, TaskModule):
    """Sequence classification (``ids, mask -> logits``) with optional distillation (eq 8).

    Args:
        model_name, model_kwargs, lr, weight_decay, betas, warmup_steps, scheduler, min_lr_ratio: see
            :class:`~hoformer.train.base.TaskModule` (paper: AdamW, weight decay 0.01, 10% linear warm-up).
        kd_alpha, kd_temperature: eq 8 (paper: 0.3, 2.0). Ignored without a teacher.
        teacher: ``save_pretrained`` directory of the teacher (same tokenizer as the datamodule), or a local Hugging
            Face ``AutoModelForSequenceClassification`` directory (``config.json`` with a ``model_type``; its own
            tokenizer in the same directory; its ``num_labels`` and, unless generic ``LABEL_k``, its ``id2label``
            names must match the dataset's classes in order).
        teacher_logits: cache file of the teacher's logits per split (written when ``teacher`` is given and the
            cache is missing or stale; read alone when ``teacher`` is None).
        init_embeddings_from: ``save_pretrained`` directory whose ``embed.*`` weights initialise the student, or a
            local Hugging Face BERT / RoBERTa checkpoint (the student then needs its width and, through the
            datamodule's ``tokenizer``, its vocabulary and pad id; see ``HOBAClassifier.load_embeddings_from``).
        init_head_from_teacher: also copy the classifier head (``head.*``) from ``init_embeddings_from`` (the paper
            initialises "embeddings and classification heads" from the teacher; needs the same width and classes).
        class_weight: None, ``"balanced"`` or one cross-entropy weight per class
            (:mod:`hoformer.train.class_balance`); ``{stage}/bacc`` (balanced accuracy) is logged beside
            ``{stage}/acc`` either way.
        export_dir: at the end of ``fit``, save the model (best checkpoint when one exists) and the datamodule's
            tokenizer there, ready for ``hoformer.models.from_pretrained`` / ``TextTokenizer.from_pretrained``.
    """

    def __init__(
        self,
        model_name: str = "hoba_classifier",
        model_kwargs: dict[str, Any] | None = None,
        lr: float = 1e-3,
        weight_decay: float = 0.01,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_steps: int = 0,
        scheduler: str = "cosine",
        min_lr_ratio: float = 0.01,
        kd_alpha: float = 0.3,
        kd_temperature: float = 2.0,
        teacher: str | None = None,
        teacher_logits: str | None = None,
        init_embeddings_from: str | None = None,
        init_head_from_teacher: bool = False,
        export_dir: str | None = None,
        class_weight: str | list[float] | None = None,
    ) -> None:
        if not 0.0 <= kd_alpha <= 1.0 or kd_temperature <= 0:
            raise ValueError(f"TextClassificationTask: need kd_alpha in [0, 1] and kd_temperature > 0, got "
                             f"{kd_alpha}, {kd_temperature}")
        if init_head_from_teacher and not init_embeddings_from:
            raise ValueError("TextClassificationTask: init_head_from_teacher=True needs init_embeddings_from (the "
                             "teacher's save_pretrained directory)")
        super().__init__(model_name, model_kwargs, lr, weight_decay, betas, warmup_steps, scheduler, min_lr_ratio)
        n_cls = getattr(self.model, "num_classes", None)
        if n_cls is None:
            raise ValueError(f"TextClassificationTask: model {model_name!r} has no `num_classes`")
        # validate_args=False: kd_loss validates the labels (torchmetrics' own check is a host sync per step on GPU)
        self.acc = torch.nn.ModuleDict({s: MulticlassAccuracy(n_cls, average="micro", validate_args=False)
                                        for s in ("fit", "val", "test")})
        self.bacc = torch.nn.ModuleDict({s: BalancedAccuracy(n_cls) for s in ("fit", "val", "test")})
        self.num_classes = n_cls
        self._init_class_weight(class_weight, n_cls)
        self.teacher_cache: dict[str, torch.Tensor] = {}
        self._teacher_data_fp: dict | None = None  # the data the in-memory teacher logits belong to
        self._embeddings_loaded = False

    # ------------------------------------------------------------------------------------------- setup
    def _datamodule(self):
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if dm is None or not hasattr(dm, "datasets"):
            raise RuntimeError("TextClassificationTask needs a hoformer.data.TextDataModule as `data`")
        dm.setup()
        return dm

    def setup(self, stage: str) -> None:
        dm = self._datamodule()
        if len(dm.class_names) != self.model.num_classes:
            raise ValueError(f"TextClassificationTask: dataset {dm.dataset_name!r} has {len(dm.class_names)} classes "
                             f"but the model has num_classes={self.model.num_classes}")
        vocab, model_vocab = dm.tokenizer.vocab_size, getattr(self.model, "vocab_size", None)
        if model_vocab is not None and vocab > model_vocab:
            raise ValueError(f"TextClassificationTask: tokenizer has {vocab} tokens but the model's vocab_size is "
                             f"{model_vocab}; set model_kwargs.vocab_size >= {vocab}")
        model_pad = getattr(self.model, "pad_id", None)
        if model_pad is not None and model_pad != dm.tokenizer.pad_id:  # else padding trains and a real token does not
            raise ValueError(f"TextClassificationTask: the tokenizer pads with id {dm.tokenizer.pad_id} but the "
                             f"model's pad_id is {model_pad}; set model_kwargs.pad_id={dm.tokenizer.pad_id}")
        if getattr(self.model, "max_len", dm.max_len) < dm.max_len:
            raise ValueError(f"TextClassificationTask: data max_len={dm.max_len} exceeds the model's max_len="
                             f"{self.model.max_len}")
        if stage == "fit" and self.hparams.init_embeddings_from and not self._embeddings_loaded:
            self.model.load_embeddings_from(self.hparams.init_embeddings_from, head=self.hparams.init_head_from_teacher)
            self._embeddings_loaded = True

    def _teacher_splits(self, splits) -> None:
        hp = self.hparams
        if not (hp.teacher or hp.teacher_logits):
            return
        dm = self._datamodule()
        cache_path = Path(hp.teacher_logits) if hp.teacher_logits else None
        # the cache is keyed by the data it was computed on (token ids + labels of every split, in order, and max_len;
        # for a Hugging Face teacher the raw texts + labels) and, when the teacher directory is known, by the
        # teacher's weights *and* config; logits loaded without a teacher keep the kind of key they were stored with
        hf = (hf_config(Path(hp.teacher)) is not None if hp.teacher else
              "train_texts" in (self._teacher_data_fp or {}))
        data_fp = _data_fingerprint(dm, hf=hf)
        if all(s in self.teacher_cache for s in splits) and self._teacher_data_fp == data_fp:
            return  # the in-memory logits are for this very data (a task reused with another datamodule is not)
        self.teacher_cache.clear()
        fp = None
        if hp.teacher:
            fp = {**_teacher_fingerprint(Path(hp.teacher), hf), **data_fp}
        cached = {}
        if cache_path is not None and cache_path.is_file():
            cached = torch.load(cache_path, map_location="cpu", weights_only=True)
            stored = cached.get("fingerprint")
            if fp is not None and stored != fp:
                cached = {}  # stale: other teacher weights / config or other data / tokenizer: recomputed below
            elif fp is None and stored is None:
                warnings.warn(f"TextClassificationTask: teacher_logits {cache_path} carries no fingerprint, so it "
                              "cannot be checked against this data (order, tokenizer, max_len); only shapes are "
                              "checked. Store one with hoformer.train.text.teacher_logits_fingerprint(datamodule).",
                              stacklevel=2)
            elif fp is None and "train_texts" in stored:  # written by a Hugging Face teacher: keyed to the texts
                data_fp = _data_fingerprint(dm, hf=True)
            if fp is None and stored is not None and {k: stored.get(k) for k in data_fp} != data_fp:
                bad = sorted(k for k in data_fp if stored.get(k) != data_fp[k])
                raise ValueError(f"TextClassificationTask: teacher_logits {cache_path} was computed on other data "
                                 f"(fingerprint differs for {bad}: another tokenizer, max_len, split or order); "
                                 "pass `teacher` to recompute it or delete the file")
        missing = [s for s in ("train", "val", "test") if s not in cached]
        if missing and hp.teacher is None:
            raise FileNotFoundError(f"TextClassificationTask: teacher_logits {cache_path} lacks splits {missing} "
                                    "and no `teacher` directory was given to compute them")
        if missing:
            run = self._run_hf_teacher if hf else self._run_teacher
            cached.update(run(Path(hp.teacher), dm, missing))
            cached["fingerprint"] = fp
            if cache_path is not None:
                atomic_write(cache_path, lambda p: torch.save(cached, p))
        for s in ("train", "val", "test"):
            t = cached[s]
            if t.shape != (len(dm.datasets[s]), self.model.num_classes):
                raise ValueError(f"TextClassificationTask: teacher logits for {s!r} have shape {tuple(t.shape)}, "
                                 f"expected {(len(dm.datasets[s]), self.model.num_classes)}")
            self.teacher_cache[s] = t.float().to(self.device)
        self._teacher_data_fp = data_fp

    @torch.no_grad()
    def _run_teacher(self, tdir: Path, dm, splits) -> dict[str, torch.Tensor]:
        from hoformer.models import from_pretrained

        teacher = from_pretrained(tdir, map_location="cpu").to(self.device).eval()
        out = {}
        loaders = {"train": dm.ordered_train_dataloader, "val": dm.val_dataloader, "test": dm.test_dataloader}
        for s in splits:
            logits = torch.empty(len(dm.datasets[s]), self.model.num_classes)
            for b in loaders[s]():
                logits[b["index"]] = teacher(b["ids"].to(self.device), b["mask"].to(self.device)).float().cpu()
            out[s] = logits
        return out

    @torch.no_grad()
    def _run_hf_teacher(self, tdir: Path, dm, splits) -> dict[str, torch.Tensor]:
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
        if n != self.model.num_classes:
            raise ValueError(f"TextClassificationTask: teacher {str(tdir)!r} has num_labels={n}, the data "
                             f"{len(dm.class_names)} classes {dm.class_names}")
        generic = all(re.fullmatch(r"LABEL_\d+", x) for x in names)
        if not generic and [x.lower() for x in names] != [c.lower() for c in dm.class_names]:
            raise ValueError(f"TextClassificationTask: teacher {str(tdir)!r} labels {names} (config.json id2label) are "
                             f"not the data's classes {dm.class_names} in that order; a teacher trained with another "
                             "label order would distil swapped classes (fix id2label if only the names differ)")
        teacher = teacher.to(self.device).eval()
        limit = _hf_max_length(tok, teacher.config)
        bs = dm.eval_batch_size or dm.batch_size
        out = {}
        for s in splits:
            texts = dm.texts(s)
            logits = torch.empty(len(texts), n)
            for i in range(0, len(texts), bs):
                enc = tok(texts[i:i + bs], padding=True, truncation=True, max_length=limit, return_tensors="pt")
                logits[i:i + bs] = teacher(**enc.to(self.device)).logits.float().cpu()
            out[s] = logits
        return out

    def on_fit_start(self) -> None:
        self._teacher_splits(("train", "val"))

    def on_validation_start(self) -> None:
        self._teacher_splits(("val",))

    def on_test_start(self) -> None:
        self._teacher_splits(("test",))

    # -------------------------------------------------------------------------------------------- steps
    def shared_step(self, batch, stage: str) -> torch.Tensor:
        if not isinstance(batch, dict) or not {"ids", "mask", "label"} <= set(batch):
            raise TypeError("TextClassificationTask: batches must be dicts with 'ids', 'mask', 'label' "
                            "(hoformer.data.TextDataModule)")
        logits = self.model(batch["ids"], batch["mask"])
        split = {"train": "train", "val": "val", "test": "test"}[stage]
        teacher = self.teacher_cache.get(split)
        t = teacher[batch["index"]] if teacher is not None else None
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

    # ------------------------------------------------------------------------------------------- export
    def save_pretrained(self, directory, model: torch.nn.Module | None = None) -> Path:
        """Model (``model``, default this task's; safetensors + JSON) and, when a datamodule is attached, its
        tokenizer in one directory."""
        d = (self.model if model is None else model).save_pretrained(directory)
        dm = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        if dm is not None and getattr(dm, "tokenizer", None) is not None:
            dm.tokenizer.save(d)
        return d

    def on_fit_end(self) -> None:
        if not self.hparams.export_dir or not self.trainer.is_global_zero:
            return
        cb = self.trainer.checkpoint_callback
        best = getattr(cb, "best_model_path", "") if cb is not None else ""
        model = self.model
        if best and os.path.isfile(best):  # into a copy: the live model (every rank's) keeps its trained weights
            from hoformer.models import create_model

            state = torch.load(best, map_location="cpu", weights_only=True)["state_dict"]
            model = create_model(self.model.config["name"], **self.model.config["kwargs"])
            model.load_state_dict({k[len("model."):]: v for k, v in state.items() if k.startswith("model.")})
        self.save_pretrained(self.hparams.export_dir, model)
