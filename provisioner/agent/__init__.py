"""The inspection/deploy agent that runs on the node, in the ramdisk. Standard library only."""
