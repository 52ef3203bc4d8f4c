"""``_scope_`` reaching ``collate_fn``.

Upstream: configs inherited through ``mmpretrain::`` get a ``_scope_`` key
in every typed dict; mmengine 0.10.7 ``Runner.build_dataloader`` forwards
all remaining keys of ``collate_fn`` to the function, which fails with
"default_collate() got an unexpected keyword argument '_scope_'". Not
fixed in any mmengine release as of 0.10.7.
"""
import functools


def strip_collate_scope() -> None:
    """Drop ``_scope_`` from ``collate_fn`` configs before mmengine reads them."""
    from mmengine.runner import Runner

    original = Runner.build_dataloader
    if getattr(original, '_mmae_fixed', False):
        return

    @functools.wraps(original)
    def build_dataloader(dataloader, *args, **kwargs):
        if isinstance(dataloader, dict) and isinstance(
                dataloader.get('collate_fn'), dict):
            dataloader = dataloader.copy()
            collate_fn = dict(dataloader['collate_fn'])
            collate_fn.pop('_scope_', None)
            dataloader['collate_fn'] = collate_fn
        return original(dataloader, *args, **kwargs)

    build_dataloader._mmae_fixed = True
    Runner.build_dataloader = staticmethod(build_dataloader)
