"""Nothing imports upward: clock -> timers -> purgatory -> broker models and dispatcher
-> asyncio integration -> pipeline -> metrics and the package root -> entry points.
Lazy imports inside functions and imports for type checking count too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "tickwheel"

# A unit is a subpackage or a top-level module; "tickwheel" is the package root.
RANK = {
    "_compat": 0, "_rawlock": 0, "_signals": 0, "_clock": 0, "_validate": 0, "_histogram": 0,
    "_mutex": 1, "schedules": 1,
    "timers": 2,
    "purgatory": 3,
    "broker": 4, "dispatch": 4,
    "aio": 5,
    "pipeline": 6,
    "metrics": 7, "tickwheel": 7,
    "service": 8,
    "client": 8.5,  # speaks the service's API: its words come from tickwheel.service.api
    "cli": 9, "demo": 9, "__main__": 9,
}


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _imports() -> list[tuple[str, str]]:
    """(importing module, imported tickwheel module) for every import in the package."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            found += [(module, name) for name in names
                      if name == "tickwheel" or name.startswith("tickwheel.")]
    return found


def test_every_unit_has_a_place_in_the_layers() -> None:
    units = {_unit(".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts))
             for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE}
    assert units - RANK.keys() == set(), "place new modules in RANK"


def test_no_module_imports_a_layer_above_its_own() -> None:
    imports = _imports()
    assert len(imports) > 50  # the walk sees the package's imports at all
    upward = [(importer, imported) for importer, imported in imports
              if _unit(importer) != _unit(imported)
              and RANK[_unit(imported)] >= RANK[_unit(importer)]]
    assert upward == []


# Inside the pipeline, lowest first: the contract, what decides outcomes, files, what is
# kept between batches, delivery, the Spark-free engines, the Spark engine, the tools.
PIPELINE_RANK = {"contract": 0, "semantics": 1, "io": 2, "state": 3, "delivery": 4,
                 "engines": 5, "spark": 6, "tools": 7}


def _part(module: str) -> str | None:
    """The pipeline subpackage a module is in (None outside the pipeline or for the
    pipeline package itself)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "pipeline" else None


def test_every_pipeline_module_is_in_a_subpackage_with_a_place() -> None:
    pipeline = PACKAGE / "pipeline"
    loose = [p.name for p in pipeline.glob("*.py") if p.name != "__init__.py"]
    assert loose == []
    assert {p.name for p in pipeline.iterdir() if (p / "__init__.py").exists()} \
        == PIPELINE_RANK.keys()


def test_no_pipeline_module_imports_a_subpackage_above_its_own() -> None:
    pairs = [(_part(a), _part(b)) for a, b in _imports()]
    inside = [(a, b) for a, b in pairs if a is not None and b is not None]
    assert len(inside) > 50
    assert [(a, b) for a, b in inside if PIPELINE_RANK[b] > PIPELINE_RANK[a]] == []


@pytest.mark.parametrize(("sub", "banned"), [
    ("contract", {"os", "pathlib", "io", "shutil", "tempfile", "fcntl", "pyarrow"}),
    # What decides outcomes knows nothing of files or of how state is encoded.
    ("semantics", {"os", "pathlib", "io", "shutil", "tempfile", "fcntl", "pyarrow",
                   "marshal", "pickle", "hashlib", "json"}),
])
def test_the_semantics_and_the_contract_touch_no_file(sub: str, banned: set[str]) -> None:
    found = []
    for path in (PACKAGE / "pipeline" / sub).glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found += [(path.name, a.name) for a in node.names
                          if a.name.split(".")[0] in banned]
            elif isinstance(node, ast.ImportFrom) and node.module:
                if node.module.split(".")[0] in banned:
                    found.append((path.name, node.module))
    assert found == []


def test_the_rule_catches_an_upward_import() -> None:
    assert PIPELINE_RANK["engines"] > PIPELINE_RANK[_part("tickwheel.pipeline.io.files") or ""]
    assert RANK[_unit("tickwheel.pipeline")] >= RANK[_unit("tickwheel.timers._wheel")]
    assert _unit("tickwheel") == "tickwheel" and _unit("tickwheel.cli") == "cli"


def test_only_the_entry_points_import_the_spark_engine() -> None:
    # The Spark engine is a backend: the Spark-free pipeline, the metrics and the
    # package root never need PySpark.
    allowed = {"cli", "demo"}
    # tickwheel.pipeline's face names SparkEngine for type checkers only, and imports
    # it on first use (a module __getattr__).
    importers = {importer for importer, imported in _imports()
                 if imported.startswith("tickwheel.pipeline.spark")
                 and not importer.startswith("tickwheel.pipeline.spark")
                 and importer != "tickwheel.pipeline"}
    assert importers and {_unit(m) for m in importers} <= allowed, importers


def test_the_pipelines_face_names_its_public_types_and_imports_none_up_front() -> None:
    import subprocess
    import sys

    code = ("import sys, tickwheel.pipeline as p; "
            "assert 'tickwheel.pipeline.spark' not in sys.modules; "
            "assert 'pyarrow' not in sys.modules; "
            "from tickwheel.pipeline import OutcomeRow, OutcomeSink, LocalFollowEngine; "
            "assert OutcomeRow.__module__ == 'tickwheel.pipeline.contract.outcomes'; "
            "assert 'tickwheel.pipeline.spark' not in sys.modules; "
            "print(sorted(p.__all__) == p.__all__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "True"


def test_the_service_object_is_the_top_of_the_service_and_only_entry_points_use_it() -> None:
    # The Service owns the intake, the engine's lifecycle, delivery and metrics: none
    # of those parts reaches up to it, and the CLI only parses into its options.
    importers = {importer for importer, imported in _imports()
                 if imported == "tickwheel.service.app" and importer != imported}
    assert importers and all(_unit(importer) in {"cli", "demo"} for importer in importers)

