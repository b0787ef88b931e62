"""Schedules as data: tasks, hints, the generators, the rules, validation and CSV.

Torch-free. Every other part builds on :mod:`hintpipe.schedule.rules`, the one
place that says which task depends on which and how many micro-batches a hint
holds in flight.
"""
