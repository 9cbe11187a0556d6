"""The inspection ramdisk, built by the daemon itself for each architecture it boots
(``provisioner ramdisk build``; ``provisioner serve`` builds a missing one in the background)."""
