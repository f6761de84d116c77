"""Published weights in the Hugging Face Llama layout, in and out: its ``config.json`` read as the
built-in Llama's shape (``config``), a node's verified cache of the files (``cache``), the weights
loaded into a sharded model with the q/k permutation between the two RoPE layouts (``load``), and a
run's checkpoint written back in that layout (``export``). May import the runtime's contract,
storage, checkpoint, models and data; never training (the loop imports this)."""
