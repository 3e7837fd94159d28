"""`modeconn experiment zoo`: real torchvision and timm model definitions through modeconn.

For each model (random initialisation, 10 classes; two independently initialised copies A and B):

1. ``symmetry_spec`` with its self-check (a random element on a perturbed copy);
2. *frozen writers*: Linear/Conv layers (and attention projections) whose output space no permutation acts on —
   only the classifier may be one;
3. the function check at ``rtol`` on a perturbed copy (random norm affines, BatchNorm statistics, biases, layer
   scales; :func:`~modeconn.symmetry.selfcheck.check_function_preserved`);
4. planted recovery: weight matching of A against A transformed by a random element must return its inverse;
5. ``merge`` of A and weight-matched B with BatchNorm reset and with REPAIR, and ``evaluate_path`` between them.

A model is *supported* when all five hold; a model whose trace is refused is reported with the error, which names
the module, the operation and what freezing would cost. ``--quick`` runs reduced configurations of the same
definitions (CI); the full size runs the standard configurations. Needs ``torchvision`` and ``timm``.
Writes ``results.json`` and ``report.md``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ..errors import ConfigError
from ..report import markdown_table
from .output import output_directory, write_results
from .registry import Experiment, register_experiment

Log = Callable[[str], None]


@dataclass(frozen=True)
class ZooSize:
    """Which models, and the function-check tolerance."""

    models: tuple[str, ...]
    rtol: float = 1e-5


def _tv(name: str, **kw: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import torchvision.models as tvm

        return getattr(tvm, name)(weights=None, num_classes=10, **kw)
    return build


def _tv_class(path: str, *args: Any, **kw: Any) -> Callable[[], nn.Module]:
    """A torchvision model class (``"resnet.ResNet"``) built with explicit, reduced settings."""
    def build() -> nn.Module:
        import importlib

        module, cls = path.rsplit(".", 1)
        resolved = [a() if callable(a) and not isinstance(a, type) else a for a in args]
        return getattr(importlib.import_module(f"torchvision.models.{module}"), cls)(*resolved, num_classes=10, **kw)
    return build


def _timm(name: str, **kw: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import timm

        return timm.create_model(name, pretrained=False, num_classes=10, **kw)
    return build


def _block(module: str, name: str) -> Callable[[], Any]:
    def get() -> Any:
        import importlib

        return getattr(importlib.import_module(f"torchvision.models.{module}"), name)
    return get


def _regnet_params():
    from torchvision.models.regnet import BlockParams

    return BlockParams.from_init_params(depth=4, w_0=16, w_a=8.0, w_m=2.0, group_width=8, se_ratio=0.25)


def _convnext_blocks():
    from torchvision.models.convnext import CNBlockConfig

    return [CNBlockConfig(16, 32, 1), CNBlockConfig(32, None, 1)]


MODELS: dict[str, tuple[Callable[[], nn.Module], int]] = {
    # standard configurations (full size): builder, input height = width
    "resnet18": (_tv("resnet18"), 64), "resnet50": (_tv("resnet50"), 64),
    "resnext50_32x4d": (_tv("resnext50_32x4d"), 64), "wide_resnet50_2": (_tv("wide_resnet50_2"), 64),
    "regnet_x_400mf": (_tv("regnet_x_400mf"), 64), "regnet_y_400mf": (_tv("regnet_y_400mf"), 64),
    "vgg11_bn": (_tv("vgg11_bn"), 64), "alexnet": (_tv("alexnet"), 224), "squeezenet1_0": (_tv("squeezenet1_0"), 64),
    "densenet121": (_tv("densenet121"), 64), "mobilenet_v2": (_tv("mobilenet_v2"), 64),
    "mobilenet_v3_small": (_tv("mobilenet_v3_small"), 64), "mnasnet0_5": (_tv("mnasnet0_5"), 64),
    "googlenet": (_tv("googlenet", aux_logits=False, init_weights=True), 224),
    "shufflenet_v2_x0_5": (_tv("shufflenet_v2_x0_5"), 64), "efficientnet_b0": (_tv("efficientnet_b0"), 64),
    "efficientnet_v2_s": (_tv("efficientnet_v2_s"), 64), "convnext_tiny": (_tv("convnext_tiny"), 64),
    "vit_b_16": (_tv("vit_b_16"), 224), "swin_t": (_tv("swin_t"), 224),
    "timm/resnet18d": (_timm("resnet18d"), 64), "timm/efficientnet_b0": (_timm("efficientnet_b0"), 64),
    "timm/convnext_atto": (_timm("convnext_atto"), 64), "timm/vit_tiny_patch16_224": (_timm("vit_tiny_patch16_224"), 224),
    "timm/dla34": (_timm("dla34"), 64), "timm/regnetx_002": (_timm("regnetx_002"), 64),
    "timm/mobilenetv3_small_100": (_timm("mobilenetv3_small_100"), 64), "timm/resnext26ts": (_timm("resnext26ts"), 64),
    "resnet34": (_tv("resnet34"), 64), "squeezenet1_1": (_tv("squeezenet1_1"), 64),
    "mobilenet_v3_large": (_tv("mobilenet_v3_large"), 64), "inception_v3": (_tv("inception_v3", aux_logits=False, init_weights=True), 75),
    "swin_v2_t": (_tv("swin_v2_t"), 224), "maxvit_t": (_tv("maxvit_t"), 224),
    "timm/deit_tiny_patch16_224": (_timm("deit_tiny_patch16_224"), 224), "timm/mixer_s16_224": (_timm("mixer_s16_224"), 224),
    "timm/resmlp_12_224": (_timm("resmlp_12_224"), 224), "timm/res2net50_14w_8s": (_timm("res2net50_14w_8s"), 64),
    "timm/cspresnet50": (_timm("cspresnet50"), 64), "timm/ghostnet_100": (_timm("ghostnet_100"), 64),
    "timm/nf_resnet26": (_timm("nf_resnet26"), 64), "timm/regnety_002": (_timm("regnety_002"), 64),
    "timm/hrnet_w18_small": (_timm("hrnet_w18_small"), 64), "timm/poolformer_s12": (_timm("poolformer_s12"), 64),
    "timm/seresnet18": (_timm("seresnet18"), 64), "timm/efficientnet_lite0": (_timm("efficientnet_lite0"), 64),
    "timm/xception41": (_timm("xception41"), 96), "timm/rexnet_100": (_timm("rexnet_100"), 64),
    "timm/dpn68": (_timm("dpn68"), 64), "timm/resnest14d": (_timm("resnest14d"), 64),
    "timm/beit_base_patch16_224": (_timm("beit_base_patch16_224"), 224),
    # reduced configurations of the same definitions (quick size)
    "resnet (1 block per stage)": (_tv_class("resnet.ResNet", _block("resnet", "BasicBlock"), [1, 1, 1, 1]), 32),
    "resnext (groups 4)": (_tv_class("resnet.ResNet", _block("resnet", "Bottleneck"), [1, 1, 1, 1], groups=4,
                                     width_per_group=4), 32),
    "regnet (SE, group width 8)": (_tv_class("regnet.RegNet", _regnet_params), 32),
    "densenet (growth 8)": (_tv_class("densenet.DenseNet", growth_rate=8, block_config=(2, 2), num_init_features=16,
                                      bn_size=2), 32),
    "mobilenet_v2 ×0.25": (_tv("mobilenet_v2", width_mult=0.25), 32),
    "mobilenet_v3_small ×0.5": (_tv("mobilenet_v3_small", width_mult=0.5), 32),
    "efficientnet_b0 (torchvision)": (_tv("efficientnet_b0"), 32),
    "convnext (2 stages)": (_tv_class("convnext.ConvNeXt", _convnext_blocks, stochastic_depth_prob=0.1), 32),
    "vit (2 layers × 32)": (_tv_class("vision_transformer.VisionTransformer", image_size=32, patch_size=8, num_layers=2,
                                      num_heads=2, hidden_dim=32, mlp_dim=64), 32),
    "swin (2 stages × 16)": (_tv_class("swin_transformer.SwinTransformer", patch_size=[4, 4], embed_dim=16,
                                       depths=[2, 2], num_heads=[2, 4], window_size=[4, 4], stochastic_depth_prob=0.1), 32),
    "timm/vit (2 layers × 32)": (_timm("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, embed_dim=32,
                                       num_heads=2), 32),
    "timm/efficientnet_b0 (BatchNormAct)": (_timm("efficientnet_b0"), 32),
    "timm/beit (2 layers × 32)": (_timm("beit_base_patch16_224", img_size=32, patch_size=8, embed_dim=32, depth=2,
                                        num_heads=2, use_rel_pos_bias=True, init_values=0.1), 32),
}
"""Model label → (builder of a randomly initialised 10-class model, input size)."""

SIZES = {
    "quick": ZooSize(models=("resnet (1 block per stage)", "resnext (groups 4)", "regnet (SE, group width 8)",
                             "densenet (growth 8)", "mobilenet_v2 ×0.25", "mobilenet_v3_small ×0.5",
                             "efficientnet_b0 (torchvision)", "convnext (2 stages)", "vit (2 layers × 32)",
                             "swin (2 stages × 16)", "timm/vit (2 layers × 32)", "timm/convnext_atto",
                             "timm/efficientnet_b0 (BatchNormAct)", "timm/dla34",
                             "timm/beit (2 layers × 32)")),
    "full": ZooSize(models=tuple(name for name in MODELS if " " not in name)),  # the standard configurations
}


def frozen_writers(spec, model: nn.Module) -> list[str]:
    """Linear / Conv / attention layers whose output no permutation acts on (their weight has no output binding)."""
    writers = [n for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d))]
    writers += [f"{n}.in_proj" for n, m in model.named_modules() if isinstance(m, nn.MultiheadAttention)]
    key = {n: f"{n}_weight" if n.endswith(".in_proj") else f"{n}.weight" for n in writers}
    return [n for n in writers if not any(b.side == "out" for b in spec.tensors.get(key[n], ()))]


def check_model(build: Callable[[], nn.Module], size: int, rtol: float) -> dict[str, Any]:
    """The five checks of the module docstring on two copies of ``build()``; raises what modeconn raises."""
    import modeconn as mc
    from ..symmetry.selfcheck import check_function_preserved

    t0 = time.perf_counter()
    torch.manual_seed(0)
    a, b = build().eval(), build().eval()
    x = torch.randn(2, 3, size, size)
    spec = mc.symmetry_spec(a, x)
    sd_a, sd_b = a.state_dict(), b.state_dict()
    err = check_function_preserved(spec, a, (x,), seed=1, rtol=rtol)
    g = spec.random_element(seed=0)
    planted = mc.weight_matching(spec, sd_a, spec.apply(sd_a, g), restarts=1, max_iter=5)
    aligned = spec.apply(sd_b, mc.weight_matching(spec, sd_a, sd_b, restarts=1, max_iter=5).element)
    loader = DataLoader(TensorDataset(torch.randn(8, 3, size, size), torch.randint(0, 10, (8,))), batch_size=4)
    mc.merge([sd_a, aligned], model=a, bn="reset", bn_loader=loader, spec=spec)
    try:
        mc.merge([sd_a, aligned], model=a, bn="repair", bn_loader=loader, spec=spec)
        repair = "ok"
    except mc.errors.ConfigError as exc:
        repair = f"refused: {exc}"
    curve = mc.evaluate_path(a, sd_a, aligned, loader, lambdas=3, bn_loader=loader, spec=spec)
    row = {"spaces": len(spec.spaces), "frozen_writers": frozen_writers(spec, a), "function_rel_err": err,
           "planted_recovered": spec.equal(planted.element, spec.inverse(g)), "repair": repair,
           "path_points": len(curve.lambdas), "parameters": sum(t.numel() for t in sd_a.values()),
           "seconds": round(time.perf_counter() - t0, 1)}
    row["status"] = "supported" if (len(row["frozen_writers"]) <= 1 and row["planted_recovered"] and err <= rtol
                                    and repair == "ok") else "partial"
    return row


def check_libraries() -> dict[str, str]:
    """torch / torchvision / timm versions; ConfigError naming what to install when one is missing."""
    versions = {"torch": torch.__version__}
    for lib in ("torchvision", "timm"):
        try:
            versions[lib] = __import__(lib).__version__
        except ImportError as exc:
            raise ConfigError(f"experiment zoo needs {lib}: pip install torch==2.14.1 torchvision==0.29.1 timm "
                              f"(torchvision must match torch) — {exc}") from None
    return versions


def run_zoo(out: str | Path, *, size: ZooSize | None = None, data: str | Path | None = None, overwrite: bool = False,
            log: Log = print) -> dict[str, Any]:
    """Run the checks (module docstring) on ``size.models`` and write ``results.json`` / ``report.md`` into ``out``
    atomically. ``data`` is not used (inputs are random: the checks are about the function, not accuracy).
    Raises ConfigError (torchvision/timm missing, unknown model) before any work."""
    size = size or SIZES["full"]
    unknown = [m for m in size.models if m not in MODELS]
    if unknown:
        raise ConfigError(f"unknown zoo models {unknown}; known: {sorted(MODELS)}")
    versions = check_libraries()
    start = time.perf_counter()
    with output_directory(out, overwrite) as tmp:
        rows: dict[str, dict[str, Any]] = {}
        for name in size.models:
            build, px = MODELS[name]
            try:
                rows[name] = check_model(build, px, size.rtol)
            except Exception as exc:  # noqa: BLE001 — a refusal (or a crash) is a result, recorded with its message
                rows[name] = {"status": "refused", "error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
            log(f"{name}: {rows[name]['status']}")
        results = {"task": "real torchvision/timm definitions through modeconn", "versions": versions,
                   "size": asdict(size), "models": rows}
        return write_results(tmp, results, report, start)


def _cells(name: str, r: dict[str, Any]) -> list[Any]:
    if r["status"] == "refused":
        return [name, "refused", "", "", "", "", "", r["error"][:500]]
    return [name, r["status"], r["spaces"], f"{r['function_rel_err']:.1e}", "exact" if r["planted_recovered"] else "no",
            r["repair"][:60], ", ".join(r["frozen_writers"]) or "none", f"{r['seconds']:.0f} s"]


def report(r: dict[str, Any]) -> str:
    rows = r["models"]
    n_ok = sum(v["status"] == "supported" for v in rows.values())
    table = markdown_table(["model", "status", "spaces", "function rel. err.", "planted", "REPAIR", "frozen writers",
                            "note / time"], [_cells(k, v) for k, v in rows.items()])
    return "\n".join([
        f"# {r['task']}", "", ", ".join(f"{k} {v}" for k, v in r["versions"].items()) + ".", "",
        f"**{n_ok} of {len(rows)} supported**: traced with no frozen writer beyond the classifier, the function kept "
        f"on a perturbed copy within {r['size']['rtol']:g} (relative), a planted element recovered exactly by weight "
        "matching, merge with BatchNorm reset and REPAIR and `evaluate_path` run. Random initialisation, two copies "
        "per model; refusals name the module, the operation and what freezing would cost.", "",
        table, "", f"Total {r['seconds']:.0f} s.", ""])


register_experiment(Experiment("zoo", __doc__, SIZES, run_zoo, report, ("report.md", "results.json"),
                               why_not="the models are fixed definitions"))
