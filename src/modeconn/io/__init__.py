"""Safe reading and atomic writing of checkpoint directories, shared by every checkpoint kind.

* :mod:`~modeconn.io.safe`: safetensors headers and tensors, ``torch.load(weights_only=True)`` only when pickles are
  allowed, JSON objects, and the containment of every file in its checkpoint's directory tree;
* :mod:`~modeconn.io.checkpoint`: modeconn checkpoint directories (save, load, config.json) and
  :func:`atomic_directory`;
* :mod:`~modeconn.io.lazy`: checkpoints larger than memory (:class:`~modeconn.io.lazy.LazyCheckpoint`, shard layouts,
  the streaming shard writer);
* :mod:`~modeconn.io.hf`: Hugging Face directories read without building a model (side files, names);
* :mod:`~modeconn.io.models`: modeconn checkpoints loaded as models for the commands (cheap config checks first);
* :mod:`~modeconn.io.vocabulary`: the tokenizer vocabularies of checkpoint directories.

Layering: ``io`` sits below :mod:`modeconn.symmetry` and imports only ``models``, ``checks``, ``errors`` and
``_util``.
"""

from ..checks import check_dtype_kinds, dtype_kind, dtype_kind_mismatches
from .checkpoint import (
    CONFIG_NAME,
    DIGEST_KEY,
    FORMAT_VERSION,
    METRICS_NAME,
    WEIGHTS_NAME,
    atomic_directory,
    check_format_version,
    check_state_dict_compatible,
    config_differences,
    describe_config_mismatch,
    load_checkpoint,
    load_weights_into,
    read_config,
    save_checkpoint,
    save_state_dict,
    write_model_directory,
)
from .safe import (
    PICKLE_SUFFIXES,
    SAFETENSORS_DTYPES,
    check_in_checkpoint,
    load_pickle_state_dict,
    load_state_dict,
    read_json_object,
    safetensors_dtype,
)

__all__ = [
    "CONFIG_NAME", "DIGEST_KEY", "FORMAT_VERSION", "METRICS_NAME", "PICKLE_SUFFIXES", "SAFETENSORS_DTYPES",
    "WEIGHTS_NAME", "atomic_directory", "check_dtype_kinds", "check_format_version", "check_in_checkpoint",
    "check_state_dict_compatible", "config_differences", "describe_config_mismatch", "dtype_kind",
    "dtype_kind_mismatches", "load_checkpoint", "load_pickle_state_dict", "load_state_dict", "load_weights_into",
    "read_config", "read_json_object", "safetensors_dtype", "save_checkpoint", "save_state_dict",
    "write_model_directory",
]
