"""Multi-seed comparisons of training configs (``tools/compare.py``).

A tool built on mmae-plugin, not part of it: the plugin never imports this
package. ``spec`` (arms, seeds, budget, protocol, the out-dir layout),
``training`` (resumable training in segments), ``protocol``
(frozen-feature and ``tools/test.py`` metrics of a checkpoint), ``jobs``
(one submitit job per arm and seed, local or Slurm), ``records``
(``runs.json``), ``curves`` (the per-epoch hook curves of a run),
``intervals`` (paired Student-t intervals), ``cost`` (each run's wall
and CPU time, from its history) and ``report`` (tables, figures
and the page writer). Needs the ``compare`` extra (submitit, scipy,
matplotlib). Import the submodules directly; this package imports no
framework on its own.
"""
