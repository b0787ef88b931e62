"""What the command line runs: the built-in models, their data, and training runs of them.

Not part of the library's core: :class:`~hintpipe.apps.training.TrainConfig`
and :func:`~hintpipe.apps.training.train` use the public runtime as any user would.
"""
