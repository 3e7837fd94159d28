"""Hugging Face encoders wrapped so that modeconn's evaluation, alignment and paths treat them like its own models:
a masked LM maps a block of token ids to per-token vocabulary logits, a sequence classifier maps padded token ids to
class logits (the attention mask is the ids that are not the pad token).

The wrappers hold the Hugging Face model itself (no copy), as the attribute ``lm`` (masked LM) or ``model``
(classifier), so the Hugging Face symmetry adapters find it (:func:`modeconn.symmetry.symmetry_spec` of a module
wrapping exactly one Hugging Face model).
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ConfigError


def _check_ids(module: nn.Module, input_ids: torch.Tensor) -> None:
    if input_ids.ndim != 2 or input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
        raise ConfigError(f"{type(module).__name__} expects input_ids of shape (batch, tokens) with an integer dtype, "
                          f"got shape {tuple(input_ids.shape)} {input_ids.dtype}")


class MaskedLM(nn.Module):
    """A masked language model (BERT, RoBERTa, DistilBERT … ``…ForMaskedLM``) whose forward maps token ids to
    per-token vocabulary logits.

    Attributes:
        lm: the Hugging Face masked LM; vocab_size: V; context_length: T (the block length).
    """

    def __init__(self, lm: nn.Module, context_length: int) -> None:
        super().__init__()
        self.lm = lm
        self.vocab_size = int(lm.config.vocab_size)
        self.context_length = int(context_length)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``input_ids`` (B, T) int ids (blocks without padding; every position attended) → logits (B, T, V).

        Raises:
            ConfigError: ``input_ids`` is not a 2-D integer tensor.
        """
        _check_ids(self, input_ids)
        return self.lm(input_ids=input_ids).logits

    def extra_repr(self) -> str:
        return f"vocab_size={self.vocab_size}, context_length={self.context_length}"


class SequenceClassifier(nn.Module):
    """A text classifier (``…ForSequenceClassification``) whose forward maps padded token ids to class logits.

    Attributes:
        model: the Hugging Face sequence classifier; pad_token_id: the id whose positions are masked out;
        num_classes: K; context_length: T.
    """

    def __init__(self, model: nn.Module, context_length: int, pad_token_id: int) -> None:
        super().__init__()
        self.model = model
        self.pad_token_id = int(pad_token_id)
        self.num_classes = int(model.config.num_labels)
        self.context_length = int(context_length)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``input_ids`` (B, T) int ids, padded with ``pad_token_id`` → logits (B, K); padding is not attended.

        Raises:
            ConfigError: ``input_ids`` is not a 2-D integer tensor.
        """
        _check_ids(self, input_ids)
        return self.model(input_ids=input_ids, attention_mask=(input_ids != self.pad_token_id).long()).logits

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}, context_length={self.context_length}, pad={self.pad_token_id}"
