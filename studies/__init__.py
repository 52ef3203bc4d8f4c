"""This repository's own studies, behind the pages in ``docs/``.

Not part of mmae-plugin and not in its wheel: the computations behind the
pages that ``tools/analysis/`` rebuilds from a finished comparison
(``mmae_compare``). ``predictors`` (do label-free statistics rank runs as
accuracy does?), ``information_flow`` (the information-flow paper's
statements on the logged curves), ``information_flow_report`` (its figures
and page), ``heldout_variants`` (the held-out quantities of kept
checkpoints under other estimators) and ``cl_ablation`` (which modelling
choice of the theory lab's CL setting moves attention, behind
``tools/theory/run_cl_ablation.py``). Run from the repository root (the
scripts in ``tools/analysis/`` put it on ``sys.path``).
"""
