"""The ``noniid-fl`` command: run a federation, list the methods, show every run-config key.

    noniid-fl run [--nodes N] [-c "key=value ..."] [--engine inprocess|ray] [--workers W] [--overwrite]
    noniid-fl methods
    noniid-fl config [METHOD]
    noniid-fl compare RUN_OR_DIR ... [-o compare.png] [--svg] [--markdown] [--band minmax|std] [--target ACC]

Imports stay lazy: a bad config is refused (server_app/preflight.py) before torch, Ray or a Flower engine
is imported.
"""
