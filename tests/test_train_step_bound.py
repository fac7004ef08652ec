"""``benchmarks/train_step.py``'s bound: the step's counted operators replayed alone (the same products at the
same layouts, nothing else), which is what the model's own matmul shapes allow against the ceiling."""
from __future__ import annotations

import torch

from hoformer.models import create_model

from _bench import load_benchmark


def _tiny_step(train_step):
    torch.manual_seed(0)
    model = create_model("hot_forecaster", seq_len=16, pred_len=8, num_variates=3, dim=16, depth=1, num_heads=2,
                         patch_size=4, dropout=0.1).train()
    args, kwargs = model.example_inputs(batch_size=2)
    return model, train_step.make_step(model, args, kwargs, torch.device("cpu"), "32")


def test_the_replay_counts_exactly_the_step_flops_and_changes_no_weight():
    train_step = load_benchmark("train_step")
    model, step = _tiny_step(train_step)
    step()  # the optimiser's state exists, as in the timed steps
    replay, replay_flops = train_step.counted_ops_replay(step)
    assert replay_flops == train_step.count_flops(step) > 0
    before = {k: v.clone() for k, v in model.state_dict().items()}
    replay()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_the_replay_keeps_each_operand_layout_and_reuses_one_tensor_per_layout():
    """A transposed operand stays transposed (its strides are what the kernel sees), and calls with one layout share
    one fresh tensor, so the replay holds a few buffers, not one per call."""
    train_step = load_benchmark("train_step")
    a, b = torch.randn(8, 4), torch.randn(8, 4)

    def step():
        for _ in range(3):
            torch.mm(a, b.t())

    seen = []
    replay, flops = train_step.counted_ops_replay(step)
    assert flops == 3 * 2 * 8 * 4 * 8

    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append([(tuple(t.shape), t.stride(), t.data_ptr()) for t in args if isinstance(t, torch.Tensor)])
            return func(*args, **(kwargs or {}))

    with Seen():
        replay()
    mm = [s for s in seen if len(s) == 2]
    assert len(mm) == 3 and mm[0][1][:2] == ((4, 8), (1, 4))  # b.t(): shape (4, 8), strides (1, 4)
    assert len({ptr for call in mm for *_, ptr in call}) == 2


def test_the_operator_shares_come_from_the_first_profiled_pass_without_page_faults(monkeypatch):
    """The profiler's buffers make the first profiled steps page-fault on blocks the steps had reused: passes are
    repeated until one runs without faults (here the third), up to a limit; without ``resource``, one pass."""
    train_step = load_benchmark("train_step")
    faults = iter([0, 500, 500, 900, 900, 901])  # before / after each pass: 500, 400, then 1 fault in 3 steps
    monkeypatch.setattr(train_step, "_minor_faults", lambda: next(faults))
    calls = []
    ops = train_step.top_operators(lambda: calls.append(torch.ones(4).sum()), n=2, steps=3)
    assert len(calls) == 9 and len(ops) <= 2 and all(0 < share <= 1 for _, share in ops)
    monkeypatch.setattr(train_step, "_minor_faults", lambda: 10**6 * len(calls))  # never quiet: stops at the limit
    calls.clear()
    train_step.top_operators(lambda: calls.append(torch.ones(4).sum()), steps=3, passes=2)
    assert len(calls) == 6
    monkeypatch.setattr(train_step, "_minor_faults", lambda: None)
    calls.clear()
    train_step.top_operators(lambda: calls.append(torch.ones(4).sum()), steps=3)
    assert len(calls) == 3
