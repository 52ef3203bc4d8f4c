"""The evidence code as a library: studies, sweeps, paired intervals.

``intervals`` (paired Student-t intervals, the one implementation),
``study`` (the long-budget study's arms, budget and layout), ``training``
(resumable training in segments), ``evaluate`` (frozen-feature metrics of a
checkpoint), ``driver`` (the resumable study driver), ``report`` (tables
and figures). The scripts in ``tools/benchmarks/`` are thin CLIs over
these modules. Import the submodules directly; this package imports no
framework on its own.
"""
