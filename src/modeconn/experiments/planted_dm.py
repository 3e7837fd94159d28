"""Planted MiniLM with dual matching (LMC-DM, docs/methods.md §3): re-joining a symmetry-moved copy of a pretrained model.

The pretrained all-MiniLM-L6-v2 (``BertModel``, post-LN) is copied and moved by a random element ``g`` of the
group BERT has *without* normalization absorption (absorption is refused for post-LN models): per layer a head
permutation with per-head orthogonal QK and OV transforms (``head_orthogonal`` on the 32 query/key and
value/output dimensions of each head) and an FFN permutation; the residual stream is the output of a bare
``BertModel`` and stays fixed. So ``B = g·A`` computes exactly A's function. Then dual matching is asked to
find the way back from scratch for the continuous parts: the permutations come from weight matching (they are
discrete, :func:`~modeconn.match.dual_matching` never learns them), the QK/OV transforms of both endpoints
start at the **identity** (``init="identity"``).

* Planted element: the continuous parts are drawn Haar-uniformly on the **identity component** SO(32) of each
  head's O(32) (a Haar draw with determinant −1 gets its first column negated). A Cayley chart centred at the
  identity only reaches SO(d), so a reflection is a discrete choice that learning from the identity cannot
  make (weight matching would, ``init="weight"``); the identity component is the part learned matching is
  responsible for.
* Loss (``loss_fn(output, y)`` of dual matching): the hidden states of *every* layer of the interpolated model
  against A's, squared error per feature divided by that feature's variance over the training tokens
  (A's hidden states have a few large-magnitude features that would otherwise dominate), averaged — a
  dimensionless "standardized MSE" that is 0 exactly when the path computes A's hidden states.
* Runs: ``steps`` Adam steps at ``lr`` (λ ~ U(0, 1)) from the identity — the learned recovery — and, for
  reference, ``wm_init_steps`` steps of dual matching's default start (``init="weight"``: B starts at weight
  matching's full element, which for a planted element is the exact ``g^{-1}``), which must *stay* at barrier ≈ 0.
* Measured on held-out blocks (text after the training blocks), along the linear path between the transformed
  endpoints: the standardized MSE of the **last** hidden state (``path_loss``) and its relative distance
  ``‖h(λ) − h_A‖_F / ‖h_A‖_F`` (``path_rel_distance``), max over λ (the barrier: both are 0 at the endpoints),
  for the path before learning (weight matching's permutations, continuous parts at the identity), weight
  matching's own full element, and the two dual-matching runs; the transformed endpoints ``π_A(θ_A)`` and
  ``π_B(θ_B)`` of each run must compute A's hidden states (max |Δ| over all layers: function preservation);
  and, per continuous space, the distance of the learned relative element ``g_A^{-1}∘g_B`` to ``g^{-1}``.

Measured results (they drift with versions) are in the generated ``docs/results/lmc-dm-vit/`` report.

Text: the first characters of the Austen novels (``MODECONN_DATA/austen``) tokenized with MiniLM's own
WordPiece tokenizer, cut into blocks of ``context`` tokens (no special tokens, no padding).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import ConfigError, DataError, SpecError

Log = Callable[[str], None]
#: the BERT group without absorption: head permutation, per-head orthogonal QK / OV, FFN permutation (default)
GROUPS = {"heads": "permutation", "qk": "head_orthogonal", "vo": "head_orthogonal", "ffn": "permutation"}
#: characters of the Austen text tokenized for the training and test blocks
TEXT_CHARS = 60_000


@dataclass(frozen=True)
class MiniLMDMSize:
    """``layers``: the first N encoder layers of MiniLM (None: all 6); blocks of ``context`` tokens, the first
    ``train_blocks`` for learning and the last ``test_blocks`` of the text slice for measuring; dual matching
    from the identity with ``steps`` Adam steps at ``lr`` (batches of ``batch_size`` blocks, λ per
    ``lambda_schedule``), and from weight matching's element with ``wm_init_steps``; ``lambdas`` points on each
    measured path; ``seed`` of the planted element and of the matching."""

    layers: int | None = None
    context: int = 32
    train_blocks: int = 128
    test_blocks: int = 32
    batch_size: int = 8
    steps: int = 300
    lr: float = 0.02
    wm_init_steps: int = 50
    lambda_schedule: str = "uniform"
    lambdas: int = 11
    seed: int = 0


class HiddenStates(nn.Module):
    """``forward(input_ids (B, T) int64) -> (B, L, T, H)``: the outputs of all L layers of the wrapped
    ``BertModel`` (no embeddings), a plain tensor for dual matching and the checks."""

    def __init__(self, bert: nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out = self.bert(input_ids=input_ids, output_hidden_states=True)
        return torch.stack(out.hidden_states[1:], dim=1)


def load_minilm(root: Path, layers: int | None = None) -> nn.Module:
    """MiniLM (``BertModel``) from ``root`` in eval mode, cut to its first ``layers`` encoder layers if given.

    Raises: ConfigError (``layers`` not in ``[1, num_hidden_layers]``)."""
    from transformers import AutoConfig, AutoModel
    from transformers.utils import logging as hf_logging

    total = AutoConfig.from_pretrained(str(root), local_files_only=True, trust_remote_code=False).num_hidden_layers
    if layers is not None and not 1 <= layers <= total:
        raise ConfigError(f"MiniLM has {total} layers; layers={layers} is out of range")
    verbosity, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # cutting layers leaves checkpoint tensors unused: expected, not a warning
    hf_logging.disable_progress_bar()
    try:
        return AutoModel.from_pretrained(str(root), local_files_only=True, trust_remote_code=False,
                                         num_hidden_layers=layers or total).eval()
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()


def identity_component(spec, g: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``g`` with every orthogonal (per-head) matrix of determinant −1 moved to SO(d) by negating its first
    column (a new dict; permutations and other groups unchanged)."""
    out = dict(g)
    for s, t in g.items():
        if spec.group_of(s).isometric and not spec.group_of(s).exact:  # orthogonal matrices (per head)
            neg = torch.linalg.det(t.double()) < 0
            t = t.clone()
            t[..., :, 0] = torch.where(neg[..., None], -t[..., :, 0], t[..., :, 0])
            out[s] = t
    return out


def _text_blocks(root: Path, data, context: int, n_train: int, n_test: int) -> tuple[torch.Tensor, torch.Tensor]:
    from tokenizers import Tokenizer

    from ..data.locate import find_data_dir, idx_file
    from ..data.text import AUSTEN_FILE, AUSTEN_SHA256, encode_stream, read_text_file

    directory = find_data_dir("austen", data)
    path = idx_file(directory, AUSTEN_FILE)
    if path is None:
        raise DataError(f"{directory}: {AUSTEN_FILE}[.gz] not found")
    text = read_text_file(path, AUSTEN_SHA256)[:TEXT_CHARS]
    ids = torch.tensor(np.asarray(encode_stream(Tokenizer.from_file(str(root / "tokenizer.json")), text)), dtype=torch.int64)
    n = ids.numel() // context
    if n < n_train + n_test:
        raise ConfigError(f"{TEXT_CHARS} characters give {n} blocks of {context} tokens; {n_train} + {n_test} asked")
    x = ids[: n * context].reshape(n, context)
    return x[:n_train], x[n - n_test:]


class _Measure:
    """Held-out measurements of :func:`planted_minilm_dual` on a private copy of the model: ``measure(sa, sb)``
    the last hidden state along the linear path from ``sa`` to ``sb`` at ``lambdas`` (standardized MSE and
    relative distance to A's), :meth:`endpoint_changes` the max |Δ hidden state| of two endpoints vs A's."""

    def __init__(self, model: nn.Module, x_test: torch.Tensor, y_test: torch.Tensor, scale: torch.Tensor,
                 lambdas: np.ndarray) -> None:
        self.work = copy.deepcopy(model)
        self.x_test, self.y_test, self.scale, self.lambdas = x_test, y_test, scale, lambdas
        self.last, self.norm = y_test[:, -1], float(y_test[:, -1].norm())

    def __call__(self, sa: dict, sb: dict) -> tuple[list[float], list[float]]:
        work, last = self.work, self.last
        losses, dists = [], []
        for lam in self.lambdas:
            work.load_state_dict({k: (a + float(lam) * (sb[k] - a)) if a.is_floating_point() else a for k, a in sa.items()})
            with torch.no_grad():
                h = work(self.x_test)[:, -1]
            losses.append(float((((h - last) / self.scale[-1]) ** 2).mean()))
            dists.append(float((h - last).norm()) / self.norm)
        return losses, dists

    def endpoint_changes(self, sa: dict, sb: dict) -> dict[str, float]:
        changes = {}
        for side, state in (("a", sa), ("b", sb)):
            self.work.load_state_dict(state)
            with torch.no_grad():
                changes[side] = float((self.work(self.x_test) - self.y_test).abs().max())
        return changes


def _element_rel_errors(element: dict[str, torch.Tensor], g_inv: dict[str, torch.Tensor],
                        spaces: list[str]) -> dict[str, float]:
    """``‖element[s] − g_inv[s]‖_F / ‖g_inv[s]‖_F`` per space ``s`` (fp64)."""
    return {s: float((element[s].double() - g_inv[s].double()).norm() / g_inv[s].double().norm()) for s in spaces}


def planted_minilm_dual(root: Path, size: MiniLMDMSize | None = None, *, data: str | Path | None = None,
                        log: Log = print) -> dict[str, Any]:
    """Plant a random group element in a copy of MiniLM and re-join the copy with dual matching (module docstring).

    Args:
        root: the MiniLM checkpoint directory (``config.json``, ``model.safetensors``, ``tokenizer.json``).
        size: :class:`MiniLMDMSize` (default: all 6 layers).
        data: where to look for the Austen text (:func:`modeconn.data.find_data_dir`).
    Returns: JSON-ready dict: ``size``, ``layers``, ``spaces`` / ``continuous_spaces``, ``discrete_recovered``
        (weight matching's permutations equal ``g^{-1}``'s); per path label (``"before learning"``,
        ``"WM (full element)"``, ``"dual (identity init)"``, ``"dual (WM init)"``): ``path_loss`` and
        ``path_rel_distance`` per λ (``lambdas``) and their maxima ``barrier`` (standardized MSE,
        dimensionless) and ``max_rel_distance``; ``runs`` — per dual-matching run: ``steps``, ``seconds``,
        ``history`` (training loss per step), ``max_output_change`` (``a``/``b``: max |Δ hidden state| of the
        transformed endpoint vs A over all layers, held-out, in the hidden states' units; ``output_scale`` is
        max |hidden state|) and ``element_rel_error`` (per continuous space ‖g_A^{-1}∘g_B − g^{-1}‖_F / ‖g^{-1}‖_F);
        ``wm_seconds``, ``seconds``.
    Raises: DataError (text not found), ConfigError (bad size), SpecError (a transformed endpoint changed its
        function beyond dual matching's tolerance).
    """
    from ..match import weight_matching
    from ..symmetry.hf import hf_symmetry_spec

    size = size or MiniLMDMSize()
    start = time.perf_counter()
    model = HiddenStates(load_minilm(root, size.layers)).eval()
    x_train, x_test = _text_blocks(root, data, size.context, size.train_blocks, size.test_blocks)
    with torch.no_grad():
        y_train, y_test = model(x_train), model(x_test)
    # per (layer, feature) standard deviation over the training tokens: (L, 1, H), broadcast over (B, L, T, H)
    scale = y_train.transpose(0, 1).reshape(y_train.shape[1], -1, y_train.shape[-1]).std(dim=1)[:, None, :]

    def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (((out - y) / scale) ** 2).mean()

    spec = hf_symmetry_spec(model, groups=GROUPS)
    sd = model.state_dict()
    g = identity_component(spec, spec.random_element(seed=size.seed))
    planted = spec.apply(sd, g)
    g_inv = spec.inverse(g)
    t0 = time.perf_counter()
    wm = weight_matching(spec, sd, planted, seed=size.seed)
    wm_seconds = time.perf_counter() - t0
    discrete = {s: wm.element[s] for s in spec.spaces if spec.group_of(s).exact}
    continuous = [s for s in spec.spaces if s not in discrete]
    lambdas = np.linspace(0.0, 1.0, size.lambdas)
    measure = _Measure(model, x_test, y_test, scale, lambdas)

    paths = {"before learning": measure(sd, spec.apply(planted, {**spec.identity(), **discrete})),
             "WM (full element)": measure(sd, wm.apply(planted))}
    runs = _dual_runs(spec, model, sd, planted, wm, loss_fn, (x_train, y_train), size, measure, paths,
                      (g_inv, continuous), log)
    scale_out = float(y_test.abs().max())
    worst = max(c for r in runs.values() for c in r["max_output_change"].values())
    if worst > 1e-3 * max(1.0, scale_out):
        raise SpecError(f"planted MiniLM: a transformed endpoint changed its hidden states by {worst:.3g}")
    return {
        "size": asdict(size),
        "layers": int(model.bert.config.num_hidden_layers),
        "groups": GROUPS,
        "spaces": len(spec.spaces),
        "continuous_spaces": len(continuous),
        "discrete_recovered": all(torch.equal(discrete[s], g_inv[s]) for s in discrete),
        "wm_seconds": wm_seconds,
        "lambdas": lambdas.tolist(),
        "path_loss": {k: v[0] for k, v in paths.items()},
        "path_rel_distance": {k: v[1] for k, v in paths.items()},
        "barrier": {k: max(v[0]) for k, v in paths.items()},
        "max_rel_distance": {k: max(v[1]) for k, v in paths.items()},
        "runs": runs,
        "output_scale": scale_out,
        "seconds": time.perf_counter() - start,
    }


def _dual_runs(spec, model: nn.Module, sd, planted, wm, loss_fn, train: tuple[torch.Tensor, torch.Tensor],
               size: MiniLMDMSize, measure: _Measure, paths: dict[str, Any], truth: tuple[Any, list[str]],
               log: Log) -> dict[str, Any]:
    """The dual-matching runs of :func:`planted_minilm_dual` (identity init, WM init) on the ``train`` blocks: each
    run's path measured into ``paths`` under its label; returns the per-run records. ``truth``: ``(g^{-1}, the
    continuous spaces)`` the learned elements are compared with."""
    from ..match import dual_matching

    g_inv, continuous = truth
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*train), batch_size=size.batch_size,
                                         shuffle=True, generator=torch.Generator().manual_seed(size.seed))
    runs: dict[str, Any] = {}
    for label, init, steps in (("dual (identity init)", "identity", size.steps), ("dual (WM init)", "weight", size.wm_init_steps)):
        t0 = time.perf_counter()
        res = dual_matching(spec, model, sd, planted, loader, steps=steps, lr=size.lr, init=init, weight_alignment=wm,
                            loss_fn=loss_fn, lambda_schedule=size.lambda_schedule, seed=size.seed)
        seconds = time.perf_counter() - t0
        sa, sb = res.apply_a(sd), res.apply_b(planted)
        paths[label] = measure(sa, sb)
        runs[label] = {"init": init, "steps": steps, "seconds": seconds, "history": res.history[0],
                       "max_output_change": measure.endpoint_changes(sa, sb),
                       "element_rel_error": _element_rel_errors(res.element, g_inv, continuous)}
        log(f"planted MiniLM: {label}, {steps} steps in {seconds:.1f} s, path loss max {max(paths[label][0]):.2e}")
    return runs


def minilm_report(m: dict[str, Any]) -> str:
    """The report.md section of :func:`planted_minilm_dual`'s result."""
    from ..report import markdown_table

    s, runs = m["size"], m["runs"]
    mid = len(m["lambdas"]) // 2
    rows = [[k, f"{v:.2e}", f"{m['path_loss'][k][mid]:.2e}", f"{m['max_rel_distance'][k]:.2e}"]
            for k, v in m["barrier"].items()]
    ends = "; ".join(f"{k}: {r['max_output_change']['a']:.2e} (A) / {r['max_output_change']['b']:.2e} (B)"
                     for k, r in runs.items())
    errs = "; ".join(f"{k}: {max(r['element_rel_error'].values()):.2e}" for k, r in runs.items())
    return "\n".join([
        "## Planted MiniLM with dual matching",
        "",
        (f"all-MiniLM-L6-v2 ({m['layers']} of its 6 layers) moved by a random element of {m['groups']} (continuous parts on the "
         f"identity component SO(32) per head), B = g·A. Dual matching with weight matching's permutations "
         f"(recovered exactly: {m['discrete_recovered']}); loss: standardized MSE of all layers' hidden states against "
         f"A's; Adam lr {s['lr']}, batches of {s['batch_size']} × {s['context']} tokens from {s['train_blocks']} blocks, "
         f"λ {s['lambda_schedule']}. *Identity init*: the QK/OV transforms of both endpoints start at the identity, "
         f"{runs['dual (identity init)']['steps']} steps ({runs['dual (identity init)']['seconds']:.0f} s). *WM init* "
         f"(dual matching's default): B starts at weight matching's full element, {runs['dual (WM init)']['steps']} "
         f"steps. Path columns: the last hidden state on {s['test_blocks']} held-out blocks along the linear path "
         f"between the transformed endpoints, {s['lambdas']} λ points (0 at both endpoints)."),
        "",
        markdown_table(["path", "barrier: max over λ of the standardized MSE", "at λ = 0.5",
                        "max over λ of ‖h(λ) − h_A‖ / ‖h_A‖"], rows),
        "",
        (f"Transformed endpoints vs A (max |Δ hidden state|, all layers, held-out; scale {m['output_scale']:.2f}): "
         f"{ends}. Largest relative distance of the learned relative element g_A⁻¹∘g_B to g⁻¹ over "
         f"{m['continuous_spaces']} continuous spaces: {errs}. Total {m['seconds']:.0f} s."),
    ])
