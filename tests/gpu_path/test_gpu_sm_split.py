"""SM split: partition arithmetic (pure), and the clear "needs a CUDA GPU" error everywhere without one."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from autospec.cli import app
from autospec.engines.sm_split import NO_CUDA, parse_fractions, partition_rule, require_cuda, split_sms
from autospec.engines.torch_engine import TorchSDEngine
from autospec.errors import InputError

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a CUDA GPU")


def test_partition_rule_by_compute_capability():
    assert partition_rule(9, 0) == (8, 8)
    assert partition_rule(10, 0) == (8, 8)
    assert partition_rule(8, 6) == (4, 2)
    assert partition_rule(7, 5) == (2, 2)
    assert partition_rule(6, 1) == (1, 1)


@pytest.mark.parametrize("total,major", [(132, 9), (108, 8), (80, 7), (144, 9)])
@pytest.mark.parametrize("r", [0.05, 0.25, 0.5, 0.75, 0.95])
def test_split_counts_are_aligned_legal_and_close_to_r(total, major, r):
    low, align = partition_rule(major)
    c = split_sms(total, r, major)
    assert c.draft_sms % align == 0 and c.target_sms % align == 0
    assert c.draft_sms >= low and c.target_sms >= low
    assert c.draft_sms + c.target_sms <= total
    if low / total < r < 1 - low / total:
        assert abs(c.draft_sms - r * total) <= align  # nearest aligned count


def test_h100_quarter_split():
    c = split_sms(132, 0.25, 9)  # H100 SXM: 132 SMs, CC 9.0
    assert (c.draft_sms, c.target_sms) == (32, 96)
    assert c.actual_r == pytest.approx(0.25)


def test_bad_splits():
    with pytest.raises(InputError, match=r"\(0, 1\)"):
        split_sms(132, 1.0, 9)
    with pytest.raises(InputError, match="cannot be split"):
        split_sms(12, 0.5, 9)
    assert parse_fractions("0.5,0.25,0.5") == [0.25, 0.5]
    with pytest.raises(InputError, match="not a number"):
        parse_fractions("0.2,x")
    with pytest.raises(InputError, match=r"\(0, 1\)"):
        parse_fractions("0")


@no_cuda
def test_require_cuda_message():
    with pytest.raises(InputError) as exc:
        require_cuda()
    assert str(exc.value) == f"[sm_split]: {NO_CUDA}"
    assert "\n" not in str(exc.value)


@no_cuda
def test_engine_option_without_cuda(tiny_pair):
    with pytest.raises(InputError, match=r"SM split needs a CUDA GPU \(torch.cuda.is_available\(\) is False\)"):
        TorchSDEngine(*tiny_pair, sm_split=0.25)


@no_cuda
def test_execution_config_without_cuda(tiny_pair):
    from autospec.strategy import ExecutionSpec

    engine = TorchSDEngine(*tiny_pair)
    with pytest.raises(InputError, match="needs a CUDA GPU"):
        engine.configure_execution(ExecutionSpec(sm_split=0.5))
    engine.configure_execution(ExecutionSpec(early_exit=True, chunk_size=2))
    assert engine.early_exit is not None and engine.frontier_chunk == 2 and engine.sm_split is None


@no_cuda
def test_profile_cli_sm_split_without_cuda(tmp_path):
    result = CliRunner().invoke(app, ["profile", "--out", str(tmp_path / "run"), "--quick",
                                      "--sm-split", "0.25,0.5"])
    assert result.exit_code == 2
    assert NO_CUDA in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "run" / "profile").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="green contexts need a CUDA GPU")
def test_gp_lcb_switches_the_engines_split_every_step_on_cuda(tiny_pair):
    """On CUDA the torch engine offers StepSmSplit: each step runs in the green contexts of the split
    GP-LCB chose for it (docs/policies.md §3, "SM split per step")."""
    from autospec.engines.base import StepSmSplit, offers
    from autospec.serving.loop import serve
    from autospec.serving.records import ServeRequest
    from autospec.serving.step import StepSettings
    from autospec.strategy import build_strategy, spec_from_dict

    engine = TorchSDEngine(*tiny_pair, device="cuda")
    assert offers(engine, StepSmSplit)
    strategy = build_strategy(spec_from_dict({"strategy": {"name": "gp"},
                                              "length": {"policy": "gp-lcb", "sm_pool": [0.25, 0.5]}}))
    ran: list[tuple[float | None, float]] = []
    real = engine.set_step_sm_split

    def spy(r):
        out = real(r)
        ran.append((strategy.length.step_sm_split(), engine.sm_split.current))
        return out

    engine.set_step_sm_split = spy
    serve(engine, strategy, [ServeRequest(i, 0.0, [1, 4, 2, i % 6], 16) for i in range(4)], max_batch=4,
          settings=StepSettings(k_max=8))
    assert ran and all(chosen == current for chosen, current in ran)
    assert {chosen for chosen, _ in ran} == {0.25, 0.5}
