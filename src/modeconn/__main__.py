"""``python -m modeconn ...`` — the command line; also ``torchrun --nproc_per_node N -m modeconn align ...``."""

from .cli import app

app(prog_name="modeconn")
