"""Messages between neighbouring ranks: :mod:`~hintpipe.runtime.transport.protocol` (what the step loop
asks of a transport, and what every transport is built from), :mod:`~hintpipe.runtime.transport.registry`
(the transports by name, and the choice between them), :mod:`~hintpipe.runtime.transport.wire` (the wire
format), :mod:`~hintpipe.runtime.transport.mailbox` (the gloo transport),
:mod:`~hintpipe.runtime.transport.staging` (a GPU's tensors through pinned host buffers),
:mod:`~hintpipe.runtime.transport.sender` (sends posted in order, each once its bytes are there) and
:mod:`~hintpipe.runtime.transport.links` (the NCCL transport)."""
