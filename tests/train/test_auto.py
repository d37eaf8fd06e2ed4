"""strategy="auto": the planner answers, the simple rule is the fallback."""

from convoy.train.auto import choose_strategy, planner_hook

GIB = 2**30


def test_planner_keeps_a_small_model_replicated():
    name, reason = choose_strategy(world_size=2, num_parameters=100_000, device_bytes=12 * GIB,
                                   planner=planner_hook("no"))
    assert name == "ddp"
    assert "100.0K parameters with fp32 adamw" in reason and "case 1" in reason


def test_planner_shards_a_model_that_does_not_fit_one_device():
    name, reason = choose_strategy(world_size=8, num_parameters=7_000_000_000, device_bytes=80 * GIB,
                                   planner=planner_hook("bf16"))
    assert name in ("zero1", "zero2", "zero3")
    assert "104.3 GiB" in reason and "case 2" in reason


def test_rule_answers_when_nothing_fits_for_the_planner():
    # 1e12 parameters on 2 x 1 GiB: no layout fits, the planner declines, the rule says zero3.
    name, _ = choose_strategy(world_size=2, num_parameters=10**12, device_bytes=GIB, planner=planner_hook("no"))
    assert name == "zero3"
