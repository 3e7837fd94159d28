"""The op rules, one module per kind of operation; importing this package registers them all
(:mod:`modeconn.symmetry.trace.registry`)."""

from . import attention, binary, elementwise, indexing, linear, norms, pairs, reshape  # noqa: F401  (registers the rules)
