"""What a launcher leaves in its ranks' environment: read by the rank's entry point before anything slow is
imported, and by the checkpoints (which process holds a run's folder). Torch-free, and nothing else."""

from __future__ import annotations

#: The environment variable in which hintpipe's launcher gives its ranks its pid.
LAUNCHER_ENV = "HINTPIPE_LAUNCHER_PID"
#: Set by torchrun in every rank it starts.
TORCHRUN_ENV = "TORCHELASTIC_RUN_ID"
