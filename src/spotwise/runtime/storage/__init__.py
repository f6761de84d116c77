"""Object storage behind one narrow protocol: ``file://`` and ``s3://`` (``base``, with
``open_storage``), ``gs://`` (``gcs``), ``az://`` (``azblob``) and the one retry policy they share
(``retry``). The runtime's leaf: imports only the base modules."""
