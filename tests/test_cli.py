"""The ``membudget`` command line: every command, its --json twin, and one-line errors."""

from __future__ import annotations

import dataclasses
import json
import shlex
import math
import shutil
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.bounds import min_memory, peak_memory
from harness.cli import main
from harness.model import save
from harness.results import STATUSES, read_rows_csv
from tests import test_suite_support as support

XHTML = "{http://www.w3.org/1999/xhtml}"

ROOT = Path(__file__).resolve().parents[1]
TIMING = ("plan_time_s", "place_time_s", "run_time_s", "finished_at", "run_id")


@pytest.fixture(autouse=True)
def _plugin():
    support.install()


@pytest.fixture
def profile_file(tmp_path):
    profile = support.chain("synthetic:chain8", 2)
    path = tmp_path / "p.json"
    save(profile, path)
    return profile, path


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _text_pairs(out: str) -> dict[str, str]:
    pairs = {}
    for line in out.splitlines():
        if line.startswith("  "):
            continue
        key, _, value = line.partition("  ")
        pairs[key.strip()] = value.strip()
    return pairs


def test_list_shows_everything_with_plugin_and_version(capsys):
    code, out, _ = _run(capsys, "list", "--json")
    assert code == 0
    entries = {(e["kind"], e["name"]): e for e in json.loads(out)}
    assert entries[("planner", "keep-all")]["plugin"] == "membudget"
    assert entries[("planner", "greedy")]["plugin"] == "membudget-greedy" and entries[("planner", "greedy")]["version"]
    assert ("executor", "simulate") in entries
    code, text, _ = _run(capsys, "list")
    for (kind, name), entry in entries.items():
        assert any(line.split()[:3] == [kind, name, entry["plugin"]] for line in text.splitlines()), name


def test_list_of_models_names_every_model_a_suite_takes(capsys):
    """``--kind model`` lists model names (what a suite and ``profile`` take), each with its factory;
    the plain list shows the factories."""
    code, out, _ = _run(capsys, "list", "--kind", "model", "--json")
    entries = json.loads(out)
    names = [e["name"] for e in entries]
    assert code == 0 and names == sorted(names)
    assert {"torchvision:resnet50", "builtin:mlp", "builtin:tiny-cnn"} <= set(names)
    assert {(e["name"], e["factory"]) for e in entries} >= {("builtin:mlp", "builtin"),
                                                            ("torchvision:resnet50", "torchvision")}
    _, text, _ = _run(capsys, "list", "--kind", "model")
    assert any(line.split()[:3] == ["model", "torchvision:resnet50", "torchvision"] for line in text.splitlines())
    _, out, _ = _run(capsys, "list", "--json")
    assert ("model", "builtin") in {(e["kind"], e["name"]) for e in json.loads(out)}


def test_a_plugin_problem_reads_as_one_line(capsys):
    """A plugin the registry worked around (a hook that raised, a name claimed twice) is one line on
    stderr, not Python's 'file:line: UserWarning' with the source line of the registry."""
    import warnings

    from harness.errors import PluginWarning

    _run(capsys, "list", "--kind", "planner")
    shown = warnings.formatwarning("plugin x: its hook raised KeyError", PluginWarning, "/x/plugins.py", 91)
    assert shown == "membudget: warning: plugin x: its hook raised KeyError\n"
    assert "UserWarning" in warnings.formatwarning("other", UserWarning, "/x/y.py", 1)


def test_list_shows_the_analytic_profilers_device_specs(capsys):
    from harness.profilers import devices

    code, out, _ = _run(capsys, "list", "--kind", "device", "--json")
    entries = json.loads(out)
    assert code == 0 and [e["name"] for e in entries] == devices.names()
    assert {e["kind"] for e in entries} == {"device"}
    v100 = next(e for e in entries if e["name"] == "V100-PCIe")
    assert "16 GiB" in v100["description"] and "12.2 GB/s host link" in v100["description"]
    _, out, _ = _run(capsys, "list", "--json")
    assert {("device", "H100"), ("planner", "keep-all")} <= {(e["kind"], e["name"]) for e in json.loads(out)}
    _, text, _ = _run(capsys, "list", "--kind", "device")
    assert all(name in text for name in devices.names())


def test_plan_prints_the_summary_and_validation_as_text_and_json(capsys, profile_file):
    profile, path = profile_file
    code, out, _ = _run(capsys, "plan", str(path), "--planner", "prefix", "--budget", "50%", "--json")
    assert code == 0
    report = json.loads(out)
    lo, hi = min_memory(profile), peak_memory(profile)
    assert report["budget_bytes"] == lo + (hi - lo) // 2
    assert report["valid"] is True and report["violations"] == []
    assert report["offloaded_stages"] and report["offloaded_bytes"] == sum(
        profile.stages[i].saved_bytes for i in report["offloaded_stages"])
    code, text, _ = _run(capsys, "plan", str(path), "--planner", "prefix", "--budget", "50%")
    assert code == 0
    pairs = _text_pairs(text)
    assert set(pairs) == set(report) - {"violations"}
    assert pairs["budget_bytes"].startswith(str(report["budget_bytes"]))
    # a list of stage indices, printed as one: rows.csv's offloaded_stages is a count ("0" read as none)
    assert pairs["offloaded_stages"] == "[" + ", ".join(map(str, report["offloaded_stages"])) + "]"
    assert pairs["recomputed_stages"] == "[]"


@pytest.mark.parametrize("word", ["MIN", "Peak"])
def test_min_and_peak_are_words_whatever_their_case_as_units_are(capsys, profile_file, word):
    """QA: --budget MIN was refused ("not a byte quantity", naming neither min nor peak), while 160mib read."""
    profile, path = profile_file
    code, out, _ = _run(capsys, "plan", str(path), "--planner", "prefix", "--budget", word, "--json")
    want = min_memory(profile) if word.lower() == "min" else peak_memory(profile)
    assert code == 0 and json.loads(out)["budget_bytes"] == want
    code, _, err = _run(capsys, "plan", str(path), "--planner", "prefix", "--budget", "lots")
    assert code == 2 and err.rstrip().endswith("or a percentage of the span min..peak like 50%, or min, or peak")


def test_plan_writes_the_schedule(capsys, profile_file, tmp_path):
    from harness.model import Schedule, load

    _, path = profile_file
    out = tmp_path / "schedule.json"
    assert _run(capsys, "plan", str(path), "--planner", "keep-all", "--budget", "peak", "-o", str(out))[0] == 0
    schedule = load(Schedule, out)
    assert schedule.planner == "keep-all" and not schedule.transfers


def test_simulate_reports_times_bounds_and_memory_and_feeds_place(capsys, profile_file, tmp_path):
    profile, path = profile_file
    trace = tmp_path / "trace.csv"
    code, out, _ = _run(capsys, "simulate", str(path), "--planner", "prefix", "--budget", "min", "--json",
                        "--trace", str(trace), "--timeline", str(tmp_path / "t.json"))
    assert code == 0
    report = json.loads(out)
    assert report["status"] == "ok" and report["budget_bytes"] == min_memory(profile)
    assert report["makespan_s"] >= report["lower_bound_s"] * (1 - 1e-9)
    assert report["ratio_to_lb"] == pytest.approx(report["makespan_s"] / report["lower_bound_s"])
    assert report["peak_bytes"] <= report["budget_bytes"] and report["moved_bytes"] > 0
    assert math.isclose(max(e[3] for e in json.loads((tmp_path / "t.json").read_text())["events"]),
                        report["makespan_s"])
    code, out, _ = _run(capsys, "place", str(trace), "--allocator", "first-fit", "--json")
    placed = json.loads(out)
    assert code == 0 and placed["valid"] and placed["arena_bytes"] >= placed["max_live_bytes"] > 0
    assert placed["max_live_bytes"] <= report["peak_bytes"]
    # QA: a reservation predicted above the budget went without a word (a suite's page marks it †)
    reserved = report["reserved_predicted_bytes"]
    assert ("reservation_note" in report) == (reserved > report["budget_bytes"])
    if reserved > report["budget_bytes"]:
        from harness.units import format_bytes

        assert f"predicts {format_bytes(reserved)} reserved, above {format_bytes(report['budget_bytes'])}" in \
            report["reservation_note"]


@pytest.mark.parametrize("argv,needle", [
    (["--planner", "prefix", "--budget", "1KiB"], "planner prefix cannot plan for 1024 bytes: "),
    (["--planner", "prefix", "--budget", "1KiB"], "needs at least {min} bytes"),
    (["--planner", "keep-all", "--budget", "50%"], "needs at least {peak} bytes"),
    (["--planner", "nope", "--budget", "1GiB"], "unknown planner 'nope'; available: "),
    (["--planner", "prefix", "--budget", "lots"], "budget: not a byte quantity: 'lots'"),
    (["--planner", "prefix", "--budget", "1GiB", "--option", "slots"], "--option 'slots': write KEY=VALUE"),
    (["--planner", "prefix", "--budget", "1GiB", "--option", "depth=3", "--option", "depth=2"],
     "--option depth is given twice: give each option once"),
    (["--planner", "keep-all", "--budget", "50%", "--option", "slots=5"],
     "planner 'keep-all' has no option 'slots'; it takes no options"),
    (["--planner", "torch-checkpoint", "--budget", "peak", "--option", "every=xyz"],
     "(options ['every=xyz']): option every is 'sqrt', 'auto' or a whole number >= 1, got 'xyz'"),
])
def test_user_errors_are_one_line_with_exit_status_2(capsys, profile_file, argv, needle):
    profile, path = profile_file
    code, out, err = _run(capsys, "plan", str(path), *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("membudget: error: ")
    assert needle.format(min=min_memory(profile), peak=peak_memory(profile)) in err


@pytest.mark.parametrize("slip, needle", [
    ("exit", "planner sloppy failed: SystemExit: the plugin called sys.exit(3) (at "
             "tests.test_suite_support:"),
    ("none", "planner sloppy: returned NoneType, not a Schedule"),
    ("key", "planner sloppy failed: KeyError: 'x' (at tests.test_suite_support:"),
    ("cancel", "planner sloppy failed: the plugin raised CancelledError: its solver's task was "
               "cancelled (at tests.test_suite_support:"),
])
def test_a_planners_slip_in_plan_is_one_line_naming_it(capsys, profile_file, monkeypatch, slip, needle):
    """QA: a planner's sys.exit ended `membudget plan` with its own exit status and no word; a bug in a
    planner (``key``) said ``KeyError: 'x'`` and nothing of where: the message names the module and line; an
    ``asyncio.CancelledError`` (a BaseException, not an interrupt) ended it with a traceback."""
    monkeypatch.setenv("MEMBUDGET_TEST_SLIP", slip)
    _, path = profile_file
    code, out, err = _run(capsys, "plan", str(path), "--planner", "sloppy", "--budget", "50%")
    assert code == 2 and out == "" and err.count("\n") == 1 and needle in err


def test_a_budget_above_the_devices_memory_is_a_warning(capsys, profile_file):
    """QA: ResNet-18 at batch 100000 planned for 1.76 TiB on a 16 GiB V100 with status ok and no word."""
    profile, path = profile_file
    code, out, _ = _run(capsys, "plan", str(path), "--planner", "prefix", "--budget", "peak", "--json")
    assert code == 0 and "warning" not in json.loads(out)  # the synthetic chain fits its 1 TB device
    big = path.parent / "small-device.json"
    save(dataclasses.replace(profile, device_memory=peak_memory(profile) - 1), big)
    code, out, _ = _run(capsys, "simulate", str(big), "--planner", "prefix", "--budget", "peak", "--json")
    report = json.loads(out)
    assert code == 0 and report["warning"].startswith("the budget (") and "above the memory of the profile's " \
        f"device, {profile.device} (" in report["warning"]


@pytest.mark.parametrize("command", ["plan", "simulate"])
@pytest.mark.parametrize("slip", ["no-b0", "algorithm", "kind"])
def test_a_malformed_schedule_is_the_validators_verdict_in_plan_and_simulate(capsys, profile_file, monkeypatch,
                                                                             command, slip):
    """QA: `membudget simulate` ran a schedule without B0 to `status ok` at 0.98x the ideal time, exit 0 (it
    never validated); `plan` printed a traceback for algorithm 7. Both give the violations, exit 1."""
    monkeypatch.setenv("MEMBUDGET_TEST_SLIP", slip)
    code, out, err = _run(capsys, command, str(profile_file[1]), "--planner", "sloppy", "--budget", "peak", "--json")
    report = json.loads(out)
    assert code == 1 and err == "" and report["valid"] is False
    assert "invalid schedule: " + report["violations"][0] == support.MALFORMED[slip]


def test_simulate_judges_a_schedule_that_runs_over_its_budget_as_plan_does(capsys, profile_file, monkeypatch):
    """A schedule whose structure is sound but which does not fit: `simulate` said `infeasible`, exit 1, and
    no verdict; it now gives the validator's, as a suite's row does."""
    monkeypatch.setenv("MEMBUDGET_TEST_SLIP", "over")
    code, out, _ = _run(capsys, "simulate", str(profile_file[1]), "--planner", "sloppy", "--budget", "50%", "--json")
    report = json.loads(out)
    assert code == 1 and report["valid"] is False and report["status"] == "error"
    assert report["message"].startswith("invalid schedule: the schedule cannot run within the budget")


@pytest.mark.parametrize("argv,needle", [
    (["--budget=1e400"], "budget: too large: '1e400'"),
    (["--budget=1e30"], "budget: too large: '1e30'"),
    (["--budget=9223372036854775808"], "budget: too large: '9223372036854775808' (at most 9223372036854775807"),
    (["--budget=-1GiB"], "budget '-1GiB': a budget must be positive"),
    (["--budget", "-1GiB"], "budget '-1GiB': a budget must be positive"),
    (["--budget", "-5%"], "budget '-5%': a fraction of the span min..peak must be within 0..100% (0..1 in a suite)"),
    (["--budget", "150%"], "budget '150%': a fraction of the span min..peak must be within 0..100% (0..1 in a suite)"),
    (["--budget", "nan%"], "budget 'nan%': a fraction of the span min..peak must be within 0..100%"),
    (["--budget", "1.5B"], "budget: not a whole number of bytes: '1.5B' (for a share of the span min..peak "
                           "write e.g. 50%)\n"),
])
def test_budgets_out_of_range_are_one_line_errors(capsys, profile_file, argv, needle):
    code, out, err = _run(capsys, "plan", str(profile_file[1]), "--planner", "prefix", *argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and needle in err, err


def test_the_cli_and_a_suite_share_one_fraction_rule(capsys, profile_file, tmp_path):
    from harness.suite import SuiteError, load_suite

    _, cli_err = _run(capsys, "plan", str(profile_file[1]), "--planner", "prefix", "--budget", "150%")[1:]
    suite = support.write_suite(tmp_path, support.SUITE.format(name="x").replace("[0, 0.5, 1.0]", "[0, 1.5]"))
    with pytest.raises(SuiteError) as exc:
        load_suite(suite)
    rule = cli_err.split("': ", 1)[-1].strip()
    assert str(exc.value).endswith(rule) and "budgets.fractions[1]" in str(exc.value)
    assert _run(capsys, "plan", str(profile_file[1]), "--planner", "prefix", "--budget", "100%")[0] == 0


def test_exact_placement_without_ortools_says_how_to_install_it(capsys, tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "ortools" or m.startswith("ortools.")] or ["ortools"]:
        monkeypatch.setitem(sys.modules, name, None)
    trace = tmp_path / "trace.csv"
    trace.write_text("id,lower,upper,size\na,0,3,4\nb,1,5,4\n")
    code, out, err = _run(capsys, "place", str(trace), "--allocator", "exact")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "pip install 'membudget[exact]'" in err


def test_unknown_planner_lists_every_choice(capsys, profile_file):
    from harness.plugins import registry

    _, err = _run(capsys, "plan", str(profile_file[1]), "--planner", "nope", "--budget", "1GiB")[1:]
    assert all(name in err for name in registry().names("planner"))


def test_malformed_profile_names_the_field(capsys, tmp_path, profile_file):
    data = json.loads(profile_file[1].read_text())
    data["stages"][3]["fwd_time"] = "fast"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    code, _, err = _run(capsys, "simulate", str(bad), "--planner", "prefix", "--budget", "1GiB")
    assert code == 2 and "stages.3.fwd_time" in err and str(bad) in err
    code, _, err = _run(capsys, "plan", str(tmp_path / "missing.json"), "--planner", "prefix", "--budget", "1GiB")
    assert code == 2 and "no such profile file" in err


def test_a_model_name_where_a_profile_file_goes_says_to_profile_it_first(capsys):
    code, _, err = _run(capsys, "simulate", "torchvision:resnet18", "--planner", "prefix", "--budget", "1GiB")
    assert code == 2
    assert "torchvision:resnet18 is a model, not a profile file" in err
    assert "membudget profile torchvision:resnet18 --batch B" in err


def test_a_profile_file_where_a_model_name_goes_says_what_reads_it(capsys, profile_file, tmp_path):
    path = str(profile_file[1])
    rescaled = str(tmp_path / "rescaled.json")
    code, _, err = _run(capsys, "profile", path, "--batch", "4", "-o", rescaled)
    assert code == 2 and f"{path} is a file, not a model name" in err and "--profiler file" in err
    code, _, err = _run(capsys, "profile", path, "--profiler", "file", "--batch", "4", "-o", rescaled)
    assert code == 0, err
    suite = tmp_path / "s.yaml"
    suite.write_text("name: s\n")
    code, _, err = _run(capsys, "profile", str(suite), "--batch", "4", "-o", rescaled)
    assert code == 2 and f"{suite} is a suite, not a model name: membudget run {suite} runs it" in err
    trace = tmp_path / "t.csv"
    trace.write_text("id,lower,upper,size\n0,0,1,8\n")
    code, _, err = _run(capsys, "plan", str(trace), "--planner", "prefix", "--budget", "50%")
    assert code == 2 and f"{trace} is a memory trace or a run's rows, not a profile" in err


def test_the_file_profiler_refuses_the_options_it_would_ignore(capsys, profile_file, tmp_path):
    """It rescales a profile to --batch; --device H100 was accepted and the profile kept its device."""
    code, _, err = _run(capsys, "profile", str(profile_file[1]), "--profiler", "file", "--batch", "4",
                        "--device", "H100", "--dtype", "bfloat16", "-o", str(tmp_path / "r.json"))
    assert code == 2 and "--device, --dtype would be ignored" in err
    assert not (tmp_path / "r.json").exists()


def test_an_output_never_overwrites_the_input_and_a_trailing_slash_names_a_folder(capsys, profile_file, tmp_path):
    """plan -o on its own profile replaced the profile with the schedule; -o out/ wrote a file named out."""
    path = profile_file[1]
    before = path.read_text()
    code, _, err = _run(capsys, "plan", str(path), "--planner", "prefix", "--budget", "50%", "-o", str(path))
    assert code == 2 and "is the input file, which the output would overwrite" in err
    assert path.read_text() == before
    code, _, err = _run(capsys, "plan", str(path), "--planner", "prefix", "--budget", "50%",
                        "-o", str(tmp_path / "out") + "/")
    assert code == 2 and "names a folder; give a file name, e.g." in err and "schedule.json" in err
    assert not (tmp_path / "out").exists()


def test_a_near_model_name_given_as_a_profile_names_the_model(capsys):
    code, _, err = _run(capsys, "plan", "resnet18", "--planner", "prefix", "--budget", "50%")
    assert code == 2 and "resnet18: no such profile file; is it the model torchvision:resnet18" in err


@pytest.mark.parametrize("argv, expected", [
    (["plan", "p.json", "--planner", "prefix", "--budget", "1GiB", "--batch", "2", "--device", "H100"],
     "membudget plan: error: unrecognized arguments: --batch 2 --device H100 (--batch, --device: options of "
     "membudget profile)"),
    (["profile", "torchvision:resnet18", "--batch", "2", "-o", "p.json", "--planner=prefix"],
     "membudget profile: error: unrecognized arguments: --planner=prefix (--planner: an option of membudget plan "
     "and membudget simulate)"),
    (["plan", "p.json", "--planner", "prefix", "--budget", "1GiB", "--batch", "2", "--allocator", "exact"],
     "(--batch: an option of membudget profile; --allocator: an option of membudget place)"),
    (["plan", "p.json", "--planner", "prefix", "--budget", "1GiB", "--", "--batch", "2"],
     "membudget plan: error: unrecognized arguments: -- --batch 2\n"),
    (["run", "suite.yaml", "--bogus"], "membudget run: error: unrecognized arguments: --bogus\n"),
])
def test_an_argument_the_command_does_not_take_is_reported_with_its_usage(capsys, argv, expected):
    """argparse reported it with the top-level usage ("membudget [-h] COMMAND ..."); the command's own
    usage, and the command an option belongs to, say what to write instead."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert f"usage: membudget {argv[0]} " in err
    assert expected in err


def test_an_unknown_option_before_the_command_is_the_top_level_s(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--bogus", "list"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "usage: membudget [-h] [--version] COMMAND" in err
    assert "membudget: error: unrecognized arguments: --bogus\n" in err
    with pytest.raises(SystemExit):
        main(["--json", "list"])
    assert "unrecognized arguments: --json (options go after the command: membudget list ... --json)" \
        in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["list"], ["list", "--json"]], ids=["rich-table", "json"])
def test_a_reader_that_closes_stdout_ends_the_command_quietly_with_sigpipes_status(argv):
    """QA: ``membudget simulate ... | head -4`` said "error: [Errno 32] Broken pipe" and exited 2, or
    (rich's table) 1, a negative verdict's status. Here the reader is gone before the first line is written."""
    child = subprocess.Popen([sys.executable, "-m", "harness.cli", *argv], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, cwd=ROOT)
    child.stdout.close()
    err = child.stderr.read().decode()
    assert child.wait(timeout=300) == 141 and err == ""


def test_the_console_script_is_not_interrupted_once_its_command_has_returned():
    """QA: Ctrl-C in the seconds of the interpreter's teardown after a complete run (torch loaded) made
    its status 130 with no word, though everything was written and said."""
    code = ("import signal, sys; sys.argv = ['membudget', 'list', '--kind', 'executor']; "
            "signal.signal(signal.SIGINT, signal.default_int_handler); signal.signal(signal.SIGTERM, signal.SIG_DFL); "
            "from harness.cli import main; status = main(); "
            "print(status, signal.getsignal(signal.SIGINT) is signal.SIG_IGN, "
            "signal.getsignal(signal.SIGTERM) is signal.SIG_IGN)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.stdout.splitlines()[-1] == "0 True True", done.stdout + done.stderr
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert main(["list", "--kind", "executor"]) == 0  # called with arguments (a test, a program): nothing changes
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_console_script_exits_2_without_a_traceback(tmp_path):
    bad = tmp_path / "suite.yaml"
    bad.write_text("name: x\nprofiler: file\ndevice: cpu\nmodels: [{model: p.json, batch_sizes: [one]}]\n")
    done = subprocess.run([sys.executable, "-m", "harness.cli", "run", str(bad)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"{bad}:4: models[0].batch_sizes[0]: a whole number, got the text 'one'" in done.stderr


def test_run_prints_a_table_and_json(capsys, tmp_path):
    suite = support.write_suite(tmp_path)
    code, out, _ = _run(capsys, "run", str(suite), "-o", str(tmp_path / "r"), "--run-id", "one")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:8] == ["model", "batch", "planner", "budget", "status", "time", "ms", "x"]
    assert len([line for line in lines if line.lstrip().startswith("synthetic:")]) == 18
    assert "18 rows (6 infeasible, 12 ok); ran 18 now, 0 already done" in out
    code, out, _ = _run(capsys, "run", str(suite), "-o", str(tmp_path / "r"), "--run-id", "one", "--resume", "--json")
    data = json.loads(out)
    assert code == 0 and data["ran"] == 0 and data["already_done"] == 18
    assert data["status_counts"] == {"ok": 12, "infeasible": 6}
    on_disk = {r["case_id"]: r for r in read_rows_csv(tmp_path / "r" / "synth" / "one" / "rows.csv")}
    for row in data["rows"]:
        disk = on_disk[row["case_id"]]
        assert row["status"] == disk["status"]
        assert (row["makespan_s"] is None) == (disk["makespan_s"] == "")


def test_run_reports_a_malformed_suite(capsys, tmp_path):
    suite = support.write_suite(tmp_path, support.SUITE.format(name="x").replace("prefix]", "prefx]"))
    code, out, err = _run(capsys, "run", str(suite), "-o", str(tmp_path / "r"))
    assert code == 2 and out == ""
    assert f"{suite}:10: planners[1].name: unknown planner 'prefx'; did you mean 'prefix'? available:" in err


@pytest.mark.parametrize("argv,needle", [
    (["--run-id", "../../escape"], "--run-id '../../escape': a run id is one plain folder name"),
    (["--run-id", "x", "--resume", "--overwrite"], "--resume or --overwrite, not both"),
    (["--retry", "error"], "--retry runs again the failed cases of an earlier run: add --resume"),
    (["--resume", "--retry", "eror"], "--retry 'eror': the statuses a case can be run again for are error, oom, "
                                      "infeasible"),
])
def test_run_refuses_bad_arguments_in_one_line_before_writing(capsys, tmp_path, argv, needle):
    suite = support.write_suite(tmp_path)
    code, out, err = _run(capsys, "run", str(suite), "-o", str(tmp_path / "out" / "r"), "--no-progress", *argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and needle in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "escape").exists()


@pytest.mark.parametrize("jobs", ["0", "-1"])
def test_run_refuses_fewer_than_one_job(capsys, tmp_path, jobs):
    suite = support.write_suite(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["run", str(suite), "-o", str(tmp_path / "r"), f"--jobs={jobs}"])
    assert exc.value.code == 2 and "argument --jobs: must be a whole number >= 1" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("limit", ["0", "-1", "inf", "nan", "1m"])
def test_run_refuses_a_case_time_limit_that_is_not_seconds(capsys, tmp_path, limit):
    suite = support.write_suite(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["run", str(suite), "-o", str(tmp_path / "r"), f"--case-timeout={limit}"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"argument --case-timeout: must be a number of seconds > 0, got '{limit}'" in err
    assert not (tmp_path / "r").exists()


def test_sigterm_stops_a_run_as_ctrl_c_does_and_meta_says_interrupted(capsys, tmp_path, monkeypatch):
    """``timeout``, ``kill`` and batch schedulers send SIGTERM: the run saves what finished, says so, exits 143."""
    import signal

    from harness.results import read_meta

    suite = support.write_suite(tmp_path, support.SUITE.format(name="term").replace("[keep-all, prefix]", "[killer]"))
    monkeypatch.setenv("MEMBUDGET_TEST_KILL_AT", "4")
    monkeypatch.setenv("MEMBUDGET_TEST_KILL_SIGNAL", "TERM")
    monkeypatch.setattr(support.Killer, "calls", 0)
    before = signal.getsignal(signal.SIGTERM)
    code, _, err = _run(capsys, "run", str(suite), "-o", str(tmp_path / "r"), "--run-id", "t", "--no-progress")
    run_dir = tmp_path / "r" / "term" / "t"
    again = f"membudget run {suite} -o {tmp_path / 'r'} --run-id t --resume"
    assert code == 143 and err.strip() == f"membudget: terminated; 3 finished cases saved in {run_dir} (resume: {again})"
    assert signal.getsignal(signal.SIGTERM) == before  # main() puts the handler back
    meta, rows = read_meta(run_dir), read_rows_csv(run_dir / "rows.csv")
    assert meta["status"] == "interrupted" and len(rows) == 3
    assert meta["sessions"][-1]["cases_run"] == len(rows)
    monkeypatch.delenv("MEMBUDGET_TEST_KILL_AT")
    # QA: "resume with --resume" alone started the run again under results/; the command it prints resumes it
    code, out, _ = _run(capsys, *again.split()[1:], "--json")
    assert code == 0 and json.loads(out)["already_done"] == 3 and read_meta(run_dir)["status"] == "complete"


def test_sigterm_inside_a_compiled_kernel_still_says_terminated_and_exits_143(capsys, tmp_path, monkeypatch):
    """A Numba kernel hands the handler's exception back as a SystemError, and the case re-raises a plain
    KeyboardInterrupt from it: the command said "interrupted" and exited 130, as for Ctrl-C."""
    original = support.Killer.plan

    def compiled(self, profile, budget_bytes, **options):
        try:
            return original(self, profile, budget_bytes, **options)
        except KeyboardInterrupt as exc:
            raise SystemError("CPUDispatcher(<function k>) returned a result with an exception set") from exc

    suite = support.write_suite(tmp_path, support.SUITE.format(name="term").replace("[keep-all, prefix]", "[killer]"))
    monkeypatch.setattr(support.Killer, "plan", compiled)
    monkeypatch.setattr(support.Killer, "calls", 0)
    monkeypatch.setenv("MEMBUDGET_TEST_KILL_AT", "2")
    monkeypatch.setenv("MEMBUDGET_TEST_KILL_SIGNAL", "TERM")
    code, _, err = _run(capsys, "run", str(suite), "-o", str(tmp_path / "r"), "--run-id", "a", "--no-progress")
    assert code == 143 and err.strip() == ("membudget: terminated; 1 finished case saved in "
                                           f"{tmp_path / 'r' / 'term' / 'a'} (resume: membudget run {suite} "
                                           f"-o {tmp_path / 'r'} --run-id a --resume)")
    monkeypatch.setenv("MEMBUDGET_TEST_KILL_SIGNAL", "INT")  # the next command's Ctrl-C is no SIGTERM
    monkeypatch.setattr(support.Killer, "calls", 0)
    # Ctrl-C as a terminal sends it: a shell that starts the tests in the background has SIGINT ignored
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code, _, err = _run(capsys, "run", str(suite), "-o", str(tmp_path / "r2"), "--run-id", "b", "--no-progress")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert code == 130 and err.strip() == ("membudget: interrupted; 1 finished case saved in "
                                           f"{tmp_path / 'r2' / 'term' / 'b'} (resume: membudget run {suite} "
                                           f"-o {tmp_path / 'r2'} --run-id b --resume)")


def test_the_resume_command_an_interrupt_prints_runs_the_rest_as_the_run_ran(tmp_path):
    """Review: the printed command left out --jobs, --backend and --case-timeout, so a run with a case time
    limit resumed without one."""
    import argparse

    from harness.cli import _what_an_interrupted_run_left

    run_dir = tmp_path / "r" / "synth" / "a"
    run_dir.mkdir(parents=True)
    exc = KeyboardInterrupt()
    exc.run_dir = run_dir
    args = argparse.Namespace(command="run", suite="my suite.yaml", output=str(tmp_path / "r"), backend="local",
                              jobs=2, case_timeout=30.0)
    suite = shlex.quote(str(Path("my suite.yaml").absolute()))  # QA: a relative path failed pasted elsewhere
    assert _what_an_interrupted_run_left(args, exc) == (
        f"; 0 finished cases saved in {run_dir} (resume: membudget run {suite} -o {tmp_path / 'r'} "
        "--run-id a --resume --jobs 2 --case-timeout 30)")
    # QA: a signal after the run had finished (while its rows printed) said "the run had not begun: nothing
    # was written", or asked to resume a complete run
    (run_dir / "meta.json").write_text(json.dumps({"status": "complete"}))
    from harness.results import COLUMNS

    (run_dir / "rows.csv").write_text(",".join(COLUMNS) + "\n" + ",".join("x/1" if c == "case_id" else "ok" if
                                                                           c == "status" else "" for c in COLUMNS) + "\n")
    args.finished_run_dir = run_dir
    assert _what_an_interrupted_run_left(args, KeyboardInterrupt()) == (
        f"; the run had finished: all 1 finished case saved in {run_dir}")


def test_version(capsys):
    from harness import __version__

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out == f"membudget {__version__}\n"


def test_ctrl_c_before_the_run_begins_promises_nothing_to_resume(capsys, tmp_path, monkeypatch):
    """An interrupt while the suite's plugins load or its run folder is chosen writes nothing: the message
    said "finished cases are saved (resume with --resume)" all the same. (With --resume, a folder from
    before is as it was: "no run folder was started" was wrong there, QA.)"""
    import harness.runner as runner

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "_check_cuda_present", interrupted)
    code, _, err = _run(capsys, "run", str(support.write_suite(tmp_path)), "-o", str(tmp_path / "r"), "--no-progress")
    assert code == 130 and err.strip() == "membudget: interrupted; the run had not begun: nothing was written"
    assert not (tmp_path / "r").exists()


def test_ctrl_c_in_another_command_than_run_promises_no_resume(capsys, monkeypatch):
    """Only ``run`` has cases to save and ``--resume``: Ctrl-C during ``list`` (or profile, plan...) just says so."""
    import harness.cli as cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_list", interrupted)
    code, _, err = _run(capsys, "list")
    assert code == 130 and err.strip() == "membudget: interrupted"


def test_a_suite_or_a_profile_that_is_not_utf8_is_one_line(capsys, tmp_path):
    """QA (2026-11-25): a Latin-1 or binary file was a UnicodeDecodeError traceback."""
    suite, profile = tmp_path / "s.yaml", tmp_path / "p.json"
    suite.write_bytes("name: caf\xe9\n".encode("latin-1"))
    profile.write_bytes(b"\xff\xfe{}")
    code, _, err = _run(capsys, "run", str(suite), "-o", str(tmp_path / "r"), "--no-progress")
    assert code == 2 and err.strip() == f"membudget: error: {suite}: not a suite: not UTF-8 text (invalid " \
        "continuation byte at byte 9)"
    code, _, err = _run(capsys, "plan", str(profile), "--planner", "keep-all", "--budget", "1GiB")
    assert code == 2 and err.strip() == f"membudget: error: {profile}: not valid JSON: not UTF-8 text (invalid " \
        "start byte at byte 0)"



def test_a_suite_where_a_profile_belongs_and_a_misspelt_suite_file_say_what_was_meant(capsys, tmp_path):
    """QA (2026-11-25): ``simulate suite.yaml`` said only "not valid JSON: Expecting value", and a suite
    file named ``.yml`` beside the ``.yaml`` one only "No such file or directory"."""
    suite = support.write_suite(tmp_path)
    code, _, err = _run(capsys, "simulate", str(suite), "--planner", "keep-all", "--budget", "1GiB")
    assert code == 2 and err.strip() == f"membudget: error: {suite}: a YAML file where a profile (JSON) was " \
        "expected; a suite runs with `membudget run`"
    typo = suite.with_suffix(".yml")
    code, _, err = _run(capsys, "run", str(typo), "-o", str(tmp_path / "r"), "--no-progress")
    assert code == 2 and err.strip() == f"membudget: error: {typo}: cannot read the suite: No such file or " \
        f"directory; did you mean {suite}?"
    assert not (tmp_path / "r").exists()
    unreadable = tmp_path / "dir.yaml"
    unreadable.mkdir()  # it exists but cannot be read: never "did you mean" itself
    code, _, err = _run(capsys, "run", str(unreadable), "-o", str(tmp_path / "r"), "--no-progress")
    assert code == 2 and "a folder, not a suite file" in err and "did you mean" not in err


def test_run_exits_1_when_a_case_fails_with_an_error(capsys, tmp_path):
    """infeasible and oom rows are results; an error row is a case the harness could not run."""
    suite = support.write_suite(tmp_path, support.SUITE.format(name="err").replace("[keep-all, prefix]",
                                                                                   "[keep-all, boom]"))
    code, out, err = _run(capsys, "run", str(suite), "-o", str(tmp_path / "r"), "--no-progress")
    assert code == 1 and "boom goes the planner" in out
    assert "membudget: 9 case(s) failed with an error (their messages are above and in rows.csv)" in err
    code, out, err = _run(capsys, "run", str(suite), "-o", str(tmp_path / "j"), "--json")
    assert code == 1 and "boom goes the planner" in out  # nothing is above: the messages are in the JSON
    assert "membudget: 9 case(s) failed with an error (their messages are in the JSON rows and in rows.csv)" in err
    (tmp_path / "ok").mkdir()
    code, _, _ = _run(capsys, "run", str(support.write_suite(tmp_path / "ok")), "-o", str(tmp_path / "r"), "--json")
    assert code == 0  # its 6 infeasible rows are no error


@pytest.mark.parametrize("argv, needle", [
    (["--option", "slots=[1"], "--option 'slots=[1': the value is not valid YAML (expected ',' or ']'"),
])
def test_a_malformed_option_value_is_a_one_line_error(capsys, profile_file, argv, needle):
    code, out, err = _run(capsys, "plan", str(profile_file[1]), "--planner", "prefix", "--budget", "50%", *argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and needle in err, err


def test_output_paths_are_checked_before_any_work_and_their_folders_made(capsys, profile_file, tmp_path):
    _, path = profile_file
    plan = ["plan", str(path), "--planner", "prefix", "--budget", "50%"]
    code, _, err = _run(capsys, *plan, "-o", str(tmp_path))
    assert code == 2 and err.strip() == f"membudget: error: -o {tmp_path}: is a folder; give a file name, e.g. " \
                                        f"{tmp_path / 'schedule.json'}"
    assert not (tmp_path.parent / f"{tmp_path.name}.tmp").exists()
    code, _, err = _run(capsys, *plan, "-o", str(path / "s.json"))
    assert code == 2 and err.strip() == f"membudget: error: -o {path / 's.json'}: {path} is a file, not a folder"
    code, _, err = _run(capsys, "publish", str(tmp_path), "-o", str(path))
    assert code == 2 and f"{path} is a file, not a folder" in err
    # QA: run said "membudget: error: r18.json/g: Not a directory"
    code, _, err = _run(capsys, "run", str(support.write_suite(tmp_path)), "-o", str(path), "--no-progress")
    assert code == 2 and err.strip() == f"membudget: error: -o {path}: {path} is a file, not a folder"
    code, _, _ = _run(capsys, *plan, "-o", str(tmp_path / "new" / "deep" / "s.json"))
    assert code == 0 and (tmp_path / "new" / "deep" / "s.json").exists()


def test_write_text_atomic_names_the_file_asked_for_and_leaves_no_temporary(tmp_path):
    from harness.files import write_text_atomic

    (tmp_path / "taken").mkdir()
    with pytest.raises(OSError) as info:
        write_text_atomic(tmp_path / "taken", "x")
    assert info.value.filename == str(tmp_path / "taken")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


@pytest.mark.parametrize("argv, needle", [
    (["profile", "synthetic:chain8", "--batch", "2.5", "-o", "x.json"],
     "argument --batch: must be a whole number >= 1, got '2.5'"),
    (["compare", "a", "b", "--rtol", "abc"], "argument --rtol: must be a number >= 0, got 'abc'"),
])
def test_argument_types_say_what_they_want_in_words(capsys, argv, needle):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and needle in err and "_positive_int" not in err and "_non_negative" not in err


def test_publishing_into_a_site_keeps_the_suites_published_there_before(capsys, tmp_path):
    """QA: publishing one suite into the committed site rewrote its index with that suite alone."""
    for name in ("first", "second"):
        assert _run(capsys, "run", str(support.write_suite(tmp_path, name=name, filename=f"{name}.yaml")),
                    "-o", str(tmp_path / "r"), "--run-id", "x")[0] == 0
    site = tmp_path / "site"

    def listed() -> list[str]:
        return [line.split("](")[1].split("/")[0] for line in (site / "index.md").read_text().splitlines()
                if line.startswith("- [")]

    assert _run(capsys, "publish", str(tmp_path / "r" / "first"), "-o", str(site))[0] == 0
    code, _, err = _run(capsys, "publish", str(tmp_path / "r" / "second"), "-o", str(site))
    assert code == 0 and listed() == ["first", "second"]
    assert f"the index also lists 1 suite published into {site} before: first" in err
    code, out, _ = _run(capsys, "publish", str(tmp_path / "r" / "first"), "-o", str(site), "--json")
    assert code == 0 and listed() == ["first", "second"] and json.loads(out)["kept_in_index"] == ["second"]
    html_links = [a.get("href") for a in ET.fromstring((site / "index.html").read_text()).iter(f"{XHTML}a")]
    assert html_links == ["first/index.html", "second/index.html"]
    shutil.rmtree(site / "first")  # a page removed by hand leaves the index
    assert _run(capsys, "publish", str(tmp_path / "r" / "second"), "-o", str(site))[0] == 0
    assert listed() == ["second"]
    (site / "suites.json").write_text("[1, 2]")
    before = (site / "index.md").read_text()
    code, _, err = _run(capsys, "publish", str(tmp_path / "r" / "first"), "-o", str(site))
    assert code == 2 and f"{site / 'suites.json'}: not a membudget site index" in err
    assert (site / "index.md").read_text() == before and not (site / "first").exists()


def test_compare_says_what_two_runs_do_not_share(capsys, tmp_path):
    """QA: two runs of different suites, devices or profilers were compared without a word, and
    ``--json`` wrote byte counts as floats (rows.csv holds whole numbers)."""
    first = support.write_suite(tmp_path, name="first", filename="first.yaml")
    text = first.read_text()
    second = support.write_suite(tmp_path, text.replace("name: first", "name: second")
                                 .replace("device: synthetic", "device: V100-PCIe"), filename="second.yaml")
    for suite in (first, second):
        assert _run(capsys, "run", str(suite), "-o", str(tmp_path / "r"), "--run-id", "x")[0] == 0
    a, b = str(tmp_path / "r" / "first" / "x"), str(tmp_path / "r" / "second" / "x")
    code, out, _ = _run(capsys, "compare", a, b, "--json")
    result = json.loads(out)
    assert result["unlike"] == ["A is a run of suite first, B of suite second",
                                "A is for the device synthetic, B for V100-PCIe (the suites' device: budgets and "
                                "analytic times)"]
    peaks = [c["peak_bytes_a"] for c in result["cases"] if c["peak_bytes_a"] is not None]
    assert peaks and all(type(v) is int for v in peaks)
    code, out, _ = _run(capsys, "compare", a, b)
    assert "note: A is a run of suite first, B of suite second; a difference below may come from that" in out
    code, out, _ = _run(capsys, "compare", a, a, "--json")
    assert code == 0 and json.loads(out)["unlike"] == []


def test_compare_says_when_two_runs_of_one_suite_simulated_different_profiles(capsys, tmp_path):
    """QA (2026-12-01): two runs of a suite that profiles anew (the torch profiler) differed by 18-30% in
    their simulated times, and compare said nothing of their profiles."""
    suite = support.write_suite(tmp_path)
    for run_id in ("x", "y"):
        assert _run(capsys, "run", str(suite), "-o", str(tmp_path / "r"), "--run-id", run_id)[0] == 0
    runs = next(p for p in (tmp_path / "r").iterdir() if p.is_dir())
    a, b = runs / "x", runs / "y"
    shared = len(list((b / "profiles").glob("*.json")))
    assert json.loads(_run(capsys, "compare", str(a), str(b), "--json")[1])["unlike"] == []
    profile = next((b / "profiles").glob("*.json"))
    data = json.loads(profile.read_text())
    data["stages"][0]["fwd_time"] *= 1.3
    profile.write_text(json.dumps(data))
    result = json.loads(_run(capsys, "compare", str(a), str(b), "--json")[1])
    assert result["unlike"] == [f"A's and B's profiles differ for 1 of the {shared} workloads they share "
                                f"({profile.stem}): each run profiled anew, and its simulated times follow its "
                                "profiles"]


def test_a_suite_budget_above_the_devices_memory_is_said_by_the_run_and_its_page(capsys, tmp_path):
    """QA: ``plan --budget 20GiB`` on a 16 GiB device warns "no such card can train it"; a suite with that
    budget ran and published a winner there without a word."""
    text = support.SUITE.format(name="big").replace("budgets: {fractions: [0, 0.5, 1.0]}",
                                                    "budgets: {fractions: [1.0], bytes: [20GiB]}")
    suite = support.write_suite(tmp_path, text)
    memory = support.chain("synthetic:chain4", 2).device_memory
    assert memory < 20 * 2**30
    code, out, _ = _run(capsys, "run", str(suite), "-o", str(tmp_path / "r"), "--run-id", "x")
    said = [line for line in out.splitlines() if line.startswith("note: ") and "20GiB (20.00 GiB)" in line]
    assert code == 0 and len(said) == 3, out  # one per model group
    assert all("budgets above the memory of the profile's device, synthetic (16.00 GiB)" in line for line in said)
    assert "f1 (" not in " ".join(said)  # the peak is well within the device
    assert _run(capsys, "publish", str(tmp_path / "r"), "-o", str(tmp_path / "site"))[0] == 0
    page = (tmp_path / "site" / "big" / "index.md").read_text()
    assert page.count("Budgets above the memory of the profile's device, synthetic (16.00 GiB): 20GiB (20.00 GiB); "
                      "no such card can train at them.") == 3


def test_an_input_size_with_a_zero_dimension_is_refused(capsys, tmp_path):
    code, _, err = _run(capsys, "profile", "synthetic:chain8", "--batch", "2", "--input-size", "3,0,32",
                        "-o", str(tmp_path / "p.json"))
    assert code == 2 and "--input-size '3,0,32': every dimension must be at least 1" in err
    assert not (tmp_path / "p.json").exists()


def test_publish_and_compare_commands(capsys, tmp_path):
    suite = support.write_suite(tmp_path)
    for run_id in ("a", "b"):
        assert _run(capsys, "run", str(suite), "-o", str(tmp_path / "r"), "--run-id", run_id, "--json")[0] == 0
    code, out, _ = _run(capsys, "publish", str(tmp_path / "r"), "-o", str(tmp_path / "site"), "--json")
    files = json.loads(out)["files"]
    assert code == 0 and str(tmp_path / "site" / "synth" / "index.html") in files
    assert all(Path(f).stat().st_size > 0 for f in files)
    code, out, _ = _run(capsys, "compare", str(tmp_path / "r" / "synth" / "a"), str(tmp_path / "r" / "synth" / "b"),
                        "--json")
    result = json.loads(out)
    assert code == 0 and result["summary"] == {"common": 18, "same": 18, "changed": 0, "status_changed": 0}
    code, out, _ = _run(capsys, "compare", str(tmp_path / "r" / "synth" / "a"), str(tmp_path / "r" / "synth" / "b"))
    assert code == 0 and "18 cases in both: 18 same, 0 changed" in out
    assert "status A" not in out  # QA: an empty table's header was printed over nothing
    (tmp_path / "empty").mkdir()
    code, _, err = _run(capsys, "compare", str(tmp_path / "empty"), str(tmp_path / "r"))
    assert code == 2 and "no results here" in err
    # QA: a rows.csv that is a folder, or a link to nothing, said "no results here" too
    (tmp_path / "empty" / "rows.csv").mkdir()
    code, _, err = _run(capsys, "publish", str(tmp_path / "empty"), "-o", str(tmp_path / "site2"))
    assert code == 2 and "rows.csv: a folder, not the run's table (a CSV file)" in err
    (tmp_path / "empty" / "rows.csv").rmdir()
    (tmp_path / "empty" / "rows.csv").symlink_to(tmp_path / "gone.csv")
    code, _, err = _run(capsys, "publish", str(tmp_path / "empty"), "-o", str(tmp_path / "site2"))
    assert code == 2 and f"rows.csv: a link to {tmp_path / 'gone.csv'}, which does not exist" in err
    # a run's rows.csv stands for its run folder (QA: "no results here (expected .../rows.csv)")
    rows = [str(tmp_path / "r" / "synth" / run_id / "rows.csv") for run_id in ("a", "b")]
    code, out, _ = _run(capsys, "compare", *rows)
    assert code == 0 and "18 cases in both: 18 same, 0 changed" in out


def test_compare_of_two_runs_that_share_no_case_is_an_error_not_a_difference(capsys, tmp_path):
    """QA (2026-11-28): it printed "0 cases in both ... 5 cases differ" and exited 1, as a regression would."""
    suite = support.write_suite(tmp_path)
    other = support.write_suite(tmp_path, support.SUITE.format(name="other").replace("chain8", "chain4"),
                                filename="other.yaml")
    other.write_text(other.read_text().replace("batch_sizes: [2]", "batch_sizes: [3]", 1)
                     .replace("batch_sizes: [1, 2]", "batch_sizes: [4]"))
    for path in (suite, other):
        assert _run(capsys, "run", str(path), "-o", str(tmp_path / "r"), "--run-id", "a", "--json")[0] == 0
    code, out, err = _run(capsys, "compare", str(tmp_path / "r" / "synth" / "a"), str(tmp_path / "r" / "other" / "a"))
    assert code == 2 and out == "" and "share no case: compare two runs of one suite" in err


def test_run_and_compare_print_labels_with_their_options(capsys, tmp_path):
    """A planner's label carries its options in brackets (``prefix[depth=3]``); rich read them as
    markup and printed ``prefix``, so two configurations of one planner looked the same in the run
    table and in compare's case ids."""
    text = support.SUITE.format(name="synth").replace("[keep-all, prefix]",
                                                      "[keep-all, prefix, {name: prefix, depth: 3}]")
    suite = support.write_suite(tmp_path, text + "allocators: [caching, {name: minisearch, time_limit: 1}]\n")
    code, out, _ = _run(capsys, "run", str(suite), "-o", str(tmp_path / "r"), "--run-id", "a", "--no-progress")
    assert code == 0
    planners = {line.split()[2] for line in out.splitlines() if line.lstrip().startswith("synthetic:")}
    assert planners == {"keep-all", "prefix", "prefix[depth=3]"}
    assert " infeasible " in out and "[red]" not in out  # the status colour is still markup
    assert "arena minisearch[time_limit=1]" in out  # an allocator's label in its column's header
    lines = sum(1 for line in out.splitlines() if line.lstrip().startswith("synthetic:"))
    # QA: "24 rows" under a table of 12 lines, each allocator's placement being a row of its own
    assert f"{2 * lines} rows, {lines} lines of 2 allocators each (" in out
    shutil.copytree(tmp_path / "r" / "synth" / "a", tmp_path / "r" / "synth" / "b")
    rows = (tmp_path / "r" / "synth" / "b" / "rows.csv").read_text().splitlines()
    (tmp_path / "r" / "synth" / "b" / "rows.csv").write_text("\n".join(rows[:-1]) + "\n")  # its last case gone
    gone = read_rows_csv(tmp_path / "r" / "synth" / "a" / "rows.csv")[-1]["case_id"]
    assert "[" in gone  # a bracketed label: prefix[depth=3] or minisearch[time_limit=1]
    code, out, _ = _run(capsys, "compare", str(tmp_path / "r" / "synth" / "a"), str(tmp_path / "r" / "synth" / "b"))
    assert code == 1 and gone in out


def test_compare_exits_1_when_runs_differ_beyond_the_tolerance(capsys, tmp_path):
    suite = support.write_suite(tmp_path)
    for run_id in ("a", "b"):
        assert _run(capsys, "run", str(suite), "-o", str(tmp_path / "r"), "--run-id", run_id, "--json")[0] == 0
    rows = read_rows_csv(tmp_path / "r" / "synth" / "b" / "rows.csv")
    target = next(r for r in rows if r["status"] == "ok" and r["planner"] == "prefix")
    target["makespan_s"] = repr(float(target["makespan_s"]) * 1.10)
    import csv

    with open(tmp_path / "r" / "synth" / "b" / "rows.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    a, b = str(tmp_path / "r" / "synth" / "a"), str(tmp_path / "r" / "synth" / "b")
    assert _run(capsys, "compare", a, a)[0] == 0
    code, out, _ = _run(capsys, "compare", a, b, "--tolerance", "5%")
    assert code == 1 and "1 case differs beyond the tolerance (5%)" in out
    code, out, _ = _run(capsys, "compare", a, b, "--tolerance", "20", "--json")
    assert code == 0 and json.loads(out)["beyond_tolerance"] == []
    code, out, _ = _run(capsys, "compare", a, b, "--json")
    assert code == 1 and json.loads(out)["beyond_tolerance"] == [target["case_id"]]
    for bad in ("lots", "-5%"):
        with pytest.raises(SystemExit) as exc:
            main(["compare", a, b, f"--tolerance={bad}"])
        assert exc.value.code == 2 and "argument --tolerance: a percentage >= 0" in capsys.readouterr().err


def test_publish_of_rows_that_are_not_results_is_a_one_line_error(capsys, tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "rows.csv").write_text("name,score\nalice,3\n")
    code, out, err = _run(capsys, "publish", str(tmp_path / "run"), "-o", str(tmp_path / "site"))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "not a membudget results table: no column(s) suite, case_id, model" in err


@pytest.mark.parametrize("content, needle", [
    (b"", "rows.csv: empty, not a membudget results table"),
    (b"\xff\xfe\x00garbage", "rows.csv: not a membudget results table (not UTF-8 text: invalid start byte at "
                              "byte 0)"),
])
def test_publish_and_compare_refuse_an_empty_or_binary_rows_file_in_one_line(capsys, tmp_path, content, needle):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "rows.csv").write_bytes(content)
    for argv in (["publish", str(tmp_path / "run"), "-o", str(tmp_path / "site")],
                 ["compare", str(tmp_path / "run"), str(tmp_path / "run")]):
        code, out, err = _run(capsys, *argv)
        assert code == 2 and out == "" and err.count("\n") == 1 and needle in err, err


def test_compare_and_publish_refuse_a_run_whose_case_has_two_rows_and_a_root_of_several_suites(capsys, tmp_path):
    suite = support.write_suite(tmp_path)
    assert _run(capsys, "run", str(suite), "-o", str(tmp_path / "r"), "--run-id", "a", "--json")[0] == 0
    other = support.write_suite(tmp_path, support.SUITE.format(name="other"), filename="other.yaml")
    assert _run(capsys, "run", str(other), "-o", str(tmp_path / "r"), "--run-id", "a", "--json")[0] == 0
    code, out, err = _run(capsys, "compare", str(tmp_path / "r"), str(tmp_path / "r" / "synth"))
    assert code == 2 and out == "" and "r: holds the runs of 2 suites (other, synth); compare a suite folder" in err
    rows_csv = tmp_path / "r" / "synth" / "a" / "rows.csv"
    lines = rows_csv.read_text().splitlines(keepends=True)
    rows_csv.write_text("".join(lines + lines[1:2]))
    code, out, err = _run(capsys, "compare", str(rows_csv.parent), str(tmp_path / "r" / "other"))
    case_id = lines[1].split(",")[1]
    assert code == 2 and f"the case {case_id!r} has more than one row; a run has one row per case" in err
    # publish too (QA, 2026-11-28: it counted the case twice, "7 cases" for 6)
    code, out, err = _run(capsys, "publish", str(rows_csv.parent), "-o", str(tmp_path / "site"))
    assert code == 2 and f"the case {case_id!r} has more than one row; a run has one row per case" in err


# --------------------------------------------------------------------------- the quick suite


def table(run_dir: Path) -> str:
    """The table ``membudget run`` prints for a run folder, planning times blanked (they vary)."""
    from rich.console import Console

    from harness.cli import run_table
    from harness.results import load_rows

    frame = load_rows(run_dir).sort_values("case_id", kind="stable")
    frame["plan_time_s"] = float("nan")
    console = Console(width=250, record=True, file=open("/dev/null", "w"))
    console.print(run_table(frame))
    return console.export_text()


def _analytic_available() -> bool:
    from harness.plugins import registry

    return "analytic" in registry().names("profiler")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    assert _analytic_available(), "the analytic profiler, a core built-in, is not registered"
    out = tmp_path_factory.mktemp("quick")
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = main(["run", str(ROOT / "suites" / "quick.yaml"), "-o", str(out), "--run-id", "local",
                     "--no-progress"])
    assert code == 0
    return out, buffer.getvalue()


@pytest.mark.slow
def test_quick_suite_prints_a_table_and_writes_rows(quick):
    out, text = quick
    assert text.splitlines()[0].split()[:14] == ["model", "batch", "planner", "budget", "status", "time", "ms", "x",
                                                 "ideal", "budget", "LB", "ms", "x", "budget"]
    rows = read_rows_csv(out / "quick" / "local" / "rows.csv")
    assert f"{len(rows)} rows" in text
    planners = {r["planner"] for r in rows}
    assert {"keep-all", "greedy"} <= planners
    for row in rows:  # a plugin's failure is a row with a message, never a lost suite
        assert row["status"] in STATUSES and (row["status"] == "ok") == (row["message"] == "")
        assert row["budget_lower_bound_s"] and row["min_memory_bytes"] and row["peak_memory_bytes"]
        if row["status"] != "ok":
            continue
        makespan, lb = float(row["makespan_s"]), float(row["lower_bound_s"])
        assert makespan >= lb * (1 - 1e-9)  # papers/004 Prop. 3
        assert float(row["ratio_to_lb"]) == pytest.approx(makespan / lb)
        assert int(row["peak_bytes"]) <= int(row["budget_bytes"])
        assert int(row["moved_bytes"]) >= 0 and row["valid"] == "true"
    core = [r for r in rows if r["planner"] in ("keep-all", "greedy")]
    assert all(r["status"] in ("ok", "infeasible") for r in core)
    greedy = [r for r in rows if r["planner"] == "greedy" and r["allocator"] == "caching"]
    assert len(greedy) == 10 and all(r["status"] == "ok" for r in greedy)  # GREEDY fits every budget >= min
    keep_all = [r for r in rows if r["planner"] == "keep-all"]
    assert {r["budget_label"] for r in keep_all if r["status"] == "ok"} == {"f1"}


@pytest.mark.slow
def test_ray_backend_gives_the_same_table_on_the_quick_suite(quick, capsys):
    ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'membudget[ray]')")
    out, text = quick
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    try:
        code, ray_text, _ = _run(capsys, "run", str(ROOT / "suites" / "quick.yaml"), "-o", str(out), "--run-id", "ray",
                                 "--backend", "ray", "--jobs", "2", "--no-progress")
    finally:
        ray.shutdown()
    assert code == 0

    assert table(out / "quick" / "ray") == table(out / "quick" / "local")
    assert "torchvision:resnet18" in ray_text
    local = read_rows_csv(out / "quick" / "local" / "rows.csv")
    remote = read_rows_csv(out / "quick" / "ray" / "rows.csv")

    def comparable(rows):
        return sorted(({k: v for k, v in r.items() if k not in TIMING} for r in rows), key=lambda r: r["case_id"])

    assert comparable(local) == comparable(remote)


# --------------------------------------------------------------------------- the run table's readability


def _rows(**overrides) -> dict:
    row = {"model": "m", "batch_size": 8, "input_size": "3x8x8", "planner_label": "greedy", "budget_label": "f0.5",
           "executor": "simulate", "repeat": 0, "seed": 0, "allocator": "", "status": "ok", "message": "",
           "makespan_s": 1.0, "lower_bound_s": 1.0, "ratio_to_lb": 1.0, "peak_bytes": 10, "moved_bytes": 0,
           "plan_time_s": 0.001, "case_id": "m/b8/3x8x8/greedy/f0.5/simulate"}
    row.update(overrides)
    return row


def test_run_table_names_the_executor_when_a_suite_has_several():
    import pandas as pd
    from rich.console import Console

    from harness.cli import run_table

    def text(frame) -> str:
        console = Console(width=250, record=True, file=open("/dev/null", "w"))
        console.print(run_table(frame))
        return console.export_text()

    one = pd.DataFrame([_rows()])
    both = pd.DataFrame([_rows(), _rows(executor="torch", case_id="m/b8/3x8x8/greedy/f0.5/torch", status="oom")])
    assert "executor" not in text(one).splitlines()[0]
    lines = text(both).splitlines()
    assert "executor" in lines[0] and "torch" in lines[2] and "simulate" in lines[1]


def test_an_error_rows_peak_is_left_out_of_the_run_table_and_an_ooms_is_not():
    """A schedule the validator refused ran only up to its failure: its peak, below the budget it broke
    (QA, 2026-12-01: "peak 506.49 MiB" beside a budget of 579.22 MiB), is no measure of it. An oom row's
    is the bytes the device held when it failed, which the table keeps."""
    import pandas as pd
    from rich.console import Console

    from harness.cli import run_table

    frame = pd.DataFrame([
        _rows(status="error", message="invalid schedule: F4 allocates ...", valid=False, peak_bytes=531093504,
              moved_bytes=7 * 2**20),
        _rows(status="oom", case_id="m/b8/3x8x8/greedy/f0.5/torch", executor="torch", peak_bytes=3 * 2**30),
        # an allocator's refusal came after the schedule ran in full: its peak stands (review)
        _rows(status="error", message="allocator caching: refused", case_id="m/b8/3x8x8/greedy/f0.5/simulate/c",
              executor="simulate", budget_label="f1", valid=True, peak_bytes=5 * 2**20)])
    console = Console(width=250, record=True, file=open("/dev/null", "w"))
    console.print(run_table(frame))
    header, *lines = console.export_text().splitlines()
    error, refused = (next(li for li in lines if label in li and "error" in li) for label in ("f0.5", "f1"))
    oom = next(li for li in lines if "oom" in li)
    assert "peak" in header and "moved" in header
    assert "506.49 MiB" not in error and "7.00 MiB" not in error
    assert "3.00 GiB" in oom and "5.00 MiB" in refused


def test_run_table_names_every_case_key_that_varies():
    """QA (2026-11-28): two input sizes (or seeds, or repeats) of one planner and budget printed as two lines
    with nothing to tell them apart."""
    import pandas as pd
    from rich.console import Console

    from harness.cli import run_table

    rows = [_rows(input_size="3x8x8", seed=0, repeat=0, makespan_s=1.0),
            _rows(input_size="3x16x16", seed=1, repeat=0, makespan_s=2.0, case_id="m/b8/3x16x16/greedy/f0.5/simulate")]
    console = Console(width=250, record=True, file=open("/dev/null", "w"))
    console.print(run_table(pd.DataFrame(rows)))
    header, first, second = console.export_text().splitlines()[:3]
    assert "input" in header and "seed" in header and "repeat" not in header
    assert "3x8x8" in first and "1000.00" in first and "3x16x16" in second and "2000.00" in second


def test_failures_are_listed_with_their_message_and_infeasible_budgets_are_not():
    import pandas as pd

    from harness.cli import failure_lines

    frame = pd.DataFrame([
        _rows(),
        _rows(status="infeasible", message="infeasible: needs at least 5 bytes", case_id="m/infeasible"),
        _rows(status="oom", message="out of memory under the budget of 10 bytes:\n CUDA out of memory. " + "x" * 400,
              case_id="m/oom"),
        _rows(status="error", message="", case_id="m/error"),
    ])
    lines = failure_lines(frame, width=80)
    assert len(lines) == 2
    assert lines[0].startswith("oom: m/oom: out of memory under the budget of 10 bytes: CUDA out of memory.")
    assert lines[0].endswith("...") and len(lines[0]) <= len("oom: m/oom: ") + 80
    assert lines[1] == "error: m/error: (no message)"


def test_a_failure_line_keeps_the_numbers_of_a_long_message_on_one_line(capsys, tmp_path):
    """The numbers of a validator's refusal come some 200 characters in; `membudget run` printed them cut
    at 160 and, into a file, folded at the console's width (QA, 2026-12-01)."""
    import pandas as pd

    from harness.cli import failure_lines

    message = ("invalid schedule: the schedule cannot run within the budget: infeasible: F4 allocates 135676928 "
               "bytes at its start but only 109181952 of the budget's 607357408 are free (weights 46751744, "
               "saved 451423232, in flight 0)")
    frame = pd.DataFrame([_rows(status="error", message=message, case_id="torchvision:resnet18/b32/3x224x224/"
                                "qa-too-big/f0/simulate")])
    (line,) = failure_lines(frame)
    assert line.endswith("in flight 0)") and "607357408" in line


def test_a_planner_out_of_memory_is_a_one_line_error(capsys, profile_file, monkeypatch):
    # recompute --option slots=1000000000 used to end in a MemoryError traceback
    import harness.case

    def too_big(*args, **kwargs):
        raise MemoryError("Allocation failed (probably too large).")

    monkeypatch.setattr(harness.case, "plan_case", too_big)
    _, path = profile_file
    code, out, err = _run(capsys, "plan", str(path), "--planner", "prefix", "--budget", "50%")
    assert code == 2 and not out and err.count("\n") == 1
    # QA: the hint of fewer slots went to every planner, those without a slots option too
    assert err == "membudget: error: planner prefix: out of memory while planning\n"
    code, out, err = _run(capsys, "plan", str(path), "--planner", "recompute", "--budget", "50%")
    assert code == 2 and err == ("membudget: error: planner recompute: out of memory while planning "
                                 "(a smaller table, e.g. fewer slots, may fit)\n")


def test_plan_says_what_a_recomputing_schedule_keeps_offloads_and_recomputes(capsys, profile_file):
    # plan and simulate printed offloaded_stages and offloaded_bytes only: a recompute, hybrid or
    # torch-checkpoint schedule read as "offloads nothing" with no word of what it recomputes
    from harness.plugins import registry

    profile, path = profile_file
    for command in ("plan", "simulate"):
        code, out, _ = _run(capsys, command, str(path), "--planner", "torch-checkpoint", "--budget", "peak", "--json")
        report = json.loads(out)
        assert code == 0 and report["recomputed_stages"] and report["recompute_s"] > 0
        assert report["recomputed_bytes"] > 0 and report["offloaded_bytes"] == 0
        # the schedule's forwards: a checkpoint Fc keeps the saved part of its input and recomputes the
        # rest, an Fn recomputes all it saves, an F (the last segment's) keeps it all
        schedule = registry().planner("torch-checkpoint").plan(profile, report["budget_bytes"])
        assert report["recomputed_stages"] == sorted({op.stage for op in schedule.ops if op.kind == "R"})
        forward = {op.stage: op.kind for op in schedule.ops if op.kind in ("F", "Fc", "Fn")}
        assert {"F", "Fc", "Fn"} <= set(forward.values())
        keeps = {"F": lambda s: s.saved_bytes, "Fc": lambda s: min(s.input_bytes, s.saved_bytes), "Fn": lambda s: 0}
        kept = [keeps[forward[i]](s) for i, s in enumerate(profile.stages)]
        assert report["kept_bytes"] == sum(kept)
        assert report["recomputed_bytes"] == sum(s.saved_bytes - k for s, k in zip(profile.stages, kept))
        assert report["recompute_s"] == pytest.approx(
            sum(profile.stages[i].fwd_time for i in report["recomputed_stages"]))


@pytest.mark.parametrize("planner, option, needle", [
    ("dynprog", "engine=numbaa", "(options ['engine=numbaa']): option engine must be one of kernel, reference, got 'numbaa'"),
    ("modnn", "sub_batch=abc", "(options ['sub_batch=abc']): option sub_batch must be one of eq3, search, got 'abc'"),
    ("torch-checkpoint", "every=0", "(options ['every=0']): option every is 'sqrt', 'auto' or a whole number >= 1"),
])
def test_a_bad_option_value_names_the_option_not_a_source_line(capsys, profile_file, planner, option, needle):
    """QA (2026-11-28): these read "... (at membudget_dynprog.planner:269 in solve)", as a plugin's crash does."""
    code, _, err = _run(capsys, "plan", str(profile_file[1]), "--planner", planner, "--budget", "50%",
                        "--option", option)
    assert code == 2 and needle in err and "(at " not in err, err


def test_a_schedule_or_timeline_given_as_a_profile_says_what_it_is(capsys, profile_file, tmp_path):
    """QA (2026-11-28): a schedule given to plan listed the ten fields a profile lacks."""
    path = str(profile_file[1])
    schedule, timeline = str(tmp_path / "schedule.json"), str(tmp_path / "timeline.json")
    assert _run(capsys, "plan", path, "--planner", "prefix", "--budget", "50%", "-o", schedule)[0] == 0
    assert _run(capsys, "simulate", path, "--planner", "prefix", "--budget", "50%", "--timeline", timeline)[0] == 0
    code, _, err = _run(capsys, "plan", schedule, "--planner", "prefix", "--budget", "50%")
    assert code == 2 and err.strip() == f"membudget: error: {schedule} is a schedule (membudget plan -o writes " \
        "one), not a profile (a JSON file from membudget profile)"
    code, _, err = _run(capsys, "simulate", timeline, "--planner", "prefix", "--budget", "50%")
    assert code == 2 and f"{timeline} is a timeline" in err


@pytest.mark.parametrize("argv, needle", [
    (["--budget", "50"], "the budget is 50 bytes (50 B); did you mean 50%?"),
    (["--budget", "50%", "--executor", "first-fit"],
     "unknown executor 'first-fit'; 'first-fit' is an allocator, not an executor; the executors: "),
])
def test_a_budget_or_plugin_name_that_reads_as_another_kind_says_so(capsys, profile_file, argv, needle):
    code, _, err = _run(capsys, "simulate", str(profile_file[1]), "--planner", "prefix", *argv)
    assert code == 2 and needle in err, err


def test_a_file_given_to_the_wrong_command_names_the_right_one_in_one_line(capsys, tmp_path):
    """QA (2026-11-28): a suite given to ``place`` read "the first line must be the header ..." with its
    comment lower-cased; a trace or a rows.csv given to ``run``, "a suite is a mapping, got str" or "not
    valid YAML"; an empty suite, "got NoneType"."""
    suite = support.write_suite(tmp_path)
    trace = tmp_path / "trace.csv"
    trace.write_text("id,lower,upper,size\n1,0,3,10\n")
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing yet\n\n")
    from harness.results import header_line

    rows = tmp_path / "run" / "rows.csv"
    rows.parent.mkdir()
    rows.write_text(header_line())
    for argv, needle in [
        (["place", str(suite), "--allocator", "bestfit"], f"{suite}: a suite (YAML), not a trace"),
        (["run", str(trace), "-o", str(tmp_path / "r")], f"{trace}: a CSV file, not a suite (YAML): membudget place"),
        (["run", str(empty), "-o", str(tmp_path / "r")], f"{empty}: the file is empty: a suite is a mapping"),
        # QA: publish and compare said "no results here" of a suite or a trace; place, of a run's rows.csv,
        # printed its 72-column header
        (["publish", str(suite), "-o", str(tmp_path / "s")], f"{suite}: a suite, not a run: membudget run {suite} "
                                                             "runs it"),
        (["compare", str(suite), str(tmp_path)], f"{suite}: a suite, not a run: membudget run"),
        (["publish", str(trace), "-o", str(tmp_path / "s")], f"{trace}: a CSV file that is no run's rows.csv: "
                                                             "membudget place reads an allocation trace"),
        (["place", str(rows), "--allocator", "bestfit"], f"{rows}: a run's rows.csv, not a trace"),
    ]:
        code, _, err = _run(capsys, *argv)
        assert code == 2 and err.count("\n") == 1 and needle in err, err


def test_a_suite_path_that_is_a_folder_or_a_profile_says_so_in_one_line(capsys, profile_file, tmp_path):
    code, _, err = _run(capsys, "run", str(profile_file[1]), "-o", str(tmp_path / "r"))
    assert code == 2 and err.count("\n") == 1 and f"{profile_file[1]}: a profile, not a suite" in err
    suite = support.write_suite(tmp_path)
    code, _, err = _run(capsys, "run", str(tmp_path), "-o", str(tmp_path / "r"))
    assert code == 2 and err.strip() == f"membudget: error: {tmp_path}: a folder, not a suite file (it holds " \
        f"{suite.name})"
    code, _, err = _run(capsys, "run", str(tmp_path / "nothere.yaml"), "-o", str(tmp_path / "r"))
    assert code == 2 and "did you mean" not in err  # synth.yaml is not near: the shared suffix does not count


def test_list_with_a_kind_as_an_argument_says_to_write_kind(capsys):
    with pytest.raises(SystemExit):
        main(["list", "planner"])
    assert "membudget list: error: unrecognized arguments: planner (write --kind planner)" in capsys.readouterr().err


def test_an_unknown_dtype_is_refused_before_the_model_is_built(capsys, tmp_path):
    code, _, err = _run(capsys, "profile", "builtin:mlp", "--batch", "2", "--dtype", "int8", "-o", str(tmp_path / "p"))
    assert code == 2 and err.strip().startswith("membudget: error: --dtype: unknown dtype 'int8'; use one of")


@pytest.mark.parametrize("argv, needle", [
    (["plan", "p.json", "--planners", "greedy", "--budget", "50%"],
     "the following arguments are required: --planner (--planners: did you mean --planner?)"),
    (["plan", "p.json", "--planner", "greedy", "--budget", "50%", "--options", "slots=5"],
     "unrecognized arguments: --options slots=5 (--options: did you mean --option?)"),
])
def test_a_misspelt_option_is_named_with_the_one_meant(capsys, argv, needle):
    """QA (2026-11-28): --planners was reported only as a missing --planner, --options with no suggestion."""
    with pytest.raises(SystemExit):
        main(argv)
    assert needle in capsys.readouterr().err


def test_the_overwrite_refusal_sees_through_file_prefixes_and_suggests_another_name(capsys, profile_file, tmp_path):
    """Review (2026-11-28): -o profile.json on profile.json suggested profile.json itself, and file:p.json
    -o p.json rewrote the input."""
    path = tmp_path / "profile.json"
    path.write_text(profile_file[1].read_text())
    before = path.read_text()
    for model in (str(path), f"file:{path}"):
        code, _, err = _run(capsys, "profile", model, "--profiler", "file", "--batch", "8", "-o", str(path))
        assert code == 2 and f"give another file, e.g. {tmp_path / 'profile-out.json'}" in err, err
    assert path.read_text() == before


def test_the_misspelling_hint_leaves_abbreviations_alone_and_reads_only_its_own_command_line(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "p.json", "--plan", "prefix"])  # argparse takes --plan for --planner
    err = capsys.readouterr().err
    assert "required: --budget" in err and "did you mean" not in err
    with pytest.raises(SystemExit):
        main(["plan", "p.json", "--planners", "prefix"])
    assert "(--planners: did you mean --planner?)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["plan", "p.json"])  # the last command line's --planners is not this one's
    err = capsys.readouterr().err
    assert "required: --planner, --budget" in err and "did you mean" not in err


def test_profile_names_the_stages_the_model_was_cut_into(capsys, tmp_path):
    """QA: ``profile`` said only "stages 5"; how a skip connection was cut (its whole span one stage) was
    in the profile JSON alone. The stage names come in the stages' order, as the planners see them."""
    from harness.model import Profile, load

    code, out, _ = _run(capsys, "profile", "torchvision:resnet18", "--batch", "2", "-o", str(tmp_path / "p.json"),
                        "--json")
    report = json.loads(out)
    names = [stage.name for stage in load(Profile, tmp_path / "p.json").stages]
    assert code == 0 and report["stage_names"] == names and len(names) == report["stages"]
    assert any("layer1" in name for name in names)  # a residual block is one stage, named by its module
    code, out, _ = _run(capsys, "profile", "torchvision:resnet18", "--batch", "2", "-o", str(tmp_path / "q.json"))
    assert "stage_names" in out and ", ".join(names[:3]) in out


def test_a_model_that_fails_at_an_input_size_not_its_own_asks_whether_the_size_is_right(capsys, tmp_path):
    """QA: ``--input-size 1,224,224`` on ResNet-18 said only "RuntimeError: Invalid channel dimensions"."""
    from harness.commands import default_input_size

    own = default_input_size("torchvision:resnet18")
    code, _, err = _run(capsys, "profile", "torchvision:resnet18", "--batch", "2", "--input-size", "1,64,64",
                        "-o", str(tmp_path / "p.json"))
    assert code == 2 and err.count("\n") == 1
    assert err.rstrip().endswith(f"(the model's own input size is {'x'.join(map(str, own))}: is --input-size "
                                 "right for it?)"), err


def test_an_option_in_scientific_notation_is_the_number_it_writes():
    """QA: ``--option time_limit=1e-9`` was refused with "got '1e-9'": YAML 1.1 reads 1e-9 as text (it
    wants 1.0e-9). A value that is a number in scientific notation is that number; other text stays text."""
    from harness.cli import _options

    assert _options(["time_limit=1e-9", "a=-2E+2", "b=1.5e3", "c=1e", "d=e5", "e=2", "f='1e5'", "g=._e5",
                     "h=4GiB", "i=0x1e5"]) == {
        "time_limit": 1e-9, "a": -200.0, "b": 1500.0, "c": "1e", "d": "e5", "e": 2, "f": "1e5", "g": "._e5",
        "h": "4GiB", "i": 0x1E5}
    # QA: YAML 1.1 read slots=0200 as octal 128 (a suite ran dynprog[slots=128]) and 08 as text
    assert _options(["slots=0200", "a=08", "b=-007", "c=0", "d='0200'"]) == {"slots": 200, "a": 8, "b": -7, "c": 0,
                                                                           "d": "0200"}


def test_a_bad_option_value_names_the_planner_once(capsys, profile_file):
    """QA: "planner dynprog (options ['slots=abc']): dynprog: option slots ..." said the planner twice."""
    pytest.importorskip("membudget_dynprog")
    _, path = profile_file
    code, _, err = _run(capsys, "plan", str(path), "--planner", "dynprog", "--budget", "50%", "--option", "slots=0")
    assert code == 2 and err == ("membudget: error: planner dynprog (options ['slots=0']): option slots must be an "
                                 "integer >= 1, got 0\n")


def test_simulate_takes_the_offload_rule(capsys, profile_file, tmp_path):
    """``--offload-start forward-end`` starts every offload once its forward has ended (the torch
    executor's rule), where the paper's starts some with it; a real executor refuses the option."""
    _, path = profile_file
    argv = ["simulate", str(path), "--planner", "prefix", "--budget", "min", "--json"]
    offloads = {}
    for rule in ("forward-start", "forward-end"):
        target = tmp_path / f"{rule}.json"
        code, out, _ = _run(capsys, *argv, "--offload-start", rule, "--timeline", str(target))
        assert code == 0 and json.loads(out)["status"] == "ok"
        events = json.loads(target.read_text())["events"]
        forward_end = {label[1:]: end for label, _, _, end in events if label.startswith("F")}
        offloads[rule] = [(start, forward_end[label.split()[1]]) for label, _, start, _ in events
                          if label.startswith("offload")]
    assert offloads["forward-start"] and len(offloads["forward-start"]) == len(offloads["forward-end"])
    assert all(start >= end for start, end in offloads["forward-end"])
    assert any(start < end for start, end in offloads["forward-start"])
    code, _, err = _run(capsys, *argv, "--offload-start", "forward-end", "--executor", "torch")
    assert code == 2 and "--offload-start is the simulate executor's rule, not torch's" in err


def test_simulate_with_a_real_executor_says_so_before_it_starts(capsys, tmp_path):
    """QA: ``simulate --executor torch`` on a large model ran minutes on the CPU in silence; it says first
    that it trains the model for real."""
    path = str(tmp_path / "tiny.json")
    assert _run(capsys, "profile", "builtin:tiny-cnn", "--batch", "2", "-o", path)[0] == 0
    code, out, err = _run(capsys, "simulate", path, "--planner", "keep-all", "--budget", "peak", "--executor", "torch")
    assert code == 0 and err.startswith("membudget: note: executor torch trains builtin:tiny-cnn at batch 2 for real")
    assert "status" in out
    assert _run(capsys, "simulate", path, "--planner", "keep-all", "--budget", "peak")[2] == ""  # the simulator: no note
    # QA (2026-12-01): its measured columns were dropped, where docs/cli.md says "as a suite's row has them"
    for line in ("grad_error", "predicted_s", "prediction_error", "time_iqr_s"):
        assert f"\n{line}" in out, out
    code, out, _ = _run(capsys, "simulate", path, "--planner", "keep-all", "--budget", "peak", "--executor", "torch",
                        "--json")
    report = json.loads(out)
    assert code == 0 and report["grad_error"] <= 1e-6 and report["prediction_error"] == pytest.approx(
        report["makespan_s"] / report["predicted_s"] - 1) and isinstance(report["metrics"], dict)


def test_a_run_into_a_log_file_writes_no_progress_bar_debris(capsys, tmp_path):
    """QA: without a terminal the progress bar left a blank line on stderr; it is drawn only on a terminal."""
    code, out, err = _run(capsys, "run", str(support.write_suite(tmp_path)), "-o", str(tmp_path / "r"))
    assert code == 0 and err == "" and "rows" in out


@pytest.mark.parametrize("argv, said", [
    (["--planner", "prefix", "--planner", "keep-all", "--budget", "50%"], "--planner given twice (prefix and keep-all)"),
    (["--planner", "prefix", "--budget", "50%", "--budget", "60%"], "--budget given twice (50% and 60%)"),
])
def test_an_option_of_one_value_given_twice_is_refused(capsys, profile_file, argv, said):
    """QA: the last --planner or --budget won silently."""
    with pytest.raises(SystemExit) as exc:
        main(["plan", str(profile_file[1]), *argv])
    assert exc.value.code == 2 and f"error: {said}: one value per command" in capsys.readouterr().err


def test_json_output_is_one_document_whatever_a_plugin_prints(capfd, profile_file, monkeypatch):
    """QA: a planner's print, or a child process a plugin starts, came before the JSON on stdout and broke
    ``json.load``; under ``--json`` they go to stderr, the JSON alone to stdout."""
    import subprocess

    _, path = profile_file
    planner = support.Prefix
    original = planner.plan

    def chatty(self, profile, budget, **options):
        print("planner says hello")
        subprocess.run(["echo", "child says hello"], check=True)
        return original(self, profile, budget, **options)

    monkeypatch.setattr(planner, "plan", chatty)
    code = main(["plan", str(path), "--planner", "prefix", "--budget", "50%", "--json"])
    out, err = capfd.readouterr()
    assert code == 0 and json.loads(out)["planner"] == "prefix"
    assert "planner says hello" in err and "child says hello" in err
    code = main(["plan", str(path), "--planner", "prefix", "--budget", "50%"])  # without --json, as before
    out, _ = capfd.readouterr()
    assert code == 0 and "planner says hello" in out and "child says hello" in out


def test_plan_and_simulate_take_the_device_budget_model(capsys):
    """QA: a user with a 16 GiB card had to write a suite to plan within what the GPU gives. With
    --budget-model device, plan and simulate plan as a suite's budget_model: device does (the H200's
    ResNet-50 profile, its 1.32 GiB of runtime bytes set aside): the planner gets a smaller chain budget,
    the predicted reservation fits, the validator judges the schedule at its chain budget; the same
    budget read as the chain model's bytes gives a plan whose reservation the simulator calls too big."""
    path = ROOT / "results" / "gpu-smoke" / "published-2" / "profiles" / "torchvision_resnet50-b256-3x224x224-float32.json"
    args = [str(path), "--planner", "greedy", "--budget", "16GiB", "--json"]
    code, out, _ = _run(capsys, "plan", *args, "--budget-model", "device")
    report = json.loads(out)
    assert code == 0 and report["valid"] and report["budget_model"] == "device"
    assert report["planning_budget_bytes"] < report["budget_bytes"] - report["runtime_bytes"]
    assert report["reserved_predicted_bytes"] <= report["budget_bytes"]
    code, out, _ = _run(capsys, "simulate", *args, "--budget-model", "device")
    device = json.loads(out)
    assert code == 0 and device["status"] == "ok" and "reservation_note" not in device
    assert device["reserved_predicted_bytes"] <= device["budget_bytes"]
    code, out, _ = _run(capsys, "simulate", *args)
    chain = json.loads(out)
    assert chain["reserved_predicted_bytes"] > chain["budget_bytes"] and "reservation_note" in chain


def test_the_run_table_gives_a_decimal_budget_its_size_in_binary_units(capsys, tmp_path):
    """QA: '24GB' stood in the budget column without its size, easily read as 24 GiB; a label in binary
    units says its size already and gets nothing more."""
    text = support.SUITE.format(name="units").replace("budgets: {fractions: [0, 0.5, 1.0]}",
                                                       "budgets: {bytes: [2MB, 2MiB]}")
    code, out, _ = _run(capsys, "run", str(support.write_suite(tmp_path, text)), "-o", str(tmp_path / "r"),
                        "--no-progress")
    assert code == 0
    assert "2MB (1.91 MiB)" in out
    assert "2MiB (" not in out and "2MiB" in out


def test_the_run_table_says_what_an_arena_above_its_budget_means(capsys, tmp_path):
    """QA: the caching model's arena above the budget stood beside a page saying every schedule fits.
    The arena is what an uncapped process reserves; the run table marks each arena above its budget
    'fits capped' where the row's capped replay serves it and 'over' where it does not, as the rows say."""
    _, suite = support.resnet18_caching_suite(tmp_path, "marks")
    code, out, _ = _run(capsys, "run", str(suite), "-o", str(tmp_path / "r"), "--run-id", "x", "--no-progress", "--json")
    rows = [r for r in json.loads(out)["rows"] if r["status"] == "ok"]
    capped = sum(1 for r in rows if r["arena_bytes"] > r["budget_bytes"] and r["arena_fits_budget"])
    over = sum(1 for r in rows if r["arena_fits_budget"] is False)
    assert capped and over  # both marks have cases to count (3 and 14 on this profile)
    code, out, _ = _run(capsys, "run", str(suite), "-o", str(tmp_path / "r"), "--run-id", "x", "--resume",
                        "--no-progress")
    assert out.count("(fits capped)") == capped and out.count("(over)") == over


def test_plan_says_when_its_wait_was_numba_compiling(capsys, profile_file, monkeypatch):
    """QA: the first `simulate` with hybrid took 24 s in silence, the next 3 s. The seconds Numba spends
    compiling (its compiler lock, as the rows' times leave out) are said on stderr when they are many;
    a plan that compiles nothing says nothing."""
    from numba.core import event

    from tests.test_suite_support import SlowFirst

    def compile_for_a_while():
        with event.trigger_event("numba:compiler_lock"):
            __import__("time").sleep(1.1)

    import harness.case

    _, path = profile_file
    monkeypatch.setattr(harness.case, "_WARMED", set())  # this test's warm-up is no other test's
    monkeypatch.setattr(SlowFirst, "compiled", False)
    monkeypatch.setattr(SlowFirst, "compile", staticmethod(compile_for_a_while))
    code, _, err = _run(capsys, "plan", str(path), "--planner", "slow-first", "--budget", "peak")
    assert code == 0 and "s of this went to compiling slow-first's Numba kernels" in err
    code, _, err = _run(capsys, "plan", str(path), "--planner", "slow-first", "--budget", "peak")
    assert code == 0 and "compiling" not in err


def test_a_refused_budget_is_json_too_with_json(capsys, profile_file):
    """QA: `simulate --json` printed nothing on stdout for a budget the planner refused, and a script
    scanning budgets had to read the need out of the error line. It still exits 2 with that line, and
    prints the refusal as JSON: the budget, the need in bytes, the message; the need plans."""
    profile, path = profile_file
    for command in ("plan", "simulate"):
        code, out, err = _run(capsys, command, str(path), "--planner", "prefix", "--budget", "1KiB", "--json")
        refusal = json.loads(out)
        assert code == 2 and "cannot plan for 1024 bytes" in err
        assert refusal["status"] == "infeasible" and refusal["budget_bytes"] == 1024
        assert refusal["needed_bytes"] == min_memory(profile) and "cannot plan" in refusal["message"]
    code, out, _ = _run(capsys, "simulate", str(path), "--planner", "prefix", "--budget", str(refusal["needed_bytes"]),
                        "--json")
    assert code == 0 and json.loads(out)["status"] == "ok"
