"""Recipes below the command line: one module per command (``align``, ``merge``, ``train``; ``pair`` loads the
endpoints of the data-driven commands), dispatching on the checkpoint kind
(:func:`modeconn.checkpoints.open_checkpoints`) through a table, checking every output target and option before any
heavy work, and returning an :class:`~modeconn.recipes.outcome.Outcome` for the command line to print. Import the
functions from their modules (``from modeconn.recipes.align import align``).
"""
