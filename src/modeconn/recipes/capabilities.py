"""What every command does on every checkpoint kind: the capability table of the docs, read from the kinds'
operations (:mod:`modeconn.checkpoints`) so that it cannot claim what the code does not do.

A cell is supported when the kind has the command's operation (its own, or the generic in-memory one); its text is
:data:`NOTES`' entry, and :data:`TESTED_BY` names the tests that run it through the command line on tiny real models.
A cell without the operation is refused, for the reason :data:`REFUSED` states (the command's error names the kinds it
reads). ``tests/test_capabilities.py`` holds all three to the code.
"""

from __future__ import annotations

from . import align, check, evaluate, merge, pair  # noqa: F401  (the operations are attached on import)
from ..checkpoints import CHECKPOINT_KINDS

COMMANDS = {"align": "align", "merge": "merge", "barrier": "pair", "path": "pair", "check": "check", "eval": "evaluate"}
"""Command → the checkpoint-kind operation it dispatches through."""

_HF_DATA = ("causal and masked LMs on text (a registered text dataset or your corpus), sequence classifiers on your "
            "labelled texts, image classifiers on your image folder")
_ABSORBED = "dual-matched causal LMs on text, ViT classifiers on your image folder"
NOTES = {
    ("modeconn", "align"): "weight, activation, learned (STE); language models also dual / one-sided",
    ("modeconn", "merge"): "every rule; --align weight / activation / none; BatchNorm reset / REPAIR; scored",
    ("modeconn", "barrier"): "the recorded dataset, a registered one or your image folder",
    ("modeconn", "path"): "every path method",
    ("modeconn", "check"): "relationship, identifiability, predicted barriers",
    ("modeconn", "eval"): "loss and accuracy on the test split",
    ("huggingface", "align"): ("streaming weight matching (permutation or full group, models larger than memory); "
                               f"activation / learned in memory ({_HF_DATA}); dual / one-sided for causal LMs and ViT classifiers"),
    ("huggingface", "merge"): ("streamed (--align weight / none; every rule, mergekit's included); --align activation "
                               f"in memory ({_HF_DATA}), scored; --align dual / one-sided for two causal LMs or ViTs; "
                               "--eval lm-eval tasks"),
    ("huggingface", "barrier"): _HF_DATA,
    ("huggingface", "path"): _HF_DATA,
    ("huggingface", "check"): _HF_DATA,
    ("huggingface", "eval"): ("loss and perplexity (causal and masked LMs), accuracy (sequence and image "
                              "classifiers); lm-eval tasks (causal LMs)"),
    ("absorbed", "barrier"): _ABSORBED,
    ("absorbed", "path"): _ABSORBED,
    ("absorbed", "check"): _ABSORBED,
    ("absorbed", "eval"): "loss and perplexity on text, loss and accuracy on images",
}
for _kind in ("timm", "torchvision"):
    NOTES |= {(_kind, "align"): "weight, activation, learned (STE); written as the same kind",
              (_kind, "merge"): "every rule; --align weight / activation / none; BatchNorm reset / REPAIR; the same kind",
              (_kind, "barrier"): "a registered dataset or your image folder (the model's own preprocessing)",
              (_kind, "path"): "every path method", (_kind, "check"): "relationship, identifiability, predicted barriers",
              (_kind, "eval"): "loss and accuracy on the test split"}

REFUSED = {
    ("absorbed", "align"): "absorbed checkpoints are dual matching's output: align the checkpoints they came from",
    ("absorbed", "merge"): ("stock transformers cannot load the merge of absorbed LayerNorm-family endpoints: merge "
                            "the stock checkpoints with --align activation, or an RMSNorm family's dual-matched "
                            "endpoints (written as stock checkpoints)"),
}
"""Why a command refuses a kind (the cells without the operation)."""

_TIMM = "tests/test_checkpoint_kinds_timm_torchvision.py"
_HF_FAMILIES = "tests/test_hf_in_memory.py::test_other_causal_lm_families_align_merge_barrier_check_and_eval"
_DUAL_LM = "tests/test_dual_hf.py::test_dual_matching_of_hugging_face_causal_lms_through_the_cli"
_DUAL_VIT = "tests/test_hf_in_memory.py::test_dual_matching_of_vit_classifiers_through_the_cli"
_VIT = "tests/test_hf_in_memory.py::test_image_classifiers_in_memory_on_an_image_folder"
_ENCODERS = "tests/test_hf_encoders.py::test_merge_barrier_check_eval_and_path_on_an_encoder"
_ENCODERS_ALIGN = "tests/test_hf_encoders.py::test_align_an_encoder_writes_a_stock_checkpoint_computing_b"
TESTED_BY: dict[tuple[str, str], str | tuple[str, ...]] = {
    ("modeconn", "align"): "tests/test_cli.py::test_train_barrier_align_merge",
    ("modeconn", "merge"): "tests/test_cli.py::test_train_barrier_align_merge",
    ("modeconn", "barrier"): "tests/test_cli.py::test_train_barrier_align_merge",
    ("modeconn", "path"): "tests/test_paths_cli.py::test_every_method_through_the_cli_gives_a_saved_path_with_the_checkpoints_as_endpoints",
    ("modeconn", "check"): "tests/test_user_data_cli.py::test_modeconn_checkpoints_on_an_image_folder",
    ("modeconn", "eval"): "tests/test_eval.py::test_a_modeconn_checkpoint_is_scored_on_its_recorded_dataset",
    ("huggingface", "align"): ("tests/test_hf_in_memory.py::test_align_in_memory_writes_a_stock_checkpoint_computing_b",
                               _HF_FAMILIES, _ENCODERS_ALIGN, _VIT),
    ("huggingface", "merge"): ("tests/test_hf_in_memory.py::test_merge_align_activation_on_a_corpus_then_eval_and_check",
                               _HF_FAMILIES, _ENCODERS, _VIT),
    ("huggingface", "barrier"): (_VIT, _HF_FAMILIES, _ENCODERS),
    ("huggingface", "path"): ("tests/test_user_data_cli.py::test_path_on_a_jsonl_corpus", _ENCODERS),
    ("huggingface", "check"): ("tests/test_check_hf.py::test_check_reads_hugging_face_causal_lms_and_recognises_a_permuted_copy",
                               _HF_FAMILIES, _ENCODERS, _VIT),
    ("huggingface", "eval"): ("tests/test_eval.py::test_lm_eval_scores_through_modeconn_equal_lm_evals_own_entry_point",
                              _HF_FAMILIES, _ENCODERS,
                              "tests/test_hf_in_memory.py::test_eval_scores_an_image_classifier_on_its_image_folder"),
    ("absorbed", "barrier"): (_DUAL_LM, _DUAL_VIT),
    ("absorbed", "path"): (_DUAL_LM, _DUAL_VIT),
    ("absorbed", "check"): (_DUAL_LM, _DUAL_VIT),
    ("absorbed", "eval"): (_DUAL_LM, _DUAL_VIT),
    ("timm", "align"): f"{_TIMM}::test_align_timm_writes_a_timm_directory_computing_b",
    ("timm", "merge"): f"{_TIMM}::test_merge_timm_reloads_identically",
    ("timm", "barrier"): f"{_TIMM}::test_barrier_and_path_on_timm",
    ("timm", "path"): f"{_TIMM}::test_barrier_and_path_on_timm",
    ("timm", "check"): f"{_TIMM}::test_fashion_mnist_fits_a_one_channel_timm_model_and_not_a_three_channel_one",
    ("timm", "eval"): f"{_TIMM}::test_barrier_and_eval_on_torchvision_and_eval_on_timm",
    ("torchvision", "align"): f"{_TIMM}::test_align_torchvision_learned_keeps_b_function",
    ("torchvision", "merge"): f"{_TIMM}::test_merge_with_weights_one_zero_computes_a",
    ("torchvision", "barrier"): f"{_TIMM}::test_barrier_and_eval_on_torchvision_and_eval_on_timm",
    ("torchvision", "path"): f"{_TIMM}::test_barrier_and_eval_on_torchvision_and_eval_on_timm",
    ("torchvision", "check"): f"{_TIMM}::test_check_on_torchvision",
    ("torchvision", "eval"): f"{_TIMM}::test_barrier_and_eval_on_torchvision_and_eval_on_timm",
}
"""The test (or tests: one per model family or task) that runs each supported cell through the command line."""


def table() -> list[dict[str, object]]:
    """One row per registered kind and command: ``kind``, ``command``, ``supported`` and ``text`` (what it does, or
    why it is refused)."""
    rows = []
    for name, kind in CHECKPOINT_KINDS.items():
        for command, operation in COMMANDS.items():
            supported = kind.operation(operation) is not None
            text = NOTES.get((name, command), "") if supported else REFUSED.get((name, command), "refused")
            rows.append({"kind": name, "command": command, "supported": supported, "text": text})
    return rows


def markdown() -> str:
    """The table as Markdown: one row per kind, ✔ cells with what the command does, refused cells with the reason."""
    head = "| kind | " + " | ".join(f"`{c}`" for c in COMMANDS) + " |\n|---|" + "---|" * len(COMMANDS) + "\n"
    by_kind: dict[str, list[str]] = {}
    for row in table():
        mark = f"✔ {row['text']}" if row["supported"] else f"✘ {row['text']}"
        by_kind.setdefault(str(row["kind"]), []).append(mark.strip())
    label = {name: kind.label for name, kind in CHECKPOINT_KINDS.items()}
    return head + "".join(f"| {label[k]} | " + " | ".join(cells) + " |\n" for k, cells in by_kind.items())
