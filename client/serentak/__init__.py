"""Serentak's client: the gRPC contracts, the SDK and the `serentak` command line.

    serentak.upload.v1, serentak.locks.v1, ...   the generated stubs (protogen.py)
    serentak.sdk                                 SerentakClient, the lock client (sdk.locks)
    serentak.channels, serentak.credentials      every channel to a Serentak service
    serentak.cli                                 the `serentak` command line

The server (`serentak-server`) depends on this package and builds its own channels with it.
"""

__version__ = "0.1.0"
