"""hoformer._checks.check_values: descriptive errors on CPU, asynchronous device-side asserts elsewhere."""
from __future__ import annotations

import pytest
import torch

from hoformer._checks import check_values


def test_cpu_raises_with_detail_only_on_failure():
    calls = []

    def detail():
        calls.append(1)
        return ", got 7"

    check_values(torch.tensor(True), "x must be < 5{detail}", detail)
    assert not calls  # detail (which may sync) runs only on failure
    with pytest.raises(ValueError, match=r"^x must be < 5, got 7$"):
        check_values(torch.tensor(False), "x must be < 5{detail}", detail)
    with pytest.raises(TypeError, match=r"^x must be < 5$"):
        check_values(torch.tensor(False), "x must be < 5{detail}", exc=TypeError)


def test_accelerator_tensors_get_an_async_assert_without_a_host_read(monkeypatch):
    """Off the CPU (a meta tensor stands in for a GPU one here) nothing is read back: the condition and the static
    message go to torch._assert_async, and ``detail`` is never called."""
    seen = []
    monkeypatch.setattr(torch, "_assert_async", lambda ok, msg: seen.append((ok.device.type, msg)))
    ok = torch.empty((), dtype=torch.bool, device="meta")
    check_values(ok, "labels must lie in [0, 3){detail}; check", lambda: pytest.fail("detail read the device"))
    assert seen == [("meta", "labels must lie in [0, 3); check")]


def test_call_sites_take_the_async_path_off_the_cpu(monkeypatch):
    """Labels, token ids and time features on a non-CPU device: no bool() of a device tensor (which would be a
    host sync), one async assert each."""
    from hoformer.functional.weaver import check_time_features
    from hoformer.train.base import check_labels

    seen = []
    monkeypatch.setattr(torch, "_assert_async", lambda ok, msg: seen.append(msg))
    check_labels(torch.zeros(4, dtype=torch.long, device="meta"), 3, "t")
    check_time_features(torch.zeros(2, 5, 2, device="meta"), "w")
    assert len(seen) == 4 and "labels must lie" in seen[0] and "minute of day" in seen[1]
    assert "day of week" in seen[2] and "fraction" in seen[3]
