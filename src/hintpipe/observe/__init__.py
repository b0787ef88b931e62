"""Observability: timelines as Perfetto traces and PNG Gantt charts."""
