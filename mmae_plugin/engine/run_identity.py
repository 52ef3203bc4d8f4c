"""Which run a checkpoint belongs to: its run id and config digest.

The plugin's checkpoint hook writes both into every checkpoint's ``meta``
and into the run record; the plugin's runners compare them before resuming
a checkpoint from outside the record.
"""
import uuid
from typing import Dict

from mmengine.dist import broadcast_object_list, get_world_size
from mmengine.model import is_model_wrapper

from mmae_plugin.checkpoint.run_record import config_digest

#: The message hub key of the run id (saved in, and resumed from, every
#: checkpoint's ``message_hub``).
RUN_ID_KEY = 'mmae_run_id'


def run_identity(runner) -> Dict[str, str]:
    """The run's id and config digest, the same on every rank.

    The id is created when the run first starts and kept in the message
    hub, which a resume restores from the checkpoint (``load_from``
    without resume starts a new run).

    Args:
        runner: The runner.

    Returns:
        ``dict(run_id=..., config_digest=...)``.
    """
    run_id = runner.message_hub.runtime_info.get(RUN_ID_KEY)
    if not isinstance(run_id, str) or not run_id:
        chosen = [uuid.uuid4().hex]
        if get_world_size() > 1:
            broadcast_object_list(chosen)
        run_id = chosen[0]
        runner.message_hub.update_info(RUN_ID_KEY, run_id)
    return dict(run_id=run_id, config_digest=runner_config_digest(runner))


def runner_config_digest(runner) -> str:
    """:func:`~mmae_plugin.checkpoint.run_record.config_digest` of the
    runner's model config (of its model's class without a config)."""
    model = (runner.cfg or {}).get('model')
    if model is None:
        model = runner.model.module if is_model_wrapper(runner.model) \
            else runner.model
    return config_digest(model)
