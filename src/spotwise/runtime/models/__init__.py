"""The built-in models: the byte-level GPT (``gpt``) and the Llama (``llama``, shaped by
:mod:`spotwise.runtime.llama_config`). Plain torch modules; they import only the runtime's contract."""
