"""What runs on a node at boot, written by the launcher: the boot script every cloud hands its nodes
(``script``: fetch and check the wheel, install, start the watcher and Ray), the GPU torch check and
refit (``torch_fit``) and how the wheel reaches the node (``shipping``). Imports the runtime's node
contract (labels, the dead man's switch, storage) and the base modules; never a cloud."""
