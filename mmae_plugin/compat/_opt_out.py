"""Opt-out environment variables of the process-wide workarounds.

Each process-wide module of :mod:`mmae_plugin.compat` reads one variable,
once, when it is imported (so before :func:`mmae_plugin.compat.apply_all`
runs). ``1`` keeps upstream's behaviour in this process and says so with a
warning naming the risk; unset, empty or ``0`` applies the workaround. Any
other value is refused, so that a typo never silently keeps (or drops) a
protection the user meant to change.
"""
import os
import warnings

#: Values that keep the workaround / that opt out of it.
KEEP_VALUES = ('', '0')
OPT_OUT_VALUE = '1'


class UpstreamBehaviourWarning(UserWarning):
    """A process-wide workaround was switched off by its variable."""


def opted_out(variable: str, risk: str) -> bool:
    """Whether ``variable`` asks for upstream's behaviour.

    Args:
        variable: The environment variable's name.
        risk: What upstream's behaviour risks, for the warning.

    Returns:
        True when the variable is ``1`` (a warning then names it and the
        risk); False when it is unset, empty or ``0``.

    Raises:
        ValueError: Any other value, naming the variable and the choices.
    """
    value = os.environ.get(variable, '').strip()
    if value in KEEP_VALUES:
        return False
    if value != OPT_OUT_VALUE:
        raise ValueError(
            f'{variable}={value!r}: set it to 1 to keep upstream behaviour '
            '(unsafe, see docs/upstream_workarounds.md) or to 0 / unset it')
    warnings.warn(
        f'{variable}=1: mmae_plugin leaves upstream behaviour in '
        f'place, so {risk}',
        UpstreamBehaviourWarning,
        stacklevel=2)
    return True
