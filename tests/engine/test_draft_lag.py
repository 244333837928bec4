"""The simulator prices a round's first draft pass by the tokens the draft model has not fed
(`autospec.engines.sim.draft_lag`); this checks that rule against the torch engine's own bookkeeping."""

from __future__ import annotations

import numpy as np

from autospec.engines.base import GenRequest
from autospec.engines.sim import draft_lag
from autospec.engines.torch_engine import TorchSDEngine


def test_draft_lag_is_what_the_torch_engine_feeds_its_draft_next(tiny_pair):
    target, draft = tiny_pair
    engine = TorchSDEngine(target, draft, k_max=3)
    rng = np.random.default_rng(3)
    ids = engine.add([GenRequest(rng.integers(0, 6, 5).tolist(), 1 << 20, ignore_eos=True)
                      for _ in range(4)]).req_ids
    lags = {rid: 1 for rid in ids}
    seen = set()
    for _ in range(80):
        plan = {}
        for rid in ids:
            k = int(rng.integers(0, 4))
            plan[rid] = k
        for j in range(max(plan.values())):
            engine.draft([rid for rid in ids if plan[rid] > j])
        verify = {rid: int(rng.integers(0, k + 1)) if rng.random() < 0.3 else k for rid, k in plan.items()}
        out = engine.verify(verify)
        for rid, drafted, accepted in zip(out.req_ids, out.drafted, out.accepted):
            lags[rid] = draft_lag(lags[rid], drafted, accepted)
            assert len(engine.request(rid).pending) == lags[rid]
            seen.add((drafted > 0, accepted == drafted))
    assert seen == {(True, True), (True, False), (False, True)}
