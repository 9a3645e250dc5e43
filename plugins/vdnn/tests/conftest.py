"""The ``analytic`` fixture: real models' analytic profiles for the paper checks."""

from membudget_vdnn.testing import analytic  # noqa: F401
