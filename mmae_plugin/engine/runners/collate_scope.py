"""``_scope_`` reaching ``collate_fn``.

Configs inherited through ``mmpretrain::`` carry ``_scope_`` in every typed
dict, and mmengine 0.10.7's ``build_dataloader`` forwards it to the collate
function ("unexpected keyword argument '_scope_'").
:class:`CollateScopeMixin` (before ``Runner`` or ``FlexibleRunner``) drops
that key; without the plugin's runner, write
``collate_fn=dict(_delete_=True, type='default_collate')``. See
docs/upstream_workarounds.md#runners-_scope_-reaching-collate_fn.
"""
from typing import Any, Union


def without_collate_scope(dataloader: Any) -> Any:
    """The dataloader config without ``_scope_`` in its ``collate_fn``.

    Args:
        dataloader: A dataloader config (dict) or a built ``DataLoader``.

    Returns:
        A copy of the config without ``collate_fn._scope_`` if it had one;
        the argument itself otherwise (never changed in place).
    """
    if not isinstance(dataloader, dict):
        return dataloader
    collate_fn = dataloader.get('collate_fn')
    if not isinstance(collate_fn, dict) or '_scope_' not in collate_fn:
        return dataloader
    dataloader = dataloader.copy()
    collate_fn = dict(collate_fn)
    # mmengine looks the function up in its FUNCTIONS registry by ``type``
    # alone and never reads the scope; it would only become a keyword.
    collate_fn.pop('_scope_')
    dataloader['collate_fn'] = collate_fn
    return dataloader


class CollateScopeMixin:
    """Runner behaviour: ``collate_fn`` never receives ``_scope_``."""

    @classmethod
    def build_dataloader(cls, dataloader: Union[dict, Any], *args: Any,
                         **kwargs: Any) -> Any:
        """Build the dataloader as mmengine does, without ``_scope_``.

        A classmethod (mmengine's is a staticmethod) so that it can hand the
        cleaned config on to the next class's method; it is called the same
        way, on the runner or its class.

        Args:
            dataloader: The dataloader config or object.
            *args: As for mmengine's ``build_dataloader`` (``seed``, ...).
            **kwargs: As for mmengine's ``build_dataloader``.

        Returns:
            The ``DataLoader`` mmengine builds.
        """
        return super(CollateScopeMixin, cls).build_dataloader(
            without_collate_scope(dataloader), *args, **kwargs)
