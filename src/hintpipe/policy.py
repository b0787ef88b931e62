"""The policy's module before 0.7: it is :mod:`hintpipe.dispatch.policy` now, beside the scoreboard whose rules it
names. This one imports, with a ``DeprecationWarning``, through 0.7.

This module is torch-free.
"""

from __future__ import annotations

from hintpipe.dispatch.policy import Policy
from hintpipe.renamed import retired_module

retired_module("hintpipe.policy", "hintpipe.dispatch.policy")

__all__ = ["Policy"]
