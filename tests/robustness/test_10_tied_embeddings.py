"""Class 10: tied embeddings / lm_head permuted twice, or the tie lost on save and reload.

GPT-2 ties ``lm_head.weight`` to ``transformer.wte.weight``; Llama can (``tie_word_embeddings``). The HF
adapter binds the tied tensor once (the alias carries no bindings of its own), ``apply`` returns one tensor
object under both keys, the logits are unchanged, and the tie survives ``load_state_dict`` and
``save_pretrained``/``from_pretrained``. Negative control: permuting the tied matrix a second time (what a
spec that binds both keys does) changes the logits, so the function check would catch it.
"""

from __future__ import annotations

import pytest
import torch
from hf_tiny import loaded, make, max_diff, outputs

import modeconn as mc
from modeconn.symmetry.hf import example_inputs

TIED = {"gpt2": ("transformer.wte.weight", "lm_head.weight"), "llama_tied_mqa": ("model.embed_tokens.weight", "lm_head.weight")}


@pytest.mark.parametrize("name", list(TIED))
def test_tied_embedding_is_transformed_once_and_stays_tied(name, tmp_path):
    emb, head = TIED[name]
    model = make(name)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    spec = mc.symmetry_spec(model)
    assert spec.tensors.get(head, ()) == () or head not in spec.tensors  # the alias carries no bindings
    x = example_inputs(model)
    sd = model.state_dict()
    g = spec.random_element(seed=3)
    sd_g = spec.apply(sd, g)
    assert sd_g[head] is sd_g[emb] or torch.equal(sd_g[head], sd_g[emb])
    assert not torch.equal(sd_g[emb], sd[emb])  # it did move
    moved = loaded(model, sd_g)
    assert moved.get_output_embeddings().weight is moved.get_input_embeddings().weight  # tie kept on load
    assert max_diff(outputs(model, x), outputs(moved, x)) < 1e-4

    moved.save_pretrained(tmp_path / "m")
    again = type(model).from_pretrained(tmp_path / "m").eval()
    assert again.get_output_embeddings().weight is again.get_input_embeddings().weight
    assert max_diff(outputs(model, x), outputs(again, x)) < 1e-4

    # negative control: the tied matrix permuted a second time (a spec binding both keys) changes the function
    twice = dict(sd_g)
    perm_space = next(b.space for b in spec.tensors[emb] if b.axis == 1)
    twice[head] = twice[emb] = spec.apply_tensor(emb, sd_g[emb], {s: (g[s] if s == perm_space else spec.identity()[s])
                                                                     for s in spec.spaces})
    assert max_diff(outputs(model, x), outputs(loaded(model, twice), x)) > 1e-3


def test_weight_matching_counts_a_tied_matrix_once():
    model = make("gpt2")
    spec = mc.symmetry_spec(model)
    sd = model.state_dict()
    g = spec.random_element(seed=1)
    res = mc.weight_matching(spec, sd, spec.apply(sd, g))
    assert spec.equal(spec.compose(res.element, g), spec.identity())
    # at the optimum the objective is Σ‖θ_k‖² over the bound tensors: the tie counted once, not twice
    once = sum(float((sd[k].double() ** 2).sum()) for k, b in spec.tensors.items() if b)
    assert res.objective == pytest.approx(once, rel=1e-4)
    assert res.objective < once + 0.5 * float((sd["lm_head.weight"].double() ** 2).sum())
