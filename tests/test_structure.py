"""The package's import structure: no circle, and the library never reaches up into the training tool."""

import ast
import os

from conftest import REPO
from nmt_tf.config import TrainingConfig

PACKAGE = os.path.join(REPO, "nmt_tf")


def module_paths() -> dict[str, str]:
    """{module: its file} for every module of the package."""
    paths = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                paths[os.path.relpath(path, REPO)[:-3].replace(os.sep, ".").removesuffix(".__init__")] = path
    return paths


def type_checking_only(tree) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:`: imports for annotations
    only, which never run."""
    blocks = [n for n in ast.walk(tree) if isinstance(n, ast.If) and isinstance(n.test, ast.Name)
              and n.test.id == "TYPE_CHECKING"]
    return {id(sub) for block in blocks for sub in ast.walk(block)}


def import_graph() -> dict[str, set[str]]:
    """{module: nmt_tf modules it imports}, read from the source (imports inside
    functions included, as they run when the function does; those for type
    annotations only left out)."""
    modules = module_paths()
    graph = {}
    for module, path in modules.items():
        found = set()
        tree = ast.parse(open(path, encoding="utf-8").read())
        skipped = type_checking_only(tree)
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:            # "from nmt_tf.data import text" imports nmt_tf.data.text
                    child = f"{node.module}.{alias.name}"
                    found.add(child if child in modules else node.module)
        graph[module] = {m for m in found if m in modules and m != module}
    return graph


def find_cycle(graph):
    """One import circle as a list of modules, or None."""
    state = {}

    def visit(module, path):
        state[module] = "open"
        for dep in sorted(graph[module]):
            if state.get(dep) == "open":
                return path[path.index(dep):] + [dep]
            if dep not in state:
                found = visit(dep, path + [dep])
                if found:
                    return found
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state:
            found = visit(module, [module])
            if found:
                return found
    return None


def test_the_package_has_no_import_circle():
    graph = import_graph()
    assert len(graph) > 30 and "nmt_tf.data.pipeline" in graph["nmt_tf.train"]     # the graph is read at all
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


# The library's floors, from the ground up: a module imports from its own
# floor or those below it, never from one above (docs/architecture.md). The
# tools and nmt_tf.api stand above them all.
FLOORS = (
    ("nmt_tf.core",),
    ("nmt_tf.data",),
    ("nmt_tf.layers",),
    ("nmt_tf.models",),
    ("nmt_tf.config", "nmt_tf.flags"),
    ("nmt_tf.inference",),
    ("nmt_tf.exporting",),
    ("nmt_tf.evaluation",),
    ("nmt_tf.presets",),
    ("nmt_tf.training",),
    ("nmt_tf.serving",),
)


def part_of(module: str) -> str:
    """The floor's part (a package, or config / flags) `module` belongs to; "tools" for the top."""
    for floor in FLOORS:
        for part in floor:
            if module == part or module.startswith(part + "."):
                return part
    return "tools"


def floor_of(module: str) -> int:
    part = part_of(module)
    return next((i for i, floor in enumerate(FLOORS) if part in floor), len(FLOORS))


def part_graph(graph) -> dict[str, set[str]]:
    """{part: the other parts it imports}, from the module graph."""
    parts = {}
    for module, deps in graph.items():
        parts.setdefault(part_of(module), set()).update(part_of(d) for d in deps)
    return {part: deps - {part} for part, deps in parts.items()}


def drawing(graph) -> str:
    """The parts from the top floor down, each with what it imports: the text
    drawing in docs/architecture.md (`python tests/test_structure.py` prints it)."""
    parts = part_graph(graph)
    order = ["tools"] + [part for floor in reversed(FLOORS) for part in floor]
    name = lambda part: "tools, api" if part == "tools" else part.removeprefix("nmt_tf.")
    return "\n".join(f"{name(part):<10}  -> {', '.join(name(p) for p in order if p in parts[part]) or '(nothing)'}"
                      for part in order if part in parts)


def test_no_module_imports_from_a_floor_above_its_own():
    graph = import_graph()
    assert {part_of(m) for m in graph} == {part for floor in FLOORS for part in floor} | {"tools"}
    up = [f"{module} imports {dep}" for module, deps in sorted(graph.items()) for dep in sorted(deps)
          if floor_of(dep) > floor_of(module)]
    assert not up, "\n".join(up)
    assert floor_of("nmt_tf.serving.rest") > floor_of("nmt_tf.inference.search") > floor_of("nmt_tf.core.files")


def test_the_top_of_the_package_holds_the_tools_api_config_and_flags():
    top = sorted(m for m in import_graph() if m.count(".") == 1 and part_of(m) in ("tools", "nmt_tf.config",
                                                                                   "nmt_tf.flags"))
    assert len(top) <= 16, top
    tools = tool_modules(import_graph())
    assert set(top) - tools == {"nmt_tf.api", "nmt_tf.config", "nmt_tf.flags"}, set(top) - tools


def test_the_architecture_page_draws_the_floors_as_they_are():
    page = open(os.path.join(REPO, "docs", "architecture.md"), encoding="utf-8").read()
    assert drawing(import_graph()) in page, "docs/architecture.md: paste `python tests/test_structure.py`'s drawing"


def test_the_cycle_finder_finds_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def reaches(graph, start, target):
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module == target:
            return True
        if module not in seen:
            seen.add(module)
            todo.extend(graph[module])
    return False


def test_translation_export_and_serving_do_not_import_the_training_tool():
    graph = import_graph()
    for module in ("nmt_tf.inference.translation_graph", "nmt_tf.inference.restore", "nmt_tf.export", "nmt_tf.serve",
                   "nmt_tf.serving.versions", "nmt_tf.serving.rest", "nmt_tf.translate", "nmt_tf.evaluate",
                   "nmt_tf.models"):
        assert not reaches(graph, module, "nmt_tf.train"), module


def test_every_registered_architecture_builds_and_is_a_model_choice():
    from nmt_tf import flags, models
    from nmt_tf.models.base import Seq2SeqModel

    assert list(models.ARCHITECTURES) == flags.FLAGS["model"].parser.enum_values
    for name in models.ARCHITECTURES:
        config = TrainingConfig(model=name, embedding_size=8, hidden_size=8, attention_size=8,
                                maxout_size=4, grconv_size=8)
        assert type(config.model_config()) is models.ARCHITECTURES[name].config
        model = models.build_model(config.model_config(), 12, 14)
        assert isinstance(model, Seq2SeqModel) and model.built
        assert model.source_vocab_size == 12 and model.target_vocab_size == 14


def test_a_setting_shared_by_architectures_is_one_flag():
    """TrainingConfig has every architecture's settings, each once: two
    architectures that declare the same setting must agree on its type,
    default, help and limits (else the flag would follow whichever came last)."""
    import dataclasses

    from nmt_tf import models

    seen = {}
    for name, architecture in models.ARCHITECTURES.items():
        assert issubclass(architecture.config, models.ModelConfig), name
        for field in dataclasses.fields(architecture.config):
            declared = (field.type, field.default, dict(field.metadata))
            assert seen.setdefault(field.name, (name, declared))[1] == declared, (field.name, name)
    assert {"hidden_size", "attention_size", "grconv_size"} <= set(seen)


def test_no_module_imports_a_command_line_tool():
    """The tools (modules run as `python -m nmt_tf.<tool>`) share the library,
    never each other: a tool importing a tool would run its flag definitions
    and drag in its dependencies."""
    graph = import_graph()
    tools = tool_modules(graph)
    assert {"nmt_tf.train", "nmt_tf.translate", "nmt_tf.evaluate", "nmt_tf.export", "nmt_tf.serve"} <= tools
    for module, deps in graph.items():
        assert not deps & tools, f"{module} imports the tool(s) {sorted(deps & tools)}"


def test_the_tools_hold_their_command_line_only():
    """Each tool is its flags and main over a library module that Python code
    calls without flags: it defines no class (errors, objects and what they
    do live in the library) and no function longer than its main's helpers
    need (30 lines, main aside)."""
    paths = module_paths()
    tools = tool_modules(import_graph())
    assert {"nmt_tf.translate", "nmt_tf.score", "nmt_tf.visualize", "nmt_tf.average", "nmt_tf.unk_dictionary"} <= tools
    for module in sorted(tools):
        tree = ast.parse(open(paths[module], encoding="utf-8").read())
        classes = [node.name for node in tree.body if isinstance(node, ast.ClassDef)]
        assert not classes, f"{module} defines {classes}: library code, not command line"
        long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)" for node in tree.body
                if isinstance(node, ast.FunctionDef) and node.name != "main" and node.end_lineno - node.lineno >= 30]
        assert not long, f"{module}: {long}"


def test_every_tool_is_a_console_script_too():
    """pyproject.toml's [project.scripts] give every tool a command
    (nmt-tf-translate, ...) that runs `python -m nmt_tf.<tool>`
    (nmt_tf.core.console); an installed one answers --help as the module does."""
    import subprocess
    import sys
    import tomllib

    from nmt_tf.core import console

    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    tools = tool_modules(import_graph())
    assert {f"nmt_tf.{tool}" for tool in console.TOOLS} == {t.removesuffix(".__main__") for t in tools}
    assert scripts == {f"nmt-tf-{tool.replace('_', '-')}": f"nmt_tf.core.console:{tool}" for tool in console.TOOLS}
    assert all(callable(getattr(console, tool)) for tool in console.TOOLS)
    installed = os.path.join(os.path.dirname(sys.executable), "nmt-tf-translate")
    if os.path.exists(installed):           # `pip install -e .` made it (make setup, CI)
        shown = subprocess.run([installed, "--help"], capture_output=True, text=True, timeout=120)
        as_module = subprocess.run([sys.executable, "-m", "nmt_tf.translate", "--help"], capture_output=True,
                                   text=True, timeout=120)
        assert shown.returncode == 0 and "--preset" in shown.stdout, shown.stderr[-2000:]
        assert shown.stdout == as_module.stdout


def tool_modules(graph):
    """The modules run as `python -m nmt_tf.<tool>`."""
    paths = module_paths()
    return {m for m in graph if 'if __name__ == "__main__":' in open(paths[m], encoding="utf-8").read()}


def test_the_library_defines_and_reads_no_command_line_flag():
    """Flags belong to the command-line layer (the tools and nmt_tf.flags): no
    other module imports nmt_tf.flags, directly or through another, and importing
    every other module in a fresh process leaves absl with no nmt_tf flag. The
    library takes a nmt_tf.config.TrainingConfig instead."""
    import subprocess
    import sys

    graph = import_graph()
    command_line = tool_modules(graph) | {"nmt_tf.flags"}
    library = sorted(m for m in set(graph) - command_line if m != "nmt_tf.presets.__main__")
    assert {"nmt_tf.inference.translation_graph", "nmt_tf.inference.restore", "nmt_tf.training.callbacks", "nmt_tf.training.fine_tune", "nmt_tf.presets", "nmt_tf.api",
            "nmt_tf.training.job", "nmt_tf.evaluation.quality", "nmt_tf.exporting.saved_model", "nmt_tf.serving.server", "nmt_tf.inference.translation",
            "nmt_tf.inference.scoring", "nmt_tf.evaluation.visualization"} <= set(library)
    assert not [m for m in library if reaches(graph, m, "nmt_tf.flags")]
    code = (f"import importlib\nfor m in {library!r}: importlib.import_module(m)\n"
            "from absl import flags\n"
            "print(sorted(m for m in flags.FLAGS.flags_by_module_dict() if m.startswith('nmt_tf')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_every_tool_reports_errors_through_one_path():
    """A tool's error line and exit code come from nmt_flags.user_error, not
    from prints of its own (one format, one place to change it)."""
    tools = [os.path.join(PACKAGE, f"{t}.py") for t in
             ("train", "translate", "evaluate", "export", "serve", "score", "average", "visualize")]
    for path in tools:
        text = open(path, encoding="utf-8").read()
        assert "user_error(" in text, path
        assert 'print(f"error' not in text and 'print("error' not in text, path


# Packages a module may import inside a function: the ones that load TensorFlow
# (the tools configure it first, in nmt_flags.start_cli: quiet import, oneDNN
# choice, logical devices; tensorflow_serving's request messages import
# TensorFlow's protos), and slow optional ones that a single command needs
# (sacremoses 0.3 s, matplotlib 0.3 s, scikit-learn 1.1 s, keras_hub 0.6 s after
# TensorFlow; measured 2026-11-24).
LOADS_TENSORFLOW = {"tensorflow", "keras", "tensorflow_text", "tensorflow_serving", "tensorboard"}
TENSORFLOW_FREE = {"tensorflow_serving.apis.model_pb2"}      # a ModelSpec: protobuf only
SLOW_OPTIONAL = {"sacremoses", "matplotlib", "sklearn", "keras_hub"}


def imports_of(path, at_top: bool):
    """(line, module) of a file's imports at module level, or inside functions
    (those under `if TYPE_CHECKING:` left out: they never run)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    inner = {id(sub) for f in functions for sub in ast.walk(f)}
    skipped = type_checking_only(tree)
    found = []
    for node in ast.walk(tree):
        if (id(node) in inner) == at_top or id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found


def tensorflow_at_import(paths) -> set[str]:
    """The nmt_tf modules whose import loads TensorFlow (through their
    module-level imports, directly or through other nmt_tf modules)."""
    direct = {m: {name for _, name in imports_of(p, at_top=True)} for m, p in paths.items()}

    def own(name):       # "nmt_tf.data.text.PAD_ID" -> "nmt_tf.data.text"; "nmt_tf.data.pipeline" stays
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    heavy = {m for m, names in direct.items()
             if any(n.split(".")[0] in LOADS_TENSORFLOW and n not in TENSORFLOW_FREE for n in names)}
    grew = True
    while grew:
        grew = False
        for m, names in direct.items():
            if m not in heavy and any(own(n) in heavy for n in names):
                heavy.add(m)
                grew = True
    return heavy


def test_imports_inside_functions_are_only_those_that_must_wait():
    """An import inside a function must have a reason: it loads TensorFlow
    and the module itself does not (so that the tools, which import it, can
    configure TensorFlow first), or it is slow and optional. Everything else
    is imported at the top of the module."""
    paths = module_paths()
    heavy = tensorflow_at_import(paths)
    assert {"nmt_tf.data.pipeline", "nmt_tf.data.text", "nmt_tf.models.base"} <= heavy      # the finder finds them
    assert not {"nmt_tf.inference.translation_graph", "nmt_tf.inference.restore", "nmt_tf.inference.saved_models",
                "nmt_tf.flags", "nmt_tf.core.files"} & heavy
    late = []
    for module, path in sorted(paths.items()):
        for line, name in imports_of(path, at_top=False):
            root = name.split(".")[0]
            target = name if name in paths else name.rpartition(".")[0]
            may_wait = root in SLOW_OPTIONAL or (module not in heavy and (root in LOADS_TENSORFLOW or target in heavy))
            # The package's lazy attributes (PEP 562): `import nmt_tf.data.text` must not import the Python API.
            may_wait = may_wait or (module == "nmt_tf" and name in ("nmt_tf.api",))
            if not may_wait:
                late.append(f"{os.path.relpath(path, REPO)}:{line} imports {name} inside a function")
    assert not late, "\n".join(late)


def test_importing_a_tool_does_not_load_tensorflow():
    """What the rule above protects: every tool answers --help and refuses bad
    flags before TensorFlow loads, and start_cli configures it first."""
    import subprocess
    import sys

    tools = ("train", "translate", "evaluate", "export", "serve", "score", "average", "visualize")
    code = (f"import sys\nfor t in {tools!r}: __import__('nmt_tf.' + t)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


if __name__ == "__main__":
    print(drawing(import_graph()))
