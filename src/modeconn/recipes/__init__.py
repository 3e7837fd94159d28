"""Every command's back-end, below the command line: one module per command (``align``, ``merge``, ``check``,
``train``, ``barrier``, ``path``, ``sweep``, ``demo``; ``pair`` loads the endpoints of the data-driven commands,
``hf_stream``, ``merge_modeconn`` and ``align_lm`` are the kind-specific back-ends), dispatching on the checkpoint
kind (:func:`modeconn.checkpoints.open_checkpoints`) through the kind's operations
(:meth:`~modeconn.checkpoints.CheckpointKind.operation`), checking every output target and option before any heavy
work, and returning what the command line prints. Import the functions from their modules
(``from modeconn.recipes.align import align``).
"""
