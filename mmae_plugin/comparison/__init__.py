"""Multi-seed comparisons of training configs (``tools/compare.py``).

``spec`` (arms, seeds, budget, protocol, the out-dir layout), ``training``
(resumable training in segments), ``protocol`` (frozen-feature and
``tools/test.py`` metrics of a checkpoint), ``jobs`` (one submitit job per
arm and seed, local or Slurm), ``records`` (``runs.json``), ``intervals``
(paired Student-t intervals), ``report`` (tables and figures) and
``predictors`` (do label-free statistics rank runs as accuracy does?). Needs
the ``compare`` extra (submitit, scipy, matplotlib). Import the submodules
directly; this package imports no framework on its own.
"""
