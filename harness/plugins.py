"""The plugin manager and the registry of everything plugins bring.

Plugins are found through the ``membudget`` entry-point group; the harness's own
built-ins register through the same hooks (module ``harness.builtins``). The registry
names its plugins and never imports them by statement: the built-ins by module name
(``BUILTINS``, as pytest loads its default plugins), the others by entry point. So
the profilers, executors and allocators, which look up model factories here, sit above
the registry without a cycle (docs/architecture.md, "The stack"). Two environment
variables choose what loads:

- ``MEMBUDGET_PLUGINS``: a comma-separated list of plugins (entry-point or distribution
  names); only those load (set it empty to load none but the built-ins);
- ``MEMBUDGET_BLOCK_PLUGINS``: a comma-separated list of plugins (entry-point or
  distribution names) never to load.

A plugin that fails never takes the others down: one that cannot be imported, whose hook
functions do not match the hook specifications (a parameter pluggy cannot give), or whose hook
raises, is skipped (nothing it registered in that hook is kept); a hook function whose name is
no hook of membudget's (a typo: ``membudget_register_planner``) is a warning naming the closest;
a name (a planner's, a model's) that an earlier plugin already registered stays the earlier one's, the built-ins first, then the
entry points by distribution name and entry-point name (not sys.path's order, which differs between machines);
an object whose method cannot take what the runner gives it (``CALLS``), a class registered for its instance, or an
object without a usable name is skipped (alone: the others of its hook are kept); one without a description, or
with one of several lines, is kept, with a warning. Each such problem is a warning and a line of
``Registry.problems``, which a run records in ``meta.json`` and its published page shows.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import re
import warnings
from dataclasses import dataclass
from typing import Any

import pluggy

from harness import hookspecs
from harness.errors import PLUGIN_FAILURES, PluginWarning, UnknownPlugin

KINDS = ("profiler", "planner", "executor", "allocator", "model")
BUILTINS = "harness.builtins"  # the core's own hook implementations, loaded by name

_TORCH_PROFILERS = ("analytic", "torch")  # registered only where torch imports (harness.profilers)


@dataclass(frozen=True)
class Registered:
    """A registered object with the plugin (distribution) and version that brought it."""

    kind: str
    name: str
    obj: Any
    plugin: str
    version: str

    @property
    def description(self) -> str:
        return getattr(self.obj, "description", "")


def _env_list(name: str) -> list[str] | None:
    value = os.environ.get(name)
    if value is None:
        return None
    return [part.strip() for part in value.split(",") if part.strip()]


class Registry:
    """Everything registered, by kind and name, with lookups that explain a miss."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self._items: dict[str, dict[str, Registered]] = {kind: {} for kind in KINDS}
        self._sources: dict[int, tuple[str, str]] = {}
        self._order: dict[int, int] = {}  # plugin object id -> when it was added: who registers first
        self._entry_points: dict[int, str] = {}  # plugin object id -> the entry point that loaded it
        self._models: dict[str, Registered] | None = None  # model name -> its factory; built on first use
        self.failed: dict[str, str] = {}  # plugin -> why it could not be loaded, or a hook of it raised
        self.problems: list[str] = []  # every plugin problem, one line each (see the module docstring)

    # -- loading
    def load(self) -> Registry:
        self._add(importlib.import_module(BUILTINS), "membudget", _version("membudget"))
        switches = {variable: _env_list(variable) for variable in ("MEMBUDGET_PLUGINS", "MEMBUDGET_BLOCK_PLUGINS")}
        only = switches["MEMBUDGET_PLUGINS"]
        chosen = {_norm(n) for n in only} if only is not None else None
        blocked = {_norm(n) for n in switches["MEMBUDGET_BLOCK_PLUGINS"] or []}
        seen: set[str] = set()
        # by distribution, then entry point: which of two plugins keeps a name they both claim does not hang on
        # the order of sys.path
        for ep in sorted(importlib.metadata.entry_points(group=hookspecs.PROJECT), key=_load_order):
            dist = _distribution_name(ep)
            names = {_norm(ep.name), _norm(dist)}
            seen |= names
            if names & blocked or (chosen is not None and not names & chosen):
                continue
            module = None
            try:
                value = getattr(ep, "value", None)
                if isinstance(value, str) and importlib.metadata.EntryPoint.pattern.match(value) is None:
                    raise ValueError(f"{ep.name} = {value!r} is not 'module' or 'module:object'")
                module = ep.load()
                self._add(module, dist, _distribution_field(ep, "version") or "")
                self._entry_points[id(module)] = ep.name
            except PLUGIN_FAILURES as exc:  # a broken plugin must not take the others down with it
                if module is not None and self.pm.is_registered(module):  # pluggy < 1.6 registers part of it
                    self.pm.unregister(module)
                text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())  # pluggy's: several
                why = f"{type(exc).__name__}: {text}"
                self.failed[dist] = why
                self._problem(f"membudget plugin {dist}: its entry point {ep.name} failed to load and is skipped "
                              f"(MEMBUDGET_BLOCK_PLUGINS={ep.name} silences this): {why}")
                continue
        for variable, names in switches.items():
            for name in names or []:
                if _norm(name) not in seen:
                    self._problem(f"{variable} names {name!r}, which is no installed membudget plugin "
                                  f"(entry points and distributions: {', '.join(sorted(seen)) or 'none'})"
                                  + _installed_elsewhere(name))
        self._check_hook_names()
        self._collect()
        return self

    def _check_hook_names(self) -> None:
        """Warn of each hook function whose name membudget has no hook for: pluggy keeps it unverified
        and never calls it, so a misspelt ``membudget_register_planner`` would register nothing in silence."""
        specs = [n for n in dir(hookspecs) if n.startswith("membudget_")]
        for name, caller in sorted(vars(self.pm.hook).items()):
            if caller.has_spec():
                continue
            for impl in caller.get_hookimpls():
                plugin = self._sources.get(id(impl.plugin), (impl.plugin_name, ""))[0]
                close = difflib.get_close_matches(name, specs, n=1)
                self._problem(f"membudget plugin {plugin}: {name} is not a membudget hook, so it is never called"
                              + (f" (did you mean {close[0]}?)" if close else ""))

    def add_plugin(self, module: Any, plugin: str = "local", version: str = "") -> None:
        """Register a plugin object by hand (tests, notebooks) and collect what it brings."""
        self._add(module, plugin, version)
        self._collect()

    def _add(self, module: Any, plugin: str, version: str) -> None:
        if self.pm.is_registered(module):
            return
        self.pm.register(module, name=f"{plugin}:{getattr(module, '__name__', id(module))}")
        self._sources[id(module)] = (plugin, version)
        self._order[id(module)] = len(self._order)

    def _collect(self) -> None:
        for kind in KINDS:
            hook = getattr(self.pm.hook, f"membudget_register_{kind}s")
            for impl in sorted(hook.get_hookimpls(), key=self._added):
                plugin, version = self._sources.get(id(impl.plugin), (impl.plugin_name, ""))
                staged: list[Registered] = []

                def register(obj: Any, _kind: str = kind, _p: str = plugin, _v: str = version) -> None:
                    staged.append(Registered(_kind, getattr(obj, "name", _NO_NAME), obj, _p, _v))

                try:
                    impl.function(register=register)
                except PLUGIN_FAILURES as exc:  # what it registered before it raised is dropped with it
                    self.failed[plugin] = f"{type(exc).__name__}: {exc}"
                    self._problem(f"membudget plugin {plugin}: its membudget_register_{kind}s hook raised "
                                  f"{type(exc).__name__}: {exc}; what it registers there is skipped")
                    continue
                names = [entry.name for entry in staged]
                for k, entry in enumerate(staged):
                    if not isinstance(entry.name, str) or not entry.name.strip() or "/" in entry.name:
                        named = (f"without a name ({_what(entry.obj)})" if entry.name is _NO_NAME
                                 else f"named {entry.name!r}")
                        self._problem(f"membudget plugin {plugin}: a {kind} {named} is skipped: a name is "
                                      "a non-empty string without '/' (which separates the parts of a case id)")
                        continue
                    if names.count(entry.name) > 1:
                        self._problem(f"membudget plugin {plugin} registers {names.count(entry.name)} {kind}s named "
                                      f"{entry.name!r}: the first is used")
                        if k != names.index(entry.name):
                            continue
                    existing = self._items[kind].get(entry.name)
                    if existing is not None and existing.plugin != entry.plugin:
                        self._problem(_clash(kind, entry.name, existing.plugin, entry.plugin,
                                             self._block_name(existing.plugin),
                                             self._entry_points.get(id(impl.plugin))))
                        continue
                    why = _cannot_be_called(kind, entry.obj)
                    if why:
                        self._problem(f"membudget plugin {plugin}: {kind} {entry.name!r} is skipped: {why}")
                        continue
                    description = str(getattr(entry.obj, "description", "") or "").strip()
                    if not description:  # kept: a page only lacks a line
                        self._problem(f"membudget plugin {plugin}: {kind} {entry.name!r} has no description "
                                      "(the one line membudget list and the published pages show)")
                    elif "\n" in description:
                        self._problem(f"membudget plugin {plugin}: {kind} {entry.name!r} has a description of several "
                                      "lines; membudget list and the published pages show one line")
                    self._items[kind][entry.name] = entry
        self._models = None

    def _added(self, impl: Any) -> int:
        """When a hook implementation's plugin was added: the order names are claimed in (pluggy's own
        order puts a ``trylast`` implementation first)."""
        return self._order.get(id(impl.plugin), len(self._order))

    def _block_name(self, plugin: str) -> str | None:
        """What ``MEMBUDGET_BLOCK_PLUGINS`` takes to leave out ``plugin``: None for the core's own
        built-ins and for a plugin added by hand (``add_plugin``), which no switch leaves out."""
        from_entry_points = {self._sources[plugin_id][0] for plugin_id in self._entry_points}
        return plugin if plugin in from_entry_points else None

    def _model_index(self) -> dict[str, Registered]:
        """Which factory answers to each model name: the first registered that lists it. Built on first
        use, not at load: listing torchvision's models imports torch, which `membudget place` never needs."""
        if self._models is not None:
            return self._models
        self._models = {}
        for entry in self._items["model"].values():  # in the order they were registered
            try:
                names = list(entry.obj.names())
            except PLUGIN_FAILURES as exc:
                self._problem(f"membudget plugin {entry.plugin}: model factory {entry.name!r} could not list its "
                              f"models ({type(exc).__name__}: {exc}); it is skipped")
                continue
            for name in names:
                owner = self._models.get(name)
                if owner is not None and owner.plugin != entry.plugin:
                    self._problem(_clash("model", name, f"{owner.plugin} (factory {owner.name})",
                                         f"{entry.plugin} (factory {entry.name})", self._block_name(owner.plugin),
                                         self._block_name(entry.plugin)))
                    continue
                self._models.setdefault(name, entry)
        return self._models

    def _problem(self, text: str) -> None:
        if text not in self.problems:
            self.problems.append(text)
            warnings.warn(text, PluginWarning, stacklevel=3)

    # -- lookups
    def names(self, kind: str) -> list[str]:
        return sorted(self._items[kind])

    def entries(self, kind: str | None = None) -> list[Registered]:
        kinds = [kind] if kind else list(KINDS)
        return [self._items[k][n] for k in kinds for n in sorted(self._items[k])]

    def get(self, kind: str, name: str) -> Any:
        """The object registered as ``name``; ``UnknownPlugin`` lists the choices if none is."""
        try:
            return self._items[kind][name].obj
        except KeyError:
            hint = None
            other = [k for k in self._items if k != kind and name in self._items[k]]
            if kind == "profiler" and name in _TORCH_PROFILERS and importlib.util.find_spec("torch") is None:
                hint = "it needs PyTorch, not installed here: pip install 'membudget[torch]'"
            elif other:
                hint = (f"{name!r} is {_a(other[0])}, not {_a(kind)}; the {kind}s: "
                        + ", ".join(sorted(self.names(kind))))
            elif close := close_names(name, self.names(kind), n=1):
                hint = f"did you mean {close[0]!r}? available: " + ", ".join(sorted(self.names(kind)))
            elif kind in ("planner", "allocator"):
                hint = ("available: " + (", ".join(sorted(self.names(kind))) or "(none registered)")
                        + "; the methods bundled with membudget are packages of their own: pip install -e "
                          "plugins/<method> from its source (README.md, \"On a fresh machine\")")
            raise UnknownPlugin(kind, name, self.names(kind), hint=hint) from None

    def profiler(self, name: str) -> Any:
        return self.get("profiler", name)

    def planner(self, name: str) -> Any:
        return self.get("planner", name)

    def executor(self, name: str) -> Any:
        return self.get("executor", name)

    def allocator(self, name: str) -> Any:
        return self.get("allocator", name)

    def model_factory(self, model_name: str) -> Any:
        """The model factory that answers to ``model_name`` (e.g. ``torchvision:resnet50``)."""
        entry = self._model_index().get(model_name)
        if entry is None:
            known = list(self._model_index())
            raise UnknownPlugin("model", model_name, sorted(known), hint=_model_hint(model_name, known))
        return entry.obj

    def models(self) -> list[tuple[str, Registered]]:
        """Every model name with the factory entry that answers to it, by name."""
        return sorted(self._model_index().items())


def _distribution_name(ep: Any) -> str:
    """The distribution an entry point came from, else the entry point's own name (a dist-info without a
    METADATA name, half written or half removed, must not take the other plugins down)."""
    name = _distribution_field(ep, "name")
    return name if isinstance(name, str) and name else ep.name


def _distribution_field(ep: Any, field: str) -> Any:
    """``ep.dist.<field>``, or None where the distribution lacks it (importlib.metadata gives None for a
    missing METADATA field in Python 3.11 and 3.12, and raises KeyError in later versions)."""
    try:
        return getattr(ep.dist, field) if ep.dist else None
    except (KeyError, AttributeError):
        return None


def _load_order(ep: Any) -> tuple[str, str]:
    return (_norm(_distribution_name(ep)), ep.name)


# what the runner calls on each kind of plugin, with the arguments it gives (harness.protocols)
CALLS = {"profiler": ("Profiler", "profile", 1), "planner": ("Planner", "plan", 2), "executor": ("Executor", "run", 3),
         "allocator": ("Allocator", "place", 1), "model": ("ModelFactory", "build", 2)}


def _cannot_be_called(kind: str, obj: Any) -> str | None:
    """Why the runner could not call ``obj`` as a ``kind`` (``harness.protocols``): its method is missing, or
    cannot take the arguments the runner gives (``plan(self, profile)`` failed every case with a TypeError).
    None when it can, or when Python cannot say (a compiled method without a signature)."""
    protocol, method, n = CALLS[kind]
    if inspect.isclass(obj):
        return f"it is a class, not an instance: register {obj.__name__}() (harness.protocols.{protocol})"
    call = getattr(obj, method, None)
    if not callable(call):
        return f"it has no {method} method (harness.protocols.{protocol})"
    try:
        signature = inspect.signature(call)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*[None] * n)
    except TypeError:
        return (f"its {method}{signature} cannot take the {n} argument{'s' if n > 1 else ''} the runner gives it "
                f"(harness.protocols.{protocol})")
    return None


def _installed_elsewhere(name: str) -> str:
    """What the warning for a plugin switch that names no membudget plugin adds when ``name`` is an installed
    distribution all the same: its entry points are in other groups (a misspelt group registers nothing)."""
    from importlib import metadata

    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return ""
    groups = sorted({ep.group for ep in dist.entry_points})
    where = f"its entry points are in {', '.join(map(repr, groups))}" if groups else "it declares no entry point"
    return (f"; the distribution {dist.metadata['Name']} is installed, but {where}, not 'membudget' "
            "([project.entry-points.membudget] in its pyproject.toml)")


_NO_NAME = object()  # what ``register`` stages for an object without a ``name``


def _what(obj: Any) -> str:
    """An object as a warning names it: its class and module."""
    cls = obj if inspect.isclass(obj) else type(obj)
    return f"a {cls.__module__}.{cls.__qualname__} {'class' if inspect.isclass(obj) else 'object'}"


def _norm(name: str) -> str:
    """A plugin name as pip compares them: case, '-', '_' and '.' do not count (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _clash(kind: str, name: str, first: str, second: str, first_block: str | None,
           second_block: str | None) -> str:
    """The warning for two plugins registering one name; a ``*_block`` is what MEMBUDGET_BLOCK_PLUGINS
    takes to leave that plugin out (None: nothing does, as for the core or a plugin added by hand)."""
    if first_block and second_block:
        choice = f" (MEMBUDGET_BLOCK_PLUGINS={first_block} or ={second_block} leaves one out)"
    elif first_block or second_block:
        which = "first" if first_block else "second"
        choice = f" (MEMBUDGET_BLOCK_PLUGINS={first_block or second_block} leaves the {which} out)"
    else:
        choice = ""
    return f"{kind} {name!r} is registered by {first} and by {second}: {first}'s is used{choice}"


def close_names(name: str, known: list[str], n: int = 5) -> list[str]:
    """The names of ``known`` closest to ``name``, best first (difflib), also matching the part after
    the colon: ``resnet18`` finds ``torchvision:resnet18``."""
    by_tail: dict[str, list[str]] = {}
    for full in known:
        by_tail.setdefault(full.split(":", 1)[-1], []).append(full)
    tail = name.split(":", 1)[-1]
    found = [full for t in difflib.get_close_matches(tail, list(by_tail), n=n) for full in by_tail[t]]
    found += difflib.get_close_matches(name, known, n=n)
    return list(dict.fromkeys(found))[:n]


def _a(kind: str) -> str:
    """``an allocator``, ``a planner``."""
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"


def _model_hint(name: str, known: list[str]) -> str:
    families = sorted({k.split(":", 1)[0] for k in known if ":" in k})
    where = f"{len(known)} models in the families {', '.join(families)}: see membudget list --kind model"
    close = close_names(name, known)
    if not close:
        return f"no model has a similar name; {where}"
    return f"did you mean {', '.join(close)}? {where}"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "dev"


_registry: Registry | None = None


def registry(reload: bool = False) -> Registry:
    """The process-wide registry, loaded on first use."""
    global _registry
    if _registry is None or reload:
        _registry = Registry().load()
    return _registry
