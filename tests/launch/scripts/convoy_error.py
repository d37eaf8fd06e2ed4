"""Every rank raises a convoy error, as a pipeline layout without loss_fn does at prepare (one line each)."""
from convoy.errors import StrategyError

raise StrategyError("pp needs a loss function for Sequential: pass strategy_options={'loss_fn': fn}")
