"""The package's shape: a small public surface, no top-level `eval` in its wheel, `import pacer_hf` loads neither the
harness nor training, collection or Hub-upload code, and its modules import each other without a cycle."""

import ast
import fnmatch
import re
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

import pacer_core
import pacer_hf

PACKAGE = Path(pacer_hf.__file__).parent
CORE = Path(pacer_core.__file__).parent
ROOT = PACKAGE.parent
# (accelerate is left out: transformers' generation code imports it whenever it is installed)
LAZY_MODULES = ("pacer_hf.bench", "pacer_hf.training", "pacer_hf.collection", "pacer_hf.hub", "sklearn", "matplotlib",
                "evaluate", "gguf")


def _loaded_after(code: str, names: tuple[str, ...]) -> list[str]:
    probe = f"import sys; {code}; print(sorted(n for n in {names!r} if any(m == n or m.startswith(n + '.') "
    probe += "for m in sys.modules)))"
    return eval(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout)


def test_importing_the_library_loads_no_harness_training_or_upload_code():
    assert _loaded_after("import pacer_hf", LAZY_MODULES) == []
    cli = "import pacer_hf; from pacer_hf.cli import build_parser; build_parser()"
    assert _loaded_after(cli, ("pacer_hf.bench", "evaluate")) == []  # the harness loads only when `bench` runs
    assert "pacer_hf.training" in _loaded_after("import pacer_hf; pacer_hf.train", LAZY_MODULES)  # on first use


def test_the_lazy_names_resolve_on_first_use():
    from pacer_hf.collection import collect
    from pacer_hf.hub import push
    from pacer_hf.training import train

    assert (pacer_hf.collect, pacer_hf.train, pacer_hf.push) == (collect, train, push)
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        pacer_hf.nonsense  # noqa: B018


def test_the_public_surface_is_small_and_documented():
    assert len(pacer_hf.__all__) <= 16
    for name in pacer_hf.__all__:
        value = getattr(pacer_hf, name)
        assert name == "__version__" or value.__doc__, name


@pytest.mark.skipif(not (ROOT / "pyproject.toml").is_file(), reason="needs the repository (an editable install)")
def test_the_wheel_ships_no_top_level_eval(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(ROOT)], check=True, capture_output=True)
    wheel = next(tmp_path.glob("pacer_hf-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top_level == {"pacer_hf"}
    assert "pacer_hf/bench/run.py" in names and "pacer_hf/bench/metrics/humaneval_pass_at_1/humaneval_pass_at_1.py" in names
    assert not any(name.startswith(("eval/", "tests/")) for name in names)


def _external_imports(path: Path) -> set[str]:
    """The top-level packages that `path` imports (function-local imports included), less the standard library."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names)


def test_pacer_core_needs_only_torch_safetensors_the_hub_client_and_jinja():
    """What a serving engine (vLLM) loads to stop its drafts with a PACER head: never transformers, whose version
    such an engine pins elsewhere, nor pacer_hf's generate() route."""
    needed = set().union(*(_external_imports(path) for path in CORE.glob("*.py")))
    assert needed == {"torch", "safetensors", "huggingface_hub"}  # Jinja2: through huggingface_hub's card templates
    code = "import pacer_core; from pacer_core import PacerHead, StopRule"
    assert _loaded_after(code, ("transformers", "pacer_hf", "accelerate")) == []


def test_pacer_hf_re_exports_the_core_it_is_built_on():
    assert pacer_hf.PacerHead is pacer_core.PacerHead and pacer_hf.PacerHeadConfig is pacer_core.PacerHeadConfig
    assert pacer_hf.__version__ == pacer_core.__version__ == metadata.version("pacer-core") == metadata.version("pacer-hf")


def _imports(path: Path, package: str) -> set[str]:
    """The modules of `package` that `path` imports, function-local imports included."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level >= 1:
            if node.module:
                names.add(node.module.split(".")[0])
            else:  # from . import x
                names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(f"{package}."):
            names.add(node.module.split(".")[1])
    return names


@pytest.mark.parametrize("folder, package", [(PACKAGE, "pacer_hf"), (PACKAGE / "bench", "pacer_hf.bench"),
                                             (CORE, "pacer_core")])
def test_no_import_cycle_between_modules(folder, package):
    modules = {p.stem: p for p in folder.glob("*.py") if p.stem not in ("__init__", "__main__")}
    graph = {name: _imports(path, package) & set(modules) for name, path in modules.items()}
    state: dict[str, str] = {}

    def visit(name: str, stack: list[str]) -> None:
        state[name] = "open"
        for dep in sorted(graph[name]):
            assert state.get(dep) != "open", f"import cycle: {' -> '.join(stack + [name, dep])}"
            if dep not in state:
                visit(dep, stack + [name])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
    assert any(graph.values())  # the walk reads real imports


def test_pacer_hf_bench_runs_the_harness(tmp_path):
    from pacer_hf.cli import main

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def add(a, b):\n", encoding="utf-8")
    assert main(["bench", "--pair", "tiny", "--prompts", f"{prompts}:0:1", "--max-new-tokens", "4", "--fixed", "2",
                 "--methods", "fixed-k2", "--out", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run.jsonl").is_file() and (tmp_path / "run.md").is_file()


# Files a report writes beside a run's records (`pacer_hf.bench.report`): derived from a cited run, kept with it.
_DERIVED_SUFFIXES = ("-speedup", "-draft-lengths")


@pytest.mark.skipif(not (ROOT / "eval" / "results").is_dir(), reason="needs the repository's eval/results")
def test_every_file_in_eval_results_belongs_to_a_run_the_readme_or_a_doc_cites():
    """One result per claim: a run's records and derived files stay only while the README or a doc cites the run
    (`eval/results/NAME.md`, `NAME.*`, ...); older runs leave."""
    texts = [ROOT / "README.md", ROOT / "eval" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    citations = {c for path in texts for c in re.findall(r"eval/results/([A-Za-z0-9_.*-]+)", path.read_text("utf-8"))}
    cited_runs = {c.split(".")[0] for c in citations if "*" not in c}
    globs = [c for c in citations if "*" in c]
    uncited = []
    for file in sorted((ROOT / "eval" / "results").iterdir()):
        stem = file.name.split(".")[0]
        runs = {stem} | {stem[: -len(s)] for s in _DERIVED_SUFFIXES if stem.endswith(s)}
        if not runs & cited_runs and not any(fnmatch.fnmatch(file.name, g) for g in globs):
            uncited.append(file.name)
    assert uncited == [], f"not cited by the README or docs/: {uncited}"
