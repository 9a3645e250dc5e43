"""A model as a chain: traced (``graph.py``), cut into stages (``stages.py``) and built for a
workload (``extract.py``), with fast paths for the slow ``meta`` kernels tracing runs into
(``metafast.py``).

The profilers measure this chain and the torch executor runs it, so both take it from here
and cut the model the same way; neither owns it.
"""
