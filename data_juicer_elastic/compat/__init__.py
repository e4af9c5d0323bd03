"""Uses of Data-Juicer's and Ray's private internals, one module per target.

Each module names what it reaches into, checks that the target still looks as it
expects (``self_check()``, run by ``dj-elastic doctor``), and fails with one
IntegrationError naming the target when an upgrade moved it.
"""
