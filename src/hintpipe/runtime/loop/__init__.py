"""One step of one rank: :mod:`~hintpipe.runtime.loop.step_loop` drives the scoreboard through
:mod:`~hintpipe.runtime.loop.executor` (compute) and a transport; :mod:`~hintpipe.runtime.loop.microbatch`
splits and orders the batch; :mod:`~hintpipe.runtime.loop.admission` says what may be held;
:mod:`~hintpipe.runtime.loop.ready_forecast` keeps the ``ready`` policy's forecast;
:mod:`~hintpipe.runtime.loop.coordination` has a tensor-parallel group run one order; around the loop,
:mod:`~hintpipe.runtime.loop.hooks` (with :mod:`~hintpipe.runtime.loop.agreement`,
:mod:`~hintpipe.runtime.loop.reports` and :mod:`~hintpipe.runtime.loop.device_memory`); task times on a GPU
come from :mod:`~hintpipe.runtime.loop.timing`."""
