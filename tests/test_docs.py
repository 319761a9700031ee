"""Documentation and recipes stay true: every flag documented, every flagfile valid,
every link and every command shown in the docs real, the front door short."""

import glob
import os
import re

import pytest

from conftest import REPO
from nmt_tf import flags


def readme():
    return open(os.path.join(REPO, "README.md"), encoding="utf-8").read()


def read(relative):
    return open(os.path.join(REPO, relative), encoding="utf-8").read()


# The user's documentation: the front door and its topic pages (docs/SPEC.md is the papers').
PAGES = ["README.md"] + sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "docs", "*.md"))
                               if p != os.path.join(REPO, "docs/SPEC.md"))


def documentation():
    return "\n".join(read(page) for page in PAGES)


def test_readme_quick_start_is_set_up_translate_demo_train_test():
    quick = readme().split("## Quick start", 1)[1].split("##", 1)[0]
    commands = re.findall(r"^make \w+", quick, flags=re.M)
    assert commands == ["make setup", "make demo", "make train", "make test"]
    assert re.search(r"^echo .* \| \.venv/bin/python -m nmt_tf\.translate --preset=multi30k_en_fr$", quick, flags=re.M)
    makefile = open(os.path.join(REPO, "Makefile"), encoding="utf-8").read()
    for command in commands:
        assert re.search(rf"^{command.split()[1]}:", makefile, flags=re.M), command
    assert os.path.exists(os.path.join(REPO, "docs", "page.png"))


def all_cli_flags():
    """Every flag defined by nmt_tf's modules (training, search, serving, each CLI)."""
    import nmt_tf.evaluate  # noqa: F401  (each CLI module defines its own flags)
    import nmt_tf.export  # noqa: F401
    import nmt_tf.presets.__main__  # noqa: F401
    import nmt_tf.score  # noqa: F401
    import nmt_tf.serve  # noqa: F401
    import nmt_tf.shortlist  # noqa: F401
    import nmt_tf.translate  # noqa: F401
    import nmt_tf.unk_dictionary  # noqa: F401
    import nmt_tf.visualize  # noqa: F401

    modules = ("nmt_tf.flags", "nmt_tf.export", "nmt_tf.serve", "nmt_tf.translate", "nmt_tf.evaluate",
               "nmt_tf.visualize", "nmt_tf.score", "nmt_tf.unk_dictionary", "nmt_tf.shortlist",
               "nmt_tf.presets.__main__")
    return sorted({f.name for m in modules for f in flags.FLAGS.get_flags_for_module(m)})


@pytest.mark.parametrize("name", all_cli_flags())
def test_every_flag_is_documented(name):
    assert re.search(rf"--{name}(?![A-Za-z0-9_])", documentation()), f"--{name} is in neither README.md nor docs/"


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(REPO, "pipelines", "**", "*.flags"),
                                              recursive=True))
                         + [os.path.join(REPO, "benchmarks", "reference.flags")])
def test_flagfiles_parse(path, monkeypatch):
    monkeypatch.chdir(REPO)         # the recipes' paths, a nested --flagfile's too, are the repository's
    try:
        flags.FLAGS(["train", f"--flagfile={path}"])
        assert flags.config_from_flags().tokenizer in ("word", "wordpiece", "sentencepiece")
    finally:
        flags.FLAGS.unparse_flags()


def test_the_training_flag_table_shows_the_real_defaults():
    rows = re.findall(r"^\| `--(\w+)` \| `([^`]*)` \|", read("docs/training.md"), flags=re.M)
    assert len(rows) == len(flags.nmt_flag_names())
    for name, shown in rows:
        default = flags.FLAGS[name].default
        expected = "—" if default is None else (str(default).lower() if isinstance(default, bool) else str(default))
        assert shown == expected, (name, shown, expected)


@pytest.mark.parametrize("script,own_flag", [("train_throughput.py", "window_steps"),
                                             ("decode_speed.py", "sort_by_length"),
                                             ("serve_load.py", "clients_list"),
                                             ("train_ab.py", "round_steps"),
                                             ("versus_joeynmt.py", "joeynmt_updates"),
                                             ("export_time.py", "max_input_length")])
def test_benchmark_scripts_define_their_flags(script, own_flag):
    """A benchmark whose flags clash with nmt_tf's dies before measuring anything."""
    from conftest import run_cli

    done = run_cli(os.path.join(REPO, "benchmarks", script), "--helpshort", timeout=120)
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert f"--{own_flag}" in done.stdout + done.stderr


def test_defaults_quoted_in_the_readmes_are_the_real_ones():
    """'`--lines_per_batch` (64)': a default quoted in running text matches the flag's."""
    all_cli_flags()
    quoted = []
    for name in PAGES + [os.path.join("export", "README.md")]:
        text = read(name)
        quoted += re.findall(r"`--(\w+)` \((\d+(?:\.\d+)?)\)", text)
    assert len(quoted) >= 10
    for name, shown in quoted:
        assert float(shown) == float(flags.FLAGS[name].default), (name, shown, flags.FLAGS[name].default)


TOOLS = {   # tool: (flags its --help must list, a flag of another tool it must refuse)
    "train": (["train_src", "hidden_size", "model_dir", "max_hours"], "beam_size"),
    "export": (["model_dir", "export_dir", "beam_size", "average_checkpoints", "ensemble"], "hidden_size"),
    "translate": (["saved_model", "server", "input", "output", "n_best", "with_scores"], "hidden_size"),
    "evaluate": (["src", "ref", "model_dir", "saved_model", "beam_size", "checkpoint"], "hidden_size"),
    "serve": (["port", "model_base_path", "model_name", "max_message_mb"], "hidden_size"),
    "score": (["saved_model", "server", "tsv", "phrase_table"], "beam_size"),
    "visualize": (["model_dir", "saved_model", "text", "beam_size"], "train_src"),
    "average": (["model_dir", "average_checkpoints", "average_from"], "beam_size"),
    "unk_dictionary": (["train_src", "train_tgt", "output", "dictionary_iterations"], "model_dir"),
}


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_each_tool_lists_its_own_flags_and_refuses_other_tools_flags(tool):
    from conftest import run_cli

    listed, foreign = TOOLS[tool]
    shown = run_cli("-m", f"nmt_tf.{tool}", "--help", timeout=120)
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr[-2000:]     # absl's exits 1
    names = set(re.findall(r"^  --(?:\[no\])?(\w+):", shown.stdout, flags=re.M))
    assert set(listed) <= names, sorted(set(listed) - names)
    assert foreign not in names
    refused = run_cli("-m", f"nmt_tf.{tool}", f"--{foreign}=1", timeout=120)
    assert refused.returncode == 1
    assert f"error: --{foreign}: not a flag of nmt_tf.{tool}, which would ignore it" in refused.stderr
    unknown = run_cli("-m", f"nmt_tf.{tool}", "--no_such_flag=1", timeout=120)
    assert unknown.returncode == 1 and "Traceback" not in unknown.stderr, unknown.stderr[-2000:]


def test_search_flags_with_a_saved_model_are_refused_as_fixed_at_export(tmp_path):
    from conftest import run_cli

    for tool, args in (("translate", ["--length_penalty=gnmt"]),
                       ("evaluate", ["--beam_size=1", "--mixed_precision=mixed_bfloat16", "--src=a", "--ref=b"]),
                       ("visualize", ["--length_alpha=0.5", "--text=x"])):
        done = run_cli("-m", f"nmt_tf.{tool}", f"--saved_model={tmp_path}", *args, timeout=120)
        assert done.returncode == 1 and "fixed when the SavedModel was exported" in done.stderr, (tool, done.stderr)
        assert tool != "evaluate" or "--beam_size, --mixed_precision:" in done.stderr, done.stderr


# --- docs/SPEC.md: every section and paper the repository cites exists in it ---

SPEC_PATH = os.path.join(REPO, "docs/SPEC.md")
# Where citations live: the package, the tests, the recipes, the benchmarks, the deployment notes, the READMEs.
CITING = ("nmt_tf/**/*.py", "tests/**/*.py", "pipelines/**/README.md", "pipelines/**/*.flags", "pipelines/**/*.py",
          "benchmarks/**/*.py", "benchmarks/**/*.flags", "export/**/*.md", "README.md", "BUILD_NOTES.md", "CHANGELOG.md",
          "docs/**/*.md")
# "docs/SPEC.md §2", "docs/SPEC.md §2, §5", "docs/SPEC.md §1–2" (a line break may fall before the §).
SPEC_CITATION = re.compile(r"docs/SPEC\.md`?\s*(§\s*\d+(?:\s*[–-]\s*\d+)?(?:\s*(?:,|and)\s*§\s*\d+(?:\s*[–-]\s*\d+)?)*)")
# "paper 000", "paper 002's", "papers 000 and 004", "paper 000 / 002".
PAPER_CITATION = re.compile(r"\b[Pp]apers? (\d{3}(?:\s*(?:,|/|and|or)\s*\d{3})*)\b")


def spec():
    return open(SPEC_PATH, encoding="utf-8").read()


def citing_files():
    paths = set()
    for pattern in CITING:
        paths.update(p for p in glob.glob(os.path.join(REPO, pattern), recursive=True)
                     if os.path.isfile(p) and "__pycache__" not in p and p != SPEC_PATH)
    return sorted(paths)


def citations(pattern):
    """[(file, line, cited text)] of every match of `pattern` in the citing files."""
    found = []
    for path in citing_files():
        text = open(path, encoding="utf-8").read()
        for match in pattern.finditer(text):
            found.append((os.path.relpath(path, REPO), text.count("\n", 0, match.start()) + 1, match.group(1)))
    return found


def section_numbers(cited):
    """'§2, §5' -> {2, 5}; '§1–2' -> {1, 2}."""
    numbers = set()
    for first, last in re.findall(r"§\s*(\d+)(?:\s*[–-]\s*(\d+))?", cited):
        numbers.update(range(int(first), int(last or first) + 1))
    return numbers


def spec_sections():
    return [int(n) for n in re.findall(r"^## (\d+)\. ", spec(), flags=re.M)]


def paper_key():
    """{"000": row, ...}: the key at the top of docs/SPEC.md (before its §1)."""
    key = spec().split("\n## 1. ", 1)[0]
    return dict(re.findall(r"^\| \*\*paper (\d{3})\*\* \| (.+) \|$", key, flags=re.M))


def test_spec_sections_are_numbered_one_to_n():
    numbers = spec_sections()
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 7, numbers


def test_every_spec_section_cited_exists():
    cited = citations(SPEC_CITATION)
    assert len(cited) >= 15, cited          # the pattern still finds the citations
    sections = set(spec_sections())
    missing = [(path, line, text) for path, line, text in cited if not section_numbers(text) <= sections]
    assert not missing, f"sections not in docs/SPEC.md: {missing}"


def test_the_spec_is_always_cited_by_its_path():
    """The specification is cited as docs/SPEC.md, a path a fresh clone has, never by
    its bare name (S[P]EC in the pattern keeps this file from matching itself)."""
    bare = citations(re.compile(r"((?<![\w/.])S[P]EC(?:\.md)?(?!\w))"))
    assert not bare, f"cite the specification as docs/SPEC.md: {bare}"


def test_every_paper_cited_is_in_the_key():
    key = paper_key()
    assert sorted(key) == ["000", "001", "002", "003", "004"], sorted(key)
    for number, row in key.items():
        assert re.search(r"arXiv:\d{4}\.\d{4,5}", row), f"paper {number} has no arXiv id in the key"
    cited = citations(PAPER_CITATION)
    assert len(cited) >= 30, cited
    missing = [(path, line, text) for path, line, text in cited
               if not set(re.findall(r"\d{3}", text)) <= set(key)]
    assert not missing, f"papers not in the key of docs/SPEC.md: {missing}"


def test_the_spec_names_only_files_that_exist():
    named = set(re.findall(r"\b((?:nmt_tf|tests|pipelines)/[\w/]+\.(?:py|md))\b", spec()))
    assert len(named) >= 15, named
    assert not [p for p in named if not os.path.exists(os.path.join(REPO, p))], named


def test_reading_the_code_maps_every_module():
    """docs/architecture.md's "Reading the code" names every module file, points to
    docs/SPEC.md and cites only its sections."""
    text = read("docs/architecture.md")
    assert text.index("## Reading the code") < text.index("## Layout")
    section = text.split("## Reading the code", 1)[1].split("\n## ", 1)[0]
    assert "docs/SPEC.md" in section and "paper 000" in section
    assert set(map(int, re.findall(r"§(\d+)", section))) <= set(spec_sections())
    modules = [os.path.relpath(p, REPO) for p in sorted(glob.glob(os.path.join(REPO, "nmt_tf", "**", "*.py"),
                                                               recursive=True))
               if not p.endswith(("__init__.py", "__main__.py"))]
    assert len(modules) >= 60, modules
    names = [os.path.basename(m) for m in modules]
    unnamed = []
    for module, name in zip(modules, names):
        if names.count(name) > 1:       # two files of one name: the map must give the path
            found = module in section
        else:
            found = re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", section) is not None
        if not found:
            unnamed.append(module)
    assert not unnamed, f"docs/architecture.md's 'Reading the code' does not name {unnamed}"


# --- the front door, its links and its commands ---

README_MAX_LINES = 300
PARAGRAPH_MAX_CHARS = 640      # about 8 lines of 80 characters
# Every page a reader can reach from the front door, whose links and commands must be real.
LINKED_PAGES = PAGES + ["docs/SPEC.md", "BUILD_NOTES.md", "CHANGELOG.md", os.path.join("export", "README.md"),
                        os.path.join("data", "multi30k", "SOURCE.md")] + sorted(
    os.path.relpath(p, REPO) for pattern in ("pipelines/**/README.md", "nmt_tf/presets/*/MODEL_CARD.md",
                                             "docs/experiments/*.md")
    for p in glob.glob(os.path.join(REPO, pattern), recursive=True))


def prose_and_code(text):
    """(prose lines with their numbers, fenced code blocks as (language, lines))."""
    prose, blocks, fence = [], [], None
    for number, line in enumerate(text.split("\n"), 1):
        if line.lstrip().startswith("```"):
            if fence is None:
                fence = (line.strip()[3:].strip(), [])
            else:
                blocks.append(fence)
                fence = None
            prose.append((number, ""))
        elif fence is not None:
            fence[1].append(line)
            prose.append((number, ""))
        else:
            prose.append((number, line))
    return prose, blocks


def paragraphs(text):
    """[(first line, text)] of the prose: blank lines, headings, tables, images and
    code end a paragraph, and every list item starts one."""
    found, current = [], []
    for number, line in prose_and_code(text)[0]:
        stripped = line.strip()
        if not stripped or stripped[0] in "|#" or stripped.startswith("!["):
            found += [current] if current else []
            current = []
            continue
        if current and re.match(r"\s*(?:[-*]|\d+\.) ", line):
            found.append(current)
            current = []
        current.append((number, stripped))
    found += [current] if current else []
    return [(lines[0][0], " ".join(s for _, s in lines)) for lines in found]


def test_the_readme_is_a_front_door():
    assert len(readme().split("\n")) <= README_MAX_LINES
    for page in PAGES[1:] + ["docs/SPEC.md", "BUILD_NOTES.md", "export/README.md"]:
        assert f"({page})" in readme() or f"({page.replace('docs/', '')})" in readme(), \
            f"README.md does not link {page}"


# The experiment pages are the history, kept as they were written.
@pytest.mark.parametrize("page", [page for page in LINKED_PAGES if not page.startswith("docs/experiments/")])
def test_no_paragraph_is_longer_than_about_8_lines(page):
    long = [(line, len(text)) for line, text in paragraphs(read(page)) if len(text) > PARAGRAPH_MAX_CHARS]
    assert not long, f"{page}: paragraphs over {PARAGRAPH_MAX_CHARS} characters (line, length): {long}"


def github_anchor(heading):
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def broken_links(text, page):
    """The relative links and images of `text` (a page at `page`) whose file or
    heading does not exist."""
    prose, _ = prose_and_code(text)
    broken = []
    for link in re.findall(r"\]\(([^)\s]+)\)", "\n".join(line for _, line in prose)):
        if re.match(r"[a-z]+:", link):            # http(s), mailto: nothing here may fetch them
            continue
        path, _, anchor = link.partition("#")
        target = os.path.normpath(os.path.join(REPO, os.path.dirname(page), path)) if path else \
            os.path.join(REPO, page)
        if not os.path.exists(target):
            broken.append(link)
        elif anchor and target.endswith(".md"):
            headings = re.findall(r"^#+ (.+)$", open(target, encoding="utf-8").read(), flags=re.M)
            if anchor not in {github_anchor(h) for h in headings}:
                broken.append(link)
    return broken


@pytest.mark.parametrize("page", LINKED_PAGES)
def test_every_link_resolves(page):
    broken = broken_links(read(page), page)
    assert not broken, f"{page}: links to nothing: {broken}"


def accepted_flags(tool):
    """The flags `python -m nmt_tf.<tool>` takes: those it declares (TOOL_FLAGS), those
    its module defines, and absl's own (--flagfile, --help...)."""
    import importlib

    name = f"nmt_tf.{tool}.__main__" if tool == "presets" else f"nmt_tf.{tool}"
    module = importlib.import_module(name)
    assert hasattr(module, "TOOL_FLAGS"), f"nmt_tf.{tool} is not a tool"
    by_module = flags.FLAGS.flags_by_module_dict()
    own = {f.name for f in by_module.get(name, [])}
    absl_flags = {f.name for m, fs in by_module.items() if m.startswith("absl") for f in fs}
    return set(module.TOOL_FLAGS) | own | absl_flags | {"flagfile", "undefok", "help", "helpfull", "helpshort", "helpxml"}


def shown_commands(text):
    """Shell commands of a page: the lines of its bash (or unlabelled) code blocks, with
    continuations joined and comments cut, and its inline `python -m nmt_tf...` spans."""
    prose, blocks = prose_and_code(text)
    commands = []
    for language, lines in blocks:
        if language not in ("", "bash", "sh", "shell"):
            continue
        joined = "\n".join(lines).replace("\\\n", " ")
        for line in joined.split("\n"):
            line = re.sub(r"(^|\s)#.*$", "", line).strip()
            if line:
                commands.append(line)
    text = "\n".join(line for _, line in prose)
    commands += [span.replace("\n", " ") for span in re.findall(r"`([^`]+)`", text)
                 if span.startswith("python -m nmt_tf.") or span.startswith(".venv/bin/python -m nmt_tf.")]
    return commands


def wrong_commands(text):
    """What is wrong with the commands `text` shows: a `python -m nmt_tf.<tool>` that
    names no tool or a flag that tool does not take, a `make <target>` the Makefile
    lacks, a script run that does not exist."""
    makefile = read("Makefile")
    wrong = []
    for command in shown_commands(text):
        for part in re.split(r"\s*(?:\||;|&&)\s*", command):
            tool = re.match(r"(?:\S*/)?python3? -m nmt_tf\.(\w+)(.*)", part)
            script = re.match(r"(?:\S*/)?python3? ((?:pipelines|benchmarks|tests|export)/\S+\.py)", part)
            make = re.match(r"make (\w+)", part)
            if tool:
                name, rest = tool.groups()
                if not (os.path.isfile(os.path.join(REPO, "nmt_tf", f"{name}.py"))
                        or os.path.isfile(os.path.join(REPO, "nmt_tf", name, "__main__.py"))):
                    wrong.append(f"{part}: no tool nmt_tf.{name}")
                    continue
                accepted = accepted_flags(name)
                for flag in re.findall(r"(?<![\w-])--(\w+)", rest):
                    base = flag[2:] if flag.startswith("no") and flag[2:] in accepted else flag
                    if base not in accepted:
                        wrong.append(f"{part}: --{flag} is not a flag of nmt_tf.{name}")
            elif script and not os.path.isfile(os.path.join(REPO, script.group(1))):
                wrong.append(f"{part}: no file {script.group(1)}")
            elif make and not re.search(rf"^{make.group(1)}:", makefile, flags=re.M):
                wrong.append(f"{part}: no Makefile target {make.group(1)}")
    return wrong


@pytest.mark.parametrize("page", LINKED_PAGES)
def test_every_command_shown_is_real(page):
    wrong = wrong_commands(read(page))
    assert not wrong, f"{page}: " + "\n".join(wrong)


def test_the_checks_find_wrong_commands_and_links():
    page = "\n".join([
        "See [training](docs/training.md), [nothing](docs/nothing.md), [a heading](docs/training.md#resuming)",
        "and [no heading](docs/training.md#no-such-heading); `python -m nmt_tf.translate --beam_sizes=3`.",
        "```bash",
        "python -m nmt_tf.train --flagfile=F --hidden_size=8 \\",
        "    --nojoint_vocabulary --port=1   # a serve flag",
        "echo x | .venv/bin/python -m nmt_tf.translate --preset=multi30k_en_fr --nowith_scores",
        "python -m nmt_tf.nosuchtool --x=1",
        "make setup && make nosuchtarget",
        "python benchmarks/no_such_script.py",
        "```"])
    assert broken_links(page, "README.md") == ["docs/nothing.md", "docs/training.md#no-such-heading"]
    assert [w.split(": ", 1)[1] for w in wrong_commands(page)] == [
        "--port is not a flag of nmt_tf.train", "no tool nmt_tf.nosuchtool", "no Makefile target nosuchtarget",
        "no file benchmarks/no_such_script.py", "--beam_sizes is not a flag of nmt_tf.translate"]
