"""Which of Lightning's strategies write their checkpoints around the CheckpointIO muster
publishes from: the integration says so in one line at setup, rather than leaving a trial
to find at its end that it has no muster checkpoint."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from muster.integrations.lightning import saves_around_checkpoint_io

strategies = pytest.importorskip("lightning.pytorch.strategies",
                                 reason="Lightning is in the 'examples' extra")


def test_a_sharded_fsdp_strategy_is_named_with_what_to_do_instead() -> None:
    said = saves_around_checkpoint_io(strategies.FSDPStrategy(state_dict_type="sharded"))
    assert said is not None
    assert said.startswith("FSDPStrategy(state_dict_type='sharded') writes its checkpoints "
                           "itself")
    assert "state_dict_type='full'" in said and "ctx.checkpoint.save_sharded" in said


@pytest.mark.parametrize("strategy", [
    lambda: strategies.FSDPStrategy(state_dict_type="full"),  # rank 0 saves through the IO
    lambda: strategies.DDPStrategy(),
    lambda: strategies.SingleDeviceStrategy("cpu"),
])
def test_strategies_that_save_through_checkpoint_io_are_not_named(
        strategy: Callable[[], object]) -> None:
    assert saves_around_checkpoint_io(strategy()) is None
