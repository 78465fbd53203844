"""seal_lite's folders are its layers, and the layer rules are contracts (pyproject.toml [tool.importlinter]).

import-linter checks them on the real import graph: no import runs back up a layer, every module sits in a layer,
and there is no circle at any depth. Every import counts, including those inside functions (kept there only to
make --help fast) and those under TYPE_CHECKING: a circle that only type checkers see is still one a reader must
untangle.
"""

import logging
from pathlib import Path

from importlinter.cli import lint_imports

PYPROJECT = Path(__file__).parents[2] / "pyproject.toml"


def lint_exit_code(config: Path) -> int:
    """0 when every contract is kept, 1 when any is broken. import-linter configures logging with dictConfig,
    which disables every logger that exists; they are enabled again, or the later tests of this process would
    never see seal-lite's own warnings (seal_lite.tracking)."""
    loggers = [logger for logger in logging.Logger.manager.loggerDict.values() if isinstance(logger, logging.Logger)]
    disabled = [logger.disabled for logger in loggers]
    try:
        return lint_imports(config_filename=str(config), no_cache=True, no_logo=True)
    finally:
        for logger, was in zip(loggers, disabled, strict=True):
            logger.disabled = was


def test_seal_lite_keeps_its_layer_contracts():
    assert lint_exit_code(PYPROJECT) == 0


def test_the_contracts_catch_an_import_that_runs_back_up(tmp_path):
    # the same contracts with core above engines: every engine imports the core, so each such import runs back up
    text = PYPROJECT.read_text()
    swapped = text.replace('    "engines",\n    "core",\n', '    "core",\n    "engines",\n')
    assert swapped != text
    config = tmp_path / "pyproject.toml"
    config.write_text(swapped)
    assert lint_exit_code(config) == 1
