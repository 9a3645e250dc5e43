"""The plugin manager: built-ins and entry points, environment switches, clear misses."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from harness import hookimpl
from harness.errors import UnknownPlugin
from harness.plugins import Registry, registry

ROOT = Path(__file__).resolve().parents[1]


def test_builtins_register_through_the_hooks() -> None:
    reg = Registry().load()
    names = {(e.kind, e.name): e for e in reg.entries()}
    assert ("planner", "keep-all") in names and ("executor", "simulate") in names
    assert names[("planner", "keep-all")].plugin == "membudget"
    assert all(e.description for e in reg.entries())


def test_unknown_name_lists_the_choices() -> None:
    with pytest.raises(UnknownPlugin) as err:
        registry().planner("gredy")
    assert "unknown planner 'gredy'; did you mean 'greedy'? available: " in str(err.value)
    assert "keep-all" in str(err.value)
    with pytest.raises(UnknownPlugin) as err:
        registry().planner("zzzzzz")  # nothing close: the choices, and where the bundled methods are
    assert "unknown planner 'zzzzzz'; available: " in str(err.value)
    assert str(err.value).endswith("pip install -e plugins/<method> from its source (README.md, \"On a fresh machine\")")


def test_a_bundled_method_not_installed_says_how_to_install_it(monkeypatch) -> None:
    """QA (2026-12-01): with the core alone installed, a suite naming dynprog said only "unknown planner
    'dynprog'; available: ...": nothing said it is a package of its own."""
    monkeypatch.setenv("MEMBUDGET_BLOCK_PLUGINS", "membudget-dynprog")
    reg = Registry().load()
    with pytest.raises(UnknownPlugin, match=r"unknown planner 'dynprog'; available: .*keep-all.*; the methods "
                                            r"bundled with membudget are packages of their own: pip install -e "
                                            r"plugins/<method>"):
        reg.planner("dynprog")


def test_a_profiler_missing_for_want_of_torch_says_how_to_install_it(monkeypatch) -> None:
    """Without PyTorch only the ``file`` profiler registers: asking for ``analytic`` says why."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else find_spec(name, *a))
    reg = Registry().load()
    assert reg.names("profiler") == ["file"]
    with pytest.raises(UnknownPlugin, match=r"unknown profiler 'analytic'; it needs PyTorch, not installed here: "
                                            r"pip install 'membudget\[torch\]'"):
        reg.profiler("analytic")
    with pytest.raises(UnknownPlugin, match="available: file"):
        reg.profiler("measured")


def test_environment_chooses_which_entry_points_load(monkeypatch) -> None:
    monkeypatch.setenv("MEMBUDGET_PLUGINS", "")
    assert "greedy" not in Registry().load().names("planner")
    monkeypatch.delenv("MEMBUDGET_PLUGINS")
    monkeypatch.setenv("MEMBUDGET_BLOCK_PLUGINS", "greedy")
    reg = Registry().load()
    assert "greedy" not in reg.names("planner") and "keep-all" in reg.names("planner")


def test_a_plugin_object_added_by_hand_registers() -> None:
    class Mine:
        name = "mine"
        description = "a test planner"

        def plan(self, profile, budget_bytes, **options):
            raise NotImplementedError

    class Plugin:
        @hookimpl
        def membudget_register_planners(self, register):
            register(Mine())

    reg = Registry().load()
    reg.add_plugin(Plugin(), "my-plugin", "9.9")
    entry = {e.name: e for e in reg.entries("planner")}["mine"]
    assert (entry.plugin, entry.version) == ("my-plugin", "9.9")


@pytest.mark.parametrize("name", ["", "  ", "my/planner", None])
def test_a_name_that_cannot_be_a_case_ids_part_is_skipped_with_a_warning(name) -> None:
    """QA (2026-11-28): a planner named "" was a blank row of ``membudget list``, and one with a '/' split its
    case ids in two."""
    class Odd:
        description = "odd"

    Odd.name = name

    class Plugin:
        @hookimpl
        def membudget_register_planners(self, register):
            register(Odd())

    reg = Registry().load()
    with pytest.warns(UserWarning, match=f"a planner named {re.escape(repr(name))} is skipped"):
        reg.add_plugin(Plugin(), "odd")
    assert name not in reg.names("planner") and "keep-all" in reg.names("planner")


def test_a_name_two_plugins_claim_stays_the_first_ones_with_a_warning() -> None:
    """A plugin cannot silently replace a built-in, nor stop every command with a traceback."""
    class Clash:
        name = "keep-all"
        description = "clash"

    class Plugin:
        @hookimpl
        def membudget_register_planners(self, register):
            register(Clash())

    reg = Registry().load()
    with pytest.warns(UserWarning, match="planner 'keep-all' is registered by membudget and by intruder"):
        reg.add_plugin(Plugin(), "intruder")
    keep_all = {e.name: e for e in reg.entries("planner")}["keep-all"]
    assert keep_all.plugin == "membudget" and not isinstance(keep_all.obj, Clash)
    # neither the core nor a plugin added by hand is left out by a switch, so none is advised
    assert any(p.endswith("membudget's is used") for p in reg.problems)


def test_a_plugin_cannot_take_a_builtin_name_by_asking_to_run_last(monkeypatch) -> None:
    """pluggy lists a trylast hook implementation first; the registry keeps the order plugins were
    loaded in, so an entry point's 'keep-all' still loses to the built-in."""
    import importlib.metadata
    import types

    class Clash:
        name = "keep-all"
        description = "clash"

    module = types.ModuleType("membudget_trylast")
    module.membudget_register_planners = hookimpl(trylast=True)(lambda register: register(Clash()))
    entry = types.SimpleNamespace(name="trylast", dist=None, load=lambda: module)
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [entry])
    with pytest.warns(UserWarning, match="planner 'keep-all' is registered by membudget and by trylast"):
        reg = Registry().load()
    assert not isinstance(reg.planner("keep-all"), Clash)


class _Models:
    """A model factory as a plugin brings it: its names, the models built for a workload."""

    def __init__(self, name: str, names: list[str]) -> None:
        self.name, self.description, self._names = name, f"{name}'s models", names

    def names(self) -> list[str]:
        return self._names

    def build(self, workload, device="cpu"):
        raise NotImplementedError


def test_a_model_name_two_factories_offer_is_the_first_factorys() -> None:
    """The QA case: factory 'aaa' listed torchvision:resnet18 and, being first by name, built its own
    one-layer model for every resnet18 profile without a word."""
    class Plugin:
        @hookimpl
        def membudget_register_models(self, register):
            register(_Models("aaa", ["torchvision:resnet18", "aaa:mine"]))

    reg = Registry().load()
    reg.add_plugin(Plugin(), "shadow")
    with pytest.warns(UserWarning, match="model 'torchvision:resnet18' is registered by membudget .factory "
                                         "torchvision. and by shadow .factory aaa."):
        assert reg.model_factory("torchvision:resnet18").name == "torchvision"
    assert reg.model_factory("aaa:mine").name == "aaa"
    assert ("aaa:mine", "aaa") in {(name, e.name) for name, e in reg.models()}


def test_a_hook_that_raises_skips_that_plugin_only() -> None:
    """An import inside a register hook that fails (the lazy-import pattern) costs that plugin what it
    registers in that hook, not every command; what it registered before raising is not kept."""
    class Half:
        name = "half"
        description = "registered before the hook raised"

    class Plugin:
        @hookimpl
        def membudget_register_planners(self, register):
            register(Half())
            import membudget_no_such_module  # noqa: F401

        @hookimpl
        def membudget_register_models(self, register):
            register(_Models("broken", None))  # names() gives None: not a list

    reg = Registry().load()
    with pytest.warns(UserWarning) as caught:
        reg.add_plugin(Plugin(), "fragile")
        reg.models()  # model names are read on first use
    messages = " / ".join(str(w.message) for w in caught)
    assert "fragile: its membudget_register_planners hook raised ModuleNotFoundError" in messages
    assert "model factory 'broken' could not list its models" in messages
    assert "half" not in reg.names("planner") and "keep-all" in reg.names("planner")
    assert reg.model_factory("torchvision:resnet18").name == "torchvision"


def _entry_points(monkeypatch, *modules: tuple[str, str, object]) -> None:
    """Make ``importlib.metadata`` list these (entry point, distribution, module) as membudget plugins; a
    function in place of the module is the entry point's ``load`` (to fail as an import would)."""
    import importlib.metadata
    import types

    entries = [types.SimpleNamespace(name=name, dist=types.SimpleNamespace(name=dist, version="1.0"),
                                     load=module if isinstance(module, types.FunctionType) else lambda m=module: m)
               for name, dist, module in modules]
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: entries)


class _Planner:
    name, description = "sound", "a planner of a sound plugin"

    def plan(self, profile, budget_bytes, **options):
        raise NotImplementedError


def _plugin(name: str, hook: str = "membudget_register_planners", function=None):
    """A plugin module whose hook function ``hook`` (any name) is ``function``, by default one that
    registers the planner 'sound'."""
    import types

    module = types.ModuleType(name)
    setattr(module, hook, hookimpl(function or (lambda register: register(_Planner()))))
    return module


def test_a_hook_with_a_parameter_membudget_does_not_give_skips_that_plugin_only(monkeypatch) -> None:
    """QA: ``def membudget_register_planners(reg)`` made every command a pluggy traceback until the plugin
    was uninstalled; now that plugin is skipped with one warning, and the others load."""
    wrong = _plugin("membudget_wrongsig", function=lambda reg: None)
    _entry_points(monkeypatch, ("wrongsig", "membudget-wrongsig", wrong),
                  ("sound", "membudget-sound", _plugin("membudget_sound")))
    with pytest.warns(UserWarning, match=r"membudget plugin membudget-wrongsig: its entry point wrongsig failed to "
                                         r"load and is skipped \(MEMBUDGET_BLOCK_PLUGINS=wrongsig silences this\): "
                                         r"PluginValidationError: .*reg") as caught:
        reg = Registry().load()
    assert all("\n" not in str(w.message) for w in caught)  # one line, though pluggy's text has several
    assert "sound" in reg.names("planner") and "keep-all" in reg.names("planner")
    assert not reg.pm.is_registered(wrong)


def test_a_misspelt_hook_name_is_a_warning_naming_the_hook(monkeypatch) -> None:
    """pluggy keeps a hook function with no specification and never calls it: the planner it registers
    was 'unknown' with no word why."""
    _entry_points(monkeypatch, ("typo", "membudget-typo", _plugin("membudget_typo", "membudget_register_planner")))
    with pytest.warns(UserWarning, match="membudget plugin membudget-typo: membudget_register_planner is not a "
                                         "membudget hook, so it is never called .did you mean "
                                         "membudget_register_planners.."):
        reg = Registry().load()
    assert "sound" not in reg.names("planner")


@pytest.mark.parametrize("variable, value, loads", [
    ("MEMBUDGET_BLOCK_PLUGINS", "membudget-sound", False), ("MEMBUDGET_BLOCK_PLUGINS", "sound", False),
    ("MEMBUDGET_PLUGINS", "membudget-sound", True), ("MEMBUDGET_PLUGINS", "sound", True),
    ("MEMBUDGET_PLUGINS", "other", False),
])
def test_the_plugin_switches_take_distribution_or_entry_point_names(monkeypatch, variable, value, loads) -> None:
    """The warnings name distributions (what pip lists), so the switches take those as well as entry points."""
    _entry_points(monkeypatch, ("sound", "membudget-sound", _plugin("membudget_sound")))
    monkeypatch.setenv(variable, value)
    assert ("sound" in Registry().load().names("planner")) == loads


def test_a_plugin_that_calls_sys_exit_is_skipped_not_the_end_of_the_command(monkeypatch) -> None:
    """QA: sys.exit at a plugin's import, or in its hook, ended every command with no word."""
    def exits_on_import():
        raise SystemExit(4)

    def exits_in_hook(register):
        raise SystemExit("bye")

    hook_exits = _plugin("membudget_hookexit", function=exits_in_hook)
    _entry_points(monkeypatch, ("hookexit", "membudget-hookexit", hook_exits),
                  ("sound", "membudget-sound", _plugin("membudget_sound")),
                  ("importexit", "membudget-x", exits_on_import))
    with pytest.warns(UserWarning) as caught:
        reg = Registry().load()
    messages = " / ".join(str(w.message) for w in caught)
    assert "entry point importexit failed to load and is skipped" in messages and "SystemExit: 4" in messages
    assert "membudget-hookexit: its membudget_register_planners hook raised SystemExit: bye" in messages
    assert "sound" in reg.names("planner") and "keep-all" in reg.names("planner")


def test_a_hook_function_of_any_other_name_is_a_warning(monkeypatch) -> None:
    """A @hookimpl named register_planners (no membudget_ prefix) was ignored in silence too."""
    _entry_points(monkeypatch, ("typo", "membudget-typo", _plugin("membudget_typo", "register_planners")))
    with pytest.warns(UserWarning, match="register_planners is not a membudget hook, so it is never called "
                                         ".did you mean membudget_register_planners.."):
        Registry().load()


def test_a_plugin_switch_that_names_no_installed_plugin_is_a_warning_and_names_compare_as_pip_does(
        monkeypatch) -> None:
    _entry_points(monkeypatch, ("sound", "membudget-sound", _plugin("membudget_sound")))
    monkeypatch.setenv("MEMBUDGET_PLUGINS", "membudget-sonud")
    with pytest.warns(UserWarning, match="MEMBUDGET_PLUGINS names 'membudget-sonud', which is no installed "
                                         "membudget plugin .entry points and distributions: membudget-sound, sound."):
        assert "sound" not in Registry().load().names("planner")
    monkeypatch.delenv("MEMBUDGET_PLUGINS")
    monkeypatch.setenv("MEMBUDGET_BLOCK_PLUGINS", "Membudget_Sound")
    assert "sound" not in Registry().load().names("planner")


def test_a_plugin_switch_naming_a_distribution_with_a_misspelt_entry_point_group_says_so(monkeypatch, tmp_path):
    """QA: a plugin declared under ``[project.entry-points.membudegt]`` registered nothing, and
    MEMBUDGET_PLUGINS naming it said only that no such plugin is installed, though pip lists it."""
    info = tmp_path / "membudget_typo-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: membudget-typo\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[membudegt]\ntypo = membudget_typo\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("MEMBUDGET_PLUGINS", "membudget-typo")
    with pytest.warns(UserWarning, match=r"MEMBUDGET_PLUGINS names 'membudget-typo', which is no installed membudget "
                                         r"plugin \(.*\); the distribution membudget-typo is installed, but its entry "
                                         r"points are in 'membudegt', not 'membudget' \(\[project\.entry-points\."
                                         r"membudget\] in its pyproject\.toml\)$"):
        Registry().load()


def test_a_clash_between_two_plugins_says_how_to_leave_out_either(monkeypatch) -> None:
    """QA: the advice named only the second plugin, which was the genuine one when an impostor came first."""
    _entry_points(monkeypatch, ("one", "membudget-one", _plugin("membudget_one")),
                  ("two", "membudget-two", _plugin("membudget_two")))
    with pytest.warns(UserWarning, match=r"planner 'sound' is registered by membudget-one and by membudget-two: "
                                         r"membudget-one's is used \(MEMBUDGET_BLOCK_PLUGINS=membudget-one or =two "
                                         r"leaves one out\)"):
        Registry().load()


def test_a_clash_with_a_plugin_added_by_hand_names_only_the_switch_that_works(monkeypatch) -> None:
    """A plugin given to ``add_plugin`` (a notebook's, a test's) is loaded by no entry point, so no
    MEMBUDGET_BLOCK_PLUGINS value leaves it out: the advice named "local" as if one did."""
    _entry_points(monkeypatch, ("one", "membudget-one", _plugin("membudget_one")))
    registry = Registry().load()
    with pytest.warns(UserWarning, match=r"registered by membudget-one and by local: membudget-one's is used "
                                         r"\(MEMBUDGET_BLOCK_PLUGINS=membudget-one leaves the first out\)$"):
        registry.add_plugin(_plugin("by_hand"))
    _entry_points(monkeypatch)
    registry = Registry().load()
    registry.add_plugin(_plugin("first_by_hand"), plugin="mine")
    with pytest.warns(UserWarning, match=r"registered by mine and by theirs: mine's is used$"):
        registry.add_plugin(_plugin("second_by_hand"), plugin="theirs")


def _link_dependencies(site: Path) -> None:
    """Make the core's third-party dependencies importable in a bare venv, without our own dists.

    A .pth pointing at the parent's site-packages would also expose the parent's installed
    membudget plugins (their dist-info), which is exactly what the test must not see; so
    only the dependency packages themselves are linked into a folder of their own.
    """
    deps = site / "_parent_deps"
    deps.mkdir()
    for module in ("numpy", "numba", "llvmlite", "pluggy", "pydantic", "pydantic_core", "typing_extensions",
                   "annotated_types", "typing_inspection", "yaml", "_yaml"):
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            continue
        origin = Path(spec.origin)
        target = origin.parent if origin.name == "__init__.py" else origin
        (deps / target.name).symlink_to(target)
    (site / "parent_deps.pth").write_text(str(deps) + "\n")


@pytest.mark.slow
def test_installing_the_greedy_plugin_into_a_fresh_venv_makes_it_appear(tmp_path: Path) -> None:
    """Build the core and plugins/greedy as wheels, install them into a new venv, list planners."""
    wheels = tmp_path / "wheels"
    for project in (ROOT, ROOT / "plugins" / "greedy"):
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "-w", str(wheels), str(project)], check=True, cwd=tmp_path)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    _link_dependencies(site)
    clean_env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMBUDGET_", "PYTHON"))}

    def install(pattern: str) -> None:
        wheel = next(wheels.glob(pattern))
        subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                        str(wheel)], check=True, env=clean_env)

    def planners() -> dict[str, str]:
        code = ("import json; from harness.plugins import registry; "
                "print(json.dumps({e.name: e.plugin for e in registry().entries('planner')}))")
        out = subprocess.run([str(python), "-c", code], check=True, capture_output=True, text=True,
                             env=clean_env, cwd=tmp_path)
        return json.loads(out.stdout)

    install("membudget-*.whl")
    before = planners()
    assert "keep-all" in before and "greedy" not in before
    install("membudget_greedy-*.whl")
    assert planners()["greedy"] == "membudget-greedy"


def test_an_object_the_runner_cannot_call_is_skipped_at_load_and_a_name_given_twice_keeps_the_first() -> None:
    """QA: a planner with ``plan(self, profile)`` registered fine, then failed every case with a TypeError; a
    plugin that registered two planners of one name kept the second without a word; one without a
    description registered silently."""
    class NoBudget(_Planner):
        name = "no-budget"

        def plan(self, profile):
            raise NotImplementedError

    class First(_Planner):
        name = "twice"

    class Second(First):
        pass

    class Silent(_Planner):
        name, description = "silent", ""

    class Wordy(_Planner):
        name, description = "wordy", "a planner\nthat explains itself\nat length"

    class Nameless:
        description = "no name"

        def plan(self, profile, budget_bytes):
            raise NotImplementedError

    class Uncalled(_Planner):
        name = "uncalled"

    class Plugin:
        @hookimpl
        def membudget_register_planners(self, register):
            # QA: an object without a name raised in the hook and took the 15 planners beside it along; a class
            # registered for its instance was said to take too few arguments; a description of several lines
            # was taken without a word
            for planner in (NoBudget(), First(), Second(), Silent(), Nameless(), Uncalled, Wordy()):
                register(planner)

    reg = Registry().load()
    with pytest.warns(UserWarning) as caught:
        reg.add_plugin(Plugin(), "careless")
    messages = [str(w.message) for w in caught]
    assert "membudget plugin careless: planner 'no-budget' is skipped: its plan(profile) cannot take the 2 arguments " \
           "the runner gives it (harness.protocols.Planner)" in messages
    assert "membudget plugin careless registers 2 planners named 'twice': the first is used" in messages
    assert "membudget plugin careless: planner 'silent' has no description (the one line membudget list and the " \
           "published pages show)" in messages
    assert any(re.fullmatch(r"membudget plugin careless: a planner without a name \(a tests\.test_plugins\..*Nameless "
                            r"object\) is skipped: .*", m) for m in messages), messages
    assert "membudget plugin careless: planner 'uncalled' is skipped: it is a class, not an instance: register " \
           "Uncalled() (harness.protocols.Planner)" in messages
    assert "membudget plugin careless: planner 'wordy' has a description of several lines; membudget list and the " \
           "published pages show one line" in messages
    assert "no-budget" not in reg.names("planner") and type(reg.planner("twice")) is First
    assert "uncalled" not in reg.names("planner")
    assert {"silent", "wordy"} <= set(reg.names("planner"))  # kept: they run, only their line is missing or long


@pytest.mark.parametrize("listed", [("zzz", "aaa"), ("aaa", "zzz")])
def test_which_plugin_keeps_a_name_two_claim_does_not_hang_on_the_order_python_lists_them(monkeypatch, listed):
    """QA: with two plugins registering one planner name, reversing PYTHONPATH handed it to the other one."""
    _entry_points(monkeypatch, *[(name, f"membudget-{name}", _plugin(f"membudget_{name}")) for name in listed])
    with pytest.warns(UserWarning, match="planner 'sound' is registered by membudget-aaa and by membudget-zzz: "
                                         "membudget-aaa's is used"):
        reg = Registry().load()
    assert {e.name: e.plugin for e in reg.entries("planner")}["sound"] == "membudget-aaa"


def test_an_entry_point_that_is_not_module_colon_object_says_so(monkeypatch) -> None:
    """QA: ``bad = this is not : a valid [ref`` warned ``AttributeError: 'NoneType' object has no attribute
    'group'`` (importlib's regular expression did not match)."""
    import importlib.metadata
    import types

    def load():
        raise AttributeError("'NoneType' object has no attribute 'group'")

    bad = types.SimpleNamespace(name="bad", value="this is not : a valid [ref", load=load,
                                dist=types.SimpleNamespace(name="membudget-bad", version="1.0"))
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [bad])
    with pytest.warns(UserWarning, match=re.escape(
            "membudget plugin membudget-bad: its entry point bad failed to load and is skipped "
            "(MEMBUDGET_BLOCK_PLUGINS=bad silences this): ValueError: bad = 'this is not : a valid [ref' is not "
            "'module' or 'module:object'")):
        Registry().load()


def test_a_dist_info_without_metadata_is_one_plugin_skipped_not_every_command_broken(monkeypatch, tmp_path) -> None:
    """QA: a dist-info with entry points but no METADATA (a plugin half reinstalled) has no distribution
    name; sorting the entry points by it raised a TypeError in every command."""
    import sys

    info = tmp_path / "broken-1.0.dist-info"
    info.mkdir()
    (info / "entry_points.txt").write_text("[membudget]\nbroken = no_such_module_here\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    with pytest.warns(UserWarning, match="membudget plugin broken: its entry point broken failed to load"):
        reg = Registry().load()
    assert "greedy" in reg.names("planner")  # the others load
