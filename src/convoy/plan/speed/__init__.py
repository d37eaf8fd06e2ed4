"""convoy.plan.speed: how fast a device runs each kind of work a step is made of, and where that figure comes from.

    from convoy.plan.speed.rates import rates_for
    rates = rates_for(lookup_gpu("H100-80GB"))        # measured here, else a shipped profile, else the model
    rates.gemm_seconds(8192, 768, 2304, "bf16"), rates.describe()

``convoy.plan.timing`` adds these up into a step; nothing here knows a layout. The modules, by what they hold:

Models of speed (pure, torch-free)
    ``rates``         kernels on a GPU: ``Rates`` and ``rates_for``, which picks the best source (calibrated, shipped
                      profile, shape-aware model on the board's physics, flat ``--efficiency`` model).
    ``collectives``   one NCCL collective's seconds (ring or tree, LL / LL128 / Simple, latency by ranks and nodes).
    ``cpu_step``      an eager step on CPU processes: the operators it runs at this CPU's cost per operator.

Measuring (imports torch, inside functions only)
    ``measure``       GEMMs at the model's shapes, fused attention, bandwidth, launch cost: ``calibrate(...)``
                      (cached) and ``measure(...)`` (always), behind ``convoy plan --calibrate``.
    ``measure_cpu``   ``OpCounter`` (the operators a step runs) and ``cpu_rates()`` (what one costs here).

Records of what was measured (torch-free)
    ``records``       the ``Calibration`` record and its JSON cache, one entry per device and torch version.
    ``observed``      a job's measured step time and memory beside its plan, kept in that cache, read by later plans.
    ``profiles``      records shipped with convoy for boards users plan for (``device_profiles/<row>.json``).
    ``cache_file``    the cache file read and written only where no other user can steer it.

The architecture facts the model starts from (best GEMM fraction, tiles, the power-limited clock) are
``convoy.plan.architectures``, beside the GPU table that needs them.
"""
