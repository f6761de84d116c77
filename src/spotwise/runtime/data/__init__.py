"""Training data: the built-in stdlib text (``stdlib``), token files (``tokens``, read by
``dataset``), a node's verified cache of them (``cache``), and what ``spotwise data tokenize`` reads and
writes with (``corpus``, ``tokenizer``). Imports storage and the runtime's contract only."""
