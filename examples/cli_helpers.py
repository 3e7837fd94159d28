"""What the tutorial scripts share: running ``modeconn`` as a user types it, a local lm-evaluation-harness task, and
the scripts' command line (``OUT_DIR [--quick]``)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

CHOICE_TASK = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {file}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
metric_list:
  - metric: acc
"""


def modeconn(*args, ok: tuple[int, ...] = (0,)) -> str:
    """``modeconn ARGS`` in a fresh process, as a user types it; its output. SystemExit for an exit status outside
    ``ok`` (``path`` also exits 3 for a path found but incomplete, still written and reported)."""
    print("$", " ".join(["modeconn", *map(str, args)]), flush=True)
    res = subprocess.run([sys.executable, "-m", "modeconn", *map(str, args)], capture_output=True, text=True,
                         check=False)
    print(res.stdout[-1500:], res.stderr[-1500:] if res.returncode else "", flush=True)
    if res.returncode not in ok:
        raise SystemExit(f"modeconn {args[0]} failed with exit status {res.returncode}")
    return res.stdout


def choice_task(directory: Path, name: str, paragraphs: list[str]) -> Path:
    """A local lm-eval task ``name`` (a YAML task over a local ``.jsonl``; no network): continue a paragraph's first
    six words with its true next three or with another paragraph's first three. Returns the task directory
    (``--include-path``)."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, p in enumerate(paragraphs[:40]):
        words, other = p.split(), paragraphs[-1 - i].split()
        rows.append({"context": " ".join(words[:6]), "choices": [" " + " ".join(words[6:9]), " " + " ".join(other[:3])],
                     "label": 0})
    (directory / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (directory / f"{name}.yaml").write_text(CHOICE_TASK.format(name=name, file=directory / f"{name}.jsonl"))
    return directory


def run_tutorial(main: Callable[[Path, bool], object], doc: str) -> None:
    """The tutorial scripts' command line: ``OUT_DIR [--quick]`` (the small size the test suite runs)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    main(args.out, args.quick)
