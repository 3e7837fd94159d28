"""A newcomer's first hour (#16): data found without exporting anything, `--download`, every printed table readable
at 80 columns (typer's runner with COLUMNS=80), reports that say what they measured, independent sweep pairs with
mean ± std over seeds, errors naming the cause, LICENSE / --version / help texts, honest barrier figures, and the
README's examples run verbatim."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

import modeconn
from modeconn.cli import app
from modeconn.cli.tables import barrier_table as terminal_barrier_table
from modeconn.data import download as download_mod
from modeconn.data import find_data_dir, locate
from modeconn.errors import ConfigError, DataError
from modeconn.experiments import identifiability
from modeconn.experiments.registry import EXPERIMENTS, Experiment
from modeconn.io import config_differences
from modeconn.path import Curve
from modeconn.report.figures import loss_acc_figure
from modeconn.report.stats import format_mean_std, mean_std
from modeconn.report.tables import FLAT_NOTE, barrier_table, flat_at_endpoint
from modeconn.report.terminal import fit_markdown

pytestmark = pytest.mark.usefixtures("one_thread")

REPO = Path(__file__).resolve().parents[1]
IDX_STEMS = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
COMMANDS = ("demo", "train", "barrier", "merge", "path", "experiment", "sweep")


def run80(*args, ok=True):
    """``modeconn ARGS`` at 80 columns, without a terminal (as in a log file or CI)."""
    res = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "80"})
    if ok:
        assert res.exit_code == 0, res.output
    return res


def assert_fits_80(text: str, path: Path | None = None) -> None:
    """Every line fits 80 columns and nothing is truncated; lines naming ``path`` (where outputs went) are exempt."""
    long = [line for line in text.splitlines() if len(line) > 80 and (path is None or str(path) not in line)]
    assert not long, f"lines wider than 80 columns: {long}"
    assert "…" not in text, "a cell or header was truncated"


@pytest.fixture
def no_env_data(monkeypatch, tmp_path):
    """No $MODECONN_DATA, an empty download cache and no system directory: only the default rule can find data."""
    monkeypatch.delenv("MODECONN_DATA", raising=False)
    monkeypatch.setattr(locate, "cache_dir", lambda: tmp_path / "cache")
    monkeypatch.setitem(locate.LAYOUTS, "fashion-mnist", dataclasses.replace(locate.LAYOUTS["fashion-mnist"], system_dirs=()))


@pytest.fixture(scope="module")
def digits_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    for name, seed, width in (("a", 0, 16), ("b", 1, 16), ("wide", 2, 32)):
        run80("train", "--out", root / name, "--dataset", "digits", "--epochs", "2", "--seed", seed,
              "-m", f"width={width}", "-m", "depth=1", "--batch-size", "64")
    return root


def _curve(test_loss, test_acc) -> Curve:
    lam = np.linspace(0, 1, len(test_loss))
    metrics = {"test": {"loss": np.asarray(test_loss, float), "acc": np.asarray(test_acc, float)}}
    return Curve(lambdas=lam, metrics=metrics)


# ------------------------------------------------------------------------------------------------ 1. data
def test_data_is_found_beside_the_checkout_without_exporting_anything(no_env_data, monkeypatch, tmp_path, shared_data):
    monkeypatch.chdir(tmp_path)  # ../shared/data from here does not exist: only the checkout rule applies
    if locate.source_checkout() is None or (locate.source_checkout().parent / "shared" / "data").resolve() != shared_data:
        pytest.fail("this test runs from a checkout with shared/ beside it (the README's layout)")
    assert find_data_dir("mnist") == locate.source_checkout().parent / "shared" / "data" / "mnist"


def test_data_is_found_in_dot_dot_shared_data_from_the_working_directory(no_env_data, monkeypatch, tmp_path):
    monkeypatch.setattr(locate, "source_checkout", lambda: None)  # an installed package, not a checkout
    data = tmp_path / "shared" / "data" / "mnist"
    data.mkdir(parents=True)
    for stem in IDX_STEMS:
        (data / f"{stem}.gz").write_bytes(b"")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert find_data_dir("mnist") == data.resolve()
    monkeypatch.setenv("MODECONN_DATA", str(tmp_path / "elsewhere"))  # an explicit setting replaces the default
    with pytest.raises(DataError, match="elsewhere"):
        find_data_dir("mnist")


def test_download_flag_fetches_missing_mnist_and_the_error_offers_it(no_env_data, monkeypatch, tmp_path, shared_data):
    monkeypatch.setattr(locate, "default_data_roots", lambda: [])
    fetched = []

    def fetch(url, output):
        fetched.append(url)
        shutil.copyfile(shared_data / "mnist" / url.rsplit("/", 1)[1], output)

    monkeypatch.setattr(download_mod, "_fetch", fetch)
    args = ["train", "--out", tmp_path / "m", "--dataset", "mnist", "--epochs", "1", "--limit-train", "256",
            "-m", "width=8", "-m", "depth=1"]
    res = run80(*args, ok=False)
    assert res.exit_code == 2 and "not found" in res.output and "--download" in res.output and fetched == []
    run80(*args, "--download")
    assert len(fetched) == 4 and (tmp_path / "m" / "model.safetensors").is_file()
    for command in ("train", "barrier", "path", "experiment"):
        assert "--download" in run80(command, "--help").output


# ------------------------------------------------------------------------------- 2, 3. tables and reports
@pytest.mark.slow
def test_demo_table_reads_at_80_columns_and_the_report_has_the_full_table(tmp_path):
    res = run80("demo", "--out", tmp_path / "demo", "--epochs", "1")
    table = res.output[res.output.index("barriers on the test split"):]
    assert_fits_80(table, tmp_path)
    assert "B_mean" in table and "B_interp" in table and "barrier_interp (loss) = max_λ" in table
    for method in ("naive", "weight", "activation"):
        assert re.search(rf"^\s*{method}\s+\d", table, re.M), f"{method} row wrapped or missing"
    report = (tmp_path / "demo" / "report.md").read_text()
    assert "| barrier_interp (loss) |" in report and "rel. acc. drop % = 100 · (max(acc(A), acc(B))" in report


def test_barrier_output_and_report_say_what_was_evaluated(digits_pair, tmp_path):
    out = tmp_path / "bar"
    res = run80("barrier", digits_pair / "a", digits_pair / "b", "--method", "naive", "--method", "weight",
                "--lambdas", "5", "--eval-limit", "50", "--out", out)
    assert_fits_80(res.output, tmp_path)
    assert "first 50 of 360 examples, --eval-limit 50" in res.output
    assert "aligning: weight matching" in res.output and not re.search(r"\w\.py:\d+", res.output)  # no file:line
    report = (out / "report.md").read_text()
    assert "`--eval-limit`: 50" in report and "test: first 50 of 360 examples" in report
    results = json.loads((out / "results.json").read_text())
    assert results["eval_limit"] == 50 and results["examples"]["test"] == {"evaluated": 50, "total": 360}
    ends = results["barriers"]["naive"]["test"]
    assert [results["endpoints"][k]["acc"] for k in "AB"] == ends["endpoint_acc"]  # the curves' examples
    acc = f"{100 * ends['endpoint_acc'][0]:.2f}%"
    assert f"A loss {ends['endpoint_loss'][0]:.4f}, acc {acc}" in report


def test_a_flat_path_says_barrier_mean_is_half_the_endpoint_difference():
    flat = _curve([0.10, 0.12, 0.14, 0.16, 0.20], [0.9, 0.9, 0.9, 0.9, 0.88])
    bump = _curve([0.10, 0.5, 0.9, 0.5, 0.20], [0.9, 0.7, 0.5, 0.7, 0.88])
    assert flat_at_endpoint(flat.summary()["test"]) and not flat_at_endpoint(bump.summary()["test"])
    assert flat.barrier("mean", "test") == pytest.approx((0.20 - 0.10) / 2)
    md = barrier_table({"aligned": flat, "naive": bump}, "test")
    assert "| aligned | 0.0500* |" in md and "| naive | 0.7500 |" in md and FLAT_NOTE in md
    summaries = {"weight": flat.summary(), "naive": bump.summary()}
    merged = {m: {"test": {"acc": 0.9}} for m in summaries}
    console = Console(width=80, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(terminal_barrier_table(summaries, merged))
    text = console.export_text()
    assert_fits_80(text)
    assert "0.0500*" in text and "half the endpoint difference" in text.replace("\n", " ")


def test_single_samples_print_no_spread_and_repeats_print_mean_std_n():
    assert format_mean_std(mean_std([0.25])) == "0.250"
    assert format_mean_std(mean_std([0.2, 0.4]), show_n=True) == "0.300 ± 0.141 (n=2)"
    assert format_mean_std(mean_std([])) == "n/a"
    one_pair = identifiability.aggregate([{"test_acc": 0.9}], ["test_acc"])
    assert identifiability._pm(one_pair, "test_acc", 100, 2) == "90.00"


def test_wide_markdown_tables_are_stacked_to_80_columns_keeping_every_cell():
    header = ["setting", "test acc %", "unaligned barrier_mean", "unaligned barrier_interp", "WM-aligned barrier_mean",
              "unaligned acc drop %", "identity/optimal AM"]
    rows = [[f"σ_F={s}", "97.12 ± 0.31", "0.812 ± 0.044", "0.800 ± 0.040", "0.051 ± 0.008", "3.21 ± 0.40", "0.912"]
            for s in (0.0, 1.0)]
    md = "# title\n\n" + "| " + " | ".join(header) + " |\n|" + "---|" * len(header) + "\n" + "\n".join(
        "| " + " | ".join(r) + " |" for r in rows) + "\n\n![figure](f.png)\n"
    text = fit_markdown(md)
    assert_fits_80(text)
    for r in rows:
        for name, value in zip(header[1:], r[1:], strict=True):
            assert f"{name}: {value}" in text
    assert "f.png" not in text
    narrow = fit_markdown("| a | b |\n|---|---:|\n| x | 1 |")
    assert narrow.splitlines()[0].split() == ["a", "b"] and "|" not in narrow


def test_experiment_output_reads_at_80_columns(monkeypatch, tmp_path):
    rows = [{"test_acc": 0.95, "unaligned_barrier_mean": 0.8, "unaligned_barrier_interp": 0.79,
             "aligned_barrier_mean": 0.05, "unaligned_acc_drop_pct": 3.0, "identity_ratio": 0.9}]
    results = {"experiment": "wide", "dataset": "synthetic", "size": "quick", "pairs": 1,
               "settings": [{"label": "σ_F=1", "summary": identifiability.aggregate(rows, list(rows[0]))}]}

    def run(out, *, size, data, overwrite, log):
        out.mkdir(parents=True)
        return results

    exp = Experiment("wide-report", "A report with a wide table.", {"quick": None, "full": None}, run,
                     identifiability.report, ("report.md",))
    monkeypatch.setitem(EXPERIMENTS._items, "wide-report", exp)
    res = run80("experiment", "wide-report", "--quick", "--out", tmp_path / "e")
    assert_fits_80(res.output, tmp_path)
    assert "unaligned barrier_interp: 0.790" in res.output and "0.790 ±" not in res.output  # one pair: no spread


# ------------------------------------------------------------------------------------------------ 4. sweeps
def test_sweep_pairs_are_independent_and_aggregated_over_seeds(tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text('name = "pairs"\ntask = "barrier"\n[base]\nepochs = 1\nwidth = 8\ndepth = 1\nlambdas = 3\n'
                    'method = "naive"\n[grid]\nseed = [0, 1]\n')
    res = run80("sweep", grid, "--out", tmp_path / "s", "--backend", "sequential")
    assert_fits_80(res.output, tmp_path)
    results = json.loads((tmp_path / "s" / "results.json").read_text())
    assert [r["init_seeds"] for r in results["rows"]] == [[0, 1], [2, 3]]  # no model shared between seeds
    (agg,) = results["over_seeds"]
    values = [r["barrier_mean_loss"] for r in results["rows"]]
    assert agg["n"] == 2 and agg["barrier_mean_loss"]["mean"] == pytest.approx(np.mean(values))
    assert agg["barrier_mean_loss"]["std"] == pytest.approx(np.std(values, ddof=1))
    assert "barrier_mean_loss: " in res.output and " ± " in res.output
    assert "mean ± std (n)" in (tmp_path / "s" / "report.md").read_text()


# ------------------------------------------------------------------------------------------------ 5. errors
def test_a_dataset_of_the_wrong_shape_names_both_shapes_before_tracing(digits_pair, tmp_path):
    res = run80("barrier", digits_pair / "a", digits_pair / "b", "--dataset", "mnist", "--limit-train", "64",
                "--out", tmp_path / "x", ok=False)
    assert res.exit_code == 2
    assert "(1, 28, 28)" in res.output and "(1, 8, 8)" in res.output and "'digits'" in res.output
    assert "fx" not in res.output and "Traceback" not in res.output


def test_mismatched_checkpoints_name_the_differing_keys(digits_pair, tmp_path):
    res = run80("barrier", digits_pair / "a", digits_pair / "wide", "--out", tmp_path / "x", ok=False)
    assert res.exit_code == 2 and "kwargs.width (32 vs 16)" in res.output
    assert "'activation'" not in res.output  # the keys that agree are not dumped
    assert config_differences({"a": 1, "k": {"w": 2, "d": 1}}, {"a": 1, "k": {"w": 3, "d": 1}, "x": 0}) == [
        ("k.w", 2, 3), ("x", "<absent>", 0)]
    with pytest.raises(ConfigError, match=r"dataset 'mnist' gives inputs of shape \(1, 28, 28\)"):
        from modeconn.io.models import check_input_shape

        check_input_shape([1, 8, 8], (1, 28, 28), "the model", "dataset 'mnist'")


# ---------------------------------------------------------------------------------------- 6. project basics
def test_licence_version_and_help_texts():
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    assert 'license = "Apache-2.0"' in (REPO / "pyproject.toml").read_text()
    assert run80("--version").output.strip() == f"modeconn {modeconn.__version__}"
    methods = (REPO / "docs" / "methods.md").read_text()
    helps = {c: CliRunner().invoke(app, [c, "--help"], env={"COLUMNS": "250"}).output for c in COMMANDS}
    for command, out in helps.items():
        assert "METHODS.md" not in out, command
        for section in re.findall(r"docs/methods\.md (§\d)", out):
            assert f"## {section} " in methods, (command, section)
    assert "pip install 'modeconn[ray]'" in helps["sweep"] and "[base], [grid]" in helps["sweep"]
    assert "first first" not in helps["merge"]


# ------------------------------------------------------------------------------------------------ 7. figures
def test_barrier_figure_uses_honest_shared_scales_and_one_legend():
    naive = _curve([0.1, 0.6, 1.0, 0.6, 0.12], [0.978, 0.97, 0.952, 0.97, 0.972])
    aligned = _curve([0.1, 0.11, 0.125, 0.115, 0.12], [0.978, 0.975, 0.97, 0.972, 0.972])
    fig = loss_acc_figure({"naive": naive, "weight matching": aligned}, ["test"], "λ", note="Evaluated — test: all")
    loss_ax, zoom_ax, acc_ax = fig.axes[:3]
    assert loss_ax.get_ylim()[0] == 0 and loss_ax.get_ylim()[1] >= 1.0
    assert zoom_ax.get_ylim()[0] == 0 and zoom_ax.get_ylim()[1] < 0.2 and len(zoom_ax.lines) == 1
    bottom, top = acc_ax.get_ylim()
    assert top >= 100 and top - bottom >= 10  # a 2.6-point drop is not blown up to the full height
    assert len(fig.legends) == 1 and [t.get_text() for t in fig.legends[0].get_texts()] == ["naive", "weight matching"]
    assert "Evaluated — test: all" in fig._suptitle.get_text()


# ------------------------------------------------------------------------------------------------ README
def _readme_block(heading: str, lang: str) -> str:
    """The first ``lang`` block after ``heading`` in the getting-started page (the README's first steps moved there)."""
    text = (REPO / "docs" / "getting-started.md").read_text()
    after = text[text.index(heading):]
    return after[after.index(f"```{lang}\n") + len(lang) + 4:].split("```", 1)[0]


@pytest.mark.slow
def test_readme_first_steps_and_python_example_run_verbatim(monkeypatch, tmp_path):
    monkeypatch.delenv("MODECONN_DATA", raising=False)
    monkeypatch.chdir(tmp_path)
    commands = [line for line in _readme_block("## First steps on MNIST", "bash").splitlines() if line.strip()]
    assert len(commands) == 3
    for line in commands:
        argv = line.split()
        assert argv[0] == "modeconn"
        run80(*argv[1:])
    assert (tmp_path / "runs" / "barrier-mnist" / "report.md").is_file()
    snippet = _readme_block("## The same in Python", "python")
    scope: dict = {}
    exec(compile(snippet, "docs/getting-started.md (Python)", "exec"), scope)  # noqa: S102 - the page's own example
    assert scope["curve"].barrier("interp", "test") < 0.5 and "merged" in scope


def test_path_report_and_output_state_the_eval_limit(digits_pair, tmp_path):
    res = run80("path", digits_pair / "a", digits_pair / "b", "--method", "linear", "--eval-limit", "40",
                "--out", tmp_path / "p", ok=False)
    assert res.exit_code in (0, 3), res.output  # 3: an incomplete path, still reported
    assert_fits_80(res.output, tmp_path)
    assert "on 40 train and 40 test examples (`--eval-limit`: 40)" in (tmp_path / "p" / "report.md").read_text()


def test_error_messages_keep_their_square_brackets(capsys):
    import typer

    from modeconn.cli._app import errors_exit

    with pytest.raises(typer.Exit), errors_exit():
        raise ConfigError("backend 'ray' needs Ray: pip install 'modeconn[ray]'; missing t10k-images-idx3-ubyte[.gz]")
    out = capsys.readouterr().out
    assert "pip install 'modeconn[ray]'" in out and "ubyte[.gz]" in out


def test_the_report_says_when_an_aligned_barrier_mean_is_only_half_the_endpoint_difference():
    from modeconn.diagnostics.compare import Comparison
    from modeconn.recipes.reporting import comparison_report

    def curve(loss):
        metrics = {s: {"loss": np.asarray(loss, float), "acc": np.full(len(loss), 0.9)} for s in ("test", "train")}
        return Curve(lambdas=np.linspace(0, 1, len(loss)), metrics=metrics)

    comp = Comparison(spec=None, examples={"test": (10, 10), "train": (10, 10)})
    comp.curves = {"naive": curve([0.1, 0.9, 0.2]), "weight": curve([0.1, 0.15, 0.2])}
    comp.merged = {m: {s: {"acc": 0.9, "loss": 0.15} for s in ("train", "test")} for m in comp.curves}
    report = comparison_report(comp, {"task": "flat"})
    assert "- weight matching: 0.0500 = 6.7% of naive (0.7500) — attained at an endpoint, so it is ½|L(A) − L(B)|" in report
    assert "| weight matching | 0.0500* |" in report and "| naive | 0.7500 |" in report
