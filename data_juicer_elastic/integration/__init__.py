"""How the plugin enters Data-Juicer: entry point, deferred patches, the ``elastic:``
config block, the shard recipe and its checks, and doctor checks.

Importing this package is cheap and imports no Data-Juicer module.
"""
