"""Micro-batches formed by predicted cost from a step's sequences.

- :mod:`~hintpipe.forming.cost`: ``a * tokens + b * tokens**2``, fitted to measured times (torch-free).
- :mod:`~hintpipe.forming.form`: which sequences go in which micro-batch, and in which order (torch-free).
- :mod:`~hintpipe.forming.collate`: the formation as tensors for ``Pipeline.step``.
- :mod:`~hintpipe.forming.profiled`: the cost fitted from the planner's profile at several lengths.
"""
