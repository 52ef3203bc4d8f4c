"""What the monitoring hooks tap, measure and probe.

The pieces :class:`~mmae_plugin.engine.hooks.MatrixInfoHook` and
:class:`~mmae_plugin.engine.hooks.OnlineProbeHook` are built from: where to
tap each algorithm (:mod:`.branches`), the forward hooks that tap
(:mod:`.taps`), the measurement (:mod:`.measure`), the held-out pass
(:mod:`.heldout`) and the online probe's parts (:mod:`.online_probe`).
"""
