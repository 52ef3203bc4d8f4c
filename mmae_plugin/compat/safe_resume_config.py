"""Resume reads a checkpoint's ``meta.config`` without executing it.

Upstream: mmengine 0.10.7's ``Runner.resume`` and ``FlexibleRunner.resume``
execute ``meta.config`` as a Python config, so a checkpoint of plain
strings ran code on every resume.

What this changes: in ``mmengine.runner.runner`` and
``mmengine.runner._flexible_runner`` only, ``mmengine.Config`` is
:class:`LiteralConfigText`, which parses the text with :mod:`ast` and keeps
only a literal ``gpu_ids``; anything else, or a text above
:data:`MAX_CONFIG_TEXT_CHARS`, skips the GPU-count check with a
:class:`ConfigTextWarning`.

Opt-out: ``MMAE_UNSAFE_RESUME_CONFIG=1`` (read once, at import); a resumed
checkpoint can then run code. Why and the size limit:
docs/upstream_workarounds.md#safe_resume_config-resume-never-executes-metaconfig
"""
import ast
import types
import warnings
from typing import Any, Dict, Optional

import mmengine
from mmengine.config import Config

from ._opt_out import opted_out

#: ``MMAE_UNSAFE_RESUME_CONFIG=1``: this module changes nothing.
OPT_OUT_VARIABLE = 'MMAE_UNSAFE_RESUME_CONFIG'
OPTED_OUT = opted_out(
    OPT_OUT_VARIABLE, "resume executes a checkpoint's meta['config'] text as "
    'a Python config: the checkpoint can run code')

#: Longest ``meta.config`` text parsed (characters): 256 KiB, about 18 times
#: the largest resolved config of this repository, parsed in well under a
#: second; longer texts are refused unparsed.
MAX_CONFIG_TEXT_CHARS = 256 * 1024

#: The top-level names of ``meta.config`` that mmengine's resume reads.
KEYS_READ_BY_RESUME = ('gpu_ids', )


class ConfigTextWarning(UserWarning):
    """``meta.config`` could not be read without executing it."""


def literal_int(node: ast.AST) -> int:
    """The value of an int literal node, ``-3`` included.

    Args:
        node: An expression node.

    Returns:
        The integer.

    Raises:
        ValueError: If the node is not an integer literal.
    """
    value = ast.literal_eval(node)
    if type(value) is not int:
        raise ValueError(f'{ast.dump(node)} is not an int literal')
    return value


def literal_gpu_ids(node: ast.AST) -> Any:
    """Evaluate a ``gpu_ids`` value without running anything.

    Accepts what ``Config.pretty_text`` writes for the values MMCV-era
    scripts stored: a list or tuple literal, or ``range(...)`` with int
    literal arguments (``ast.literal_eval`` accepts no call, so the name
    ``range`` cannot be rebound by the text).

    Args:
        node: The right-hand side of ``gpu_ids = ...``.

    Returns:
        The value (a ``list``, ``tuple`` or ``range``).

    Raises:
        ValueError: If the value is anything else.
    """
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == 'range' and not node.keywords
            and 1 <= len(node.args) <= 3):
        value = range(*(literal_int(arg) for arg in node.args))
        try:
            len(value)  # what resume takes of it
        except OverflowError:
            raise ValueError(f'{value} has more items than len() can count')
        return value
    value = ast.literal_eval(node)
    if not isinstance(value, (list, tuple)):
        raise ValueError(f'gpu_ids is a {type(value).__name__}, not a list, '
                         'tuple or range')
    return value


def top_level_assignment(tree: ast.Module, name: str) -> Optional[ast.AST]:
    """The value last assigned to ``name`` at module level, as a node.

    Args:
        tree: The parsed config text.
        name: The variable name.

    Returns:
        The expression node, or None if the text never assigns ``name``.
    """
    found = None
    for statement in tree.body:
        if (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)
                and statement.targets[0].id == name):
            found = statement.value
    return found


def read_resume_keys(cfg_text: Any) -> Dict[str, Any]:
    """The keys resume reads from ``meta.config``, parsed, never executed.

    Args:
        cfg_text: ``checkpoint['meta']['config']``.

    Returns:
        ``{'gpu_ids': value}`` when the text assigns it a literal, else
        ``{}`` (with a :class:`ConfigTextWarning` if the text is unreadable
        or longer than :data:`MAX_CONFIG_TEXT_CHARS`).
    """
    if not isinstance(cfg_text, str):
        warnings.warn(
            f"checkpoint meta['config'] is a {type(cfg_text).__name__}, not "
            'config text; the GPU-count check of resume is skipped',
            ConfigTextWarning)
        return {}
    if len(cfg_text) > MAX_CONFIG_TEXT_CHARS:
        warnings.warn(
            f"checkpoint meta['config'] is {len(cfg_text):,} characters, over "
            f'the {MAX_CONFIG_TEXT_CHARS:,}-character limit of config text '
            'read on resume; it is not parsed, and the GPU-count check of '
            'resume is skipped', ConfigTextWarning)
        return {}
    try:
        tree = ast.parse(cfg_text, mode='exec')
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        warnings.warn(
            f"checkpoint meta['config'] is not parseable Python ({error!r}); "
            'the GPU-count check of resume is skipped', ConfigTextWarning)
        return {}
    keys = {}
    for name in KEYS_READ_BY_RESUME:
        node = top_level_assignment(tree, name)
        if node is None:
            continue
        try:
            keys[name] = literal_gpu_ids(node)
        except (ValueError, TypeError, SyntaxError, RecursionError,
                MemoryError) as error:
            warnings.warn(
                f"checkpoint meta['config'] assigns {name} a value that is "
                f'not a literal ({error}); it is not executed, and the '
                'GPU-count check of resume is skipped', ConfigTextWarning)
    return keys


class LiteralConfigText(Config):
    """``Config`` as the runner modules see it: text is parsed, not run."""

    @staticmethod
    def fromstring(cfg_str: str, file_format: str) -> Config:
        """Read ``gpu_ids`` from config text without executing it.

        Args:
            cfg_str: The config text (a checkpoint's ``meta.config``).
            file_format: Must be ``'.py'``, the only format resume passes.

        Returns:
            A ``Config`` holding the keys resume reads, if literal.

        Raises:
            ValueError: If ``file_format`` is not ``'.py'``.
        """
        if file_format != '.py':
            raise ValueError(
                f'file_format={file_format!r}: the runner modules read only '
                "'.py' config text from checkpoints")
        return Config(read_resume_keys(cfg_str))


class MmengineWithLiteralConfigText(types.ModuleType):
    """The ``mmengine`` package as the runner modules see it.

    Every attribute is the real package's, except ``Config``.
    """

    Config = LiteralConfigText

    def __init__(self) -> None:
        super().__init__(mmengine.__name__, mmengine.__doc__)

    def __getattr__(self, name: str) -> Any:
        return getattr(mmengine, name)


def read_resume_config_without_executing() -> None:
    """Make both runners' resume parse ``meta.config``, never run it."""
    if OPTED_OUT:
        return
    import mmengine.runner._flexible_runner as flexible_runner_module
    import mmengine.runner.runner as runner_module

    for module in (runner_module, flexible_runner_module):
        if not isinstance(module.mmengine, MmengineWithLiteralConfigText):
            module.mmengine = MmengineWithLiteralConfigText()
