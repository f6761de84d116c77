"""Checkpoints: the sharded commit protocol (``checkpointer``), where they live and which is newest,
read without torch (``layout``), asynchronous saves (``async_save``, ``staging``), the copy between
stores (``copy``) and the sharding-independent weight fingerprint (``digest``). Imports storage only."""
