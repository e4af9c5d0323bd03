from tests.jobdir.conftest import clock, job  # noqa: F401  (shared fixtures)
